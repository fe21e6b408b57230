"""The transaction coordinator's replicated state: Kafka's transition table through the
transaction commands, the producer id and epoch checks with Kafka's codes (a rejection leaves
the state untouched), KIP-890's epoch bump at the end of a transaction, pending transactional
offsets that become committed offsets only with a commit, `partition_in_transaction`, and
snapshots."""

from __future__ import annotations

from dataclasses import replace

import pytest

from raftlog.metadata.commands import (
    AddToTransaction,
    AllocateProducerIds,
    CommitTransactionOffsets,
    CompleteEndTransaction,
    DeleteTopic,
    ErrorCode,
    ExpireTransactionalId,
    InitTransaction,
    PrepareEndTransaction,
    decode_command,
    encode_command,
)
from raftlog.metadata.state import MetadataState
from raftlog.metadata.transaction_plans import (
    Answer,
    InitPlan,
    needs_new_producer_id,
    plan_init,
)
from raftlog.metadata.transactions import (
    NO_PRODUCER_EPOCH,
    PRODUCER_EPOCH_MAX,
    TxnState,
    partition_in_transaction,
)
from raftlog.types import PartitionId
from tests.unit.metadata.test_metadata_state import Log, content, create, register

TID = "tx-1"


@pytest.fixture
def log() -> Log:
    log = Log()
    log.ok(register(1), register(2), register(3), create("orders"), AllocateProducerIds(100))
    return log


def init(
    pid: int = 7, epoch: int = 0, timeout_ms: int = 60_000, now_ms: int = 0
) -> InitTransaction:
    return InitTransaction(TID, pid, epoch, timeout_ms, now_ms)


def add(
    *partitions: int, pid: int = 7, epoch: int = 0, groups: tuple[str, ...] = (), now_ms: int = 5
) -> AddToTransaction:
    return AddToTransaction(
        TID, pid, epoch, tuple(("orders", PartitionId(p)) for p in partitions), groups, now_ms
    )


def end(commit: bool, *, pid: int = 7, epoch: int = 0, bump: bool = False) -> PrepareEndTransaction:
    return PrepareEndTransaction(TID, pid, epoch, commit, bump, 9)


def test_a_transaction_goes_through_kafkas_states(log: Log) -> None:
    log.ok(init())
    txn = log.state.transaction(TID)
    assert txn is not None and txn.state is TxnState.EMPTY
    assert (txn.producer_id, txn.producer_epoch, txn.last_producer_epoch) == (7, 0, -1)
    log.ok(add(0, 1))
    assert partition_in_transaction(log.state, 7, 0, "orders", 1)
    assert not partition_in_transaction(log.state, 7, 0, "orders", 2)
    assert not partition_in_transaction(log.state, 7, 1, "orders", 1)
    log.ok(add(2, now_ms=8))
    txn = log.state.transaction(TID)
    assert txn is not None and txn.state is TxnState.ONGOING and txn.started_ms == 5
    assert txn.partitions == {("orders", 0), ("orders", 1), ("orders", 2)}
    log.ok(end(True))
    assert not partition_in_transaction(log.state, 7, 0, "orders", 1)
    log.ok(CompleteEndTransaction(TID, 7, 0, 10))
    txn = log.state.transaction(TID)
    assert txn is not None and txn.state is TxnState.COMPLETE_COMMIT and not txn.partitions


def test_producer_id_and_epoch_are_checked_with_kafkas_codes(log: Log) -> None:
    log.rejected(add(0), ErrorCode.INVALID_PRODUCER_ID_MAPPING, "no producer id")
    log.ok(init(), init(epoch=1))
    log.rejected(add(0, pid=8, epoch=1), ErrorCode.INVALID_PRODUCER_ID_MAPPING)
    log.rejected(add(0, epoch=0), ErrorCode.PRODUCER_FENCED)
    log.rejected(add(0, epoch=2), ErrorCode.INVALID_PRODUCER_EPOCH)
    log.rejected(end(True, epoch=1), ErrorCode.INVALID_TXN_STATE, "Empty")
    log.ok(add(0, epoch=1), end(False, epoch=1))
    log.rejected(add(1, epoch=1), ErrorCode.CONCURRENT_TRANSACTIONS, "PrepareAbort")
    log.rejected(end(False, epoch=1), ErrorCode.CONCURRENT_TRANSACTIONS)
    log.rejected(init(epoch=2), ErrorCode.CONCURRENT_TRANSACTIONS)
    log.rejected(add(9, epoch=1), ErrorCode.UNKNOWN_PARTITION)


def test_init_needs_a_successor_of_the_producer(log: Log) -> None:
    log.rejected(init(pid=500), ErrorCode.CONCURRENT_TRANSACTIONS, "stale plan")  # not allocated
    log.rejected(init(epoch=1), ErrorCode.CONCURRENT_TRANSACTIONS)
    log.rejected(init(timeout_ms=0), ErrorCode.INVALID_TRANSACTION_TIMEOUT)
    log.ok(init())
    log.rejected(init(), ErrorCode.CONCURRENT_TRANSACTIONS)  # the same epoch again
    log.rejected(InitTransaction("other", 7, 0, 1000, 0), ErrorCode.CONCURRENT_TRANSACTIONS)
    log.ok(init(pid=8))  # rotation: a new producer id at epoch 0
    txn = log.state.transaction(TID)
    assert txn is not None and txn.last_producer_epoch == NO_PRODUCER_EPOCH
    assert log.state.transaction_of_producer(7) is None
    assert log.state.transaction_of_producer(8) == txn


def test_end_txn_v5_bumps_the_epoch_so_a_late_request_is_fenced(log: Log) -> None:
    log.ok(init(), add(0), end(True, bump=True))
    txn = log.state.transaction(TID)
    assert txn is not None and (txn.producer_epoch, txn.last_producer_epoch) == (1, 0)
    log.rejected(CompleteEndTransaction(TID, 7, 0, 10), ErrorCode.PRODUCER_FENCED)
    log.ok(CompleteEndTransaction(TID, 7, 1, 10))
    log.rejected(add(0, epoch=0), ErrorCode.PRODUCER_FENCED)  # the ended transaction's epoch
    log.ok(add(0, epoch=1))
    assert partition_in_transaction(log.state, 7, 1, "orders", 0)


def test_transactional_offsets_wait_for_the_commit(log: Log) -> None:
    offsets = (("orders", PartitionId(0), 42),)
    commit_offsets = CommitTransactionOffsets(TID, 7, 0, "g", offsets)
    log.ok(init(), add(0))
    log.rejected(commit_offsets, ErrorCode.INVALID_TXN_STATE, "not added")
    log.ok(add(groups=("g",)), commit_offsets)
    assert log.state.has_pending_transaction_offsets("g")
    assert log.state.committed_offsets("g") == {}
    log.ok(end(True), CompleteEndTransaction(TID, 7, 0, 10))
    assert log.state.committed_offsets("g") == {("orders", 0): 42}
    assert not log.state.has_pending_transaction_offsets("g")


def test_transactional_offsets_are_dropped_on_abort_and_with_their_topic(log: Log) -> None:
    log.ok(init(), add(0, groups=("g",)))
    log.ok(CommitTransactionOffsets(TID, 7, 0, "g", (("orders", PartitionId(0), 42),)))
    log.ok(end(False), CompleteEndTransaction(TID, 7, 0, 10))
    assert log.state.committed_offsets("g") == {}
    assert not log.state.has_pending_transaction_offsets("g")
    log.ok(add(0, groups=("g",)))
    log.ok(CommitTransactionOffsets(TID, 7, 0, "g", (("orders", PartitionId(1), 1),)))
    log.ok(DeleteTopic("orders"))
    assert not log.state.has_pending_transaction_offsets("g")


def test_snapshot_restores_transactions_and_pending_offsets(log: Log) -> None:
    log.ok(init(), add(0, 2, groups=("g",)))
    log.ok(
        CommitTransactionOffsets(TID, 7, 0, "g", (("orders", PartitionId(0), 42),), (3,), ("m",))
    )
    log.ok(InitTransaction("tx-2", 8, 0, 1000, 0))
    restored = MetadataState.restore(log.state.snapshot())
    assert restored.snapshot() == log.state.snapshot()
    assert content(restored)["transactions"] == content(log.state)["transactions"]
    assert partition_in_transaction(restored, 7, 0, "orders", 2)
    assert restored.transaction_of_producer(8) == log.state.transaction("tx-2")


def test_commands_round_trip_through_their_encoding() -> None:
    for command in (
        init(),
        add(0, 1, groups=("g",)),
        end(True, bump=True),
        CompleteEndTransaction(TID, 7, 0, 10),
        CommitTransactionOffsets(TID, 7, 0, "g", (("orders", PartitionId(0), 42),)),
        ExpireTransactionalId(TID, 1000, 5000),
    ):
        assert decode_command(encode_command(command)) == command


def test_init_plans_follow_kip_360_and_rotate_spent_epochs(log: Log) -> None:
    assert isinstance(plan_init(log.state, TID, 1000, None, 7, 0), InitPlan)
    log.ok(init(), init(epoch=1))
    # A client that is neither the current producer nor the one just before the bump.
    fenced = plan_init(log.state, TID, 1000, (7, 5), None, 0)
    assert fenced == Answer(ErrorCode.PRODUCER_FENCED)
    assert plan_init(log.state, TID, 1000, (8, 1), None, 0) == fenced
    # A retry from epoch 0 whose answer (epoch 1) was lost: answered again, nothing written.
    assert plan_init(log.state, TID, 1000, (7, 0), None, 0) == Answer(ErrorCode.NONE, 7, 1)
    bump = plan_init(log.state, TID, 1000, (7, 1), None, 0)
    assert isinstance(bump, InitPlan) and bump.command == InitTransaction(TID, 7, 2, 1000, 0)
    log.ok(add(0, epoch=1))
    fence = plan_init(log.state, TID, 1000, None, None, 0)
    assert isinstance(fence, InitPlan) and fence.then is ErrorCode.CONCURRENT_TRANSACTIONS
    assert fence.command == PrepareEndTransaction(TID, 7, 1, False, True, 0)


def test_a_spent_epoch_takes_a_new_producer_id(log: Log) -> None:
    log.ok(init())
    txn = log.state.transaction(TID)
    assert txn is not None
    # 32765 bumps, skipped: the table's own effect, as InitTransaction would leave it.
    log.state._transactions.put(replace(txn, producer_epoch=PRODUCER_EPOCH_MAX - 1))
    assert needs_new_producer_id(log.state, TID)
    plan = plan_init(log.state, TID, 1000, None, 9, 0)
    assert isinstance(plan, InitPlan) and plan.command == InitTransaction(TID, 9, 0, 1000, 0)
    log.ok(plan.command)
    assert log.state.transaction_of_producer(9) is not None
    assert log.state.transaction_of_producer(7) is None


def test_an_unused_id_expires_and_starts_afresh(log: Log) -> None:
    week_ms = 7 * 24 * 3600 * 1000
    log.ok(init(now_ms=0), add(0, now_ms=10))
    log.rejected(
        ExpireTransactionalId(TID, week_ms, week_ms + 20), ErrorCode.CONCURRENT_TRANSACTIONS
    )
    log.ok(end(False), CompleteEndTransaction(TID, 7, 0, 100))
    log.rejected(
        ExpireTransactionalId(TID, week_ms, week_ms + 100), ErrorCode.CONCURRENT_TRANSACTIONS
    )
    log.ok(ExpireTransactionalId(TID, week_ms, week_ms + 101))
    assert log.state.transaction(TID) is None and log.state.transaction_of_producer(7) is None
    log.ok(InitTransaction(TID, 8, 0, 1000, week_ms + 200))
