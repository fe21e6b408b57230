"""The transaction coordinator's decisions: from the metadata state and a client's request to
the command to propose, or the answer to give without writing (Kafka's
TransactionCoordinator.handleInitProducerId and handleEndTransaction).

Theory of operation. Pure functions: the Kafka handlers call them on the controller, propose
the command they return through Raft, and answer once it applied. The command's check runs
again at apply against whatever committed meanwhile, so a plan made from a state another
request has since changed is rejected there, never applied twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from raftlog.metadata.commands import (
    ErrorCode,
    InitTransaction,
    PrepareEndTransaction,
)
from raftlog.metadata.transactions import (
    NO_PRODUCER_ID,
    TransactionState,
    TxnState,
    epoch_exhausted,
)

if TYPE_CHECKING:
    from raftlog.metadata.state import MetadataState

__all__ = [
    "NO_PRODUCER_ID",
    "Answer",
    "EndPlan",
    "InitPlan",
    "needs_new_producer_id",
    "needs_next_producer_id",
    "plan_end_txn",
    "plan_init",
]


@dataclass(frozen=True, slots=True)
class Answer:
    """What to answer without proposing anything: an error code, or the producer as it is."""

    code: ErrorCode
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = -1


@dataclass(frozen=True, slots=True)
class InitPlan:
    """Propose `command`; then answer `then` (CONCURRENT_TRANSACTIONS when the command only
    aborts the open transaction first), else the producer id and epoch it installed."""

    command: InitTransaction | PrepareEndTransaction
    then: ErrorCode = ErrorCode.NONE


def plan_init(
    state: MetadataState,
    transactional_id: str,
    timeout_ms: int,
    expected: tuple[int, int] | None,
    new_producer_id: int | None,
    now_ms: int,
) -> InitPlan | Answer:
    """InitProducerId of a transactional id. `expected` is the (producer id, epoch) a client
    passed to recover (KIP-360), `new_producer_id` a fresh id from the allocator (None: not
    needed, ask `needs_new_producer_id` first)."""
    txn = state.transaction(transactional_id)
    if txn is None or txn.state is TxnState.DEAD:
        assert new_producer_id is not None
        return InitPlan(InitTransaction(transactional_id, new_producer_id, 0, timeout_ms, now_ms))
    if expected is not None and txn.rotated_from(*expected):
        # A client that missed the rotation of its spent producer id (an EndTxn or
        # InitProducerId answer lost): it is the producer now at epoch 0 of the new id.
        expected = (txn.producer_id, 0)
    if expected is not None and not (
        expected[0] == txn.producer_id
        and expected[1] in (txn.producer_epoch, txn.last_producer_epoch)
    ):
        # KIP-360: a client that is not the id's current producer (or the one just before the
        # last bump) was fenced.
        return Answer(ErrorCode.PRODUCER_FENCED)
    if txn.state.preparing:
        return Answer(ErrorCode.CONCURRENT_TRANSACTIONS)
    if txn.state is TxnState.ONGOING:
        # Fence the older instance: abort its transaction at a bumped epoch. The client retries
        # and gets one more bump once the abort completed (Kafka's prepareFenceProducerEpoch).
        fence = PrepareEndTransaction(
            transactional_id, txn.producer_id, txn.producer_epoch, False, True, now_ms
        )
        return InitPlan(fence, then=ErrorCode.CONCURRENT_TRANSACTIONS)
    if expected is not None and expected[1] == txn.last_producer_epoch != txn.producer_epoch:
        # A retry whose answer was lost: the bump it asked for already happened.
        return Answer(ErrorCode.NONE, txn.producer_id, txn.producer_epoch)
    if epoch_exhausted(txn.producer_epoch):
        assert new_producer_id is not None
        return InitPlan(InitTransaction(transactional_id, new_producer_id, 0, timeout_ms, now_ms))
    return InitPlan(
        InitTransaction(
            transactional_id, txn.producer_id, txn.producer_epoch + 1, timeout_ms, now_ms
        )
    )


def needs_new_producer_id(state: MetadataState, transactional_id: str) -> bool:
    """Whether `plan_init` may need a fresh producer id for this id (new, or epochs spent)."""
    txn = state.transaction(transactional_id)
    return txn is None or txn.state is TxnState.DEAD or epoch_exhausted(txn.producer_epoch)


def _rotates(txn: TransactionState | None, bump_epoch: bool) -> bool:
    """Whether ending `txn` now rotates its producer id: an end that bumps a spent epoch."""
    return (
        bump_epoch
        and txn is not None
        and txn.state is TxnState.ONGOING
        and epoch_exhausted(txn.producer_epoch)
    )


def needs_next_producer_id(state: MetadataState, transactional_id: str, bump_epoch: bool) -> bool:
    """Whether `plan_end_txn` needs a fresh producer id to rotate to (allocate it first)."""
    return _rotates(state.transaction(transactional_id), bump_epoch)


@dataclass(frozen=True, slots=True)
class EndPlan:
    command: PrepareEndTransaction


def plan_end_txn(
    state: MetadataState,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    bump_epoch: bool,
    now_ms: int,
    next_producer_id: int | None = None,
) -> EndPlan | Answer:
    """EndTxn. A retry of an EndTxn that already decided the same outcome (its answer lost)
    gets NONE and the producer the next transaction uses, as Kafka answers it (with EndTxn v5
    the retry carries the epoch before the bump, and after a rotation the previous producer
    id); the other outcome is INVALID_TXN_STATE. Everything else is the command's check's to
    judge. `next_producer_id`: a fresh producer id, when `needs_next_producer_id` said so
    (an end that bumps a spent epoch rotates to it; without one that end is answered
    CONCURRENT_TRANSACTIONS, retriable)."""
    txn = state.transaction(transactional_id)
    if txn is not None and bump_epoch and txn.rotated_from(producer_id, producer_epoch):
        return _after_rotation(txn, commit)
    if txn is None or txn.producer_id != producer_id or txn.state is TxnState.ONGOING:
        next_id = NO_PRODUCER_ID
        if txn is not None and _rotates(txn, bump_epoch) and producer_id == txn.producer_id:
            if next_producer_id is None:
                return Answer(ErrorCode.CONCURRENT_TRANSACTIONS)  # the epoch was spent meanwhile
            next_id = next_producer_id
        command = PrepareEndTransaction(
            transactional_id, producer_id, producer_epoch, commit, bump_epoch, now_ms, next_id
        )
        return EndPlan(command)
    same_epoch = producer_epoch == txn.producer_epoch or (
        bump_epoch and producer_epoch == txn.last_producer_epoch
    )
    committed = txn.state in (TxnState.PREPARE_COMMIT, TxnState.COMPLETE_COMMIT)
    aborted = txn.state in (TxnState.PREPARE_ABORT, TxnState.COMPLETE_ABORT)
    if same_epoch and (committed or aborted):
        if committed != commit:
            return Answer(ErrorCode.INVALID_TXN_STATE)
        if txn.state.preparing and not bump_epoch:
            return Answer(ErrorCode.CONCURRENT_TRANSACTIONS)
        return Answer(ErrorCode.NONE, *txn.producer_after_end())
    if producer_epoch < txn.producer_epoch:
        return Answer(ErrorCode.PRODUCER_FENCED)
    if txn.state.preparing:
        return Answer(ErrorCode.CONCURRENT_TRANSACTIONS)
    return Answer(ErrorCode.INVALID_TXN_STATE)


def _after_rotation(txn: TransactionState, commit: bool) -> Answer:
    """EndTxn from the producer just before the rotation (Kafka's retryOnOverflow): the
    retry of the end that rotated, answered with the new producer if its outcome matches."""
    if txn.state not in (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT):
        return Answer(ErrorCode.PRODUCER_FENCED)  # the new producer id began a transaction
    if (txn.state is TxnState.COMPLETE_COMMIT) != commit:
        return Answer(ErrorCode.INVALID_TXN_STATE)
    return Answer(ErrorCode.NONE, txn.producer_id, txn.producer_epoch)
