"""The safety checker: judges a history of sends, polls, watermarks and a final read.

Theory of operation. Every value a producer sends is unique in the run (`"<process>-<n>"`),
so the checker can follow each one: where its send said it landed, where polls saw it, where
the final read (every partition from offset 0 after all faults healed) found it. From those
observations it reports each anomaly a commit log must never show:

    lost                 an acknowledged send whose value is not in the final read
    duplicate            one value at two offsets
    inconsistent_offset  one offset holding two values (in acks, polls and the final read)
    phantom_read         a value read that no one ever sent
    failed_read          a value read whose send definitely failed
    poll_backward        a consumer's offsets in one partition not increasing
    poll_skip            a consumer jumping over an offset that holds a record
    send_reorder         one producer's sends to one partition landing out of send order
    read_then_gone       a value a poll returned that the final read no longer has
    hw_backward          a high watermark lower than one seen by an earlier completed read

and, for consumer groups, the four of raftlog.chaos.consumer_group_checker (commit_backward,
commit_undelivered, rebalance_skip, revoked_read), and, for the transactional workload, those
of raftlog.chaos.txn_checker (aborted_read, lost_committed, torn_txn, txn_order). A group
member's polls of a partition are judged for skips and rewinds from each time it is given the
partition: a new owner starts at the group's committed offset, which may lie anywhere another
member left it.

Unknown outcomes (`info`) are never held against the system: an `info` send may or may not be
in the log. A partition whose final read failed cannot be judged for losses; it is counted in
`unchecked` rather than silently passed. Offsets are the Kafka offsets every client sees
(docs/offsets.md: Raft's own entries take none), yet gaps remain possible (records compaction
removed, Kafka control batches such as transaction markers), which is why `poll_skip` asks
the final read whether a skipped offset held a record rather than demanding contiguous
offsets.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from raftlog.chaos.compaction_checker import COMPACTION_ANOMALIES, check_compaction
from raftlog.chaos.consumer_group_checker import GROUP_ANOMALIES, check_groups, group_timeline
from raftlog.chaos.history import Op
from raftlog.chaos.txn_checker import TXN_ANOMALIES, check_transactions

__all__ = ["ANOMALIES", "CheckResult", "Observation", "check"]

ANOMALIES = (
    "lost",
    "duplicate",
    "inconsistent_offset",
    "phantom_read",
    "failed_read",
    "poll_backward",
    "poll_skip",
    "send_reorder",
    "read_then_gone",
    "hw_backward",
    *GROUP_ANOMALIES,
    *COMPACTION_ANOMALIES,
    *TXN_ANOMALIES,
)
TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Observation:
    """One sighting of a value at an offset: by a send's ack, a poll or the final read."""

    source: str  # "ack", "poll" or "final"
    process: int | str
    time: int
    tp: TopicPartition
    offset: int
    value: str


@dataclass(slots=True)
class CheckResult:
    examples_max: int
    anomalies: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    unchecked: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        """True when no anomaly was counted (unchecked partitions are the caller's to judge)."""
        return not any(self.counts.values())

    def add(self, name: str, example: dict[str, Any]) -> None:
        """Count one anomaly `name` (one of ANOMALIES) and keep `example` while fewer than
        `examples_max` are kept for it."""
        assert name in ANOMALIES, name
        self.counts[name] = self.counts.get(name, 0) + 1
        examples = self.anomalies.setdefault(name, [])
        if len(examples) < self.examples_max:
            examples.append(example)


def _records(op: Op) -> list[dict[str, Any]]:
    value = op.value if isinstance(op.value, dict) else {}
    records = value.get("records", [])
    assert isinstance(records, list), op
    return records


def _observations(ops: Sequence[Op]) -> list[Observation]:
    found: list[Observation] = []
    for op in ops:
        if op.type != "ok" or op.completion is None:
            continue
        time = op.completion.time
        if op.f == "send" and op.value.get("offset", -1) >= 0:
            v = op.value
            tp = (v["topic"], v["partition"])
            found.append(Observation("ack", op.process, time, tp, v["offset"], v["value"]))
        elif op.f in ("poll", "final_read"):
            source = "poll" if op.f == "poll" else "final"
            for r in _records(op):
                tp = (r["topic"], r["partition"])
                found.append(Observation(source, op.process, time, tp, r["offset"], r["value"]))
    return found


@dataclass(slots=True)
class _Facts:
    """What the history establishes, gathered once for all the checks."""

    sends: dict[str, Op]
    observations: list[Observation]
    final: dict[TopicPartition, dict[str, list[int]]]  # value -> offsets, per final-read tp
    final_offsets: dict[TopicPartition, list[int]]  # sorted data offsets per final-read tp

    @staticmethod
    def gather(ops: Sequence[Op]) -> _Facts:
        """Index `ops` once: sends by value, every sighting of a value, and the final read's values
        and offsets per partition it read."""
        sends = {str(op.invoke.value["value"]): op for op in ops if op.f == "send"}
        observations = _observations(ops)
        final: dict[TopicPartition, dict[str, list[int]]] = {}
        for op in ops:
            if op.f == "final_read" and op.type == "ok":
                final.setdefault((op.value["topic"], op.value["partition"]), {})
        for seen in observations:
            if seen.source == "final":
                final[seen.tp].setdefault(seen.value, []).append(seen.offset)
        final_offsets = {
            tp: sorted(o for offsets in by_value.values() for o in offsets)
            for tp, by_value in final.items()
        }
        return _Facts(sends, observations, final, final_offsets)


def check(ops: Iterable[Op], *, examples_max: int = 10, compacted: bool = False) -> CheckResult:
    """Judge the client operations of one run; `result.valid` is True when none is found.
    On a `compacted` topic superseded values may go: `lost` and `read_then_gone` give way to
    the keyed checks of `raftlog.chaos.compaction_checker`."""
    assert examples_max > 0
    ops = list(ops)
    facts = _Facts.gather(ops)
    result = CheckResult(examples_max, counts=dict.fromkeys(ANOMALIES, 0))
    if compacted:
        check_compaction(ops, result.add, result.unchecked)
    else:
        _check_lost(facts, result)
    _check_offsets(facts, result)
    _check_reads(facts, result, compacted=compacted)
    _check_polls(ops, facts, result)
    _check_send_order(ops, result)
    _check_watermarks(ops, result)
    check_groups(ops, facts.final_offsets, result)
    if any(op.f in ("txn", "txn_read") for op in ops):
        check_transactions(ops, result)
    assert set(result.counts) == set(ANOMALIES)
    return result


def _check_lost(facts: _Facts, result: CheckResult) -> None:
    unchecked: set[TopicPartition] = set()
    for value, op in facts.sends.items():
        if op.type != "ok":
            continue
        tp = (op.value["topic"], op.value["partition"])
        if tp not in facts.final:
            unchecked.add(tp)
        elif value not in facts.final[tp]:
            result.add(
                "lost",
                {
                    "value": value,
                    "ack": op.value,
                    "process": op.process,
                    "acked_at_ns": op.completion.time if op.completion else None,
                },
            )
    result.unchecked.extend(f"lost: no final read of {t}/{p}" for t, p in sorted(unchecked))


def _check_offsets(facts: _Facts, result: CheckResult) -> None:
    values_at: dict[tuple[TopicPartition, int], dict[str, Observation]] = defaultdict(dict)
    offsets_of: dict[str, dict[tuple[TopicPartition, int], Observation]] = defaultdict(dict)
    sources: dict[tuple[str, TopicPartition, int], set[str]] = defaultdict(set)
    for seen in facts.observations:
        values_at[(seen.tp, seen.offset)].setdefault(seen.value, seen)
        offsets_of[seen.value].setdefault((seen.tp, seen.offset), seen)
        sources[(seen.value, seen.tp, seen.offset)].add(seen.source)
    for (tp, offset), by_value in sorted(values_at.items()):
        if len(by_value) > 1:
            result.add(
                "inconsistent_offset",
                {
                    "topic": tp[0],
                    "partition": tp[1],
                    "offset": offset,
                    "seen": [_describe(s) for s in by_value.values()],
                },
            )
    for value, by_place in offsets_of.items():
        if len(by_place) > 1:
            # Each place lists every source that saw the value there (ack, poll, final).
            places = [
                {**_describe(s), "sources": sorted(sources[(value, s.tp, s.offset)])}
                for s in by_place.values()
            ]
            result.add("duplicate", {"value": value, "seen": places})


def _describe(seen: Observation) -> dict[str, Any]:
    return {
        "source": seen.source,
        "process": seen.process,
        "time": seen.time,
        "partition": seen.tp[1],
        "offset": seen.offset,
        "value": seen.value,
    }


def _check_reads(facts: _Facts, result: CheckResult, *, compacted: bool) -> None:
    reported: set[tuple[str, str]] = set()
    for seen in facts.observations:
        if seen.source == "ack":
            continue
        send = facts.sends.get(seen.value)
        if send is None:
            name = "phantom_read"
        elif send.type == "fail":
            name = "failed_read"
        elif (
            seen.source == "poll"
            and not compacted
            and seen.tp in facts.final
            and seen.value not in facts.final[seen.tp]
        ):
            name = "read_then_gone"
        else:
            continue
        if (name, seen.value) not in reported:  # one report per value, not per sighting
            reported.add((name, seen.value))
            result.add(name, _describe(seen))


_GIVEN = -2  # in `_check_polls`: a partition just given to a group member


def _check_polls(ops: Sequence[Op], facts: _Facts, result: CheckResult) -> None:
    # A member given a partition starts wherever the group committed: its first record
    # there is judged by the group checks (rebalance_skip), not against offset 0.
    given = _GIVEN
    last: dict[tuple[int | str, TopicPartition], int] = {}
    for op in group_timeline(ops):  # each process polls one at a time, so this is its order
        if op.f == "assign":
            for p in op.value["partitions"]:
                last[(op.process, (op.value["topic"], p))] = given
        if op.f != "poll":
            continue
        for r in _records(op):
            tp = (r["topic"], r["partition"])
            offset = r["offset"]
            previous = last.get((op.process, tp), -1)
            last[(op.process, tp)] = offset
            if previous == given:
                continue
            example = {
                "process": op.process,
                "partition": tp[1],
                "previous_offset": previous,
                "offset": offset,
                "time": op.invoke.time,
            }
            if offset <= previous:
                result.add("poll_backward", example)
                continue
            known = facts.final_offsets.get(tp, [])
            skipped = known[
                bisect.bisect_right(known, previous) : bisect.bisect_left(known, offset)
            ]
            if skipped:
                result.add("poll_skip", {**example, "skipped_offsets": skipped[:10]})


def _check_send_order(ops: Sequence[Op], result: CheckResult) -> None:
    last: dict[tuple[int | str, TopicPartition], tuple[int, str]] = {}
    for op in ops:  # invoke order is send() order within a process
        if op.f != "send" or op.type != "ok" or op.value.get("offset", -1) < 0:
            continue
        tp = (op.value["topic"], op.value["partition"])
        offset, value = op.value["offset"], op.value["value"]
        previous = last.get((op.process, tp))
        if previous is not None and offset <= previous[0]:
            result.add(
                "send_reorder",
                {
                    "process": op.process,
                    "partition": tp[1],
                    "earlier_send": {"value": previous[1], "offset": previous[0]},
                    "later_send": {"value": value, "offset": offset},
                },
            )
        last[(op.process, tp)] = (offset, value)


def _watermarks(op: Op) -> dict[TopicPartition, int]:
    v = op.value
    if op.f == "final_read":
        return {(v["topic"], v["partition"]): v["end_offset"]}
    return {(v["topic"], int(p)): hw for p, hw in v["high_watermarks"].items()}


def _check_watermarks(ops: Sequence[Op], result: CheckResult) -> None:
    """A read that began after another completed must not see a lower high watermark."""
    reads = [op for op in ops if op.f in ("watermarks", "final_read") and op.type == "ok"]
    timeline: list[tuple[int, int, Op]] = []  # (time, 0 = completion first, op)
    for op in reads:
        assert op.completion is not None
        timeline.append((op.invoke.time, 1, op))
        timeline.append((op.completion.time, 0, op))
    timeline.sort(key=lambda item: (item[0], item[1]))
    floor: dict[TopicPartition, tuple[int, Op]] = {}
    floor_at_invoke: dict[int, dict[TopicPartition, tuple[int, Op]]] = {}
    for _, kind, op in timeline:
        if kind == 1:
            floor_at_invoke[id(op)] = dict(floor)
            continue
        for tp, hw in _watermarks(op).items():
            before = floor_at_invoke[id(op)].get(tp)
            if before is not None and hw < before[0]:
                result.add(
                    "hw_backward",
                    {
                        "partition": tp[1],
                        "high_watermark": hw,
                        "process": op.process,
                        "time": op.invoke.time,
                        "earlier": before[0],
                        "earlier_process": before[1].process,
                    },
                )
            if tp not in floor or hw > floor[tp][0]:
                floor[tp] = (hw, op)
