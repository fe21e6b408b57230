"""Benchmark `scale-pressure`: the scale suite's idle run under CPU pressure.

Theory of operation. A slow node must degrade gracefully, not start a storm: a lease that
expires because the machine is busy fences a node, its leaderships move, the elections add
load, more leases expire. This suite runs `scale.idle_metrics` (3 nodes, one topic of 1,000
partitions, RF 3, a 60 s idle window) twice: alone, then with a CPU hog of one core that the
suite starts itself (`python -c 'while True: pass'`, killed at the end). Figures, each
suffixed `_1000_partitions` (see suites/scale.py for how they are measured), with `_hog`
for the run under pressure:

- `settle_ratio_hog_1000_partitions`: settle time under the hog / settle time alone
  (goal <= 2);
- `spurious_elections_..._hog`, `idle_cpu_cores_per_node_..._hog` (goals 0 and <= 0.05);
- `fences_..._hog` and `fences_...`: "fencing node" lines the controllers logged over the
  whole run (creation and settling included, so at least the idle window's; goal 0), and
  `self_fences_...`: "fenced:" lines, a node finding its own lease lapsed (goal 0);
- full mode adds the unloaded run at 3,000 partitions (goals: settle < 60 s, 0 spurious
  elections, idle <= 0.05 core per node).

The node logs stay in `<out>/idle-work-logs`, `<out>/idle-hog-work-logs`, ...: every fence,
election and leadership change names its cause there.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

SUITES_DIR = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(SUITES_DIR)]
from scale import PARTITIONS, idle_metrics  # noqa: E402

FULL_ONLY_PARTITIONS = 3000
FENCE_LINE = "fencing node"
SELF_FENCE_LINE = ": fenced: "  # a node that saw its own lease lapse (raftlog.node.node)


@contextmanager
def cpu_hog() -> Iterator[int]:
    """One process spinning on one core for as long as the block runs; yields its pid."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield hog.pid
    finally:
        hog.kill()
        hog.wait(timeout=10)


def fences_logged(logs: pathlib.Path, line_part: str = FENCE_LINE) -> int:
    """How many fences the nodes whose logs are in `logs` committed or tried to (or, with
    `SELF_FENCE_LINE`, how often a node fenced itself when its own lease lapsed)."""
    return sum(
        line.count(line_part)
        for log in sorted(logs.glob("node-*.log"))
        for line in log.read_text(errors="replace").splitlines()
    )


def pressure_metrics(
    out_dir: pathlib.Path, *, quick: bool, partitions: int = PARTITIONS, window_s: float = 60.0
) -> dict[str, float]:
    """The idle run alone, then under a one-core hog, at `partitions`."""
    suffix = f"_{partitions}_partitions"
    alone = idle_metrics(
        out_dir, quick=quick, partitions=partitions, work_name="idle-work", window_s=window_s
    )
    _count_fences(alone, out_dir / "idle-work-logs", suffix)
    with cpu_hog():
        hogged = idle_metrics(
            out_dir, quick=quick, partitions=partitions, work_name="idle-hog-work",
            window_s=window_s,
        )  # fmt: skip
    _count_fences(hogged, out_dir / "idle-hog-work-logs", suffix)
    metrics = dict(alone)
    metrics.update({f"{name}_hog": value for name, value in hogged.items()})
    settled_alone = alone[f"leaders_settled_s{suffix}"]
    metrics[f"settle_ratio_hog{suffix}"] = hogged[f"leaders_settled_s{suffix}"] / settled_alone
    return metrics


def _count_fences(metrics: dict[str, float], logs: pathlib.Path, suffix: str) -> None:
    metrics[f"fences{suffix}"] = float(fences_logged(logs))
    metrics[f"self_fences{suffix}"] = float(fences_logged(logs, SELF_FENCE_LINE))


def run(out_dir: pathlib.Path, *, quick: bool) -> dict[str, float]:
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics = pressure_metrics(out_dir, quick=quick)
    if not quick:
        many = idle_metrics(
            out_dir, quick=False, partitions=FULL_ONLY_PARTITIONS, work_name="idle-3000-work"
        )
        _count_fences(many, out_dir / "idle-3000-work-logs", f"_{FULL_ONLY_PARTITIONS}_partitions")
        metrics.update(many)
    (out_dir / "scale_pressure.json").write_text(json.dumps(metrics, indent=2, sort_keys=True))
    return metrics
