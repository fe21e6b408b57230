"""PNG plots of the cluster benchmarks, drawn with matplotlib's Agg backend.

Theory of operation. Suites pass plain numbers (no raftlog types) and a path; each function
draws one figure, writes it and returns the path. Nothing here measures: a plot can be
redrawn from results without rerunning a cluster (`python benchmarks/plots.py DIR` redraws
from DIR/cluster-points.json and DIR/failover-points.json when they exist).
"""

from __future__ import annotations

import json
import pathlib
import sys
from collections.abc import Mapping, Sequence
from types import ModuleType

DPI = 110


def _pyplot() -> ModuleType:
    """matplotlib.pyplot on the Agg backend, imported only when a figure is drawn: imported
    at start it added some 53,000 objects to the measuring process's heap, which every full
    garbage collection of the producer under test then walked (tens of ms each)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # the backend must be chosen first

    return matplotlib.pyplot


def offered_load(points: Sequence[Mapping[str, float]], path: pathlib.Path) -> pathlib.Path:
    """Achieved throughput and latency percentiles against offered load (acks=all, 1 KiB).

    Each point: offered_mb_s, achieved_mb_s, p50_ms, p99_ms, p999_ms."""
    assert points, "no offered-load points to plot"
    offered = [p["offered_mb_s"] for p in points]
    plt = _pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    left.plot(offered, [p["achieved_mb_s"] for p in points], "o-", label="achieved")
    left.plot(offered, offered, ":", color="grey", label="offered = achieved")
    left.set_xlabel("offered load (MB/s)")
    left.set_ylabel("acknowledged (MB/s)")
    left.set_title("acks=all throughput, 1 KiB records")
    left.legend()
    for key, label in (("p50_ms", "p50"), ("p99_ms", "p99"), ("p999_ms", "p99.9")):
        right.plot(offered, [p[key] for p in points], "o-", label=label)
    right.set_yscale("log")
    right.set_xlabel("offered load (MB/s)")
    right.set_ylabel("produce latency (ms, log scale)")
    right.set_title("acks=all latency (from due time to ack)")
    right.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=DPI)
    plt.close(figure)
    return path


def failover_timeline(
    trials: Sequence[Mapping[str, object]], path: pathlib.Path, *, columns: int = 4
) -> pathlib.Path:
    """One panel per trial: acknowledged records per 50 ms bucket around the SIGKILL.

    Each trial: ack_times_s (relative to the kill), unavailability_s, trial."""
    assert trials, "no failover trials to plot"
    rows = (len(trials) + columns - 1) // columns
    plt = _pyplot()
    figure, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 2.4 * rows), squeeze=False)
    for index, trial in enumerate(trials):
        axis = axes[index // columns][index % columns]
        times = [float(t) for t in trial["ack_times_s"]]  # type: ignore[attr-defined]
        axis.hist(times, bins=[i * 0.05 for i in range(-40, 101)], color="tab:blue")
        axis.axvline(0.0, color="red", linestyle="--", linewidth=1)
        gap = float(trial["unavailability_s"])  # type: ignore[arg-type]
        axis.axvspan(0.0, gap, color="red", alpha=0.15)
        axis.set_title(f"trial {trial['trial']}: {gap:.2f} s", fontsize=9)
        axis.tick_params(labelsize=7)
    for index in range(len(trials), rows * columns):
        axes[index // columns][index % columns].axis("off")
    figure.supxlabel("seconds from SIGKILL of the partition leader (acks per 50 ms)")
    figure.tight_layout()
    figure.savefig(path, dpi=DPI)
    plt.close(figure)
    return path


def throughput_bars(figures: Mapping[str, float], path: pathlib.Path) -> pathlib.Path:
    """Horizontal bars of MB/s figures measured in one run (limits, baseline, raftlog)."""
    assert figures, "no throughput figures to plot"
    names = list(figures)
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(8, 0.45 * len(names) + 1.2))
    axis.barh(names, [figures[n] for n in names], color="tab:green")
    for y, name in enumerate(names):
        axis.text(figures[name], y, f" {figures[name]:.1f}", va="center", fontsize=8)
    axis.invert_yaxis()
    axis.set_xscale("log")
    axis.set_xlabel("MB/s (log scale), same run, same machine")
    figure.tight_layout()
    figure.savefig(path, dpi=DPI)
    plt.close(figure)
    return path


def main(out_dir: pathlib.Path) -> None:
    points = out_dir / "cluster-points.json"
    if points.exists():
        data = json.loads(points.read_text())
        print(offered_load(data["offered_load"], out_dir / "offered_load.png"))
        print(throughput_bars(data["throughput"], out_dir / "throughput.png"))
    failover = out_dir / "failover-points.json"
    if failover.exists():
        print(failover_timeline(json.loads(failover.read_text()), out_dir / "failover.png"))


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "bench-out"))
