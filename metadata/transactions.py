"""The transaction coordinator's replicated state: one `TransactionState` per transactional id,
and the rules by which it may change (Kafka's TransactionMetadata, KIP-98, KIP-890).

Theory of operation. The controller is every transactional id's coordinator, and the state of
each id lives in the metadata state like consumer groups' committed offsets: it changes only
by metadata commands (`raftlog.metadata.commands`: InitTransaction, AddToTransaction,
PrepareEndTransaction, CompleteEndTransaction, CommitTransactionOffsets), committed by Raft
before anyone is answered, so a new controller carries on from what it applied. This module
holds the record, the transition table as data and the read-only checks of those commands;
`MetadataState` holds the records and carries the effects out.

The life of an id (Kafka's states; `Dead` is an expired id, kept for the table):

    (none) -InitTransaction-> Empty -AddToTransaction-> Ongoing -PrepareEndTransaction->
    PrepareCommit | PrepareAbort -CompleteEndTransaction-> CompleteCommit | CompleteAbort
    -AddToTransaction-> Ongoing ...   (InitTransaction again from Empty/Complete*: epoch bump)

Epochs, a worked example. InitTransaction gives producer id 7 epoch 0; a transaction at
epoch 0; EndTxn v5 (KIP-890 part 2) moves Ongoing -> PrepareCommit *and* bumps the epoch to 1
(last_producer_epoch 0), so the markers and the next transaction use epoch 1, and a produce
delayed from the ended transaction (epoch 0) is refused by the partition instead of joining
the next. A second instance calling InitProducerId while a transaction is Ongoing fences the
first: PrepareAbort at epoch+1, markers, CompleteAbort, then its retry bumps once more. An
epoch at `PRODUCER_EPOCH_MAX - 1` is spent (`epoch_exhausted`): the next InitTransaction takes
a new producer id at epoch 0 (Kafka's producer id rotation).

Rotation at the end of a transaction, a worked example (Kafka's nextProducerId and
previousProducerId, KIP-890 part 2). Producer id 7 at epoch 32766 (spent: a fence needs one
more) ends its transaction with EndTxn v5 (or the gRPC EndTxn). The coordinator allocates
producer id 9 and commits PrepareCommit at 7/32767 with `next_producer_id` 9: the markers
are written as 7/32767, and the answer is 9/0, the producer the client uses next.
CompleteEndTransaction moves the id to 9/0 with `previous_producer_id` 7, so a client that
lost the answer and retries EndTxn (7/32766), or recovers with InitProducerId (KIP-360)
passing 7/32766, is recognised as the producer it was, not fenced; once 9 has moved past
epoch 0, or rotated again, 7 is fenced like any older producer.

Pending transactional offsets: TxnOffsetCommit's offsets wait per (consumer group, producer
id) and become the group's committed offsets only when CompleteEndTransaction of a commit
applies; an abort drops them (KIP-98, KIP-447).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from raftlog.metadata.commands import NO_PRODUCER_ID

if TYPE_CHECKING:
    from raftlog.metadata.state import MetadataState

__all__ = [
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "PRODUCER_EPOCH_MAX",
    "TRANSACTIONAL_IDS_MAX",
    "TRANSACTIONAL_ID_CHARS_MAX",
    "TRANSACTIONAL_ID_EXPIRATION_MS",
    "TRANSACTION_TIMEOUT_MS_MAX",
    "VALID_PREVIOUS_STATES",
    "TransactionState",
    "TxnState",
    "epoch_exhausted",
    "partition_in_transaction",
]

NO_PRODUCER_EPOCH = -1  # last_producer_epoch before any bump of this producer id
PRODUCER_EPOCH_MAX = (1 << 15) - 1  # a producer epoch is Kafka's int16
TRANSACTIONAL_ID_CHARS_MAX = 255
# Transactional ids the metadata state holds at most (ids are not expired yet, so this is what
# bounds the state; a new id past it gets INVALID_REQUEST).
TRANSACTIONAL_IDS_MAX = 100_000
# Kafka's transactional.id.expiration.ms default (7 days): an id unused that long, with no
# transaction open, is forgotten by the coordinator.
TRANSACTIONAL_ID_EXPIRATION_MS = 7 * 24 * 3600 * 1000
# Kafka's transaction.max.timeout.ms default (15 minutes): a longer timeout is refused with
# INVALID_TRANSACTION_TIMEOUT.
TRANSACTION_TIMEOUT_MS_MAX = 900_000


class TxnState(enum.Enum):
    """Kafka's transaction states (the values are the names Kafka's tools print)."""

    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    DEAD = "Dead"

    @property
    def preparing(self) -> bool:
        """A commit or abort decided, its markers not all written yet."""
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)

    @property
    def ended(self) -> bool:
        """No transaction open: a new one, or a new epoch, may start."""
        return self in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)


# Kafka's TransactionMetadata transition table: state -> the states it may be entered from.
# A fresh id enters Empty from nothing. PrepareAbort from an ended state is KIP-890's abort of
# an empty transaction with an epoch bump; raftlog never proposes it but the table is Kafka's.
VALID_PREVIOUS_STATES: Mapping[TxnState, frozenset[TxnState]] = {
    TxnState.EMPTY: frozenset({TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT}),
    TxnState.ONGOING: frozenset(
        {TxnState.ONGOING, TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT}
    ),
    TxnState.PREPARE_COMMIT: frozenset({TxnState.ONGOING}),
    TxnState.PREPARE_ABORT: frozenset(
        {TxnState.ONGOING, TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT}
    ),
    TxnState.COMPLETE_COMMIT: frozenset({TxnState.PREPARE_COMMIT}),
    TxnState.COMPLETE_ABORT: frozenset({TxnState.PREPARE_ABORT}),
    TxnState.DEAD: frozenset({TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT}),
}


@dataclass(frozen=True, slots=True)
class TransactionState:
    """One transactional id as the coordinator holds it (Kafka's TransactionMetadata).

    `producer_epoch` is the epoch the producer must use; `last_producer_epoch` the one before
    the latest bump of the same producer id (NO_PRODUCER_EPOCH if none), which lets a retried
    InitProducerId or EndTxn whose answer was lost be recognised. `partitions` and `groups`
    are those of the open (or ending) transaction, empty once it completed. `started_ms` is
    when the open transaction began (its timeout runs from it), `updated_ms` the last change;
    both from the proposing controller's clock.

    `next_producer_id` is set only while an end that rotates the producer id completes (the
    epoch was spent; see the module docstring): the markers still carry `producer_id`, and
    completion switches to it at epoch 0. `previous_producer_id` is the producer id before the
    latest rotation (NO_PRODUCER_ID if none), by which a client that missed the rotation is
    recognised."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[tuple[str, int]]
    groups: frozenset[str]
    started_ms: int
    updated_ms: int
    next_producer_id: int = NO_PRODUCER_ID
    previous_producer_id: int = NO_PRODUCER_ID

    def __post_init__(self) -> None:
        assert 0 <= self.producer_epoch <= PRODUCER_EPOCH_MAX, self
        assert NO_PRODUCER_EPOCH <= self.last_producer_epoch <= PRODUCER_EPOCH_MAX, self
        assert not (self.state.ended and (self.partitions or self.groups)), self
        assert self.next_producer_id == NO_PRODUCER_ID or self.state.preparing, self
        assert self.producer_id not in (self.next_producer_id, self.previous_producer_id), self

    def is_producer(self, producer_id: int, producer_epoch: int) -> bool:
        """Whether (producer_id, producer_epoch) is this id's current producer."""
        return self.producer_id == producer_id and self.producer_epoch == producer_epoch

    def producer_after_end(self) -> tuple[int, int]:
        """The producer id and epoch the producer uses once the ending transaction completed:
        what EndTxn answers (the next producer id at epoch 0 when the end rotates)."""
        if self.next_producer_id != NO_PRODUCER_ID:
            return self.next_producer_id, 0
        return self.producer_id, self.producer_epoch

    def rotated_from(self, producer_id: int, producer_epoch: int) -> bool:
        """Whether (producer_id, producer_epoch) is the producer this id had just before its
        latest producer id rotation, which its client may not have heard of: the previous
        producer id at a spent epoch, while the new producer id is still at epoch 0 (Kafka's
        retryOnOverflow and KIP-360's check of the previous producer id)."""
        return (
            producer_id == self.previous_producer_id != NO_PRODUCER_ID
            and epoch_exhausted(producer_epoch)
            and self.producer_epoch == 0
        )

    def expired(self, now_ms: int, expiration_ms: int) -> bool:
        """No transaction open and unchanged for `expiration_ms`: the id may be forgotten."""
        return self.state.ended and now_ms - self.updated_ms > expiration_ms

    def timed_out(self, now_ms: int) -> bool:
        """An open transaction older than its timeout (the coordinator aborts it)."""
        return self.state is TxnState.ONGOING and now_ms - self.started_ms > self.timeout_ms


def epoch_exhausted(epoch: int) -> bool:
    """No bump is left for this producer id: fencing needs one more epoch than the producer's
    (Kafka's isProducerEpochExhausted), so a new producer id is taken instead."""
    return epoch >= PRODUCER_EPOCH_MAX - 1


def partition_in_transaction(
    state: MetadataState, producer_id: int, producer_epoch: int, topic: str, partition: int
) -> bool:
    """True iff some transactional id's transaction is Ongoing with this producer id and epoch
    and has `(topic, partition)` added: the check a partition leader makes before accepting
    the first transactional batch of a transaction (KIP-890 part 1)."""
    txn = state.transaction_of_producer(producer_id)
    return (
        txn is not None
        and txn.state is TxnState.ONGOING
        and txn.is_producer(producer_id, producer_epoch)
        and (topic, partition) in txn.partitions
    )
