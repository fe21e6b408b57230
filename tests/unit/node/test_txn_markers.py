"""The controller's transaction duty on a real metadata state, with the marker writes and the
command submission as recording fakes: markers for every existing partition of a preparing
transaction at its (bumped) epoch, completion only once every marker is written, the abort of
a transaction past its timeout with an epoch bump, nothing while not the controller, and the
news of a completion to the requests held for it just before it is proposed."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from raftlog.metadata.commands import (
    AddToTransaction,
    AllocateProducerIds,
    ApplyResult,
    Command,
    CompleteEndTransaction,
    DeleteTopic,
    InitTransaction,
    PrepareEndTransaction,
    encode_command,
)
from raftlog.metadata.transactions import TRANSACTIONAL_ID_EXPIRATION_MS, TxnState
from raftlog.node.txn_markers import TransactionMarkerDuty
from raftlog.rpc.txn_completions import TxnCompletions
from raftlog.types import PartitionId, TxnMarker, TxnMarkerResult
from tests.unit.metadata.test_metadata_state import Log, create, register


class Fakes:
    def __init__(self, log: Log) -> None:
        self.log = log
        self.term: int | None = 4
        self.now_ms = 0
        self.markers: list[TxnMarker] = []
        self.marker_code = 0
        self.refused: set[int] = set()  # partitions answered NOT_LEADER_OR_FOLLOWER
        self.unknown: set[int] = set()  # partitions answered UNKNOWN_TOPIC_OR_PARTITION
        self.answers_lost = False  # a submit commits, then times out
        self.completions = TxnCompletions()
        self.events: list[str] = []  # what happened, in order (submits and completion news)

    async def submit(self, command: Command) -> ApplyResult:
        self.events.append(type(command).__name__)
        result = self.log.apply(encode_command(command))
        if self.answers_lost:
            raise TimeoutError("committed, but the answer was lost")
        return result

    async def write(self, markers: Sequence[TxnMarker], timeout_s: float) -> list[TxnMarkerResult]:
        self.markers += markers
        return [TxnMarkerResult(m.topic, m.partition, self._code(m.partition)) for m in markers]

    def _code(self, partition: int) -> int:
        if partition in self.refused:
            return 6
        return 3 if partition in self.unknown else self.marker_code

    def duty(self) -> TransactionMarkerDuty:
        return TransactionMarkerDuty(
            state=lambda: self.log.state,
            controller_term=lambda: self.term,
            submit=self.submit,
            write_markers=self.write,
            wall_clock_ms=lambda: self.now_ms,
            completions=self.completions,
        )


def _open_transaction(log: Log) -> None:
    log.ok(register(1), register(2), register(3), create("orders"), AllocateProducerIds(10))
    log.ok(InitTransaction("tx", 3, 0, 1000, 0))
    partitions = (("orders", PartitionId(0)), ("orders", PartitionId(2)))
    log.ok(AddToTransaction("tx", 3, 0, partitions, (), 100))


async def _settle(duty: TransactionMarkerDuty) -> None:
    duty.step()
    await asyncio.sleep(0)
    await asyncio.gather(*duty._in_flight.values())


def _state(log: Log) -> TxnState:
    txn = log.state.transaction("tx")
    assert txn is not None
    return txn.state


async def _case_a_decided_commit_gets_its_markers_then_completes() -> None:
    log = Log()
    _open_transaction(log)
    log.ok(PrepareEndTransaction("tx", 3, 0, True, True, 200))
    fakes = Fakes(log)
    fakes.now_ms = 300
    await _settle(fakes.duty())
    assert [(m.topic, m.partition, m.producer_epoch, m.commit) for m in fakes.markers] == [
        ("orders", 0, 1, True),
        ("orders", 2, 1, True),
    ]
    assert {m.coordinator_epoch for m in fakes.markers} == {4}
    assert _state(log) is TxnState.COMPLETE_COMMIT


async def _case_no_completion_until_every_marker_is_written() -> None:
    log = Log()
    _open_transaction(log)
    log.ok(PrepareEndTransaction("tx", 3, 0, False, False, 200))
    fakes = Fakes(log)
    fakes.marker_code = 6  # NOT_LEADER_OR_FOLLOWER
    duty = fakes.duty()
    await _settle(duty)
    assert _state(log) is TxnState.PREPARE_ABORT
    fakes.marker_code = 0
    await _settle(duty)
    assert _state(log) is TxnState.COMPLETE_ABORT
    assert all(not m.commit for m in fakes.markers)


async def _retried_until_written(answer: str) -> None:
    """orders-2's marker is answered `answer` ("refused": NOT_LEADER_OR_FOLLOWER, no leader
    for a while; "unknown": UNKNOWN_TOPIC_OR_PARTITION from a restarted node that has not
    replayed its metadata, for a partition that exists) until it is written: the
    transaction completes only then, and orders-0 takes its marker once."""
    log = Log()
    _open_transaction(log)
    log.ok(PrepareEndTransaction("tx", 3, 0, True, False, 200))
    fakes = Fakes(log)
    setattr(fakes, answer, {2})
    duty = fakes.duty()
    await _settle(duty)
    await _settle(duty)
    assert _state(log) is TxnState.PREPARE_COMMIT
    setattr(fakes, answer, set())
    await _settle(duty)
    assert _state(log) is TxnState.COMPLETE_COMMIT
    assert [m.partition for m in fakes.markers] == [0, 2, 2, 2]


async def _case_a_retry_writes_only_the_markers_not_yet_written() -> None:
    await _retried_until_written("refused")


async def _case_unknown_partition_from_a_node_is_retried_while_the_partition_exists() -> None:
    # Completing on that answer would leave the partition without its marker (its records
    # open, later indexed as aborted by the producer's next ABORT).
    await _retried_until_written("unknown")


async def _case_a_lost_completion_answer_never_skips_the_next_transactions_markers() -> None:
    # An EndTxn v1 client keeps its epoch between transactions. The first transaction's
    # completion is retried after orders-2 refused its marker, and the retry's answer is lost
    # though it committed: the set of markers written must not carry over to the second.
    log = Log()
    _open_transaction(log)
    log.ok(PrepareEndTransaction("tx", 3, 0, True, False, 200))
    fakes = Fakes(log)
    fakes.refused = {2}
    duty = fakes.duty()
    await _settle(duty)
    fakes.refused = set()
    fakes.answers_lost = True
    await _settle(duty)
    assert _state(log) is TxnState.COMPLETE_COMMIT
    fakes.answers_lost = False
    partitions = (("orders", PartitionId(0)), ("orders", PartitionId(2)))
    log.ok(AddToTransaction("tx", 3, 0, partitions, (), 250))
    log.ok(PrepareEndTransaction("tx", 3, 0, True, False, 300))
    fakes.markers.clear()
    await _settle(duty)
    assert _state(log) is TxnState.COMPLETE_COMMIT
    assert sorted(m.partition for m in fakes.markers) == [0, 2]


async def _case_a_deleted_partitions_marker_is_not_waited_for() -> None:
    log = Log()
    _open_transaction(log)
    log.ok(PrepareEndTransaction("tx", 3, 0, True, False, 200))
    fakes = Fakes(log)
    fakes.unknown = {0, 2}
    duty = fakes.duty()
    await _settle(duty)
    assert _state(log) is TxnState.PREPARE_COMMIT
    log.ok(DeleteTopic("orders"))
    await _settle(duty)
    assert _state(log) is TxnState.COMPLETE_COMMIT


async def _case_a_transaction_past_its_timeout_is_aborted_and_its_producer_fenced() -> None:
    log = Log()
    _open_transaction(log)
    fakes = Fakes(log)
    duty = fakes.duty()
    fakes.now_ms = 1100  # started at 100, timeout 1000 ms: not yet past it
    await _settle(duty)
    assert _state(log) is TxnState.ONGOING
    fakes.now_ms = 1101
    await _settle(duty)
    await _settle(duty)
    txn = log.state.transaction("tx")
    assert txn is not None and txn.state is TxnState.COMPLETE_ABORT
    assert txn.producer_epoch == 1  # the producer's epoch 0 is fenced
    assert log.apply(encode_command(CompleteEndTransaction("tx", 3, 0, 0))).code.name == (
        "PRODUCER_FENCED"
    )


async def _case_an_id_unused_for_a_week_is_forgotten() -> None:
    log = Log()
    _open_transaction(log)
    log.ok(PrepareEndTransaction("tx", 3, 0, True, False, 200))
    fakes = Fakes(log)
    duty = fakes.duty()
    fakes.now_ms = 300
    await _settle(duty)
    fakes.now_ms = 300 + TRANSACTIONAL_ID_EXPIRATION_MS
    await _settle(duty)
    assert log.state.transaction("tx") is not None  # completed at 300: not past it yet
    fakes.now_ms += 1
    await _settle(duty)
    assert log.state.transaction("tx") is None


async def _case_nothing_happens_off_the_controller() -> None:
    log = Log()
    _open_transaction(log)
    log.ok(PrepareEndTransaction("tx", 3, 0, True, False, 200))
    fakes = Fakes(log)
    fakes.term = None
    await _settle(fakes.duty())
    assert not fakes.markers and _state(log) is TxnState.PREPARE_COMMIT


async def _case_held_requests_hear_of_the_completion_just_before_it_is_proposed() -> None:
    log = Log()
    _open_transaction(log)
    log.ok(PrepareEndTransaction("tx", 3, 0, True, True, 200))
    fakes = Fakes(log)
    fakes.refused = {2}
    duty = fakes.duty()

    def heard() -> None:
        fakes.events.append(f"proposing {_state(log).value} after {len(fakes.markers)} markers")

    with fakes.completions.watch("tx", heard), fakes.completions.watch("other", heard):
        await _settle(duty)  # a marker failed: no completion, nothing heard
        assert fakes.events == []
        fakes.refused = set()
        await _settle(duty)
        assert fakes.completions.waiting() == 1  # "tx"'s watcher was told and dropped
    assert fakes.events == ["proposing PrepareCommit after 3 markers", "CompleteEndTransaction"]
    assert _state(log) is TxnState.COMPLETE_COMMIT
    assert fakes.completions.waiting() == 0


def test_held_requests_hear_of_the_completion_just_before_it_is_proposed() -> None:
    """The news comes once every marker is written and before CompleteEndTransaction is
    submitted, so a held request woken by it is proposed behind the completion; a watcher
    of another id hears nothing, and leaving the block forgets the watcher."""
    asyncio.run(_case_held_requests_hear_of_the_completion_just_before_it_is_proposed())


def test_a_decided_commit_gets_its_markers_then_completes() -> None:
    asyncio.run(_case_a_decided_commit_gets_its_markers_then_completes())


def test_no_completion_until_every_marker_is_written() -> None:
    asyncio.run(_case_no_completion_until_every_marker_is_written())


def test_a_retry_writes_only_the_markers_not_yet_written() -> None:
    asyncio.run(_case_a_retry_writes_only_the_markers_not_yet_written())


def test_unknown_partition_from_a_node_is_retried_while_the_partition_exists() -> None:
    asyncio.run(_case_unknown_partition_from_a_node_is_retried_while_the_partition_exists())


def test_a_lost_completion_answer_never_skips_the_next_transactions_markers() -> None:
    asyncio.run(_case_a_lost_completion_answer_never_skips_the_next_transactions_markers())


def test_a_deleted_partitions_marker_is_not_waited_for() -> None:
    asyncio.run(_case_a_deleted_partitions_marker_is_not_waited_for())


def test_a_transaction_past_its_timeout_is_aborted_and_its_producer_fenced() -> None:
    asyncio.run(_case_a_transaction_past_its_timeout_is_aborted_and_its_producer_fenced())


def test_nothing_happens_off_the_controller() -> None:
    asyncio.run(_case_nothing_happens_off_the_controller())


def test_an_id_unused_for_a_week_is_forgotten() -> None:
    asyncio.run(_case_an_id_unused_for_a_week_is_forgotten())
