"""The chaos suite's docker backend: a short run under kill, pause and partition against
containers of raftlog:local.

It lives beside the compose test, which builds raftlog:local with `make image` when it is
missing: pytest runs this file after that one, so on a fresh machine the image is there by
now (chaos/ comes before docker/, and a test there always found no image in CI).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from raftlog.chaos.cli import main
from raftlog.chaos.docker_backend import unavailable_reason

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_the_docker_backend_runs_or_skips_cleanly(tmp_path: Path) -> None:
    reason = unavailable_reason("raftlog:local")
    if reason is not None:
        pytest.skip(f"docker backend: {reason}")
    argv = ["run", "--backend", "docker", "--nemesis", "kill,pause,partition"]
    argv += ["--duration", "20", "--seed", "9", "--out", str(tmp_path / "run")]
    assert main(argv) == 0
