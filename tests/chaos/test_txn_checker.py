"""The transactional checker on hand-written histories: each anomaly is found, a valid history
is valid, and (hypothesis) any history the log could produce by applying whole transactions in
order is valid, while dropping, duplicating or moving one record of it is caught."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from raftlog.chaos.checker import check
from raftlog.chaos.history import Event, Op, pair_operations

TOPICS = ("a", "b")


class _History:
    """Builds a history: transactions of producer processes, then reads."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._time = itertools.count()
        self._next_txn: dict[int, int] = {}

    def _event(self, process: int | str, type_: Any, f: str, value: Any) -> None:
        self.events.append(Event(process, type_, f, value, next(self._time)))

    def txn(self, process: int, writes: list[tuple[str, int]], outcome: str) -> list[str]:
        """One transaction of `process` writing to (topic, partition) in order; `outcome` ok, fail,
        info or None (never completed). Returns the values it wrote."""
        number = self._next_txn.get(process, 0)
        self._next_txn[process] = number + 1
        rows = [{"topic": t, "partition": p, "value": f"{process}-{number}-{i}"}
                for i, (t, p) in enumerate(writes)]  # fmt: skip
        value = {"txn": number, "intent": "commit", "flush": True, "writes": rows}
        self._event(process, "invoke", "txn", value)
        if outcome is not None:
            self._event(process, outcome, "txn", value)
        return [r["value"] for r in rows]

    def read(
        self, process: int | str, records: list[tuple[str, int, int, str]], **extra: Any
    ) -> None:
        rows = [{"topic": t, "partition": p, "offset": o, "value": v} for t, p, o, v in records]
        self._event(process, "invoke", "txn_read", {})
        self._event(process, "ok", "txn_read", {"records": rows, **extra})

    def ops(self) -> list[Op]:
        return list(pair_operations(self.events))


def _log(history: _History, values_by_tp: dict[tuple[str, int], list[str]]) -> list[Any]:
    return [(t, p, offset, v) for (t, p), values in values_by_tp.items()
            for offset, v in enumerate(values)]  # fmt: skip


def _counts(history: _History) -> dict[str, int]:
    result = check(history.ops())
    assert not result.unchecked, result.unchecked
    return {name: n for name, n in result.counts.items() if n}


def test_a_valid_history_is_valid() -> None:
    h = _History()
    t0 = h.txn(0, [("a", 0), ("b", 1)], "ok")
    h.txn(0, [("a", 0)], "fail")
    t2 = h.txn(1, [("a", 0), ("a", 1)], "info")  # indefinite: all visible
    h.txn(1, [("b", 0)], "info")  # indefinite: none visible
    t4 = h.txn(0, [("a", 0), ("b", 1)], "ok")
    log = {("a", 0): [t0[0], t2[0], t4[0]], ("a", 1): [t2[1]], ("b", 1): [t0[1], t4[1]]}
    h.read(3, _log(h, log)[:2])
    h.read("final", _log(h, log), unfinished=[])
    assert _counts(h) == {}


def test_an_aborted_read_is_found() -> None:
    h = _History()
    aborted = h.txn(0, [("a", 0)], "fail")
    h.read(3, [("a", 0, 0, aborted[0])])
    h.read("final", [], unfinished=[])
    assert _counts(h) == {"aborted_read": 1}


def test_a_lost_committed_write_is_found_and_the_torn_transaction_with_it() -> None:
    h = _History()
    committed = h.txn(0, [("a", 0), ("b", 0)], "ok")
    h.read("final", [("a", 0, 0, committed[0])], unfinished=[])
    assert _counts(h) == {"lost_committed": 1, "torn_txn": 1}


def test_a_committed_transaction_missing_entirely_is_lost_but_not_torn() -> None:
    h = _History()
    h.txn(0, [("a", 0), ("b", 0)], "ok")
    h.read("final", [], unfinished=[])
    assert _counts(h) == {"lost_committed": 2}


def test_an_indefinite_transaction_must_still_be_all_or_nothing() -> None:
    h = _History()
    values = h.txn(0, [("a", 0), ("a", 1), ("b", 2)], "info")
    h.read("final", [("a", 1, 0, values[1])], unfinished=[])
    assert _counts(h) == {"torn_txn": 1}


def test_a_transaction_never_completed_counts_as_indefinite() -> None:
    h = _History()
    values = h.txn(0, [("a", 0), ("b", 0)], None)
    h.read("final", [("a", 0, 0, values[0]), ("b", 0, 0, values[1])], unfinished=[])
    assert _counts(h) == {}


def test_a_duplicate_in_the_final_read_and_in_one_reader_is_found() -> None:
    h = _History()
    values = h.txn(0, [("a", 0)], "ok")
    h.read(3, [("a", 0, 0, values[0]), ("a", 0, 1, values[0])])
    h.read("final", [("a", 0, 0, values[0]), ("a", 0, 1, values[0])], unfinished=[])
    assert _counts(h) == {"duplicate": 2}


def test_a_later_transaction_before_an_earlier_one_in_a_partition_is_out_of_order() -> None:
    h = _History()
    first = h.txn(0, [("a", 0)], "ok")
    second = h.txn(0, [("a", 0)], "ok")
    h.read("final", [("a", 0, 0, second[0]), ("a", 0, 1, first[0])], unfinished=[])
    assert _counts(h) == {"txn_order": 1}


def test_records_within_a_transaction_out_of_produce_order_are_out_of_order() -> None:
    h = _History()
    values = h.txn(0, [("a", 0), ("a", 0)], "ok")
    h.read("final", [("a", 0, 0, values[1]), ("a", 0, 1, values[0])], unfinished=[])
    assert _counts(h) == {"txn_order": 1}


def test_different_producers_interleave_freely() -> None:
    h = _History()
    p0 = h.txn(0, [("a", 0)], "ok")
    p1 = h.txn(1, [("a", 0)], "ok")
    h.read("final", [("a", 0, 0, p1[0]), ("a", 0, 1, p0[0])], unfinished=[])
    assert _counts(h) == {}


def test_a_phantom_value_is_found() -> None:
    h = _History()
    h.read("final", [("a", 0, 0, "9-9-9")], unfinished=[])
    assert _counts(h) == {"phantom_read": 1}


def test_a_partition_the_final_read_did_not_finish_is_unchecked() -> None:
    h = _History()
    h.txn(0, [("a", 0)], "ok")
    h.read("final", [], unfinished=[["a", 0]])
    result = check(h.ops())
    assert result.unchecked == ["txn: final read did not reach the end of a/0"]
    assert result.counts["lost_committed"] == 1


def test_without_a_final_read_nothing_is_judged_and_the_run_is_unchecked() -> None:
    h = _History()
    h.txn(0, [("a", 0)], "ok")
    assert check(h.ops()).unchecked == ["txn: no final read"]


_WRITES = st.lists(st.tuples(st.sampled_from(TOPICS), st.integers(0, 1)), min_size=1, max_size=4)
_TXNS = st.lists(
    st.tuples(st.integers(0, 2), _WRITES, st.sampled_from(["ok", "fail", "info"]), st.booleans()),
    min_size=1,
    max_size=12,
)


def _apply(h: _History, txns: list[tuple[int, Any, str, bool]]) -> dict[tuple[str, int], list[str]]:
    """Run the transactions in order; the log holds every record of each committed one, and of
    each indefinite one whose flag says it took effect."""
    log: dict[tuple[str, int], list[str]] = {}
    for process, writes, outcome, took_effect in txns:
        values = h.txn(process, writes, outcome)
        if outcome == "ok" or (outcome == "info" and took_effect):
            for (t, p), v in zip(writes, values, strict=True):
                log.setdefault((t, p), []).append(v)
    return log


def _values(op: Op) -> list[str]:
    return [w["value"] for w in op.invoke.value["writes"]]


@given(_TXNS)
def test_whole_transactions_applied_in_order_are_valid(txns: list[Any]) -> None:
    h = _History()
    log = _apply(h, txns)
    h.read("final", _log(h, log), unfinished=[])
    assert _counts(h) == {}


@given(_TXNS, st.sampled_from(["drop", "duplicate", "swap"]), st.randoms(use_true_random=False))
def test_one_record_dropped_duplicated_or_swapped_is_caught(
    txns: list[Any], damage: str, rng: Any
) -> None:
    h = _History()
    log = _apply(h, txns)
    records = _log(h, log)
    # A lone record of an indefinite transaction may be dropped: it just did not take effect.
    committed = {v for op in h.ops() if op.type == "ok" for v in _values(op)}
    candidates = [i for i, r in enumerate(records) if damage != "drop" or r[3] in committed]
    if not candidates:
        return
    index = rng.choice(candidates)
    t, p, offset, value = records[index]
    if damage == "drop":
        del records[index]
    elif damage == "duplicate":
        records.append((t, p, len(log[(t, p)]), value))
    else:
        same = [i for i, r in enumerate(records) if r[:2] == (t, p) and r[3] != value]
        mates = [i for i in same if records[i][3].split("-")[0] == value.split("-")[0]]
        if not mates:
            return
        other = rng.choice(mates)
        records[index] = (t, p, offset, records[other][3])
        records[other] = (t, p, records[other][2], value)
    h.read("final", records, unfinished=[])
    assert _counts(h), (damage, records)
