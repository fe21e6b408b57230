"""The operators' transaction calls on a real metadata state (rpc/txn_admin.py): what list
and describe answer, and what an abort decides in each state of a transactional id, applied
as the controller would, so the answer is checked against the committed state."""

from __future__ import annotations

from raftlog.metadata.commands import (
    AddToTransaction,
    AllocateProducerIds,
    CompleteEndTransaction,
    InitTransaction,
    PrepareEndTransaction,
)
from raftlog.metadata.transactions import TxnState
from raftlog.rpc.txn_admin import (
    AbortWait,
    abort_done,
    describe_transaction,
    list_transactions,
    plan_abort,
)
from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.types import PartitionId
from tests.unit.metadata.test_metadata_state import Log, create, register


def _log_with_open_transaction() -> Log:
    log = Log()
    log.ok(register(1), register(2), register(3), create("orders"), AllocateProducerIds(10))
    log.ok(InitTransaction("tx", 3, 0, 1000, 0), InitTransaction("idle", 4, 0, 1000, 0))
    partitions = (("orders", PartitionId(2)), ("orders", PartitionId(0)))
    log.ok(AddToTransaction("tx", 3, 0, partitions, ("enricher",), 100))
    return log


def test_list_and_describe_answer_the_state_and_the_open_transaction() -> None:
    state = _log_with_open_transaction().state
    listed = list_transactions(state, pb.ListTransactionsRequest(), 1, 500)
    assert [(t.transactional_id, t.state) for t in listed.transactions] == [
        ("idle", "Empty"),
        ("tx", "Ongoing"),
    ]
    assert listed.transactions[0].start_time_ms == -1  # nothing open
    ongoing = list_transactions(state, pb.ListTransactionsRequest(states=["Ongoing"]), 1, 500)
    assert [t.transactional_id for t in ongoing.transactions] == ["tx"]
    refused = list_transactions(state, pb.ListTransactionsRequest(states=["Open"]), 1, 500)
    assert refused.error.code == pb.INVALID_REQUEST and "'Open'" in refused.error.message

    described = describe_transaction(state, "tx", 1, 500)
    info = described.transaction
    assert (info.producer_id, info.producer_epoch, info.coordinator_id) == (3, 0, 1)
    assert (info.start_time_ms, info.timeout_ms, list(info.groups)) == (100, 1000, ["enricher"])
    assert [(tp.topic, list(tp.partitions)) for tp in info.partitions] == [("orders", [0, 2])]
    unknown = describe_transaction(state, "nope", 1, 500)
    assert unknown.error.code == pb.TRANSACTIONAL_ID_NOT_FOUND and "'nope'" in unknown.error.message
    assert describe_transaction(state, "", 1, 500).error.code == pb.INVALID_REQUEST


def test_an_abort_fences_the_producer_and_is_waited_for_until_complete() -> None:
    log = _log_with_open_transaction()
    command = plan_abort(log.state, "tx", 200)
    assert command == PrepareEndTransaction("tx", 3, 0, False, True, 200)
    log.ok(command)
    txn = log.state.transaction("tx")
    assert txn is not None and (txn.state, txn.producer_epoch) == (TxnState.PREPARE_ABORT, 1)
    wait = plan_abort(log.state, "tx", 300)  # asked again while the markers are written
    assert wait == AbortWait(3) and not abort_done(log.state, "tx", wait)
    log.ok(CompleteEndTransaction("tx", 3, 1, 400))
    assert abort_done(log.state, "tx", wait)
    again = plan_abort(log.state, "tx", 500)
    assert isinstance(again, pb.Error) and again.code == pb.INVALID_TXN_STATE
    assert "no transaction open" in again.message


def test_an_abort_is_refused_without_a_transaction_or_while_one_commits() -> None:
    log = _log_with_open_transaction()
    unknown = plan_abort(log.state, "nope", 200)
    assert isinstance(unknown, pb.Error) and unknown.code == pb.TRANSACTIONAL_ID_NOT_FOUND
    idle = plan_abort(log.state, "idle", 200)
    assert isinstance(idle, pb.Error) and idle.code == pb.INVALID_TXN_STATE
    log.ok(PrepareEndTransaction("tx", 3, 0, True, True, 200))
    committing = plan_abort(log.state, "tx", 300)
    assert isinstance(committing, pb.Error) and committing.code == pb.INVALID_TXN_STATE
    assert "committing" in committing.message
