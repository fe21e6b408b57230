"""Fixtures for the security tests: a fresh PKI and token file per session."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.security.pki import Pki, make_pki, write_tokens


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl")
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session")
def tokens_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokens(tmp_path_factory.mktemp("auth") / "tokens.toml")
