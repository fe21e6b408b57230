"""A partition replica: produce with acks, idempotence, committed-only fetch.

Theory of operation. A partition is one Raft group whose log is the partition's segmented
log; this class is that group's state machine and the place produce and fetch requests land.

Produce (leader only): each batch is checked at the header level (length, magic, CRC32C,
size bound: `raftlog.storage.batch.verify_batch`) and, once, at the records' framing
(`raftlog.storage.records.validate_records`: nothing a consumer cannot decode is stored),
checked against the idempotent-producer table,
then proposed as one Raft entry occupying `record_count` offsets. The storage layer patches the
batch's base offset and leader epoch (the Raft term) when it appends. The answer waits for the
requested acks: 0 = appended, 1 = durable on this leader, all = committed by a majority.

Transactions (docs/transactions.md). A transactional batch opens its producer's transaction
here; the first one of a transaction is accepted only if `txn_verifier` (the node's copy of
the coordinator's state, KIP-890 part 1) shows this partition in that producer's ongoing
transaction at that epoch, else INVALID_TXN_STATE and nothing is written. The coordinator
ends it with a COMMIT or ABORT marker (`write_txn_marker`), one control batch through Raft.
The last stable offset (LSO) is the first offset of the earliest open transaction, capped
at the high watermark and at the applied offset + 1 (the producer table knows no later
transaction); read_committed fetches stop there and carry the aborted transactions of what
they return, from the aborted-transaction index (`raftlog.storage.txn_index`: one file
beside each segment, appended as ABORT markers are applied, deleted and cut with its
segment). The index is flushed before each checkpoint, so a restart finds on disk every
entry up to the checkpoint and re-derives the later ones by re-applying the log; a damaged
index file makes the replica distrust its checkpoint and re-apply from its snapshot or the
log start instead. A table restored from a snapshot may be ahead of the snapshot's offset:
the entries it accounts for above that offset travel with it and wait in `_carried` until
their markers are applied.

High watermark = commit offset + 1 (exclusive, as in Kafka). Fetch returns whole batches
strictly below it, never a byte above: a batch that straddles the watermark cannot exist,
because commit offsets always land on entry boundaries.

Leader readiness. A newly elected leader's commit offset may trail the previous leader's until
it commits its first entry (its no-op, Raft §8). Until then it answers produce and fetch with a
retriable LeaderNotReadyError. That keeps two promises: a client never sees the high watermark
go backward across a leader change, and the producer table the leader checks against is
complete (every entry before the no-op has been applied) so a retry cannot slip in twice.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from raftlog.config import LogConfig
from raftlog.errors import (
    BatchOverSegmentError,
    BatchTooLargeError,
    CorruptBatchError,
    InvalidTxnStateError,
    LeaderNotReadyError,
    NotLeaderError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    RequestTimedOutError,
    TransactionCoordinatorFencedError,
)
from raftlog.partition.checkpoint import CheckpointStore, PartitionCheckpoint
from raftlog.partition.producer_state import (
    PRODUCERS_MAX_DEFAULT,
    AbortedTxn,
    ProducerStateTable,
    Verdict,
    decode_aborted,
)
from raftlog.raft.types import Entry, EntryKind, Membership, Role, Snapshot, SnapshotMeta
from raftlog.runtime.group import RaftGroup
from raftlog.storage.batch import BatchHeader, Compression, parse_header, verify_batch
from raftlog.storage.compression import CompressionError
from raftlog.storage.file_system import FileSystem
from raftlog.storage.recompression import recompress_batch
from raftlog.storage.records import decode_txn_marker, encode_txn_marker, validate_records
from raftlog.storage.sim_file_system import SimFileSystem
from raftlog.storage.txn_index import TransactionIndex
from raftlog.types import Commitment, Offset, Term

__all__ = [
    "AbortedTransaction",
    "FetchResult",
    "OffsetSpec",
    "PartitionLog",
    "PartitionReplica",
    "ProduceResult",
    "ProducerDescription",
    "TxnVerifier",
]

# KIP-890 part 1: whether the coordinator (the node's metadata copy) has this partition in
# the producer's ongoing transaction at this epoch, (producer id, producer epoch) -> bool;
# it may wait a short bounded time for the copy to catch up.
TxnVerifier = Callable[[int, int], Awaitable[bool]]

_logger = logging.getLogger(__name__)


class PartitionLog(Protocol):
    """What a replica reads besides the Raft view: batches for consumers, in Kafka offsets
    (raftlog.storage.kafka_offsets: Raft's own entries take none)."""

    def log_start_offset(self) -> int: ...

    def kafka_offset(self, offset: int) -> int:
        """The Kafka offset of Raft offset `offset` (first offset to log end)."""
        ...

    def raft_offset(self, kafka_offset: int) -> int:
        """The Raft offset holding Kafka offset `kafka_offset`."""
        ...

    def set_kafka_start(self, kafka_offset: int) -> None:
        """The Kafka offset of the log's first offset (from the partition's snapshot)."""
        ...

    def read_kafka(
        self,
        kafka_offset: int,
        *,
        bytes_max: int,
        end_offset: int | None = None,
        skip_emptied: bool = False,
    ) -> bytes:
        """`read` from the batch holding `kafka_offset`, as clients see it: Raft's own
        batches left out, base offsets in Kafka offsets; `end_offset` is a Raft offset."""
        ...

    def read(
        self,
        offset: int,
        *,
        bytes_max: int,
        end_offset: int | None = None,
        skip_emptied: bool = False,
    ) -> bytes:
        """Whole batches from the one containing `offset` (at least one if any, unless it
        reaches `end_offset`), stopping before the first batch that reaches `end_offset`;
        with `skip_emptied`, without the batches compaction emptied of every record."""
        ...

    def offset_for_timestamp(self, timestamp_ms: int) -> int | None: ...


class RecoveryLog(Protocol):
    """What `PartitionReplica.recover` asks of the log it resumes on."""

    def snapshot(self) -> Snapshot | None: ...

    def last_offset(self) -> Offset: ...

    def term_at(self, offset: Offset) -> Term | None: ...


class _UnhostedLayout:
    """One segment in memory from offset 0: the aborted-transaction index of a replica
    without a segmented log (simulations, tests of other things)."""

    def __init__(self) -> None:
        self.files: FileSystem = SimFileSystem()
        self.directory = "/txn-index"
        self.files.make_directory(self.directory)

    @property
    def segment_base_offsets(self) -> tuple[int, ...]:
        return (0,)

    @property
    def log_end_offset(self) -> int:
        return 2**63 - 1

    @property
    def removal_count(self) -> int:
        return 0


class OffsetSpec(enum.IntEnum):
    EARLIEST = 0
    LATEST = 1
    TIMESTAMP = 2


@dataclass(frozen=True, slots=True)
class ProduceResult:
    base_offset: int
    last_offset: int
    high_watermark: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class AbortedTransaction:
    """An aborted transaction a read_committed fetch lists (Kafka's FetchResponse entry):
    records of `producer_id` from `first_offset` (a Kafka offset) on, up to its ABORT
    marker, are to be skipped."""

    producer_id: int
    first_offset: int


@dataclass(frozen=True, slots=True)
class ProducerDescription:
    """A producer as a partition's leader has it applied (Kafka's DescribeProducers entry);
    `current_txn_start_offset` (a Kafka offset) is -1 without an open transaction."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    coordinator_epoch: int
    current_txn_start_offset: int


@dataclass(frozen=True, slots=True)
class FetchResult:
    batches: bytes
    high_watermark: int
    log_start_offset: int
    leader_epoch: int
    last_stable_offset: int = -1  # Kafka offset; -1 where not computed (never by a replica)
    # None for read_uncommitted; the aborted transactions overlapping what is returned else.
    aborted_transactions: tuple[AbortedTransaction, ...] | None = None


class PartitionReplica:
    def __init__(
        self,
        *,
        topic: str,
        partition: int,
        log: PartitionLog,
        config: LogConfig,
        producers_max: int = PRODUCERS_MAX_DEFAULT,
        checkpoint: CheckpointStore | None = None,
        keys_required: Callable[[], bool] = lambda: False,
        txn_verifier: TxnVerifier | None = None,
        txn_index: TransactionIndex | None = None,
        log_start_floor: Callable[[], int] = lambda: 0,
        compression: Callable[[], Compression | None] = lambda: None,
    ) -> None:
        assert checkpoint is None or checkpoint.producers_max >= producers_max
        self.topic = topic
        self.partition = partition
        self._log = log
        self._config = config
        self._producers_max = producers_max
        self._committed_producers = ProducerStateTable(producers_max=producers_max)
        # The leader's view: committed state plus its own appends not yet committed.
        self._leader_producers: ProducerStateTable | None = None
        self._leader_producers_term = -1
        self._group: RaftGroup | None = None
        self._hw_advanced = asyncio.Event()
        # Last offset applied to the producer table (the core resumes after its snapshot).
        self._applied_offset = -1
        # None: no checkpoints (simulations, tests of other things); see checkpoint.py.
        self._checkpoint = checkpoint
        # Whether the topic is compacted now (its config may change while the replica runs).
        self._keys_required = keys_required
        # The Kafka offset DeleteRecords moved the log start to, as the metadata has it now:
        # replicated there, so every replica that leads later honours it.
        self._log_start_floor = log_start_floor
        # The codec the topic stores batches in now (None: each as its producer wrote it).
        self._compression = compression
        # None: transactional batches are not checked against the coordinator (the test-only
        # switch `kafka.txn_verification` off, or a replica outside a node).
        self._txn_verifier = txn_verifier
        # Producer id -> the verification its latest request awaits: a later request of the
        # producer waits for it first, so pipelined requests reach the log in their order.
        self._txn_verifying: dict[int, asyncio.Future[None]] = {}
        self._applied_bytes_since_checkpoint = 0
        self._applied_term = -1  # the term of the entry at _applied_offset
        # None: the index lives in memory (a replica without a segmented log).
        self._txn_index = txn_index or TransactionIndex(
            _UnhostedLayout(), cached_entries_max=config.txn_index_cached_entries_max
        )
        # Aborted transactions the producer table accounts for whose markers lie after the
        # applied offset (a restored snapshot's table is ahead of it), in marker order: each
        # goes into the index when its marker is applied (module docstring).
        self._carried: list[AbortedTxn] = []

    def attach(self, group: RaftGroup) -> None:
        assert self._group is None
        self._group = group

    @property
    def group(self) -> RaftGroup:
        assert self._group is not None, "replica used before its Raft group was attached"
        return self._group

    @property
    def raft_high_watermark(self) -> int:
        """The commit offset + 1, in Raft offsets: what readers may see stops before it."""
        return self.group.node.commit_offset + 1

    @property
    def high_watermark(self) -> int:
        """The high watermark clients see, in Kafka offsets."""
        return self._log.kafka_offset(self.raft_high_watermark)

    @property
    def raft_last_stable_offset(self) -> int:
        """The LSO in Raft offsets: the first offset of the earliest open transaction, else
        the high watermark; never past the applied offset + 1, since the producer table
        knows nothing of transactions opened after it (module docstring)."""
        bound = min(self.raft_high_watermark, self._applied_offset + 1)
        first_open = self._committed_producers.first_open_offset()
        return bound if first_open is None else min(bound, first_open)

    @property
    def last_stable_offset(self) -> int:
        """The LSO clients see (read_committed reads stop before it), in Kafka offsets."""
        return self._log.kafka_offset(self.raft_last_stable_offset)

    def _log_first(self) -> int:
        return self._log.log_start_offset()

    @property
    def log_start_offset(self) -> int:
        """The first offset readers may ask for, in Kafka offsets: where retention left the
        log, or higher where DeleteRecords moved the start (Kafka's log start offset)."""
        return max(self._log.kafka_offset(self._log.log_start_offset()), self._log_start_floor())

    @property
    def log_end_offset(self) -> int:
        """The offset after the last entry this replica holds, committed or not, in Kafka
        offsets."""
        return self._log.kafka_offset(self.group.node.last_offset + 1)

    def raft_log_start_floor(self) -> int | None:
        """The Raft offset holding DeleteRecords' log start, for retention: segments wholly
        below it may go. None while that start is not above the log's first offset."""
        floor = self._log_start_floor()
        if floor == 0 or floor <= self._log.kafka_offset(self._log.log_start_offset()):
            return None
        return self._log.raft_offset(floor)

    def first_open_transaction_offset(self) -> int | None:
        """The Raft offset retention must keep: the earliest open transaction's first offset
        (None when none is open): a cut above it would drop records not yet committed or
        aborted, and the LSO with them."""
        return self._committed_producers.first_open_offset()

    def aborted_transactions_below(self, offset: int) -> tuple[AbortedTxn, ...]:
        """The aborted transactions (Raft offsets) with records below `offset`: the log
        cleaner drops their records (partition/cleaning.py)."""
        return tuple(self.aborted_transactions(0, offset))

    def aborted_transactions(self, start_offset: int, end_offset: int) -> list[AbortedTxn]:
        """The aborted transactions with records in [start_offset, end_offset) (Raft
        offsets): marker at or after `start_offset`, first offset before `end_offset`."""
        indexed = self._txn_index.collect(start_offset, end_offset)
        return indexed + [
            a
            for a in self._carried
            if a.last_offset >= start_offset and a.first_offset < end_offset
        ]

    @property
    def applied_offset(self) -> int:
        """The last offset applied to the producer table (-1: none)."""
        return self._applied_offset

    def is_leader_ready(self) -> bool:
        """Leader, its term's no-op committed, and everything before the no-op *applied*.

        Commit alone is not enough: a Ready applies at most `apply_bytes_max`, so applying
        can trail the commit offset by several passes after an election, and until the
        entries of earlier terms are applied the producer table misses their sequences: a
        retried batch would look new and be written twice (docs/chaos.md tells how the chaos
        suite caught it).
        """
        node = self.group.node
        if node.role is not Role.LEADER or not node.committed_in_term():
            return False
        return self._applied_offset >= node.term_start_offset

    def _require_leader(self) -> None:
        node = self.group.node
        if node.role is not Role.LEADER:
            raise NotLeaderError(leader_hint=node.leader_id)
        if not self.is_leader_ready():
            raise LeaderNotReadyError(leader_hint=node.node_id)

    # -- state machine (called by the ready processor, in offset order) ------------------------

    def apply(self, entry: Entry) -> None:
        assert entry.offset > self._applied_offset, (entry, self._applied_offset)
        self._applied_offset = entry.last_offset
        # Before the marker itself: replaying a table that is ahead may reopen a transaction
        # at a later batch of it, and its ABORT then returns a later first offset; the
        # carried entry has the true one and the index keeps the first it gets.
        while self._carried and self._carried[0].last_offset <= entry.last_offset:
            self._txn_index.append(self._carried.pop(0))
        if entry.kind is EntryKind.DATA:
            header = parse_header(entry.data)
            if header.producer_id >= 0 and header.is_control:
                aborted = self._apply_marker(
                    self._committed_producers, header, entry.data, entry.offset
                )
                if aborted is not None:
                    self._txn_index.append(aborted)
            elif header.producer_id >= 0:
                self._committed_producers.record(
                    producer_id=header.producer_id,
                    epoch=header.producer_epoch,
                    base_sequence=header.base_sequence,
                    record_count=header.record_count,
                    base_offset=entry.offset,
                    last_offset=entry.last_offset,
                    transactional=header.is_transactional,
                )
        self._applied_term = entry.term
        self._applied_bytes_since_checkpoint += len(entry.data)
        if (
            self._checkpoint is not None
            and self._applied_bytes_since_checkpoint >= self._config.checkpoint_interval_bytes
        ):
            self.save_checkpoint(entry.term)
        self._hw_advanced.set()
        self._hw_advanced = asyncio.Event()

    @staticmethod
    def _apply_marker(
        producers: ProducerStateTable, header: BatchHeader, batch: bytes, offset: int
    ) -> AbortedTxn | None:
        """A COMMIT/ABORT marker ends its producer's transaction (a marker's one record is
        decoded here: markers are few, and only the producer table reads them); the
        aborted transaction it ends, if any."""
        marker = decode_txn_marker(batch)
        if marker is None:
            return None
        return producers.end_transaction(
            producer_id=header.producer_id,
            epoch=header.producer_epoch,
            coordinator_epoch=marker.coordinator_epoch,
            commit=marker.commit,
            offset=offset,
        )

    def save_checkpoint(self, term: Term) -> None:
        """Save the applied state; `term` is that of the last entry applied.

        Applied entries are committed and durable here (the host applies after its fsync),
        so the log a restart finds always holds the checkpoint's offset. The aborted-
        transaction index is flushed first: every entry up to the checkpoint is then on disk.
        """
        assert self._checkpoint is not None and self._applied_offset >= 0
        self._txn_index.flush()
        offset = Offset(self._applied_offset)
        counts = self._txn_index.entry_counts(offset)
        self._checkpoint.save(PartitionCheckpoint(offset, term, self.snapshot_data(), counts))
        self._applied_bytes_since_checkpoint = 0

    def checkpoint_on_close(self) -> None:
        """A clean stop: save what was applied since the last checkpoint, so the next start
        re-applies nothing (Kafka also snapshots producer state at a clean shutdown)."""
        if self._checkpoint is not None and self._applied_bytes_since_checkpoint > 0:
            assert self._applied_term >= 0, self._applied_offset
            self.save_checkpoint(Term(self._applied_term))

    def recover(self, log: RecoveryLog) -> Offset:
        """Before the Raft core starts: load the checkpoint if the log vouches for it.

        Returns the applied offset the core resumes after (`RaftNode(applied_offset=...)`), or
        -1 when there is no usable checkpoint newer than the log's snapshot; the snapshot (if
        any) is then restored as before. A checkpoint is used only if the log still holds its
        offset in the same term: otherwise applying from the start rebuilds the same state.
        """
        assert self._applied_offset == -1, "recover runs once, before anything is applied"
        index_sound = self._txn_index.recover()
        if (found := log.snapshot()) is not None:
            # The snapshot says where Kafka offsets stand at the log's first offset, whether
            # or not it is restored below (a newer checkpoint resumes after it).
            self._log.set_kafka_start(decode_snapshot_data(found)[0])
        checkpoint = None if self._checkpoint is None else self._checkpoint.load()
        if checkpoint is None:
            return Offset(-1)
        if not index_sound:
            # Entries up to the checkpoint may be gone: re-applying re-derives them.
            _logger.warning(
                "%s-%s: not resuming after the checkpoint at offset %d: the aborted-"
                "transaction index was damaged",
                self.topic,
                self.partition,
                checkpoint.offset,
            )
            return Offset(-1)
        snapshot = log.snapshot()
        if snapshot is not None and snapshot.meta.offset >= checkpoint.offset:
            return Offset(-1)
        if (
            checkpoint.offset > log.last_offset()
            or log.term_at(checkpoint.offset) != checkpoint.term
        ):
            return Offset(-1)
        if (missing := self._txn_index.missing_entries(checkpoint.index_counts)) is not None:
            # Deleted or cut at an entry boundary while the node was down (no CRC tells):
            # re-applying re-derives the entries.
            _logger.warning(
                "%s-%s: not resuming after the checkpoint at offset %d: the aborted-"
                "transaction index lost entries (%s)",
                self.topic,
                self.partition,
                checkpoint.offset,
                missing,
            )
            return Offset(-1)
        self._committed_producers = ProducerStateTable.decode(
            checkpoint.state, producers_max=self._producers_max
        )
        self._applied_offset = checkpoint.offset
        self._applied_term = checkpoint.term
        self._take_carried(decode_aborted(checkpoint.state))
        _logger.info(
            "%s-%s: resuming after the checkpoint at offset %d (the log ends at %d)",
            self.topic,
            self.partition,
            checkpoint.offset,
            log.last_offset(),
        )
        return checkpoint.offset

    def restore(self, snapshot: Snapshot) -> None:
        self._applied_offset = snapshot.meta.offset
        self._applied_term = snapshot.meta.term
        self._applied_bytes_since_checkpoint = 0  # the snapshot file holds this state
        kafka_start, producers = decode_snapshot_data(snapshot)
        self._log.set_kafka_start(kafka_start)
        self._committed_producers = ProducerStateTable.decode(
            producers, producers_max=self._producers_max
        )
        self._take_carried(decode_aborted(producers))
        self._leader_producers = None

    def _take_carried(self, aborted: list[AbortedTxn]) -> None:
        """The aborted transactions a restored table carries: those whose marker was applied
        go into the index (a replay where it holds them; a table saved before the index
        lists them all), the later ones wait in `_carried`."""
        self._carried = []
        for txn in aborted:
            if txn.last_offset > self._applied_offset:
                self._carried.append(txn)
            else:
                self._txn_index.append(txn)

    def compaction_snapshot(self, offset: Offset, term: Term, membership: Membership) -> Snapshot:
        """The snapshot a partition records before retention drops the log below `offset`.

        A partition's state *is* its log, so the snapshot carries only the Kafka offset at
        `offset + 1` (Raft's own entries below the cut take none) and the producer table (for
        idempotence across the cut); a follower that installs it starts its log empty at
        `offset + 1`. The table is the applied one, which may be slightly ahead of `offset`:
        entries re-applied after it only repeat what it already remembers.
        """
        assert offset <= self.group.node.commit_offset, (offset, self.group.node.commit_offset)
        kafka_start = self._log.kafka_offset(offset + 1)
        # The table accounts for the markers up to the applied offset: those after `offset`
        # travel with it (an installing follower's index starts empty).
        ahead = self._txn_index.collect(offset + 1, 2**63 - 1) + self._carried
        table = self._committed_producers.encode(aborted=ahead)
        return Snapshot(
            SnapshotMeta(offset, term, membership), encode_snapshot_data(kafka_start, table)
        )

    def snapshot_data(self) -> bytes:
        """The producer table a checkpoint saves, with the aborted transactions it accounts
        for above the applied offset (the log and its index hold the rest)."""
        return self._committed_producers.encode(aborted=self._carried)

    # -- produce -------------------------------------------------------------------------------

    async def produce(
        self, batches: list[bytes], *, commitment: Commitment, timeout_s: float
    ) -> ProduceResult:
        """Append `batches` in order; raises PartitionError/RaftError subclasses."""
        assert batches, "empty produce"
        self._require_leader()
        keys_required = self._keys_required()
        headers = [self._verify(batch, keys_required=keys_required) for batch in batches]
        codec = self._compression()
        if codec is not None:
            batches = [
                self._recompressed(batch, header, codec)
                for batch, header in zip(batches, headers, strict=True)
            ]
        if self._txn_verifier is not None and await self._verify_transactions(headers):
            self._require_leader()  # it may have lost leadership while it waited
        self._require_room(batches)
        producers = self._leader_view()
        term = self.group.node.term  # the term of the view the sequences are checked against
        deadline = asyncio.get_running_loop().time() + timeout_s
        futures: list[asyncio.Future[Offset]] = []
        first = last = -1
        duplicate_last: _Duplicate | None = None  # the latest duplicate, if any
        for batch, header in zip(batches, headers, strict=True):
            duplicate = self._check_sequence(producers, header)
            if duplicate is not None:
                if first < 0:
                    first = duplicate.base_offset
                last = duplicate.last_offset
                if duplicate_last is None or duplicate.last_offset > duplicate_last.last_offset:
                    duplicate_last = duplicate
                continue
            base, future = self.group.propose(
                batch, offset_count=header.offset_count, commitment=commitment
            )
            self._remember(producers, header, base)
            futures.append(future)
            first = base if first < 0 else first
            last = base + header.offset_count - 1
        if futures:
            try:
                # One batch per request is the common case: no gather future around it.
                waited = futures[0] if len(futures) == 1 else asyncio.gather(*futures)
                await asyncio.wait_for(waited, timeout_s)
            except TimeoutError:
                raise RequestTimedOutError(
                    f"{self.topic}-{self.partition}: not {commitment.name.lower()}-acknowledged "
                    f"within {timeout_s:.3f}s; the write may still succeed"
                ) from None
        if (
            duplicate_last is not None
            and duplicate_last.last_offset >= self.raft_high_watermark
            and commitment is not Commitment.NONE
        ):
            await self._await_original(duplicate_last, term, commitment, deadline, timeout_s)
        kafka = self._log.kafka_offset
        return ProduceResult(kafka(first), kafka(last), self.high_watermark, duplicate=not futures)

    async def _await_original(
        self,
        duplicate: _Duplicate,
        term: Term,
        commitment: Commitment,
        deadline: float,
        timeout_s: float,
    ) -> None:
        """Wait until the original of a duplicate is as safe as `commitment` asks.

        A retried batch the leader appended in `term` but has not committed yet is a
        duplicate: its answer must still wait for the commitment asked, or a retry (a
        producer with several batches in flight resends after a lost answer) would be
        acknowledged before the original is safe. The group answers it as it answers the
        original proposal (`RaftGroup.waiter_for`): at commit for acks=all, once durable
        here for acks=1, with ProposalDroppedError if another leader's entry replaced it.
        Entries commit and become durable in offset order, so the latest duplicate of the
        request stands for all of them.
        """
        future = self.group.waiter_for(
            Offset(duplicate.base_offset),
            Offset(duplicate.last_offset),
            term=term,
            commitment=commitment,
        )
        remaining = max(deadline - asyncio.get_running_loop().time(), 0.0)
        try:
            await asyncio.wait_for(future, remaining)
        except TimeoutError:
            raise RequestTimedOutError(
                f"{self.topic}-{self.partition}: the retried batch at offset "
                f"{duplicate.last_offset} was not {commitment.name.lower()}-acknowledged "
                f"within {timeout_s:.3f}s; the write may still succeed"
            ) from None

    def _verify(self, batch: bytes, *, keys_required: bool) -> BatchHeader:
        if len(batch) > self._config.batch_bytes_max:
            raise BatchTooLargeError(len(batch), batch_bytes_max=self._config.batch_bytes_max)
        header = verify_batch(batch, batch_bytes_max=self._config.batch_bytes_max)
        if header.size_bytes != len(batch):
            raise CorruptBatchError(
                f"{len(batch) - header.size_bytes} bytes follow the batch; send one batch per item"
            )
        if header.is_control:
            raise CorruptBatchError("clients may not write control batches")
        # A CRC-valid batch of malformed records must not be stored and served. The
        # one walk of the records happens here, on a client's produce; replication and fetch
        # never decode (benchmarks/suites/record_validation.py measures its cost).
        # A compacted topic needs a key per record: the same walk checks them, before
        # anything of the request is proposed.
        if self._config.produce_record_validation == "full" or keys_required:
            validate_records(
                batch,
                header,
                decompressed_bytes_max=self._config.decompressed_bytes_max,
                keys_required=keys_required,
            )
        if len(batch) > self._config.segment_bytes_max:  # Kafka's order: after the records
            raise BatchOverSegmentError(
                len(batch), segment_bytes_max=self._config.segment_bytes_max
            )
        return header

    def _recompressed(self, batch: bytes, header: BatchHeader, codec: Compression) -> bytes:
        """The batch in the topic's codec (Kafka's compression.type other than producer),
        checked against the same bounds as the producer's batch."""
        try:
            rewritten = recompress_batch(
                batch, header, codec, decompressed_bytes_max=self._config.decompressed_bytes_max
            )
        except CompressionError as error:
            raise CorruptBatchError(f"records do not decompress: {error}") from None
        if len(rewritten) > self._config.batch_bytes_max:
            raise BatchTooLargeError(len(rewritten), batch_bytes_max=self._config.batch_bytes_max)
        if len(rewritten) > self._config.segment_bytes_max:
            raise BatchOverSegmentError(
                len(rewritten), segment_bytes_max=self._config.segment_bytes_max
            )
        return rewritten

    async def _verify_transactions(self, headers: list[BatchHeader]) -> bool:
        """KIP-890 part 1: the first transactional batch of a producer's transaction here
        is accepted only if the coordinator added this partition to that transaction at
        that epoch; InvalidTxnStateError (nothing written) otherwise. Fenced batches and
        duplicates are left to the sequence checks. True when it awaited anything (the
        caller checks leadership again).

        While a request of a producer waits here, the producer's later requests queue
        behind it, each in turn (`_txn_verifying` holds the last one's gate, done just
        before it returns to propose): a pipelining producer's next batch would otherwise
        overtake it and be refused OUT_OF_ORDER_SEQUENCE. A waiting request's own gate stays
        until it proposed, so a request that arrives while the one before it is waking
        waits as well."""
        assert self._txn_verifier is not None
        producer_ids = sorted({h.producer_id for h in headers if h.producer_id >= 0})
        earlier = [
            gate for pid in producer_ids if (gate := self._txn_verifying.get(pid)) is not None
        ]
        if not earlier and not self._first_transactional_batches(headers):
            return False
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for producer_id in producer_ids:
            self._txn_verifying[producer_id] = done
        try:
            for gate in earlier:
                await asyncio.shield(gate)  # its failure is its own request's
            self._require_leader()  # it may have lost leadership while it waited
            for producer_id, epoch in self._first_transactional_batches(headers):
                if not await self._txn_verifier(producer_id, epoch):
                    raise InvalidTxnStateError(
                        f"{self.topic}-{self.partition} is not in the ongoing transaction of "
                        f"producer {producer_id} at epoch {epoch}"
                    )
        finally:
            for producer_id in producer_ids:
                if self._txn_verifying.get(producer_id) is done:
                    del self._txn_verifying[producer_id]
            # Wakes the producer's next request; this one proposes before it runs (no
            # await between here and the proposal).
            done.set_result(None)
        return True

    def _first_transactional_batches(self, headers: list[BatchHeader]) -> list[tuple[int, int]]:
        """(producer id, epoch) of the batches that would open a transaction here: no open
        transaction in the leader's view, and not refused by the sequence checks anyway
        (a gap is included: the batch before it may be in this very request)."""
        producers = self._leader_view()
        return sorted(
            {
                (header.producer_id, header.producer_epoch)
                for header in headers
                if header.is_transactional
                and header.producer_id >= 0
                and not producers.has_open_transaction(header.producer_id)
                and producers.check(
                    producer_id=header.producer_id,
                    epoch=header.producer_epoch,
                    base_sequence=header.base_sequence,
                    record_count=header.record_count,
                    transactional=True,
                ).verdict
                in (Verdict.NEW, Verdict.OUT_OF_ORDER)
            }
        )

    def _require_room(self, batches: list[bytes]) -> None:
        """Refuse the whole request, before any sequence is checked, when the leader could
        not append it now (flow control, a leadership transfer): ProposalDroppedError.

        As Kafka refuses NOT_ENOUGH_REPLICAS before it validates sequences. Checked only at
        the append, a producer's next pipelined batch would get OUT_OF_ORDER_SEQUENCE
        instead (its predecessor was refused), and librdkafka answers that by bumping its
        epoch and resending every unacknowledged batch under new sequence numbers, those
        already appended too, which writes them twice (confluentinc/librdkafka#4953; found
        by `raftlog chaos run --client kafka` under partitions). Refused alike, the batches
        are all retried in order with their sequences, which the leader deduplicates.
        """
        self.group.node.check_propose(sum(len(batch) for batch in batches))

    def _leader_view(self) -> ProducerStateTable:
        # Copied from the applied table only by a ready leader: it then holds every entry
        # of earlier terms, and the leader's own appends are added as they are proposed.
        assert self.is_leader_ready(), (self.topic, self.partition)
        term = self.group.node.term
        if self._leader_producers is None or self._leader_producers_term != term:
            self._leader_producers = self._committed_producers.copy()
            self._leader_producers_term = term
        return self._leader_producers

    @staticmethod
    def _check_sequence(producers: ProducerStateTable, header: BatchHeader) -> _Duplicate | None:
        if header.producer_id < 0:
            return None
        verdict = producers.check(
            producer_id=header.producer_id,
            epoch=header.producer_epoch,
            base_sequence=header.base_sequence,
            record_count=header.record_count,
            transactional=header.is_transactional,
        )
        if verdict.verdict is Verdict.NEW:
            return None
        if verdict.verdict is Verdict.DUPLICATE:
            return _Duplicate(verdict.base_offset, verdict.last_offset)
        if verdict.verdict is Verdict.FENCED:
            raise ProducerFencedError(verdict.message)
        if verdict.verdict is Verdict.INVALID_TXN_STATE:
            raise InvalidTxnStateError(verdict.message)
        assert verdict.verdict is Verdict.OUT_OF_ORDER, verdict
        raise OutOfOrderSequenceError(verdict.message)

    @staticmethod
    def _remember(producers: ProducerStateTable, header: BatchHeader, base_offset: int) -> None:
        if header.producer_id >= 0:
            producers.record(
                producer_id=header.producer_id,
                epoch=header.producer_epoch,
                base_sequence=header.base_sequence,
                record_count=header.record_count,
                base_offset=base_offset,
                last_offset=base_offset + header.offset_count - 1,
                transactional=header.is_transactional,
            )

    async def write_txn_marker(
        self,
        *,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        commit: bool,
        timestamp_ms: int,
        timeout_s: float,
    ) -> int:
        """Write a COMMIT or ABORT marker for `producer_id` (leader only) and wait until it
        is committed; its Kafka offset. A marker with an epoch older than the producer's is
        refused (ProducerFencedError: INVALID_PRODUCER_EPOCH), one from an older coordinator
        TransactionCoordinatorFencedError; one for a producer with no open transaction here
        is written and ends nothing, as Kafka does (the coordinator may retry a marker)."""
        self._require_leader()
        producers = self._leader_view()
        verdict = producers.check_marker(
            producer_id=producer_id, epoch=producer_epoch, coordinator_epoch=coordinator_epoch
        )
        if verdict.verdict is Verdict.FENCED:
            raise ProducerFencedError(verdict.message)
        if verdict.verdict is Verdict.COORDINATOR_FENCED:
            raise TransactionCoordinatorFencedError(verdict.message)
        assert verdict.verdict is Verdict.NEW, verdict
        batch = encode_txn_marker(
            commit=commit,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            coordinator_epoch=coordinator_epoch,
            timestamp_ms=timestamp_ms,
        )
        self._require_room([batch])
        base, future = self.group.propose(batch, offset_count=1, commitment=Commitment.QUORUM)
        self._apply_marker(producers, parse_header(batch), batch, base)
        try:
            await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            raise RequestTimedOutError(
                f"{self.topic}-{self.partition}: the marker of producer {producer_id} was not "
                f"committed within {timeout_s:.3f}s; it may still be"
            ) from None
        return self._log.kafka_offset(base)

    def transaction_start_offset(self, producer_id: int) -> int:
        """The Kafka offset where `producer_id`'s open transaction starts (DescribeProducers'
        current_txn_start_offset), -1 when none is open; leader only, from the applied
        table as `describe_producer`."""
        self._require_leader()
        first = self._committed_producers.open_transaction_first_offset(producer_id)
        # Retention keeps an open transaction's first offset (first_open_transaction_offset).
        return -1 if first is None else self._log.kafka_offset(first)

    def describe_producers(self) -> list[ProducerDescription]:
        """Every producer the partition remembers, from the applied table (leader only)."""
        self._require_leader()
        kafka = self._log.kafka_offset
        return [
            ProducerDescription(pid, epoch, last_sequence, coordinator_epoch, kafka(first))
            if first >= 0
            else ProducerDescription(pid, epoch, last_sequence, coordinator_epoch, -1)
            for pid, epoch, last_sequence, coordinator_epoch, first in (
                self._committed_producers.describe_all()
            )
        ]

    def describe_producer(self, producer_id: int) -> tuple[int, int, int] | None:
        """(epoch, last sequence, last offset) a producer has *committed* here (KIP-664).

        Leader only, once ready (every earlier entry applied), and from the applied table: a
        writer resuming after the answer must never skip a record that may still be lost.
        """
        self._require_leader()
        described = self._committed_producers.describe(producer_id)
        if described is None:
            return None
        epoch, last_sequence, last_offset = described
        return epoch, last_sequence, self._log.kafka_offset(last_offset)

    # -- offsets -------------------------------------------------------------------------------

    def list_offset(
        self, spec: OffsetSpec, timestamp_ms: int = 0, *, read_committed: bool = False
    ) -> int:
        """Earliest, latest (the high watermark; the LSO with `read_committed`) or the first
        offset below that whose batch has a timestamp >= `timestamp_ms` (-1 when none)."""
        self._require_leader()
        high_watermark = (
            self.raft_last_stable_offset if read_committed else self.raft_high_watermark
        )
        if spec is OffsetSpec.EARLIEST:
            return self.log_start_offset
        if spec is OffsetSpec.LATEST:
            # Retention never cuts past an open transaction; DeleteRecords may (Kafka's rule),
            # and the last stable offset is then the new log start.
            return max(self._log.kafka_offset(high_watermark), self._log_start_floor())
        offset = self._log.offset_for_timestamp(timestamp_ms)
        return -1 if offset is None or offset >= high_watermark else self._log.kafka_offset(offset)

    def deletion_offset(self, offset: int) -> int:
        """Where a DeleteRecords of `offset` (-1: the high watermark) moves the log start, in
        Kafka offsets, checked by the leader: past the high watermark or below 0 raises
        OffsetOutOfRangeError (Kafka's rule: only committed records may be deleted)."""
        self._require_leader()
        high_watermark = self.high_watermark
        wanted = high_watermark if offset == -1 else offset
        if not 0 <= wanted <= high_watermark:
            raise OffsetOutOfRangeError(
                wanted, log_start_offset=self.log_start_offset, log_end_offset=high_watermark
            )
        return wanted

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """Kafka's OffsetForLeaderEpoch, answered by the leader: the largest term <= `epoch`
        in the log and the offset just past its last entry, capped at the high watermark
        (readers see nothing above it, so nothing they read can be truncated; a client
        compares this with its position after a leader change). (-1, -1) when the log holds
        no such term (retention removed it)."""
        self._require_leader()
        log = self.group.node.log
        end = min(int(log.first_offset_of_term_at_least(Term(epoch + 1))), self.raft_high_watermark)
        term = log.term_at(Offset(end - 1)) if end - 1 >= log.first_offset() - 1 else None
        if term is None or term > epoch:
            return -1, -1
        return int(term), self._log.kafka_offset(end)

    # -- fetch ---------------------------------------------------------------------------------

    async def fetch(
        self,
        offset: int,
        *,
        bytes_max: int,
        wait_ms_max: int,
        bytes_min: int = 1,
        allow_follower: bool = False,
        skip_emptied: bool = False,
        read_committed: bool = False,
    ) -> FetchResult:
        """Committed batches from `offset`, long-polling up to `wait_ms_max` for `bytes_min`
        (`skip_emptied`: PartitionLog.read); with `read_committed` (Kafka's isolation level
        1) only below the LSO, with the aborted transactions among them."""
        if not allow_follower:
            self._require_leader()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms_max / 1000
        while True:
            result = self._fetch_now(
                offset,
                bytes_max=bytes_max,
                skip_emptied=skip_emptied,
                read_committed=read_committed,
            )
            remaining = deadline - loop.time()
            if len(result.batches) >= bytes_min or remaining <= 0:
                return result
            try:
                await asyncio.wait_for(self._hw_advanced.wait(), remaining)
            except TimeoutError:
                return self._fetch_now(
                    offset,
                    bytes_max=bytes_max,
                    skip_emptied=skip_emptied,
                    read_committed=read_committed,
                )

    def _fetch_now(
        self, offset: int, *, bytes_max: int, skip_emptied: bool, read_committed: bool
    ) -> FetchResult:
        """`offset` and the answer in Kafka offsets; the read stops below the Raft high
        watermark, or the LSO with `read_committed` (an offset between the two is in range
        and answers nothing yet, as Kafka)."""
        raft_high_watermark = self.raft_high_watermark
        high_watermark = self._log.kafka_offset(raft_high_watermark)
        raft_start = self._log.log_start_offset()
        start = self.log_start_offset
        if offset < start or offset > high_watermark:
            raise OffsetOutOfRangeError(
                offset, log_start_offset=start, log_end_offset=high_watermark
            )
        raft_end = self.raft_last_stable_offset if read_committed else raft_high_watermark
        raft_end = max(raft_end, raft_start)
        end = self._log.kafka_offset(raft_end)
        data = (
            b""
            if offset >= end
            else self._log.read_kafka(
                offset, bytes_max=bytes_max, end_offset=raft_end, skip_emptied=skip_emptied
            )
        )
        aborted = None
        if read_committed:
            aborted = self._aborted_between(self._log.raft_offset(offset), raft_end) if data else ()
        # Never below the log start, which DeleteRecords may move past an open transaction
        # (Kafka bounds its first unstable offset by the log start likewise).
        last_stable = max(
            self._log.kafka_offset(max(self.raft_last_stable_offset, raft_start)), start
        )
        term = int(self.group.node.term)
        return FetchResult(data, high_watermark, start, term, last_stable, aborted)

    def _aborted_between(self, raft_start: int, raft_end: int) -> tuple[AbortedTransaction, ...]:
        """The aborted transactions with records in [raft_start, raft_end), their first
        offsets in Kafka offsets (one below the log start reads as the log start)."""
        log_first = self._log_first()
        return tuple(
            AbortedTransaction(
                aborted.producer_id, self._log.kafka_offset(max(aborted.first_offset, log_first))
            )
            for aborted in self.aborted_transactions(raft_start, raft_end)
        )


@dataclass(frozen=True, slots=True)
class _Duplicate:
    base_offset: int
    last_offset: int


# A partition snapshot's data: this prefix, the Kafka offset at the snapshot's offset + 1, then
# the producer table. Data without the prefix was written before Kafka offsets left out Raft's
# own entries: offsets above the cut kept their Raft numbers then, so they start there.
_SNAPSHOT_PREFIX = b"\x00K"
_KAFKA_START = struct.Struct(">q")


def encode_snapshot_data(kafka_start: int, producers: bytes) -> bytes:
    """A partition snapshot's data (see `_SNAPSHOT_PREFIX`)."""
    assert kafka_start >= 0, kafka_start
    return _SNAPSHOT_PREFIX + _KAFKA_START.pack(kafka_start) + producers


def decode_snapshot_data(snapshot: Snapshot) -> tuple[int, bytes]:
    """(Kafka offset at the snapshot's offset + 1, the producer table's bytes)."""
    data = snapshot.data
    if not data.startswith(_SNAPSHOT_PREFIX):
        return snapshot.meta.offset + 1, data
    start = len(_SNAPSHOT_PREFIX)
    (kafka_start,) = _KAFKA_START.unpack_from(data, start)
    return kafka_start, data[start + _KAFKA_START.size :]
