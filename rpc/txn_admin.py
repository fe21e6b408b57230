"""Transactions for operators on the gRPC Admin service: ListTransactions, DescribeTransaction
and AbortTransaction (what Kafka's kafka-transactions.sh does with list, describe and abort).

Theory of operation. Every transactional id's state is replicated in the metadata quorum
(`raftlog.metadata.transactions`), so list and describe read this node's copy of it; the
coordinator they name is the controller. An abort is the coordinator's own decision, the one
it takes for a transaction past its timeout: PrepareEndTransaction(abort) at the producer's
epoch with the epoch bumped, so the producer is fenced (its next request carries an epoch
from the past), then the controller's marker duty (`raftlog.node.txn_markers`) writes the
ABORT markers into every partition of it and completes it. The answer waits for that
completion, so once `raftlog txn abort` returns, the partitions' last stable offsets have
moved past the transaction. This module holds the pure parts (the planning and the answers);
`AdminServicer` does the I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from raftlog.metadata import MetadataState
from raftlog.metadata.commands import PrepareEndTransaction
from raftlog.metadata.transaction_checks import check_transactional_id
from raftlog.metadata.transactions import TransactionState, TxnState
from raftlog.rpc.v1 import raftlog_pb2 as pb

__all__ = [
    "TXN_STATE_NAMES",
    "AbortWait",
    "abort_done",
    "bad_transactional_id",
    "describe_transaction",
    "list_transactions",
    "plan_abort",
    "transaction_info",
]

TXN_STATE_NAMES = frozenset(s.value for s in TxnState)


def transaction_info(txn: TransactionState, coordinator_id: int) -> pb.TransactionInfo:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(txn.partitions):
        by_topic.setdefault(topic, []).append(partition)
    open_ = not txn.state.ended
    return pb.TransactionInfo(
        transactional_id=txn.transactional_id,
        producer_id=txn.producer_id,
        producer_epoch=txn.producer_epoch,
        state=txn.state.value,
        coordinator_id=coordinator_id,
        start_time_ms=txn.started_ms if open_ else -1,
        last_update_ms=txn.updated_ms,
        timeout_ms=txn.timeout_ms,
        partitions=[pb.TopicPartitions(topic=t, partitions=p) for t, p in by_topic.items()],
        groups=sorted(txn.groups),
    )


def bad_transactional_id(transactional_id: str) -> pb.Error | None:
    """INVALID_REQUEST for an id no producer could have (empty, too long)."""
    problem = check_transactional_id(transactional_id)
    if problem is None:
        return None
    return pb.Error(code=pb.INVALID_REQUEST, message=problem.message, leader_id=-1)


def _not_found(transactional_id: str) -> pb.Error:
    return pb.Error(
        code=pb.TRANSACTIONAL_ID_NOT_FOUND,
        message=f"unknown transactional id {transactional_id!r} (never used, or expired)",
        leader_id=-1,
    )


def list_transactions(
    state: MetadataState, request: pb.ListTransactionsRequest, coordinator_id: int, now_ms: int
) -> pb.ListTransactionsResponse:
    unknown = sorted(set(request.states) - TXN_STATE_NAMES)
    if unknown:
        return pb.ListTransactionsResponse(
            error=pb.Error(
                code=pb.INVALID_REQUEST,
                message=f"unknown transaction states {unknown}; expected some of "
                f"{sorted(TXN_STATE_NAMES)}",
                leader_id=-1,
            )
        )
    wanted = set(request.states)
    return pb.ListTransactionsResponse(
        transactions=[
            transaction_info(txn, coordinator_id)
            for txn in sorted(state.transactions(), key=lambda t: t.transactional_id)
            if not wanted or txn.state.value in wanted
        ],
        now_ms=now_ms,
    )


def describe_transaction(
    state: MetadataState, transactional_id: str, coordinator_id: int, now_ms: int
) -> pb.DescribeTransactionResponse:
    error = bad_transactional_id(transactional_id)
    txn = state.transaction(transactional_id) if error is None else None
    if error is None and txn is None:
        error = _not_found(transactional_id)
    if error is not None or txn is None:
        return pb.DescribeTransactionResponse(error=error)
    return pb.DescribeTransactionResponse(
        transaction=transaction_info(txn, coordinator_id), now_ms=now_ms
    )


@dataclass(frozen=True, slots=True)
class AbortWait:
    """The abort is decided (or was already): wait for the completion of this producer's."""

    producer_id: int


def plan_abort(
    state: MetadataState, transactional_id: str, now_ms: int
) -> PrepareEndTransaction | AbortWait | pb.Error:
    """The command that aborts `transactional_id`'s open transaction; AbortWait when an abort
    is already under way; else why nothing can be aborted."""
    error = bad_transactional_id(transactional_id)
    if error is not None:
        return error
    txn = state.transaction(transactional_id)
    if txn is None:
        return _not_found(transactional_id)
    if txn.state is TxnState.ONGOING:
        return PrepareEndTransaction(
            transactional_id, txn.producer_id, txn.producer_epoch, False, True, now_ms
        )
    if txn.state is TxnState.PREPARE_ABORT:
        return AbortWait(txn.producer_id)
    what = (
        "is committing (its COMMIT markers are being written)"
        if txn.state is TxnState.PREPARE_COMMIT
        else "has no transaction open"
    )
    return pb.Error(
        code=pb.INVALID_TXN_STATE,
        message=f"transactional id {transactional_id!r} {what}: state {txn.state.value}",
        leader_id=-1,
    )


def abort_done(state: MetadataState, transactional_id: str, wait: AbortWait) -> bool:
    """Whether the abort being waited for has completed (its markers are all written): the
    id left PrepareAbort, or is gone, or belongs to another producer id by now."""
    txn = state.transaction(transactional_id)
    return (
        txn is None
        or txn.producer_id != wait.producer_id
        or txn.state is not TxnState.PREPARE_ABORT
    )
