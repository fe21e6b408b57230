"""The transactional Producer's client-side state (raftlog.client._transactions) against a
recording coordinator: the order of calls a transaction makes, CONCURRENT_TRANSACTIONS
retried, misuse refused with a clear error, and PRODUCER_FENCED final."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest

from raftlog.client._transactions import ConsumerGroupMetadata, TransactionManager
from raftlog.client.errors import ClientError, ProducerFencedError, ServerError, TransactionError
from raftlog.rpc.v1 import raftlog_pb2 as pb


class Coordinator:
    """Answers every call; `refusals` are raised first, one per call, in order."""

    def __init__(self, *refusals: str) -> None:
        self.calls: list[str] = []
        self.refusals = list(refusals)

    def __call__(self, rpc: str, request: Any, concerning: str) -> Any:
        self.calls.append(rpc)
        if self.refusals:
            code = self.refusals.pop(0)
            error = pb.Error(code=pb.ErrorCode.Value(code), message="refused")
            cls = ProducerFencedError if code == "PRODUCER_FENCED" else ServerError
            raise cls(code, error.message, concerning=concerning)
        return pb.InitProducerIdResponse(producer_id=7, producer_epoch=2)


def _manager(coordinator: Coordinator) -> TransactionManager:
    return TransactionManager(
        transactional_id="tx", transaction_timeout_ms=1000, call_controller=coordinator,
        request_timeout_ms=1000, retry_backoff_ms=1, sleep=lambda s: None,
    )  # fmt: skip


def test_a_transaction_adds_each_partition_once_then_ends() -> None:
    coordinator = Coordinator("CONCURRENT_TRANSACTIONS")
    txn = _manager(coordinator)
    assert txn.init() == (7, 2)
    txn.begin()
    txn.before_append("t", 0)
    txn.before_append("t", 0)
    txn.before_append("t", 1)
    txn.send_offsets({("in", 0): 3}, "g")
    txn.end(commit=True, flush=lambda: None)
    assert coordinator.calls == [
        "Log.InitProducerId",  # CONCURRENT_TRANSACTIONS, retried
        "Log.InitProducerId",
        "Log.AddPartitionsToTxn",
        "Log.AddPartitionsToTxn",
        "Log.AddOffsetsToTxn",
        "Log.TxnOffsetCommit",
        "Log.EndTxn",
    ]


def test_misuse_is_refused_and_a_failed_record_blocks_the_commit() -> None:
    txn = _manager(Coordinator())
    with pytest.raises(ClientError, match="init_transactions"):
        txn.begin()
    txn.init()
    with pytest.raises(ClientError, match="outside a transaction"):
        txn.before_append("t", 0)
    txn.begin()
    with pytest.raises(ClientError, match="while in transaction"):
        txn.begin()
    failed: Future[Any] = Future()
    failed.set_exception(ClientError("delivery failed"))
    txn.track(failed)
    with pytest.raises(TransactionError, match="abort it"):
        txn.end(commit=True, flush=lambda: None)
    txn.end(commit=False, flush=lambda: None)  # the abort goes through
    txn.begin()


def test_fenced_is_final() -> None:
    txn = _manager(Coordinator())
    txn.init()
    txn.begin()
    txn._call_controller = Coordinator("PRODUCER_FENCED")
    with pytest.raises(ProducerFencedError):
        txn.before_append("t", 0)
    with pytest.raises(ProducerFencedError):
        txn.begin()


def test_each_end_adopts_the_bumped_epoch_and_offsets_carry_the_member() -> None:
    """EndTxn answers the epoch the coordinator bumped to (KIP-890 part 2): the next
    transaction's calls carry it and the producer is told to renumber; a consumer's group
    metadata travels in TxnOffsetCommit (KIP-447), a bare group id as a non-member."""
    requests: list[Any] = []
    epochs = iter([2, 3, 4])

    def coordinator(rpc: str, request: Any, concerning: str) -> Any:
        requests.append(request)
        epoch = next(epochs) if rpc in ("Log.InitProducerId", "Log.EndTxn") else -1
        return pb.InitProducerIdResponse(producer_id=7, producer_epoch=epoch)

    txn = _manager(coordinator)
    renumbered: list[tuple[int, int]] = []
    assert txn.init() == (7, 2)
    for member in (ConsumerGroupMetadata("g", "m-1", 5), "g"):
        txn.begin()
        txn.send_offsets({("in", 0): 3}, member)
        txn.end(commit=True, flush=lambda: None, renumber=lambda *p: renumbered.append(p))
    assert renumbered == [(7, 3), (7, 4)]
    commits = [r for r in requests if isinstance(r, pb.TxnOffsetCommitRequest)]
    assert [(c.producer_epoch, c.member_id, c.member_epoch) for c in commits] == [
        (2, "m-1", 5),
        (3, "", -1),
    ]
    ends = [r for r in requests if isinstance(r, pb.EndTxnRequest)]
    assert [e.producer_epoch for e in ends] == [2, 3]
