"""`pytest tests/interaction --rewrite` (or RAFTLOG_REWRITE=1) regenerates the transcripts."""

from __future__ import annotations

import os

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--rewrite",
        action="store_true",
        default=False,
        help="rewrite the golden transcripts in tests/interaction/testdata",
    )


@pytest.fixture
def rewrite(request: pytest.FixtureRequest) -> bool:
    option = bool(request.config.getoption("--rewrite", default=False))
    return option or os.environ.get("RAFTLOG_REWRITE") == "1"
