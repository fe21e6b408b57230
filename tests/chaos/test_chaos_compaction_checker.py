"""The keyed checker (raftlog.chaos.compaction_checker) is trusted only after it reports each
planted anomaly in a hand-made history of a compacted partition, and passes the valid ones:
superseded values gone, a later send of unknown outcome landing after the last acknowledged
one."""

from __future__ import annotations

from typing import Any

from raftlog.chaos.checker import check
from raftlog.chaos.history import Event, Op, pair_operations

T = "chaos"


class Keyed:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.time = 0

    def event(self, process: int | str, type_: Any, f: str, value: Any) -> None:
        self.time += 10
        self.events.append(Event(process, type_, f, value, self.time))

    def send(self, key: str, value: str, result: str, offset: int = -1) -> None:
        invoke = {"topic": T, "partition": 0, "value": value, "key": key}
        self.event(0, "invoke", "send", invoke)
        if result != "none":
            done = {**invoke, "offset": offset} if result == "ok" else {**invoke, "error": "x"}
            self.event(0, result, "send", done)

    def final(self, records: list[tuple[int, str, str]]) -> list[Op]:
        self.event("final", "invoke", "final_read", {"topic": T, "partition": 0})
        rows = [{"topic": T, "partition": 0, "offset": o, "key": k, "value": v}
                for o, k, v in records]  # fmt: skip
        value = {"topic": T, "partition": 0, "records": rows, "end_offset": 10}
        self.event("final", "ok", "final_read", value)
        return list(pair_operations(self.events))


def history() -> Keyed:
    h = Keyed()
    h.send("a", "0-1", "ok", 1)
    h.send("b", "0-2", "ok", 2)
    h.send("a", "0-3", "ok", 3)
    h.send("a", "0-4", "fail")
    return h


def found(ops: list[Op]) -> set[str]:
    result = check(ops, compacted=True)
    return {name for name, count in result.counts.items() if count}


def test_a_compacted_final_read_with_only_the_latest_values_is_valid() -> None:
    assert found(history().final([(2, "b", "0-2"), (3, "a", "0-3")])) == set()
    assert found(history().final([(1, "a", "0-1"), (2, "b", "0-2"), (3, "a", "0-3")])) == set()


def test_an_unknown_send_landing_after_the_latest_is_allowed() -> None:
    h = history()
    h.send("a", "0-5", "info")
    h.send("b", "0-6", "none")
    assert found(h.final([(3, "a", "0-3"), (5, "a", "0-5"), (6, "b", "0-6")])) == set()


def test_a_lost_latest_value_is_caught() -> None:
    assert found(history().final([(1, "a", "0-1"), (2, "b", "0-2")])) == {"lost_latest"}
    assert found(history().final([(3, "a", "0-3")])) == {"lost_latest"}  # b vanished


def test_a_failed_send_standing_as_the_latest_is_caught() -> None:
    ops = history().final([(2, "b", "0-2"), (3, "a", "0-3"), (4, "a", "0-4")])
    assert found(ops) == {"lost_latest", "failed_read"}


def test_a_value_reappearing_after_a_later_acknowledged_one_is_caught() -> None:
    ops = history().final([(2, "b", "0-2"), (3, "a", "0-3"), (4, "a", "0-1")])
    assert "value_reappears" in found(ops)


def test_the_unkeyed_checks_would_call_compaction_a_loss() -> None:
    ops = history().final([(2, "b", "0-2"), (3, "a", "0-3")])
    assert check(ops).counts["lost"] == 1
