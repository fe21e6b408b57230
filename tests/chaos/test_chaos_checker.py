"""The chaos checker is trusted only after it reports each planted anomaly in a hand-made history.

Each test starts from one valid history (two producers, a consumer, a watermark reader and a
final read), checks that it passes, then plants exactly one anomaly and expects exactly that
anomaly name to be reported (some anomalies imply others; those are listed explicitly).
"""

from __future__ import annotations

from typing import Any

import pytest

from raftlog.chaos.checker import ANOMALIES, check
from raftlog.chaos.compaction_checker import COMPACTION_ANOMALIES
from raftlog.chaos.consumer_group_checker import GROUP_ANOMALIES
from raftlog.chaos.history import Event, Op, pair_operations
from raftlog.chaos.txn_checker import TXN_ANOMALIES

T = "chaos"


class Builder:
    """Appends events with increasing times; `op` appends an invoke and its completion."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.time = 0

    def event(self, process: int | str, type_: Any, f: str, value: Any) -> None:
        self.time += 10
        self.events.append(Event(process, type_, f, value, self.time))

    def send(self, process: int, value: str, partition: int, result: str, offset: int = -1) -> None:
        invoke = {"topic": T, "partition": partition, "value": value}
        self.event(process, "invoke", "send", invoke)
        done = {**invoke, "offset": offset} if result == "ok" else {**invoke, "error": "x"}
        self.event(process, result, "send", done)

    def poll(self, process: int, records: list[tuple[int, int, str]]) -> None:
        self.event(process, "invoke", "poll", None)
        rows = [{"topic": T, "partition": p, "offset": o, "value": v} for p, o, v in records]
        self.event(process, "ok", "poll", {"records": rows})

    def watermarks(self, process: int, hws: dict[int, int]) -> None:
        self.event(process, "invoke", "watermarks", {"topic": T})
        value = {"topic": T, "high_watermarks": {str(p): hw for p, hw in hws.items()}}
        self.event(process, "ok", "watermarks", value)

    def final(self, partition: int, records: list[tuple[int, str]], end_offset: int) -> None:
        self.event("final", "invoke", "final_read", {"topic": T, "partition": partition})
        rows = [{"topic": T, "partition": partition, "offset": o, "value": v} for o, v in records]
        value = {"topic": T, "partition": partition, "records": rows, "end_offset": end_offset}
        self.event("final", "ok", "final_read", value)

    def ops(self) -> list[Op]:
        return list(pair_operations(self.events))


def valid_history(plant: str | None = None) -> Builder:
    """Partition 0 holds a no-op at 0 then 0-1, 0-2, 1-1 at 1..3; partition 1 holds 1-2 at 2."""
    b = Builder()
    b.send(0, "0-1", 0, "ok", 1)
    b.send(1, "1-1", 0, "info") if plant != "lost" else b.send(1, "1-1", 0, "ok", 3)
    b.send(0, "0-2", 0, "ok", 2 if plant != "send_reorder" else 0)
    b.send(1, "1-2", 1, "ok", 2)
    b.send(1, "1-3", 1, "fail")
    b.watermarks(3, {0: 3, 1: 3})
    polled = [(0, 1, "0-1"), (0, 2, "0-2"), (1, 2, "1-2")]
    if plant == "phantom_read":
        polled.append((1, 3, "never-sent"))
    if plant == "failed_read":
        polled.append((1, 3, "1-3"))
    if plant == "poll_backward":
        polled.append((0, 2, "0-2"))
    if plant == "poll_skip":
        polled = [(0, 2, "0-2"), (1, 2, "1-2")]
    if plant == "read_then_gone":
        polled.append((1, 3, "1-1"))
    b.poll(2, polled)
    b.watermarks(3, {0: 4, 1: 3} if plant != "hw_backward" else {0: 2, 1: 3})
    p0 = [(1, "0-1"), (2, "0-2")]
    if plant == "duplicate":
        p0.append((3, "0-1"))
    elif plant == "inconsistent_offset":
        p0 = [(1, "1-1"), (2, "0-2"), (3, "0-1")]
    elif plant != "lost" and plant != "read_then_gone":
        p0.append((3, "1-1"))
    b.final(0, p0, 4)
    b.final(1, [(2, "1-2")], 3)
    return b


def test_the_valid_history_passes() -> None:
    result = check(valid_history().ops())
    assert result.valid, result.anomalies
    assert result.unchecked == []


# Anomalies a plant also causes: an inconsistent offset moves a value, so it is a duplicate
# too; a send acked at an earlier offset than the one before it contradicts the final read.
ALSO = {
    "inconsistent_offset": {"duplicate"},
    "send_reorder": {"inconsistent_offset", "duplicate"},
    "lost": set(),
}


# The group, keyed and transactional anomalies have their own planted histories
# (test_chaos_group_checker.py, test_chaos_compaction_checker.py, test_txn_checker.py).
@pytest.mark.parametrize(
    "anomaly",
    [a for a in ANOMALIES if a not in GROUP_ANOMALIES + COMPACTION_ANOMALIES + TXN_ANOMALIES],
)
def test_each_planted_anomaly_is_reported(anomaly: str) -> None:
    result = check(valid_history(plant=anomaly).ops())
    reported = {name for name, count in result.counts.items() if count}
    assert anomaly in reported, result.counts
    assert reported <= {anomaly} | ALSO.get(anomaly, set()), result.counts
    assert not result.valid
    assert result.anomalies[anomaly], "each anomaly comes with an example"


def test_an_unknown_send_is_not_held_against_the_system() -> None:
    # "1-1" is info in the valid history: present in the final read, and that is fine; absent
    # would be fine too.
    b = valid_history()
    b.events = [e for e in b.events if not (e.f == "final_read" and e.value.get("partition") == 0)]
    b.final(0, [(1, "0-1"), (2, "0-2")], 4)
    assert check(b.ops()).valid


def test_a_partition_without_final_read_is_unchecked_not_passed() -> None:
    b = valid_history()
    b.events = [e for e in b.events if e.f != "final_read" or e.value.get("partition") != 1]
    result = check(b.ops())
    assert result.unchecked == [f"lost: no final read of {T}/1"]


def test_a_send_without_completion_counts_as_unknown() -> None:
    b = valid_history()
    b.event(4, "invoke", "send", {"topic": T, "partition": 0, "value": "4-1"})
    ops = b.ops()
    assert ops[-1].type == "info"
    assert check(ops).valid


def test_examples_are_bounded_but_counts_are_not() -> None:
    b = valid_history()
    for n in range(5):
        b.send(5, f"5-{n}", 1, "ok", 10 + n)  # acked, never in the final read
    result = check(b.ops(), examples_max=2)
    assert result.counts["lost"] == 5
    assert len(result.anomalies["lost"]) == 2
