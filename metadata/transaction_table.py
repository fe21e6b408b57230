"""The transactional ids and pending transactional offsets a `MetadataState` holds, and the
effects of the transaction commands on them (their checks are `transaction_checks.py`).

Theory of operation. `TransactionTable` is part of the metadata state: only
`MetadataState.apply` (after the command's check passed) and `restore` change it. Besides the
records it keeps one derived index, producer id -> transactional id, because a partition
leader asks `partition_in_transaction` on the produce path; `violations()` checks the index
against the records, and snapshots carry only the records.
"""

from __future__ import annotations

from dataclasses import replace

from raftlog.metadata.commands import (
    AddToTransaction,
    CommitTransactionOffsets,
    CompleteEndTransaction,
    ExpireTransactionalId,
    InitTransaction,
    PrepareEndTransaction,
    committed_offsets_of,
)
from raftlog.metadata.model import CommittedOffset
from raftlog.metadata.transactions import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    PRODUCER_EPOCH_MAX,
    VALID_PREVIOUS_STATES,
    TransactionState,
    TxnState,
)

__all__ = ["GroupOffsets", "PendingKey", "TransactionTable"]

GroupOffsets = dict[str, dict[tuple[str, int], CommittedOffset]]
PendingKey = tuple[str, int]  # (consumer group id, producer id)


class TransactionTable:
    def __init__(self) -> None:
        self.transactions: dict[str, TransactionState] = {}
        self.pending_offsets: dict[PendingKey, dict[tuple[str, int], CommittedOffset]] = {}
        self._by_producer: dict[int, str] = {}

    # ---- queries ---------------------------------------------------------------------

    def get(self, transactional_id: str) -> TransactionState | None:
        return self.transactions.get(transactional_id)

    def of_producer(self, producer_id: int) -> TransactionState | None:
        transactional_id = self._by_producer.get(producer_id)
        return None if transactional_id is None else self.transactions[transactional_id]

    def has_pending_offsets(self, group_id: str) -> bool:
        return any(group == group_id for group, _ in self.pending_offsets)

    # ---- effects (each after its check passed) ------------------------------------------

    def put(self, updated: TransactionState) -> None:
        """Stores `updated` as its id's state, asserting Kafka's transition table."""
        previous = self.transactions.get(updated.transactional_id)
        if previous is None:
            assert updated.state is TxnState.EMPTY, updated
        else:
            assert previous.state in VALID_PREVIOUS_STATES[updated.state], (previous, updated)
            if previous.producer_id != updated.producer_id:
                del self._by_producer[previous.producer_id]
        self.transactions[updated.transactional_id] = updated
        self._by_producer[updated.producer_id] = updated.transactional_id

    def init(self, command: InitTransaction) -> None:
        previous = self.transactions.get(command.transactional_id)
        same_producer = previous is not None and previous.producer_id == command.producer_id
        if previous is None:
            previous_producer_id = NO_PRODUCER_ID
        elif same_producer:
            previous_producer_id = previous.previous_producer_id
        else:
            previous_producer_id = previous.producer_id  # rotated: its epochs were spent
        self.put(
            TransactionState(
                transactional_id=command.transactional_id,
                producer_id=command.producer_id,
                producer_epoch=command.producer_epoch,
                last_producer_epoch=previous.producer_epoch
                if previous is not None and same_producer
                else NO_PRODUCER_EPOCH,
                timeout_ms=command.timeout_ms,
                state=TxnState.EMPTY,
                partitions=frozenset(),
                groups=frozenset(),
                started_ms=command.now_ms,
                updated_ms=command.now_ms,
                previous_producer_id=previous_producer_id,
            )
        )

    def add(self, command: AddToTransaction) -> None:
        txn = self.transactions[command.transactional_id]
        starting = txn.state is not TxnState.ONGOING
        self.put(
            replace(
                txn,
                state=TxnState.ONGOING,
                partitions=txn.partitions | {(t, int(p)) for t, p in command.partitions},
                groups=txn.groups | set(command.groups),
                started_ms=command.now_ms if starting else txn.started_ms,
                updated_ms=command.now_ms,
            )
        )

    def prepare_end(self, command: PrepareEndTransaction) -> None:
        txn = self.transactions[command.transactional_id]
        # An epoch at the int16 maximum cannot be bumped (a producer never holds it: its
        # epochs are spent one before, and an EndTxn then rotates with `next_producer_id`).
        bump = command.bump_epoch and txn.producer_epoch < PRODUCER_EPOCH_MAX
        self.put(
            replace(
                txn,
                state=TxnState.PREPARE_COMMIT if command.commit else TxnState.PREPARE_ABORT,
                producer_epoch=txn.producer_epoch + 1 if bump else txn.producer_epoch,
                last_producer_epoch=txn.producer_epoch if bump else txn.last_producer_epoch,
                updated_ms=command.now_ms,
                next_producer_id=command.next_producer_id,
            )
        )

    def complete_end(self, command: CompleteEndTransaction, group_offsets: GroupOffsets) -> None:
        """Ends the transaction; a commit's pending offsets join `group_offsets` (the state's
        committed offsets), an abort's are dropped."""
        txn = self.transactions[command.transactional_id]
        commit = txn.state is TxnState.PREPARE_COMMIT
        for group_id in sorted(txn.groups):
            pending = self.pending_offsets.pop((group_id, txn.producer_id), {})
            if commit and pending:
                group_offsets.setdefault(group_id, {}).update(pending)
        rotating = txn.next_producer_id != NO_PRODUCER_ID
        # A rotation moves the id to its next producer id now: the markers were written with
        # the spent one.
        self.put(
            replace(
                txn,
                state=TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT,
                partitions=frozenset(),
                groups=frozenset(),
                updated_ms=command.now_ms,
                producer_id=txn.next_producer_id if rotating else txn.producer_id,
                producer_epoch=0 if rotating else txn.producer_epoch,
                last_producer_epoch=NO_PRODUCER_EPOCH if rotating else txn.last_producer_epoch,
                next_producer_id=NO_PRODUCER_ID,
                previous_producer_id=txn.producer_id if rotating else txn.previous_producer_id,
            )
        )

    def commit_offsets(self, command: CommitTransactionOffsets) -> None:
        pending = self.pending_offsets.setdefault((command.group_id, command.producer_id), {})
        pending.update(committed_offsets_of(command))

    def expire(self, command: ExpireTransactionalId) -> None:
        txn = self.transactions.pop(command.transactional_id)
        assert txn.state.ended and self._by_producer[txn.producer_id] == txn.transactional_id
        del self._by_producer[txn.producer_id]

    def drop_topic(self, topic: str) -> None:
        """A deleted topic's pending offsets go with it (its committed ones do too)."""
        for key, offsets in list(self.pending_offsets.items()):
            kept = {tp: o for tp, o in offsets.items() if tp[0] != topic}
            if kept:
                self.pending_offsets[key] = kept
            else:
                del self.pending_offsets[key]

    def restore(
        self,
        transactions: dict[str, TransactionState],
        pending_offsets: dict[PendingKey, dict[tuple[str, int], CommittedOffset]],
    ) -> None:
        self.transactions = transactions
        self.pending_offsets = pending_offsets
        self._by_producer = {t.producer_id: t.transactional_id for t in transactions.values()}

    # ---- invariants --------------------------------------------------------------------

    def violations(self) -> list[str]:
        violations = []
        if len(self._by_producer) != len(self.transactions):
            violations.append("two transactional ids share a producer id")
        for transactional_id, txn in self.transactions.items():
            if txn.transactional_id != transactional_id:
                violations.append(f"transactional id {transactional_id!r} filed under another")
            if txn.next_producer_id != NO_PRODUCER_ID and txn.next_producer_id in self._by_producer:
                violations.append(f"the next producer id of {transactional_id!r} is in use")
        for (group_id, producer_id), offsets in self.pending_offsets.items():
            owner = self.of_producer(producer_id)
            open_ = owner is not None and (owner.state is TxnState.ONGOING or owner.state.preparing)
            if not offsets or owner is None or not open_:
                violations.append(f"pending offsets of {group_id!r} outside an open transaction")
            elif group_id not in owner.groups:
                violations.append(f"pending offsets of {group_id!r} not in the transaction")
        return violations
