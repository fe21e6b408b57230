"""Transactions on a partition (docs/transactions.md, "Partitions"): transactional batches
checked against the coordinator (KIP-890 part 1, through an injected verifier), COMMIT/ABORT
markers through Raft, the last stable offset and the aborted index, on every replica. Three
real Raft groups over in-memory storage, driven by hand (replica_groups.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from raftlog.errors import (
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    TransactionCoordinatorFencedError,
)
from raftlog.partition.cleaning import aborted_batches
from raftlog.partition.policy import apply_retention
from raftlog.partition.producer_state import AbortedTxn, ProducerStateTable, decode_aborted
from raftlog.partition.replica import OffsetSpec, decode_snapshot_data
from raftlog.raft.types import Membership
from raftlog.storage.batch import parse_header
from raftlog.storage.compaction import clean_batch, latest_record_keeper
from raftlog.storage.records import RecordInput, encode_batch
from raftlog.types import Commitment, Offset
from tests.unit.partition.replica_groups import LEADER, NODES, ReplicaGroups

TIMEOUT_S = 60.0  # never reached: the tests resolve every wait by driving the groups
T = TypeVar("T")


def _batch(producer_id: int, sequence: int, *, epoch: int = 0, transactional: bool = True) -> bytes:
    return encode_batch(
        [RecordInput(None, b"value", 0), RecordInput(None, b"value", 0)],
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
        is_transactional=transactional,
    )


class Coordinator:
    """The verifier a node builds from its metadata copy: which (producer, epoch) have this
    partition in their ongoing transaction."""

    def __init__(self) -> None:
        self.added: set[tuple[int, int]] = set()
        self.asked: list[tuple[int, int]] = []

    async def __call__(self, producer_id: int, epoch: int) -> bool:
        self.asked.append((producer_id, epoch))
        return (producer_id, epoch) in self.added


def _drive(partition: ReplicaGroups, coroutine: Coroutine[Any, Any, T]) -> T:
    async def scenario() -> T:
        task = asyncio.ensure_future(coroutine)
        while not task.done():
            await asyncio.sleep(0)
            partition.settle()
        return task.result()

    return asyncio.run(scenario())


def _produce(partition: ReplicaGroups, batch: bytes) -> int:
    coroutine = partition.leader.produce([batch], commitment=Commitment.QUORUM, timeout_s=TIMEOUT_S)
    return _drive(partition, coroutine).base_offset


def _marker(
    partition: ReplicaGroups,
    producer_id: int,
    *,
    commit: bool,
    epoch: int = 0,
    coordinator_epoch: int = 0,
) -> int:
    coroutine = partition.leader.write_txn_marker(
        producer_id=producer_id,
        producer_epoch=epoch,
        coordinator_epoch=coordinator_epoch,
        commit=commit,
        timestamp_ms=1000,
        timeout_s=TIMEOUT_S,
    )
    return _drive(partition, coroutine)


def test_the_lso_stops_at_the_earliest_open_transaction_on_every_replica() -> None:
    coordinator = Coordinator()
    coordinator.added = {(7, 0), (8, 0)}
    partition = ReplicaGroups(txn_verifier=coordinator)
    plain = _produce(partition, _batch(5, 0, transactional=False))
    first_7 = _produce(partition, _batch(7, 0))
    first_8 = _produce(partition, _batch(8, 0))
    _produce(partition, _batch(7, 2))
    for replica in partition.replicas.values():
        assert replica.raft_last_stable_offset == first_7 > plain
    assert partition.leader.list_offset(OffsetSpec.LATEST, read_committed=True) == first_7
    assert partition.leader.list_offset(OffsetSpec.LATEST) == partition.leader.high_watermark
    assert partition.leader.transaction_start_offset(7) == first_7
    aborted_at = _marker(partition, 7, commit=False)
    for replica in partition.replicas.values():
        assert replica.raft_last_stable_offset == first_8
    committed_at = _marker(partition, 8, commit=True)
    assert committed_at == aborted_at + 1  # a marker takes one offset
    for replica in partition.replicas.values():
        assert replica.raft_last_stable_offset == replica.raft_high_watermark
        indexed = replica.aborted_transactions(0, 2**62)
        assert [(a.producer_id, a.first_offset, a.last_offset) for a in indexed] == [
            (7, first_7, aborted_at)
        ]
    assert partition.leader.transaction_start_offset(7) == -1
    # Only the first batch of each transaction asked the coordinator.
    assert coordinator.asked == [(7, 0), (8, 0)]


def test_a_transactional_batch_for_a_partition_not_in_the_transaction_writes_nothing() -> None:
    coordinator = Coordinator()
    partition = ReplicaGroups(txn_verifier=coordinator)
    end = partition.leader.raft_high_watermark
    with pytest.raises(InvalidTxnStateError, match="not in the ongoing transaction"):
        _produce(partition, _batch(7, 0))
    assert partition.leader.raft_high_watermark == end
    coordinator.added = {(7, 1)}  # added at a later epoch only
    with pytest.raises(InvalidTxnStateError):
        _produce(partition, _batch(7, 0))
    _produce(partition, _batch(7, 0, epoch=1))


def test_a_plain_batch_while_the_transaction_is_open_is_invalid_txn_state() -> None:
    coordinator = Coordinator()
    coordinator.added = {(7, 0)}
    partition = ReplicaGroups(txn_verifier=coordinator)
    _produce(partition, _batch(7, 0))
    with pytest.raises(InvalidTxnStateError, match="non-transactional"):
        _produce(partition, _batch(7, 2, transactional=False))
    _marker(partition, 7, commit=True)
    _produce(partition, _batch(7, 2, transactional=False))


def test_markers_from_the_past_are_refused_and_markers_for_unknown_producers_written() -> None:
    coordinator = Coordinator()
    coordinator.added = {(7, 3)}
    partition = ReplicaGroups(txn_verifier=coordinator)
    _produce(partition, _batch(7, 0, epoch=3))
    end = partition.leader.raft_high_watermark
    with pytest.raises(ProducerFencedError, match="older than 3"):
        _marker(partition, 7, commit=True, epoch=2)
    assert partition.leader.raft_high_watermark == end
    # KIP-890 part 2: the marker carries the bumped epoch, fencing the ended transaction's
    # late batches.
    _marker(partition, 7, commit=True, epoch=4, coordinator_epoch=5)
    with pytest.raises(ProducerFencedError):
        _produce(partition, _batch(7, 2, epoch=3))
    with pytest.raises(TransactionCoordinatorFencedError, match="coordinator epoch 4"):
        _marker(partition, 7, commit=False, epoch=4, coordinator_epoch=4)
    # A producer the partition never saw: written (as Kafka), it ends nothing.
    offset = _marker(partition, 99, commit=False)
    assert offset == partition.leader.raft_high_watermark - 1
    for replica in partition.replicas.values():
        assert replica.aborted_transactions(0, 2**62) == []
        assert replica.raft_last_stable_offset == replica.raft_high_watermark


def test_after_a_bumped_marker_the_next_transaction_starts_at_sequence_zero() -> None:
    coordinator = Coordinator()
    coordinator.added = {(7, 0), (7, 1)}
    partition = ReplicaGroups(txn_verifier=coordinator)
    _produce(partition, _batch(7, 0))
    _marker(partition, 7, commit=False, epoch=1)
    with pytest.raises(OutOfOrderSequenceError):
        _produce(partition, _batch(7, 2, epoch=1))
    _produce(partition, _batch(7, 0, epoch=1))


def test_open_transactions_and_the_aborts_after_its_offset_travel_with_a_snapshot() -> None:
    """A snapshot's table is the applied one, ahead of the snapshot's offset: the aborted
    transactions it accounts for after that offset travel with it (a follower installing it
    starts with an empty index); those before stay in the index files."""
    coordinator = Coordinator()
    coordinator.added = {(7, 0), (8, 0), (9, 0)}
    partition = ReplicaGroups(txn_verifier=coordinator)
    first_9 = _produce(partition, _batch(9, 0))
    aborted_9 = _marker(partition, 9, commit=False)
    first_7 = _produce(partition, _batch(7, 0))
    first_8 = _produce(partition, _batch(8, 0))
    aborted_at = _marker(partition, 7, commit=False)
    leader = partition.leader
    snapshot = leader.compaction_snapshot(
        Offset(first_8), leader.group.node.term, Membership(voters=frozenset(NODES))
    )
    data = decode_snapshot_data(snapshot)[1]
    table = ProducerStateTable.decode(data, producers_max=10)
    assert table.first_open_offset() == first_8
    assert decode_aborted(data) == [AbortedTxn(7, first_7, aborted_at)]
    assert leader.aborted_transactions(0, 2**62) == [
        AbortedTxn(9, first_9, aborted_9),
        AbortedTxn(7, first_7, aborted_at),
    ]


class _ExpiredLog:
    """Storage whose segments below `point` have all expired; a cut is a test failure."""

    def __init__(self, point: int) -> None:
        self.point = point
        self.log = self

    def retention_point(self, now_ms: int) -> int:
        return self.point

    def first_offset(self) -> int:
        return 0

    def snapshot(self) -> None:
        return None

    def term_at(self, offset: int) -> int:
        return 1

    def config_entries(self) -> list[object]:
        return []

    def compact(self, snapshot: object) -> None:
        raise AssertionError("retention cut past an open transaction")


def test_retention_never_cuts_past_an_open_transaction() -> None:
    coordinator = Coordinator()
    coordinator.added = {(7, 0)}
    partition = ReplicaGroups(txn_verifier=coordinator)
    _produce(partition, _batch(5, 0, transactional=False))
    first_7 = _produce(partition, _batch(7, 0))
    _produce(partition, _batch(5, 2, transactional=False))
    storage = _ExpiredLog(partition.leader.raft_high_watermark)
    bootstrap = partition.groups[LEADER].bootstrap_membership
    apply_retention(partition.leader, storage, bootstrap, 0)  # type: ignore[arg-type]
    assert partition.leader.first_open_transaction_offset() == first_7


class _CutLog(_ExpiredLog):
    """Storage whose segments below `point` have all expired; records the cuts."""

    def __init__(self, point: int) -> None:
        super().__init__(point)
        self.cuts: list[int] = []

    def segment_start_at_or_below(self, offset: int) -> None:
        return None

    def compact(self, snapshot: Any) -> None:
        self.cuts.append(int(snapshot.meta.offset))


class _Lagging:
    """A replica whose producer table was applied only up to `applied_offset`."""

    def __init__(self, replica: Any, applied_offset: int) -> None:
        self._replica = replica
        self.applied_offset = applied_offset

    def __getattr__(self, name: str) -> Any:
        return getattr(self._replica, name)


def test_retention_never_cuts_past_what_the_replica_applied() -> None:
    # The snapshot at the cut carries the producer table as applied: a cut past it would
    # drop entries whose producers the table never saw.
    partition = ReplicaGroups()
    for sequence in (0, 2, 4):  # two records a batch
        _produce(partition, _batch(5, sequence, transactional=False))
    leader = partition.leader
    end = leader.raft_high_watermark
    assert leader.applied_offset == end - 1
    bootstrap = partition.groups[LEADER].bootstrap_membership
    storage = _CutLog(end)
    apply_retention(_Lagging(leader, end - 3), storage, bootstrap, 0)  # type: ignore[arg-type]
    assert storage.cuts == []
    apply_retention(leader, storage, bootstrap, 0)  # type: ignore[arg-type]
    assert storage.cuts == [end - 1]


def test_compaction_drops_the_records_of_aborted_transactions_only() -> None:
    aborted = aborted_batches([AbortedTxn(7, 10, 15), AbortedTxn(8, 3, 4)])

    def batch(producer_id: int, base_offset: int, *, transactional: bool = True) -> bytes:
        return encode_batch(
            [RecordInput(b"k", b"v", 0)],
            base_offset=base_offset,
            producer_id=producer_id,
            producer_epoch=0,
            base_sequence=0,
            is_transactional=transactional,
        )

    verdicts = {
        (pid, offset, transactional): aborted(parse_header(batch(pid, offset, transactional=t)))
        for pid, offset, transactional in [
            (7, 10, True),
            (7, 14, True),
            (7, 15, True),  # after the marker: the next transaction
            (7, 9, True),
            (7, 12, False),  # not transactional
            (8, 3, True),
            (9, 12, True),  # another producer
        ]
        for t in [transactional]
    }
    assert [key for key, verdict in verdicts.items() if verdict] == [
        (7, 10, True),
        (7, 14, True),
        (8, 3, True),
    ]
    keep_all = latest_record_keeper({}, now_ms=0, delete_retention_ms=0)
    cleaned, removed = clean_batch(batch(7, 12), keep_all, aborted)
    assert removed == 1 and parse_header(cleaned).record_count == 0
    assert parse_header(cleaned).last_offset == 12  # the batch keeps its offsets
    committed = batch(9, 12)
    assert clean_batch(committed, keep_all, aborted) == (committed, 0)


def test_a_pipelined_request_waits_for_the_verification_of_the_one_before() -> None:
    """librdkafka keeps up to five requests in flight: the second batch of a transaction
    must not overtake the first while the first waits for the coordinator (it would be
    refused OUT_OF_ORDER_SEQUENCE)."""

    class SlowCoordinator(Coordinator):
        def __init__(self) -> None:
            super().__init__()
            self.release = asyncio.Event()

        async def __call__(self, producer_id: int, epoch: int) -> bool:
            # Only the first question waits (the node's metadata copy catches up meanwhile):
            # a later one is answered at once, while the first's request still sleeps.
            if not self.asked:
                self.asked.append((producer_id, epoch))
                await self.release.wait()
                return (producer_id, epoch) in self.added
            return await super().__call__(producer_id, epoch)

    coordinator = SlowCoordinator()
    coordinator.added = {(7, 0)}
    partition = ReplicaGroups(txn_verifier=coordinator)

    async def scenario() -> list[int]:
        leader = partition.leader
        first = asyncio.ensure_future(
            leader.produce([_batch(7, 0)], commitment=Commitment.QUORUM, timeout_s=TIMEOUT_S)
        )
        await asyncio.sleep(0)
        second = asyncio.ensure_future(
            leader.produce([_batch(7, 2)], commitment=Commitment.QUORUM, timeout_s=TIMEOUT_S)
        )
        for _ in range(3):
            await asyncio.sleep(0)
        assert not first.done() and not second.done()
        coordinator.release.set()
        while not (first.done() and second.done()):
            await asyncio.sleep(0)
            partition.settle()
        return [first.result().base_offset, second.result().base_offset]

    first_offset, second_offset = asyncio.run(scenario())
    assert second_offset == first_offset + 2
    assert coordinator.asked == [(7, 0)]  # the second found the transaction open


def test_a_request_arriving_as_the_verified_one_proposes_waits_for_the_one_behind_it() -> None:
    """Three pipelined requests of one transaction: the first waits for the coordinator, the
    second for the first. The third arrives in the turn the first proposes, before the
    second has woken: it must queue behind the second, not propose past it (found by
    tests/kafka/test_transaction_faults.py on a loaded machine, at the Kafka listener)."""

    class SlowCoordinator(Coordinator):
        def __init__(self) -> None:
            super().__init__()
            self.release = asyncio.Event()

        async def __call__(self, producer_id: int, epoch: int) -> bool:
            self.asked.append((producer_id, epoch))
            await self.release.wait()
            return (producer_id, epoch) in self.added

    coordinator = SlowCoordinator()
    coordinator.added = {(7, 0)}
    partition = ReplicaGroups(txn_verifier=coordinator)

    async def scenario() -> list[int]:
        leader = partition.leader

        def produce(sequence: int) -> asyncio.Future[Any]:
            return asyncio.ensure_future(
                leader.produce(
                    [_batch(7, sequence)], commitment=Commitment.QUORUM, timeout_s=TIMEOUT_S
                )
            )

        requests = [produce(0)]
        await asyncio.sleep(0)
        requests.append(produce(2))
        for _ in range(3):
            await asyncio.sleep(0)
        assert not any(r.done() for r in requests)
        coordinator.release.set()
        await asyncio.sleep(0)  # the first is verified and proposes in this turn
        requests.append(produce(4))
        while not all(r.done() for r in requests):
            await asyncio.sleep(0)
            partition.settle()
        return [r.result().base_offset for r in requests]

    offsets = asyncio.run(scenario())
    assert offsets == [offsets[0], offsets[0] + 2, offsets[0] + 4]
    assert coordinator.asked == [(7, 0)]
