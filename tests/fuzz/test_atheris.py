"""Run each atheris target for a bounded number of inputs (longer runs: see atheris_targets)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("atheris") is None, reason="atheris is not installed"
)
ROOT = Path(__file__).resolve().parents[2]
# A bounded run for CI (about 5 s a target on 2 cores); set RAFTLOG_FUZZ_EXAMPLES for longer.
RUNS = int(os.environ.get("RAFTLOG_FUZZ_EXAMPLES", 20000))


@pytest.mark.parametrize("target", ["batch", "records", "recovery", "mark"])
def test_atheris_target_finds_nothing(target: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.fuzz.atheris_targets", target, f"-runs={RUNS}",
         f"-artifact_prefix={tmp_path}/", "-seed=1"],
        cwd=ROOT, capture_output=True, timeout=300,
    )  # fmt: skip
    report = done.stderr.decode(errors="replace")[-3000:]
    assert done.returncode == 0, report
    assert "Done" in report, report
