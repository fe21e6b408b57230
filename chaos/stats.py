"""Availability and latency of a run, and the series the report plots.

Theory of operation. Safety is the checker's job; this module measures liveness: the
fraction of operations of each kind that succeeded (`ok` over all completed or abandoned
ones), the longest window in which no send succeeded (from the first send's invoke to the
last client event, so a cluster that never recovers scores the whole tail), and latency
percentiles of successful operations, nearest-rank, in milliseconds. Fault windows come from
the nemesis events: a "start" opens a window under its `id`, the matching "stop" closes it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from raftlog.chaos.history import NEMESIS, Event, Op

__all__ = ["FaultWindow", "availability", "fault_windows", "latency_percentiles"]
__all__ += ["error_summary", "percentile", "throughput_series"]

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000


@dataclass(frozen=True, slots=True)
class FaultWindow:
    fault: str
    start_ns: int
    stop_ns: int
    detail: Any


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending sequence (fraction in [0, 1])."""
    assert sorted_values and 0.0 <= fraction <= 1.0
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


def latency_percentiles(ops: Sequence[Op]) -> dict[str, dict[str, float]]:
    """Per kind of operation, the count, p50, p90, p99 and maximum latency in milliseconds of the
    successful ones (nearest rank)."""
    by_f: dict[str, list[float]] = {}
    for op in ops:
        latency = op.latency_ns
        if op.type == "ok" and latency is not None:
            by_f.setdefault(op.f, []).append(latency / NS_PER_MS)
    summary: dict[str, dict[str, float]] = {}
    for f, values in sorted(by_f.items()):
        values.sort()
        summary[f] = {
            "count": len(values),
            **{f"p{int(q * 100)}_ms": round(percentile(values, q), 3) for q in (0.5, 0.9, 0.99)},
            "max_ms": round(values[-1], 3),
        }
    return summary


def availability(ops: Sequence[Op], *, end_ns: int) -> dict[str, Any]:
    """Per kind of operation, the count of each outcome and the fraction ok; and the longest time
    without a successful send, between the first send's invoke and `end_ns` (or the last ok send,
    if later), so a cluster that never recovers scores the whole tail."""
    counts: dict[str, dict[str, int]] = {}
    for op in ops:
        per_type = counts.setdefault(op.f, {"ok": 0, "fail": 0, "info": 0})
        per_type[op.type] += 1
    fractions = {f: round(c["ok"] / max(1, sum(c.values())), 4) for f, c in counts.items()}
    sends = [op for op in ops if op.f == "send"]
    gap_ns = 0
    if sends:
        times = sorted(op.completion.time for op in sends if op.completion and op.type == "ok")
        edges = [sends[0].invoke.time, *times, max(end_ns, times[-1] if times else 0)]
        gap_ns = max(b - a for a, b in itertools.pairwise(edges))
    assert gap_ns >= 0
    return {
        "operations": counts,
        "ok_fraction": fractions,
        "longest_window_without_ok_send_s": round(gap_ns / NS_PER_S, 3),
    }


def error_summary(ops: Sequence[Op], *, kinds_max: int = 10) -> dict[str, dict[str, int]]:
    """The most frequent error messages of failed or unknown operations, per kind of op.

    The client checks some invariants itself (offsets increase, records below the high
    watermark) and raises; those surface here rather than in the checker."""
    by_f: dict[str, dict[str, int]] = {}
    for op in ops:
        error = op.value.get("error") if isinstance(op.value, dict) else None
        if op.type != "ok" and error:
            key = " ".join(str(error).split())[:160]
            counts = by_f.setdefault(op.f, {})
            counts[key] = counts.get(key, 0) + 1
    return {
        f: dict(sorted(c.items(), key=lambda item: -item[1])[:kinds_max]) for f, c in by_f.items()
    }


def fault_windows(events: Sequence[Event], *, end_ns: int) -> list[FaultWindow]:
    """The faults of the nemesis events, each from its start to its stop (to `end_ns` if never
    stopped), in start order."""
    opened: dict[Any, Event] = {}
    windows: list[FaultWindow] = []
    for event in events:
        if event.process != NEMESIS or not isinstance(event.value, dict):
            continue
        key = event.value.get("id")
        if event.f == "start":
            opened[key] = event
        elif event.f == "stop" and key in opened:
            start = opened.pop(key)
            windows.append(FaultWindow(start.value["fault"], start.time, event.time, start.value))
    for start in opened.values():  # never healed: open to the end
        windows.append(FaultWindow(start.value["fault"], start.time, end_ns, start.value))
    assert all(w.start_ns <= w.stop_ns for w in windows)
    return sorted(windows, key=lambda w: w.start_ns)


def throughput_series(ops: Sequence[Op], f: str, *, bucket_s: float = 1.0) -> dict[str, list[int]]:
    """Completions of kind `f` per bucket, by outcome: {"ok": [...], "fail": [...], ...}."""
    assert bucket_s > 0
    bucket_ns = int(bucket_s * NS_PER_S)
    done = [op for op in ops if op.f == f and op.completion is not None]
    if not done:
        return {"ok": [], "fail": [], "info": []}
    buckets = max(op.completion.time for op in done if op.completion) // bucket_ns + 1
    series = {kind: [0] * buckets for kind in ("ok", "fail", "info")}
    for op in done:
        assert op.completion is not None
        series[op.type][op.completion.time // bucket_ns] += 1
    return series
