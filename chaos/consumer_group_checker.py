"""The consumer-group checks: what Jepsen checks of Kafka's groups, over a chaos history.

Theory of operation. In `--consumer-mode group` the history has each member's `assign` and
`revoke` (the partitions its coordinator gave or took, recorded before the records of the
poll that learned it), its polls (marked with the group), its `commit`s and a reader's
`committed` reads (raftlog.chaos.consumer_groups). Events are taken in completion order; a poll's
records count as delivered when the poll completed. Four anomalies:

    commit_backward     a `committed` read lower than a committed offset that an earlier
                        completed commit or read established (per group and partition)
    commit_undelivered  a committed offset c (acknowledged, or read) while a record of the
                        final read below c had not yet been delivered to any member
    rebalance_skip      a member given a partition whose first record from it lies above the
                        highest offset any commit invoked before then could have set, while
                        the final read holds records in between (at-least-once across
                        members: a new owner starts at the group's committed offset)
    revoked_read        a member received a record of a partition it did not hold then
                        (revoked from it, or never given)

Unknown commits (`info`) may or may not have been applied, so they only ever widen what is
allowed: they count for the rebalance bound, never as a floor.
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from raftlog.chaos.history import Op

if TYPE_CHECKING:
    from raftlog.chaos.checker import CheckResult

__all__ = ["GROUP_ANOMALIES", "check_groups", "group_timeline"]

GROUP_ANOMALIES = ("commit_backward", "commit_undelivered", "rebalance_skip", "revoked_read")
TopicPartition = tuple[str, int]
Offsets = dict[TopicPartition, int]
MEMBERSHIP = ("assign", "revoke")


def _offsets(op: Op) -> Offsets:
    v = op.value
    return {(v["topic"], int(p)): o for p, o in v.get("offsets", {}).items()}


def _partitions(op: Op) -> list[TopicPartition]:
    return [(op.value["topic"], p) for p in op.value["partitions"]]


def _is_group_poll(op: Op) -> bool:
    return op.f == "poll" and op.type == "ok" and "group" in op.value


def group_timeline(ops: Sequence[Op]) -> list[Op]:
    """Completed polls and membership changes in completion order (each process's own
    events are sequential, so this is also each member's order)."""
    chosen = [op for op in ops if op.type == "ok" and op.f in ("poll", *MEMBERSHIP)]
    return sorted(chosen, key=lambda op: op.completion.time if op.completion else 0)


def check_groups(
    ops: Sequence[Op], final_offsets: dict[TopicPartition, list[int]], result: CheckResult
) -> None:
    """Add to `result` every commit_backward, commit_undelivered, rebalance_skip and revoked_read
    that `ops` show; `final_offsets` are the final read's data offsets per partition, sorted."""
    timeline = group_timeline(ops)
    _check_revoked_reads(timeline, result)
    _check_commit_order(ops, result)
    _check_commits_delivered(ops, final_offsets, result)
    _check_rebalance_skips(ops, timeline, final_offsets, result)


def _check_revoked_reads(timeline: Sequence[Op], result: CheckResult) -> None:
    held: dict[int | str, set[TopicPartition]] = defaultdict(set)
    for op in timeline:
        if op.f == "assign":
            held[op.process].update(_partitions(op))
        elif op.f == "revoke":
            held[op.process].difference_update(_partitions(op))
        elif _is_group_poll(op):
            reported: set[TopicPartition] = set()
            for r in op.value["records"]:
                tp = (r["topic"], r["partition"])
                if tp not in held[op.process] and tp not in reported:
                    reported.add(tp)
                    example = {"process": op.process, "partition": tp[1], "offset": r["offset"],
                               "held": sorted(p for _, p in held[op.process])}  # fmt: skip
                    result.add("revoked_read", {**example, "time": _done(op)})


def _done(op: Op) -> int:
    assert op.completion is not None
    return op.completion.time


def _check_commit_order(ops: Sequence[Op], result: CheckResult) -> None:
    """A `committed` read invoked after a commit or read completed must not be lower."""
    timeline: list[tuple[int, int, Op]] = []  # (time, 0 = completion first, op)
    for op in ops:
        if op.type == "ok" and op.f in ("commit", "committed"):
            timeline.append((_done(op), 0, op))
            if op.f == "committed":
                timeline.append((op.invoke.time, 1, op))
    timeline.sort(key=lambda item: (item[0], item[1]))
    floor: dict[tuple[str, TopicPartition], tuple[int, Op]] = {}
    floor_at_invoke: dict[int, dict[tuple[str, TopicPartition], tuple[int, Op]]] = {}
    for _, kind, op in timeline:
        if kind == 1:
            floor_at_invoke[id(op)] = dict(floor)
            continue
        group = str(op.value["group"])
        for tp, offset in _offsets(op).items():
            before = floor_at_invoke.get(id(op), {}).get((group, tp))
            if op.f == "committed" and before is not None and offset < before[0]:
                result.add(
                    "commit_backward",
                    {"group": group, "partition": tp[1], "committed": offset,
                     "process": op.process, "time": op.invoke.time, "earlier": before[0],
                     "earlier_by": f"{before[1].f} of process {before[1].process}"},
                )  # fmt: skip
            if (group, tp) not in floor or offset > floor[(group, tp)][0]:
                floor[(group, tp)] = (offset, op)


def _first_deliveries(ops: Sequence[Op]) -> dict[tuple[TopicPartition, int], int]:
    first: dict[tuple[TopicPartition, int], int] = {}
    for op in ops:
        if _is_group_poll(op):
            for r in op.value["records"]:
                key = ((r["topic"], r["partition"]), r["offset"])
                first[key] = min(first.get(key, _done(op)), _done(op))
    return first


def _check_commits_delivered(
    ops: Sequence[Op], final_offsets: dict[TopicPartition, list[int]], result: CheckResult
) -> None:
    """Every final-read record below a committed offset was delivered before it was seen."""
    first = _first_deliveries(ops)
    never = float("inf")
    latest: dict[TopicPartition, list[float]] = {}  # prefix max of first delivery times
    for tp, offsets in final_offsets.items():
        times = [first.get((tp, o), never) for o in offsets]
        latest[tp] = list(itertools.accumulate(times, max))
    reported: set[tuple[TopicPartition, int]] = set()
    for op in ops:
        if op.type != "ok" or op.f not in ("commit", "committed"):
            continue
        for tp, committed in _offsets(op).items():
            offsets = final_offsets.get(tp, [])
            below = bisect.bisect_left(offsets, committed)
            if below == 0 or latest[tp][below - 1] <= _done(op):
                continue
            late = next(o for o in offsets[:below] if first.get((tp, o), never) > _done(op))
            if (tp, late) in reported:
                continue
            reported.add((tp, late))
            result.add(
                "commit_undelivered",
                {"partition": tp[1], "committed": committed, "undelivered_offset": late,
                 "by": f"{op.f} of process {op.process}", "time": _done(op),
                 "delivered_at": first.get((tp, late))},
            )  # fmt: skip


class _CommitBound:
    """The highest offset commits invoked before a time could have set (0: none yet)."""

    def __init__(self, ops: Sequence[Op]) -> None:
        found: dict[TopicPartition, list[tuple[int, int]]] = defaultdict(list)
        for op in ops:
            if op.f == "commit" and op.type != "fail":
                for tp, offset in _offsets(op).items():
                    found[tp].append((op.invoke.time, offset))
        self._times: dict[TopicPartition, list[int]] = {}
        self._highest: dict[TopicPartition, list[int]] = {}
        for tp, commits in found.items():
            commits.sort()
            self._times[tp] = [t for t, _ in commits]
            self._highest[tp] = list(itertools.accumulate((o for _, o in commits), max))

    def before(self, tp: TopicPartition, time: int) -> int:
        """The highest offset that the commits of `tp` (ok or unknown) invoked before `time` could
        have set; 0 if there were none."""
        index = bisect.bisect_left(self._times.get(tp, []), time)
        return self._highest[tp][index - 1] if index else 0


def _check_rebalance_skips(
    ops: Sequence[Op],
    timeline: Sequence[Op],
    final_offsets: dict[TopicPartition, list[int]],
    result: CheckResult,
) -> None:
    bound = _CommitBound(ops)
    awaiting: set[tuple[int | str, TopicPartition]] = set()  # given, no record from it yet
    for op in timeline:
        if op.f in MEMBERSHIP:
            keys = {(op.process, tp) for tp in _partitions(op)}
            awaiting = awaiting | keys if op.f == "assign" else awaiting - keys
            continue
        if not _is_group_poll(op):
            continue
        firsts: dict[TopicPartition, int] = {}
        for r in op.value["records"]:
            tp = (r["topic"], r["partition"])
            if (op.process, tp) in awaiting:
                firsts[tp] = min(firsts.get(tp, r["offset"]), r["offset"])
        for tp, first in firsts.items():
            awaiting.discard((op.process, tp))
            start = bound.before(tp, _done(op))
            offsets = final_offsets.get(tp, [])
            skipped = offsets[
                bisect.bisect_left(offsets, start) : bisect.bisect_left(offsets, first)
            ]
            if skipped:
                example: dict[str, Any] = {"process": op.process, "partition": tp[1],
                                           "first_offset": first, "committed_at_most": start,
                                           "skipped_offsets": skipped[:10]}  # fmt: skip
                result.add("rebalance_skip", {**example, "time": _done(op)})
