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
# A bounded run for CI; set RAFTLOG_FUZZ_EXAMPLES for longer. The targets that open a log on
# a simulated file system per input cost about 0.8 ms an input (16 s for 20,000 on a 2-core
# CI host, a third of the fuzzers' share of the suite), so they run fewer in make test.
RUNS = int(os.environ.get("RAFTLOG_FUZZ_EXAMPLES", 20000))
RUNS_FILE_SYSTEM_TARGETS = int(os.environ.get("RAFTLOG_FUZZ_EXAMPLES", 8000))


def _runs(target: str) -> int:
    return RUNS_FILE_SYSTEM_TARGETS if target in ("recovery", "mark") else RUNS


@pytest.mark.parametrize("target", ["batch", "records", "recovery", "mark"])
def test_atheris_target_finds_nothing(target: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.fuzz.atheris_targets", target, f"-runs={_runs(target)}",
         f"-artifact_prefix={tmp_path}/", "-seed=1"],
        cwd=ROOT, capture_output=True, timeout=300,
    )  # fmt: skip
    report = done.stderr.decode(errors="replace")[-3000:]
    assert done.returncode == 0, report
    assert "Done" in report, report
