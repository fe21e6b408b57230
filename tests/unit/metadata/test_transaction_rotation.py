"""Producer id rotation at the end of a transaction (Kafka's nextProducerId and
previousProducerId, KIP-890 part 2): an EndTxn that bumps a spent epoch moves the
transactional id to a new producer id at epoch 0 when the transaction completes, the markers
keeping the old one; a client that missed the rotation (a retried EndTxn, a KIP-360
InitProducerId with the old producer id) is recognised, not fenced; both fields survive the
command codec and snapshots, and what was written before them still decodes."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.metadata.commands import (
    AddToTransaction,
    AllocateProducerIds,
    CompleteEndTransaction,
    ErrorCode,
    InitTransaction,
    PrepareEndTransaction,
    decode_command,
    encode_command,
)
from raftlog.metadata.state import MetadataState
from raftlog.metadata.transaction_plans import (
    NO_PRODUCER_ID,
    Answer,
    EndPlan,
    InitPlan,
    needs_new_producer_id,
    needs_next_producer_id,
    plan_end_txn,
    plan_init,
)
from raftlog.metadata.transactions import PRODUCER_EPOCH_MAX, TxnState
from raftlog.types import PartitionId
from tests.unit.metadata.test_metadata_state import Log, content, create, register

TID = "tx-1"
SPENT = PRODUCER_EPOCH_MAX - 1  # the last epoch a producer holds: a fence needs one more


@pytest.fixture
def log() -> Log:
    log = Log()
    log.ok(register(1), register(2), register(3), create("orders"), AllocateProducerIds(100))
    return log


def add(pid: int, epoch: int) -> AddToTransaction:
    return AddToTransaction(TID, pid, epoch, (("orders", PartitionId(0)),), (), 5)


def at_epoch(log: Log, epoch: int) -> None:
    """Producer 7 at `epoch`, with no transaction open."""
    log.ok(InitTransaction(TID, 7, 0, 60_000, 0))
    set_epoch(log, epoch)


def set_epoch(log: Log, epoch: int) -> None:
    """The bumps up to `epoch` skipped: the table's own effect, as InitTransaction or a bumping
    end leaves it (32766 bumps would take a while)."""
    txn = log.state.transaction(TID)
    assert txn is not None
    log.state._transactions.put(replace(txn, producer_epoch=epoch))
    log.state._transaction_changed(TID)


def end_at_spent_epoch(log: Log, commit: bool = True) -> None:
    """Producer 7 at the spent epoch ends a transaction with EndTxn v5: PrepareX at 32767 with
    producer id 9 next."""
    at_epoch(log, SPENT)
    log.ok(add(7, SPENT))
    assert needs_next_producer_id(log.state, TID, bump_epoch=True)
    assert not needs_next_producer_id(log.state, TID, bump_epoch=False)
    plan = plan_end_txn(log.state, TID, 7, SPENT, commit, True, 9, next_producer_id=9)
    assert isinstance(plan, EndPlan) and plan.command.next_producer_id == 9
    log.ok(plan.command)


def test_an_end_at_the_spent_epoch_rotates_to_the_next_producer_id(log: Log) -> None:
    end_at_spent_epoch(log)
    txn = log.state.transaction(TID)
    assert txn is not None and txn.state is TxnState.PREPARE_COMMIT
    # The markers carry the spent producer id at the bumped epoch; the answer is the next.
    assert (txn.producer_id, txn.producer_epoch, txn.next_producer_id) == (7, PRODUCER_EPOCH_MAX, 9)
    assert txn.producer_after_end() == (9, 0)
    log.rejected(add(9, 0), ErrorCode.INVALID_PRODUCER_ID_MAPPING)  # not before the completion
    log.ok(CompleteEndTransaction(TID, 7, PRODUCER_EPOCH_MAX, 10))
    txn = log.state.transaction(TID)
    assert txn is not None and txn.state is TxnState.COMPLETE_COMMIT
    assert (txn.producer_id, txn.producer_epoch, txn.previous_producer_id) == (9, 0, 7)
    assert txn.next_producer_id == NO_PRODUCER_ID
    assert log.state.transaction_of_producer(7) is None
    assert log.state.transaction_of_producer(9) == txn
    log.rejected(add(7, PRODUCER_EPOCH_MAX), ErrorCode.INVALID_PRODUCER_ID_MAPPING)
    log.ok(add(9, 0))


def test_an_end_below_the_spent_epoch_or_without_a_bump_does_not_rotate(log: Log) -> None:
    at_epoch(log, SPENT - 1)
    log.ok(add(7, SPENT - 1))
    assert not needs_next_producer_id(log.state, TID, bump_epoch=True)
    plan = plan_end_txn(log.state, TID, 7, SPENT - 1, True, True, 9)
    assert isinstance(plan, EndPlan) and plan.command.next_producer_id == NO_PRODUCER_ID
    # A spent epoch with no fresh id at hand (it was spent between the allocation and the
    # plan) is retried, never ended without the rotation.
    set_epoch(log, SPENT)
    assert plan_end_txn(log.state, TID, 7, SPENT, True, True, 9) == Answer(
        ErrorCode.CONCURRENT_TRANSACTIONS
    )


def test_a_rotation_is_checked_at_apply(log: Log) -> None:
    at_epoch(log, SPENT - 1)
    log.ok(InitTransaction("other", 8, 0, 60_000, 0), add(7, SPENT - 1))
    rotate = PrepareEndTransaction(TID, 7, SPENT - 1, True, True, 9, next_producer_id=9)
    log.rejected(rotate, ErrorCode.INVALID_REQUEST, "not spent")
    set_epoch(log, SPENT)
    log.rejected(replace(rotate, producer_epoch=SPENT, bump_epoch=False), ErrorCode.INVALID_REQUEST)
    for taken in (8, 500):  # another id's producer; one the allocator never gave out
        spent = replace(rotate, producer_epoch=SPENT, next_producer_id=taken)
        log.rejected(spent, ErrorCode.INVALID_REQUEST, "not allocated or is in use")
    log.ok(replace(rotate, producer_epoch=SPENT))


def test_a_retried_end_txn_gets_the_new_producer(log: Log) -> None:
    end_at_spent_epoch(log, commit=False)
    # Its answer lost while the markers are written, then after the completion.
    retry = Answer(ErrorCode.NONE, 9, 0)
    assert plan_end_txn(log.state, TID, 7, SPENT, False, True, 11) == retry
    assert plan_end_txn(log.state, TID, 7, SPENT, True, True, 11) == Answer(
        ErrorCode.INVALID_TXN_STATE
    )
    log.ok(CompleteEndTransaction(TID, 7, PRODUCER_EPOCH_MAX, 10))
    assert plan_end_txn(log.state, TID, 7, SPENT, False, True, 11) == retry
    assert plan_end_txn(log.state, TID, 7, SPENT, True, True, 11) == Answer(
        ErrorCode.INVALID_TXN_STATE
    )
    # Once the new producer id began a transaction the old one is only a zombie.
    log.ok(add(9, 0))
    assert plan_end_txn(log.state, TID, 7, SPENT, False, True, 11) == Answer(
        ErrorCode.PRODUCER_FENCED
    )


def test_kip_360_recovery_with_the_previous_producer_id(log: Log) -> None:
    end_at_spent_epoch(log)
    log.ok(CompleteEndTransaction(TID, 7, PRODUCER_EPOCH_MAX, 10))
    # The client never heard of producer id 9: it recovers as producer 7 at its epoch and
    # is given the next epoch of 9, fencing whatever held 9 at epoch 0.
    plan = plan_init(log.state, TID, 1000, (7, SPENT), None, 20)
    assert isinstance(plan, InitPlan) and plan.command == InitTransaction(TID, 9, 1, 1000, 20)
    assert plan_init(log.state, TID, 1000, (7, 5), None, 20) == Answer(ErrorCode.PRODUCER_FENCED)
    log.ok(plan.command)
    # A retry of it whose answer was lost: the bump already happened.
    assert plan_init(log.state, TID, 1000, (7, SPENT), None, 20) == Answer(
        ErrorCode.PRODUCER_FENCED
    )
    assert plan_init(log.state, TID, 1000, (9, 0), None, 20) == Answer(ErrorCode.NONE, 9, 1)


def test_kip_360_recovery_after_a_rotation_by_init_producer_id(log: Log) -> None:
    at_epoch(log, SPENT)
    plan = plan_init(log.state, TID, 1000, (7, SPENT), 9, 20)
    assert isinstance(plan, InitPlan) and plan.command == InitTransaction(TID, 9, 0, 1000, 20)
    log.ok(plan.command)
    txn = log.state.transaction(TID)
    assert txn is not None and txn.previous_producer_id == 7
    # Its answer lost, the client asks again with producer 7: recognised, not fenced.
    again = plan_init(log.state, TID, 1000, (7, SPENT), None, 30)
    assert isinstance(again, InitPlan) and again.command == InitTransaction(TID, 9, 1, 1000, 30)


def test_rotation_fields_survive_codec_and_snapshot_and_old_forms_decode(log: Log) -> None:
    plain = PrepareEndTransaction(TID, 7, 3, True, True, 9)
    rotating = replace(plain, next_producer_id=12)
    for command in (plain, rotating):
        assert decode_command(encode_command(command)) == command
    # Written before the field existed: the same bytes as a command without it.
    assert b"next_producer_id" not in encode_command(plain)
    old = encode_command(plain)
    assert decode_command(old) == plain
    assert b"previous_producer_id" not in log.state.snapshot()
    end_at_spent_epoch(log)
    assert content(log.state)["transactions"][0]["next_producer_id"] == 9  # type: ignore[index]
    restored = MetadataState.restore(log.state.snapshot())
    assert restored.transaction(TID) == log.state.transaction(TID)
    log.ok(CompleteEndTransaction(TID, 7, PRODUCER_EPOCH_MAX, 10))
    snapshot = log.state.snapshot()
    body = json.loads(snapshot[1:])
    assert body["transactions"][0]["previous_producer_id"] == 7
    assert "next_producer_id" not in body["transactions"][0]
    restored = MetadataState.restore(snapshot)
    assert restored.transaction(TID) == log.state.transaction(TID)
    assert restored.transaction_of_producer(9) == log.state.transaction(TID)


class _Client:
    """A transactional producer as the coordinator's handlers serve it: it uses the producer
    it was last answered, and sometimes loses an answer and asks again."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.producer = (7, 0)

    def allocate(self) -> int:
        result = self.log.apply(AllocateProducerIds(1))
        assert result.ok and result.producer_id_first is not None
        return result.producer_id_first

    def complete(self) -> None:
        """The marker duty: markers with the producer the state holds, then the completion."""
        txn = self.log.state.transaction(TID)
        assert txn is not None and txn.state.preparing
        self.log.ok(CompleteEndTransaction(TID, txn.producer_id, txn.producer_epoch, 50))

    def end(self, commit: bool, lose_answer: bool, recover: bool) -> None:
        state = self.log.state
        next_id = self.allocate() if needs_next_producer_id(state, TID, True) else None
        plan = plan_end_txn(self.log.state, TID, *self.producer, commit, True, 40, next_id)
        assert isinstance(plan, EndPlan)
        self.log.ok(plan.command)
        txn = self.log.state.transaction(TID)
        assert txn is not None
        answered = txn.producer_after_end()
        self.complete()
        if lose_answer and recover:
            new_id = self.allocate() if needs_new_producer_id(state, TID) else None
            init = plan_init(self.log.state, TID, 60_000, self.producer, new_id, 60)
            if isinstance(init, Answer):  # the bump it asked for: the end's own
                assert init.code is ErrorCode.NONE, init  # recognised, never fenced
                answered = (init.producer_id, init.producer_epoch)
            else:
                assert isinstance(init.command, InitTransaction), init
                self.log.ok(init.command)
                answered = (init.command.producer_id, init.command.producer_epoch)
        elif lose_answer:
            retry = plan_end_txn(self.log.state, TID, *self.producer, commit, True, 60)
            assert retry == Answer(ErrorCode.NONE, *answered), retry
        self.producer = answered


@settings(max_examples=60, deadline=None)
@given(
    start_epoch=st.integers(SPENT - 4, SPENT),
    ends=st.lists(st.tuples(st.booleans(), st.booleans(), st.booleans()), max_size=8),
)
def test_a_client_following_the_answers_is_never_fenced_nor_given_the_last_epoch(
    start_epoch: int, ends: list[tuple[bool, bool, bool]]
) -> None:
    """Whatever the epoch it starts at and whichever answers it loses (retrying EndTxn, or
    recovering with InitProducerId and its producer), the client's producer is always the
    one the coordinator holds, its epoch leaves one for a fence, and a producer id it gave
    up is never handed out again."""
    log = Log()
    log.ok(register(1), register(2), register(3), create("orders"), AllocateProducerIds(8))
    at_epoch(log, start_epoch)
    client = _Client(log)
    client.producer = (7, start_epoch)
    held = [7]
    for commit, lose_answer, recover in ends:
        log.ok(add(*client.producer))
        client.end(commit, lose_answer, recover)
        txn = log.state.transaction(TID)
        assert txn is not None and txn.state.ended
        assert (txn.producer_id, txn.producer_epoch) == client.producer
        assert client.producer[1] <= SPENT
        if client.producer[0] != held[-1]:
            assert client.producer[0] not in held
            held.append(client.producer[0])
