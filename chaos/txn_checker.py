"""The transactional checks: what Jepsen's Kafka checker asks of transactions, over a history.

Theory of operation. In `--workload txn` (raftlog.chaos.txn_workload) each producer process
runs one transaction at a time; a transaction is one operation `txn` whose invoke lists its
writes (topic, partition, value, each value unique in the run, in the order produced) and
whose completion is what the client learned:

    ok     committed (commit_transaction returned)
    fail   aborted (the generator chose to abort, or the client aborted after an error)
    info   indefinite (the client could not tell; also a transaction the run cut short)

Readers record `txn_read` operations (isolation.level=read_committed) whose records carry
topic, partition, offset and value; the one of process "final", after the heal, read every
partition from offset 0 up to its end. Anomalies:

    aborted_read     a record of an aborted transaction was read (by any reader)
    lost_committed   a committed transaction's record is not in the final read
    torn_txn         a transaction of which the final read holds some records but not all
                     (whatever its outcome: all or nothing is required of an indefinite one too)
    duplicate        one value read at two offsets (by the final read), or twice by one reader
    txn_order        one producer's records in one partition in another order than it wrote
                     them (a later transaction's record before an earlier one's, or within a
                     transaction out of produce order)
    phantom_read     a value read that no transaction wrote

A partition the final read could not finish is counted in `unchecked`: a read_committed read
stops at the last stable offset, so a transaction left open (hanging) shows as the records
behind it being lost, and that partition is named there too.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raftlog.chaos.history import Op

if TYPE_CHECKING:
    from raftlog.chaos.checker import CheckResult

__all__ = ["FINAL", "TXN_ANOMALIES", "TxnWrite", "check_transactions"]

TXN_ANOMALIES = ("aborted_read", "lost_committed", "torn_txn", "txn_order")
FINAL = "final"
TopicPartition = tuple[str, int]
OUTCOMES = {"ok": "committed", "fail": "aborted", "info": "indefinite"}


@dataclass(frozen=True, slots=True)
class TxnWrite:
    """One record a transaction wrote: the producer, the transaction's number within the
    producer (its order), the record's position within the transaction, where it went."""

    process: int | str
    txn: int
    index: int
    tp: TopicPartition
    value: str


@dataclass(frozen=True, slots=True)
class _Read:
    process: int | str
    tp: TopicPartition
    offset: int
    value: str


def _writes(txns: Sequence[Op]) -> dict[str, TxnWrite]:
    found: dict[str, TxnWrite] = {}
    for op in txns:
        invoke = op.invoke.value
        for index, w in enumerate(invoke["writes"]):
            value = str(w["value"])
            assert value not in found, f"value {value} written twice by the workload"
            tp = (w["topic"], int(w["partition"]))
            found[value] = TxnWrite(op.process, int(invoke["txn"]), index, tp, value)
    return found


def _reads(ops: Iterable[Op]) -> list[_Read]:
    return [
        _Read(op.process, (r["topic"], int(r["partition"])), int(r["offset"]), str(r["value"]))
        for op in ops
        if op.f == "txn_read" and op.type == "ok"
        for r in op.value.get("records", [])
    ]


def check_transactions(ops: Iterable[Op], result: CheckResult) -> None:
    """Add to `result` every anomaly of TXN_ANOMALIES (and duplicate, phantom_read) that the `txn`
    and `txn_read` operations of `ops` show; partitions the final read did not finish go to
    `result.unchecked`."""
    ops = list(ops)
    txns = [op for op in ops if op.f == "txn"]
    outcome = {(op.process, int(op.invoke.value["txn"])): OUTCOMES[op.type] for op in txns}
    writes = _writes(txns)
    reads = _reads(ops)
    finals = [op for op in ops if op.f == "txn_read" and op.process == FINAL]
    if not any(op.type == "ok" for op in finals):
        result.unchecked.append("txn: no final read")
        return
    final_ops = [op for op in finals if op.type == "ok"]
    unfinished = sorted({tuple(tp) for op in final_ops for tp in op.value.get("unfinished", [])})
    result.unchecked.extend(
        f"txn: final read did not reach the end of {t}/{p}" for t, p in unfinished
    )
    final = [r for r in reads if r.process == FINAL]
    _check_reads(reads, writes, outcome, result)
    _check_final(final, writes, outcome, result)
    _check_order(final, writes, result)


def _check_reads(
    reads: Sequence[_Read],
    writes: dict[str, TxnWrite],
    outcome: dict[tuple[int | str, int], str],
    result: CheckResult,
) -> None:
    seen: dict[tuple[int | str, str], _Read] = {}
    for read in reads:
        write = writes.get(read.value)
        if write is None:
            result.add("phantom_read", {"value": read.value, "read": _describe(read)})
            continue
        if outcome[(write.process, write.txn)] == "aborted":
            result.add(
                "aborted_read", {"value": read.value, "txn": _txn(write), "read": _describe(read)}
            )
        earlier = seen.setdefault((read.process, read.value), read)
        if earlier is not read and read.process != FINAL and earlier.offset != read.offset:
            result.add(
                "duplicate", {"value": read.value, "reads": [_describe(earlier), _describe(read)]}
            )


def _check_final(
    final: Sequence[_Read],
    writes: dict[str, TxnWrite],
    outcome: dict[tuple[int | str, int], str],
    result: CheckResult,
) -> None:
    offsets: dict[str, set[int]] = defaultdict(set)
    for read in final:
        offsets[read.value].add(read.offset)
    for value, found in offsets.items():
        if len(found) > 1:
            result.add("duplicate", {"value": value, "offsets": sorted(found)})
    by_txn: dict[tuple[int | str, int], list[TxnWrite]] = defaultdict(list)
    for write in writes.values():
        by_txn[(write.process, write.txn)].append(write)
    for key, txn_writes in sorted(by_txn.items(), key=lambda kv: str(kv[0])):
        visible = [w.value for w in txn_writes if w.value in offsets]
        missing = [w.value for w in txn_writes if w.value not in offsets]
        example = {
            "txn": _txn(txn_writes[0]),
            "outcome": outcome[key],
            "visible": visible,
            "missing": missing,
        }
        if visible and missing:
            result.add("torn_txn", example)
        if outcome[key] == "committed":
            for value in missing:
                result.add("lost_committed", {"value": value, **example})


def _check_order(final: Sequence[_Read], writes: dict[str, TxnWrite], result: CheckResult) -> None:
    """Per producer and partition, walking the final read in offset order, the (transaction,
    index) of each record must increase."""
    last: dict[tuple[int | str, TopicPartition], tuple[TxnWrite, int]] = {}
    for read in sorted(final, key=lambda r: (r.tp, r.offset)):
        write = writes.get(read.value)
        if write is None:
            continue
        key = (write.process, read.tp)
        before = last.get(key)
        if before is not None and (before[0].txn, before[0].index) > (write.txn, write.index):
            example: dict[str, Any] = {
                "process": write.process,
                "topic": read.tp[0],
                "partition": read.tp[1],
            }
            example["earlier"] = {"offset": before[1], "value": before[0].value}
            example["later"] = {"offset": read.offset, "value": write.value}
            result.add("txn_order", example)
        if before is None or (before[0].txn, before[0].index) < (write.txn, write.index):
            last[key] = (write, read.offset)


def _txn(write: TxnWrite) -> str:
    return f"{write.process}/{write.txn}"


def _describe(read: _Read) -> dict[str, Any]:
    return {
        "process": read.process,
        "topic": read.tp[0],
        "partition": read.tp[1],
        "offset": read.offset,
    }
