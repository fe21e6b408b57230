"""The report of a run: report.md with the verdict and tables, and PNG plots as Jepsen draws them.

Theory of operation. Two plots share a time axis in seconds since the run started, with each
fault window shaded in its nemesis' colour: `latency.png` puts every operation at its invoke
time and latency (ok as dots, fail as crosses, info as triangles at the top when they never
completed), `throughput.png` counts completions per second by kind and outcome. matplotlib
draws off-screen (the Agg backend) so a run needs no display. `report.md` links both and
lists the verdict, every anomaly with its first examples, availability and latency.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from raftlog.chaos.history import Event, Op, pair_operations
from raftlog.chaos.stats import NS_PER_MS, NS_PER_S, fault_windows, throughput_series

__all__ = ["write_report"]

COLOURS = {"kill": "#e15759", "pause": "#f28e2b", "partition": "#4e79a7", "flaky": "#b07aa1"}
MARKERS = {"ok": ("o", 2.0), "fail": ("x", 12.0), "info": ("^", 12.0)}
KINDS = ("send", "poll", "watermarks", "txn", "txn_read")  # txn: the transactional workload


def _shade(axes: Any, events: Sequence[Event], end_ns: int) -> None:
    labelled: set[str] = set()
    for window in fault_windows(events, end_ns=end_ns):
        colour = COLOURS.get(window.fault, "#999999")
        label = None if window.fault in labelled else window.fault
        labelled.add(window.fault)
        axes.axvspan(
            window.start_ns / NS_PER_S,
            window.stop_ns / NS_PER_S,
            color=colour,
            alpha=0.15,
            label=label,
        )


def _latency_plot(path: Path, ops: Sequence[Op], events: Sequence[Event], end_ns: int) -> None:
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(11, 4.5))
    _shade(axes, events, end_ns)
    ceiling_ms = max([(op.latency_ns or 0) / NS_PER_MS for op in ops] + [1.0])
    for f, colour in zip(
        KINDS, ("#59a14f", "#4e79a7", "#9c755f", "#e15759", "#f28e2b"), strict=True
    ):
        for outcome, (marker, size) in MARKERS.items():
            chosen = [op for op in ops if op.f == f and op.type == outcome]
            if not chosen:
                continue
            xs = [op.invoke.time / NS_PER_S for op in chosen]
            ys = [(op.latency_ns if op.latency_ns is not None else 0) / NS_PER_MS for op in chosen]
            ys = [
                y if op.completion is not None else ceiling_ms
                for y, op in zip(ys, chosen, strict=True)
            ]
            axes.scatter(
                xs, ys, s=size, marker=marker, color=colour, label=f"{f} {outcome}", alpha=0.6
            )
    axes.set_yscale("log")
    axes.set_xlabel("time since start (s)")
    axes.set_ylabel("latency (ms)")
    axes.set_title("Latency of each operation (faults shaded)")
    axes.legend(fontsize=7, loc="upper right", ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _throughput_plot(path: Path, ops: Sequence[Op], events: Sequence[Event], end_ns: int) -> None:
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(11, 4.5))
    _shade(axes, events, end_ns)
    for f in ("send", "poll", "txn"):
        series = throughput_series(ops, f)
        for outcome, style in (("ok", "-"), ("fail", ":"), ("info", "--")):
            counts = series[outcome]
            if any(counts):
                axes.plot(range(len(counts)), counts, style, label=f"{f} {outcome}", linewidth=1.2)
    axes.set_xlabel("time since start (s)")
    axes.set_ylabel("completions per second")
    axes.set_title("Throughput (faults shaded)")
    axes.legend(fontsize=7, loc="upper right", ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _markdown(results: dict[str, Any]) -> str:
    lines = [
        f"# Chaos run, seed {results['seed']}: {'VALID' if results['valid'] else 'INVALID'}",
        "",
        "![latency](latency.png)",
        "",
        "![throughput](throughput.png)",
        "",
        "## Anomalies",
        "",
        "| anomaly | count |",
        "|---|---|",
        *[f"| {name} | {count} |" for name, count in results["anomaly_counts"].items()],
        "",
    ]
    for name, examples in results["anomalies"].items():
        if examples:
            lines += [
                f"### {name}",
                "",
                "```json",
                *[json.dumps(e) for e in examples[:5]],
                "```",
                "",
            ]
    if results["unchecked"]:
        lines += ["Not judged: " + "; ".join(results["unchecked"]), ""]
    lines += [
        "## Availability",
        "",
        "```json",
        json.dumps(results["availability"], indent=2),
        "```",
    ]
    lines += ["", "## Most frequent errors", "", "```json"]
    lines += [json.dumps(results.get("errors", {}), indent=2), "```", ""]
    return "\n".join(lines + _tables(results))


def _tables(results: dict[str, Any]) -> list[str]:
    lines = ["## Latency (ms, ok operations)", "", "| op | count | p50 | p90 | p99 | max |"]
    lines += ["|---|---|---|---|---|---|"]
    for f, s in results["latency_ms"].items():
        cells = [f, s["count"], s["p50_ms"], s["p90_ms"], s["p99_ms"], s["max_ms"]]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines += ["", "## Faults", "", "| start (s) | stop (s) | fault | detail |", "|---|---|---|---|"]
    for w in results["faults"]:
        detail = {k: w["detail"][k] for k in ("kind", "nodes", "links") if k in w["detail"]}
        start_s, stop_s = w["start_ns"] / NS_PER_S, w["stop_ns"] / NS_PER_S
        lines.append(f"| {start_s:.1f} | {stop_s:.1f} | {w['fault']} | {json.dumps(detail)} |")
    lines += _storage_table(results.get("storage"))
    lines += _elections_table(results.get("elections"))
    lines += ["", "Options: `" + json.dumps(results["options"]) + "`", ""]
    return lines


def _storage_table(storage: dict[str, Any] | None) -> list[str]:
    """The `corrupt` nemesis's damage and the repairs the node logs report."""
    if not storage or not storage["damage"]:
        return []
    lines = ["", "## Storage damage", ""]
    lines += [
        f"Damaged {len(storage['damage'])} times; the nodes found damage "
        f"{storage['damage_found']} times and finished {storage['repairs_finished']} repairs.",
        "",
        "| node | file | damage |",
        "|---|---|---|",
    ]
    for report in storage["damage"]:
        lines.append(f"| {report['node']} | {report['file']} | {report['damage']} |")
    return lines


def _elections_table(elections: dict[str, Any] | None) -> list[str]:
    """Elections and fences of the load phase against the faults that explain them."""
    if not elections:
        return []
    lines = ["", "## Elections and fences (load phase, from the node logs)", ""]
    lines += ["| elections | per minute | transfers | fences | per minute | explained by faults |"]
    lines += ["|---|---|---|---|---|---|"]
    cells = [
        elections["elections"],
        elections["elections_per_minute"],
        elections["transfers"],
        elections["fences"],
        elections["fences_per_minute"],
        f"{elections['elections_explained_by_faults']} "
        f"({elections['leader_removing_faults']} faults removed a node)",
    ]
    lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


def write_report(out_dir: Path, events: Sequence[Event], results: dict[str, Any]) -> Path:
    """Write report.md, latency.png and throughput.png into `out_dir`; returns report.md."""
    import matplotlib

    matplotlib.use("Agg")
    ops = list(pair_operations(events))
    end_ns = events[-1].time if events else 0
    _latency_plot(out_dir / "latency.png", ops, events, end_ns)
    _throughput_plot(out_dir / "throughput.png", ops, events, end_ns)
    report = out_dir / "report.md"
    report.write_text(_markdown(results))
    assert report.exists()
    return report
