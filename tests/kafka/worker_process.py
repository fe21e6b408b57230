"""A stream processor's worker for the exactly-once tests: its own process group (so a
SIGKILL takes every process it started), output to a log file the test keeps."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path


def spawn_worker(
    argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], log: Path
) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            list(argv), cwd=cwd, env=dict(env), stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
