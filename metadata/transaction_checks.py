"""The checks of the transaction commands: what `MetadataState.apply` would reject, and with
which of Kafka's codes (the coordinator turns them into the wire's codes as they are).

As `checks.py`: read-only, run by the controller before proposing and by every node again
before the effect, so two requests racing for one transactional id cannot both pass against
the same state (the second is checked against what the first did). The order of the checks
is Kafka's TransactionCoordinator's: the producer id, then the epoch, then the state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raftlog.metadata import checks
from raftlog.metadata.commands import (
    OFFSETS_PER_COMMIT_MAX,
    AddToTransaction,
    ApplyResult,
    CommitTransactionOffsets,
    CompleteEndTransaction,
    ErrorCode,
    ExpireTransactionalId,
    InitTransaction,
    PrepareEndTransaction,
    reject,
)
from raftlog.metadata.transactions import (
    NO_PRODUCER_ID,
    PRODUCER_EPOCH_MAX,
    TRANSACTION_TIMEOUT_MS_MAX,
    TRANSACTIONAL_ID_CHARS_MAX,
    TRANSACTIONAL_IDS_MAX,
    TransactionState,
    TxnState,
    epoch_exhausted,
)

if TYPE_CHECKING:
    from raftlog.metadata.state import MetadataState

__all__ = [
    "check_add_to_transaction",
    "check_commit_transaction_offsets",
    "check_complete_end_transaction",
    "check_expire_transactional_id",
    "check_init_transaction",
    "check_prepare_end_transaction",
    "check_transactional_id",
    "producer_problem",
]


def check_transactional_id(transactional_id: str) -> ApplyResult | None:
    return checks.id_length("transactional id", transactional_id, TRANSACTIONAL_ID_CHARS_MAX)


def producer_problem(
    txn: TransactionState | None, transactional_id: str, producer_id: int, producer_epoch: int
) -> ApplyResult | None:
    """Whether (producer_id, producer_epoch) is the id's producer: INVALID_PRODUCER_ID_MAPPING
    for an unknown id or another producer id, PRODUCER_FENCED for an older epoch (another
    instance took over, or the coordinator aborted on timeout), INVALID_PRODUCER_EPOCH for a
    newer one (it never handed it out)."""
    if txn is None or txn.producer_id != producer_id:
        owner = "no producer id" if txn is None else f"producer id {txn.producer_id}"
        return reject(
            ErrorCode.INVALID_PRODUCER_ID_MAPPING,
            f"transactional id {transactional_id!r} has {owner}, not {producer_id}",
        )
    if producer_epoch != txn.producer_epoch:
        code = (
            ErrorCode.PRODUCER_FENCED
            if producer_epoch < txn.producer_epoch
            else ErrorCode.INVALID_PRODUCER_EPOCH
        )
        return reject(
            code,
            f"transactional id {transactional_id!r} is at epoch {txn.producer_epoch}, "
            f"the request at {producer_epoch}",
        )
    return None


_ProducerCommand = (
    AddToTransaction | PrepareEndTransaction | CompleteEndTransaction | CommitTransactionOffsets
)


def _producer_of(
    state: MetadataState, command: _ProducerCommand
) -> tuple[TransactionState | None, ApplyResult | None]:
    """The command's transactional id's state, and why its producer may not send it."""
    txn = state.transaction(command.transactional_id)
    return txn, producer_problem(
        txn, command.transactional_id, command.producer_id, command.producer_epoch
    )


def _state_problem(txn: TransactionState, allowed: frozenset[TxnState]) -> ApplyResult | None:
    """CONCURRENT_TRANSACTIONS while a commit or abort completes (retriable), else
    INVALID_TXN_STATE for a state the request cannot be served in."""
    if txn.state in allowed:
        return None
    code = ErrorCode.CONCURRENT_TRANSACTIONS if txn.state.preparing else ErrorCode.INVALID_TXN_STATE
    return reject(code, f"transactional id {txn.transactional_id!r} is {txn.state.value}")


_ADDABLE = frozenset(
    {TxnState.EMPTY, TxnState.ONGOING, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT}
)


def check_init_transaction(state: MetadataState, command: InitTransaction) -> ApplyResult | None:
    problem = check_transactional_id(command.transactional_id)
    if problem is None and not 1 <= command.timeout_ms <= TRANSACTION_TIMEOUT_MS_MAX:
        problem = reject(
            ErrorCode.INVALID_TRANSACTION_TIMEOUT,
            f"transaction timeout {command.timeout_ms} ms outside "
            f"[1, {TRANSACTION_TIMEOUT_MS_MAX}]",
        )
    if problem is not None:
        return problem
    txn = state.transaction(command.transactional_id)
    if txn is None and state.transaction_count() >= TRANSACTIONAL_IDS_MAX:
        return reject(
            ErrorCode.INVALID_REQUEST, f"{TRANSACTIONAL_IDS_MAX} transactional ids already held"
        )
    if txn is not None and not (txn.state.ended or txn.state is TxnState.DEAD):
        return reject(
            ErrorCode.CONCURRENT_TRANSACTIONS,
            f"transactional id {txn.transactional_id!r} is {txn.state.value}: it ends first",
        )
    bumped = (
        txn is not None
        and command.producer_id == txn.producer_id
        and command.producer_epoch == txn.producer_epoch + 1 <= PRODUCER_EPOCH_MAX
    )
    owner = state.transaction_of_producer(command.producer_id)
    fresh = (
        command.producer_epoch == 0
        and command.producer_id < state.next_producer_id
        and owner is None
    )
    if not (bumped or fresh):
        # Planned against a state another request changed first (two InitProducerId of one
        # id racing): retriable, the retry plans against the new state.
        return reject(
            ErrorCode.CONCURRENT_TRANSACTIONS,
            f"producer id {command.producer_id} epoch {command.producer_epoch} does not follow "
            f"{None if txn is None else (txn.producer_id, txn.producer_epoch)} (a stale plan)",
        )
    return None


def check_add_to_transaction(state: MetadataState, command: AddToTransaction) -> ApplyResult | None:
    txn, problem = _producer_of(state, command)
    if problem is not None or txn is None:
        return problem
    count = len(command.partitions) + len(command.groups)
    if not 1 <= count <= OFFSETS_PER_COMMIT_MAX or len(txn.partitions) + count > (
        OFFSETS_PER_COMMIT_MAX
    ):
        return reject(
            ErrorCode.INVALID_REQUEST,
            f"a transaction holds 1-{OFFSETS_PER_COMMIT_MAX} partitions and groups",
        )
    for topic, partition in command.partitions:
        problem = problem or checks.partition_known(state, topic, partition)
    for group_id in command.groups:
        problem = problem or checks.consumer_group_id(group_id)
    return problem or _state_problem(txn, _ADDABLE)


def check_prepare_end_transaction(
    state: MetadataState, command: PrepareEndTransaction
) -> ApplyResult | None:
    txn, problem = _producer_of(state, command)
    if problem is not None or txn is None:
        return problem
    return _state_problem(txn, frozenset({TxnState.ONGOING})) or _rotation_problem(
        state, txn, command
    )


def _rotation_problem(
    state: MetadataState, txn: TransactionState, command: PrepareEndTransaction
) -> ApplyResult | None:
    """A next producer id is for an end that bumps a spent epoch only, and must be one the
    allocator gave out that no transactional id holds (the allocator never gives one twice,
    so only a malformed command fails this)."""
    next_id = command.next_producer_id
    if next_id == NO_PRODUCER_ID:
        return None
    if not (command.bump_epoch and epoch_exhausted(txn.producer_epoch)):
        return reject(
            ErrorCode.INVALID_REQUEST,
            f"producer id {txn.producer_id} epoch {txn.producer_epoch} is not spent: no rotation",
        )
    if not next_id < state.next_producer_id or state.transaction_of_producer(next_id) is not None:
        return reject(
            ErrorCode.INVALID_REQUEST, f"producer id {next_id} is not allocated or is in use"
        )
    return None


def check_complete_end_transaction(
    state: MetadataState, command: CompleteEndTransaction
) -> ApplyResult | None:
    txn, problem = _producer_of(state, command)
    if problem is None and txn is not None and not txn.state.preparing:
        problem = reject(
            ErrorCode.INVALID_TXN_STATE,
            f"transactional id {txn.transactional_id!r} is {txn.state.value}, not preparing",
        )
    return problem


def check_commit_transaction_offsets(
    state: MetadataState, command: CommitTransactionOffsets
) -> ApplyResult | None:
    txn, problem = _producer_of(state, command)
    if problem is not None or txn is None:
        return problem
    problem = _state_problem(txn, frozenset({TxnState.ONGOING}))
    if problem is None and command.group_id not in txn.groups:
        # AddOffsetsToTxn first: otherwise no marker's completion would ever apply them.
        problem = reject(
            ErrorCode.INVALID_TXN_STATE,
            f"consumer group {command.group_id!r} was not added to the transaction",
        )
    return problem or checks.check_offsets(state, command)


def check_expire_transactional_id(
    state: MetadataState, command: ExpireTransactionalId
) -> ApplyResult | None:
    """Checked at apply against the id as it is then: an InitProducerId or a new transaction
    applied after the controller decided keeps the id."""
    txn = state.transaction(command.transactional_id)
    if txn is None or not txn.expired(command.now_ms, command.expiration_ms):
        return reject(
            ErrorCode.CONCURRENT_TRANSACTIONS,
            f"transactional id {command.transactional_id!r} is in use",
        )
    return None
