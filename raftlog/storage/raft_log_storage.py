"""`RaftLogStorage`: the Raft core's `DurableLog` over a `SegmentedLog` (one per Raft group).

Theory of operation. The Raft index space is the offset space, and every Raft entry is one
record batch in the segmented log, its term in the batch's partition-leader-epoch field:

    EntryKind.DATA    the entry's bytes when they are one record batch occupying exactly
                      `offset_count` offsets (a partition's produced batches), stored as is
                      (the log patches base offset and epoch); any other bytes (metadata
                      commands) go in a control batch of type CONTROL_OPAQUE_DATA
    EntryKind.NOOP    a control batch of type CONTROL_LEADER_CHANGE (2), as Kafka's KRaft
    EntryKind.CONFIG  a control batch of type CONTROL_VOTERS (6), value Membership.encode()

Reads turn batches back into entries: a non-control batch is a DATA entry whose data is the
batch; a control batch is decoded (they are few and small).

Answering `term_at` must not read the disk: a *leader-epoch cache* (Kafka's
leader-epoch-checkpoint) lists `(term, start_offset)` for each term in the log, and the
offsets of the CONFIG entries after the snapshot ride along. Both change rarely (a leader
change, a membership change, a truncation, a compaction) and are then written to
`raft-checkpoint` atomically. A truncation, snapshot or compaction writes it at once; an
append that starts a term or adds a CONFIG entry (every group at an election: a thousand
partitions elect at once) only marks it pending, and the next sync writes it on the disk
thread just *before* fsyncing the log it describes (`FlushTicket.prelude`), so no replace
and fsync of a file runs on the event loop per election. On open it is cut back to the log's
end (a crash may have lost appends), checked against the last batch's term, and rebuilt
from a scan if missing, damaged or inconsistent: a crash that wrote log pages back before
the pending checkpoint reached disk leaves the last batch's term unknown to it, so the
check sends it to the scan. Term start offsets are unique (Log Matching), so a checkpoint
whose last term matches the log's is right for every term it lists.

The latest snapshot's metadata (and data: a partition's is empty, the metadata quorum's holds
its state machine) lives in `snapshot`, also replaced atomically, and is written *before* the
log drops the entries it covers. `first_offset()` is `snapshot.offset + 1`; the segmented log
deletes whole segments only, so it may still hold older batches, which are then invisible here.
After a crash between writing a snapshot and trimming the log, open finishes the job.

Files (next to the segments; big-endian):
    raft-checkpoint  crc32c u32 of the rest, then JSON {"epochs": [[term, start_offset], ...],
                     "configs": [offset, ...]}
    snapshot         b"RLSN", crc32c u32 of the rest, offset i64, term i64, membership
                     length u32, Membership.encode(), then the snapshot's data to the end
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import struct
import threading
from collections.abc import Sequence

from raftlog.config import LogConfig
from raftlog.errors import CorruptBatchError, StorageError
from raftlog.raft.types import NO_OFFSET, Entry, EntryKind, Membership, Snapshot, SnapshotMeta
from raftlog.storage import kafka_offsets
from raftlog.storage.batch import (
    CRC_FIELD,
    CRC_START,
    BatchHeader,
    crc32c,
    parse_header,
)
from raftlog.storage.durable_mark import MarkSyncer
from raftlog.storage.file_system import (
    FileSystem,
    OsFileSystem,
    read_whole_file,
    write_file_atomically,
)
from raftlog.storage.log import FlushTicket, LogDamage, SegmentedLog
from raftlog.storage.record_decoder import decode_batch
from raftlog.storage.records import (
    CONTROL_LEADER_CHANGE,
    CONTROL_VOTERS,
    decode_control_batch,
    decode_txn_marker,
    encode_control_batch,
)
from raftlog.storage.wall_clock import SystemWallClock, WallClock
from raftlog.types import Offset, Term

__all__ = ["CONTROL_OPAQUE_DATA", "RaftLogStorage"]

log = logging.getLogger(__name__)

# A control type of raftlog's own (Kafka uses 0-6): a DATA entry whose bytes are not a batch.
CONTROL_OPAQUE_DATA = 1000
CHECKPOINT_FILE_NAME = "raft-checkpoint"
SNAPSHOT_FILE_NAME = "snapshot"
_KIND_BY_CONTROL = {
    CONTROL_LEADER_CHANGE: EntryKind.NOOP,
    CONTROL_VOTERS: EntryKind.CONFIG,
    CONTROL_OPAQUE_DATA: EntryKind.DATA,
}
_CONTROL_BY_KIND = {kind: control for control, kind in _KIND_BY_CONTROL.items()}
_SNAPSHOT_HEAD = struct.Struct(">4sIqqI")  # magic, crc, offset, term, membership bytes
_SNAPSHOT_MAGIC = b"RLSN"
_LAST_OFFSET_DELTA = struct.Struct(">i")
_LAST_OFFSET_DELTA_FIELD = 23
_CRC = struct.Struct(">I")


class RaftLogStorage:
    """A `raftlog.raft.ports.DurableLog` (and the partition's `PartitionLog`) on disk."""

    def __init__(self, log: SegmentedLog, clock: WallClock) -> None:
        # Use RaftLogStorage.open().
        self.log = log
        self.clock = clock
        self.files = log.files
        self.directory = log.directory
        self._snapshot: Snapshot | None = None
        self._epoch_terms: list[int] = []
        self._epoch_starts: list[int] = []
        self._config_offsets: list[int] = []
        # Raft's own entries besides CONFIG: each term's no-op. With the CONFIG entries they
        # are what Kafka offsets leave out (raftlog.storage.kafka_offsets).
        self._noop_offsets: list[int] = []
        self._internal: list[int] | None = None  # the two merged, from the first offset
        # The Kafka offset of the first offset: 0 unless the partition's snapshot says more.
        self.kafka_start = 0
        # Checkpoint versions: the latest encoded, the latest on disk, and the one waiting for
        # the next sync. A disk thread and the loop may both write (a ticket's prelude, a
        # compaction), so writes are serialized and never replace a newer version by an older.
        self._checkpoint_version = 0
        self._checkpoint_written = 0
        self._checkpoint_pending: tuple[int, bytes] | None = None
        self._checkpoint_lock = threading.Lock()

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        *,
        config: LogConfig,
        files: FileSystem | None = None,
        clock: WallClock | None = None,
        mark_syncer: MarkSyncer | None = None,
    ) -> RaftLogStorage:
        files, clock = files or OsFileSystem(), clock or SystemWallClock()
        log = SegmentedLog.open(
            directory, config=config, files=files, clock=clock, mark_syncer=mark_syncer
        )
        storage = cls(log, clock)
        try:
            storage._snapshot = storage._load_snapshot()
        except StorageError as error:
            storage._discard_for_repair(str(error))
        if storage._snapshot is None and storage.log.log_start_offset > 0:
            # Only a snapshot lets a log start above 0: it was lost.
            storage._discard_for_repair(f"{storage._snapshot_path()} is missing")
        storage._finish_snapshot()
        if not storage._load_checkpoint():
            storage._rebuild_checkpoint()
        return storage

    # --- LogStorage ---------------------------------------------------------------------

    def first_offset(self) -> Offset:
        if self._snapshot is not None:
            return Offset(self._snapshot.meta.offset + 1)
        return Offset(self.log.log_start_offset)

    def last_offset(self) -> Offset:
        return Offset(self.log.log_end_offset - 1)

    def term_at(self, offset: Offset) -> Term | None:
        snapshot_offset = NO_OFFSET if self._snapshot is None else self._snapshot.meta.offset
        if offset == snapshot_offset:
            return Term(0) if self._snapshot is None else self._snapshot.meta.term
        if not self.first_offset() <= offset <= self.last_offset():
            return None
        index = bisect.bisect_right(self._epoch_starts, offset) - 1
        assert index >= 0, f"the epoch cache does not cover offset {offset}"
        return Term(self._epoch_terms[index])

    def entries(self, start: Offset, *, bytes_max: int) -> Sequence[Entry]:
        if not self.first_offset() <= start <= self.last_offset():
            raise LookupError(
                f"no entry at offset {start} in {self.directory} (log holds "
                f"[{self.first_offset()}, {self.last_offset()}])"
            )
        result: list[Entry] = []
        size_bytes, offset = 0, int(start)
        while offset < self.log.log_end_offset:
            for header, view in self.log.batches(offset, bytes_max=max(bytes_max - size_bytes, 1)):
                if not result and header.base_offset != start:
                    raise LookupError(f"offset {start} is inside the entry at {header.base_offset}")
                entry = self._entry_from(header, view)
                self._check_term(entry)
                if result and size_bytes + entry.size_bytes > bytes_max:
                    return result
                result.append(entry)
                size_bytes += entry.size_bytes
                offset = header.last_offset + 1
        assert result and result[0].offset == start, (start, self.directory)
        return result

    def config_entries(self) -> Sequence[Entry]:
        entries = [self.entries(Offset(offset), bytes_max=1)[0] for offset in self._config_offsets]
        assert all(entry.kind is EntryKind.CONFIG for entry in entries), self.directory
        return entries

    def snapshot(self) -> Snapshot | None:
        return self._snapshot

    # --- DurableLog ---------------------------------------------------------------------

    def append(self, entries: Sequence[Entry]) -> None:
        if not entries:
            return
        first = entries[0].offset
        if not self.first_offset() <= first <= self.last_offset() + 1:
            raise LookupError(
                f"cannot append at offset {first} to {self.directory}: log holds "
                f"[{self.first_offset()}, {self.last_offset()}]"
            )
        if first <= self.last_offset():
            self.log.truncate_from(first)  # Raft §5.3: drop the conflicting suffix
            self._forget_from(first)
        batches = [self._batch_for(entry) for entry in entries]
        if self._note_appends(entries):
            self._save_checkpoint(defer=True)  # written by the next sync, before its fsyncs
        for entry, batch in zip(entries, batches, strict=True):
            info = self.log.append(batch, leader_epoch=entry.term, base_offset=entry.offset)
            assert info.last_offset == entry.last_offset, (info, entry)
        assert self.last_offset() == entries[-1].last_offset
        assert self.term_at(entries[-1].last_offset) == entries[-1].term

    def install_snapshot(self, snapshot: Snapshot) -> None:
        offset = snapshot.meta.offset
        assert offset + 1 >= self.log.log_start_offset, (offset, self.log.log_start_offset)
        self._save_snapshot(snapshot)
        if self.log.log_end_offset > self.log.log_start_offset:
            self.log.truncate_from(self.log.log_start_offset)
        self.log.delete_segments_before(offset + 1)
        self._epoch_terms, self._epoch_starts, self._config_offsets = [], [], []
        self._noop_offsets, self._internal = [], None
        self._save_checkpoint()
        assert self.last_offset() == offset

    def compact(self, snapshot: Snapshot) -> None:
        offset = snapshot.meta.offset
        snapshot_offset = NO_OFFSET if self._snapshot is None else self._snapshot.meta.offset
        if not snapshot_offset < offset <= self.last_offset():
            raise LookupError(
                f"cannot compact {self.directory} to {offset}: log holds "
                f"[{self.first_offset()}, {self.last_offset()}]"
            )
        assert self.term_at(offset) == snapshot.meta.term, (offset, snapshot.meta.term)
        if offset < self.last_offset():
            following = self.log.read(offset + 1, bytes_max=1).base_offset
            assert following == offset + 1, f"snapshot offset {offset} must end an entry"
        # What the cut leaves must keep its Kafka offsets (the snapshot's data carries the
        # same number for followers and restarts; raftlog.partition.replica).
        kafka_start = self.kafka_offset(offset + 1)
        self._save_snapshot(snapshot)
        self.log.delete_segments_before(offset + 1)
        self._config_offsets = [o for o in self._config_offsets if o > offset]
        self._noop_offsets = [o for o in self._noop_offsets if o > offset]
        self._internal = None
        self.kafka_start = kafka_start
        self._save_checkpoint()
        assert self.first_offset() == offset + 1 and self.log.log_start_offset <= offset + 1

    def sync(self) -> None:
        self._write_pending_checkpoint()
        self.log.flush()

    def prepare_sync(self) -> FlushTicket:
        """`sync` split for the group host: run the ticket off the loop, then complete it."""
        ticket = self.log.prepare_flush()
        pending, self._checkpoint_pending = self._checkpoint_pending, None
        if pending is not None:
            version, data = pending
            ticket.prelude = lambda: self._write_checkpoint(version, data)
        return ticket

    def complete_sync(self, ticket: FlushTicket) -> None:
        assert ticket.done
        self.log.complete_flush(ticket)

    # --- repair after storage damage (raftlog.raft.repair) --------------------------------

    @property
    def is_repairing(self) -> bool:
        """Whether the log lost synced data that a leader has not yet refilled."""
        return self.log.is_repairing

    @property
    def repair_offset(self) -> Offset | None:
        """While repairing: the last offset the log had durably reached before the damage
        (what the Raft core must commit again before it votes, raftlog.raft.repair)."""
        end = self.log.repair_end_offset
        return None if end is None else Offset(end - 1)

    @property
    def damage(self) -> LogDamage | None:
        return self.log.damage

    def finish_repair(self) -> None:
        # The plain mark it writes claims the log's durable end, which a segment roll may have
        # raised past entries whose checkpoint is still pending: the checkpoint goes first,
        # as before every other mark that claims more (a restart scans only past the mark).
        self._write_pending_checkpoint()
        self.log.finish_repair()

    def close(self) -> None:
        self._write_pending_checkpoint()
        self.log.close()

    # --- PartitionLog (what a partition replica reads for consumers) ---------------------

    def log_start_offset(self) -> int:
        return int(self.first_offset())

    def read(
        self,
        offset: int,
        *,
        bytes_max: int,
        end_offset: int | None = None,
        skip_emptied: bool = False,
        internal: frozenset[int] = frozenset(),
    ) -> bytes:
        """Raw whole batches from the one containing `offset`; b"" at the log end.

        With `end_offset` (a partition's high watermark) the bytes stop before the first
        batch that reaches it, cut with the headers the read already parsed and checked.
        With `skip_emptied`, see `_read_skipping_emptied` (which also steps over the batches
        at `internal` offsets: they hold no record a client sees)."""
        if offset == self.log.log_end_offset:
            return b""
        result = self.log.read(offset, bytes_max=bytes_max)
        size = 0
        for header in result.headers:
            if end_offset is not None and header.last_offset >= end_offset:
                return result.data[:size]
            if skip_emptied and header.record_count == 0:
                return self._read_skipping_emptied(offset, bytes_max, end_offset, internal)
            size += header.size_bytes
        return result.data

    def _read_skipping_emptied(
        self, offset: int, bytes_max: int, end_offset: int | None, internal: frozenset[int]
    ) -> bytes:
        """`read`, leaving out the batches compaction emptied of every record, and reading on
        past a run of them (up to `emptied_scan_bytes_max`, across segments) to the next
        batch that holds a record; Raft's own batches (`internal`) count as empty here, or a
        run that ends in a no-op would give a client nothing to move past.

        A Kafka client takes a fetch answer that holds batches but no record as a sign that
        its size limit cut a record in two: librdkafka doubles its limit each time and,
        after ten, reports the partition stuck ("might be too large to fetch"). A cleaned
        prefix can hold whole segments of emptied batches. An answer that finds nothing else
        holds the run's last batch alone, so the client still moves past the run."""
        end = (
            self.log.log_end_offset
            if end_offset is None
            else min(end_offset, self.log.log_end_offset)
        )
        kept: list[bytes] = []
        kept_bytes = scanned_bytes = 0
        last_emptied = b""
        scan_bytes_max = self.log.config.emptied_scan_bytes_max
        while offset < end and not kept and scanned_bytes < scan_bytes_max:
            result = self.log.read(offset, bytes_max=bytes_max)
            scanned_bytes += len(result.data)
            view, position = memoryview(result.data), 0
            for header in result.headers:
                if header.last_offset >= end:
                    offset = end
                    break
                batch = view[position : position + header.size_bytes]
                position += header.size_bytes
                offset = header.last_offset + 1
                if header.base_offset in internal:
                    continue
                if header.record_count == 0:
                    last_emptied = bytes(batch)
                elif kept_bytes < bytes_max or not kept:
                    kept.append(bytes(batch))
                    kept_bytes += len(batch)
        return b"".join(kept) if kept else last_emptied

    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        """The first record at or after `timestamp_ms`, as Kafka's log answers ListOffsets:
        the segment index finds the first data batch whose max timestamp reaches it (Raft's
        own entries carry the wall-clock time of their append, never a record's, so they are
        stepped over), then that one batch is decoded for the record, since a batch's records
        need not be in timestamp order and a client asks for a record (librdkafka's
        0054_offset_time sends two records in one batch and asks for the second's time)."""
        internal = frozenset(self.internal_offsets())
        offset = self.log.offset_for_timestamp(timestamp_ms, skip=internal.__contains__)
        if offset is None:
            return None
        offset = max(offset, int(self.first_offset()))
        return self._first_record_at(offset, timestamp_ms)

    def _first_record_at(self, offset: int, timestamp_ms: int) -> int:
        """The offset of the first record from `offset` on in the batch holding `offset` whose
        timestamp is at least `timestamp_ms`; `offset` itself for a batch that does not decode
        (the batch as a whole still qualifies by its max timestamp)."""
        batches = self.log.batches(offset, bytes_max=1)
        try:
            records = decode_batch(batches[0][1]).records
        except CorruptBatchError:
            return offset
        found = (r.offset for r in records if r.offset >= offset and r.timestamp_ms >= timestamp_ms)
        return next(found, offset)

    # --- Kafka offsets (raftlog.storage.kafka_offsets) ---------------------------------

    def internal_offsets(self) -> list[int]:
        """The offsets of Raft's own entries from the first offset on (no-ops, CONFIG)."""
        if self._internal is None:
            first = int(self.first_offset())
            merged = sorted(o for o in (*self._noop_offsets, *self._config_offsets) if o >= first)
            self._internal = merged
        return self._internal

    def set_kafka_start(self, kafka_offset: int) -> None:
        """The Kafka offset of the first offset, as the partition's snapshot records it."""
        assert kafka_offset >= 0, kafka_offset
        self.kafka_start = kafka_offset

    def kafka_offset(self, offset: int) -> int:
        """The Kafka offset of Raft offset `offset` (from the first offset to the log end)."""
        return kafka_offsets.kafka_offset(
            max(offset, int(self.first_offset())),
            first=int(self.first_offset()),
            kafka_start=self.kafka_start,
            internal=self.internal_offsets(),
        )

    def raft_offset(self, kafka_offset: int) -> int:
        """The Raft offset that holds Kafka offset `kafka_offset` (>= the Kafka log start)."""
        return kafka_offsets.raft_offset(
            kafka_offset,
            first=int(self.first_offset()),
            kafka_start=self.kafka_start,
            internal=self.internal_offsets(),
        )

    def read_kafka(
        self,
        kafka_offset: int,
        *,
        bytes_max: int,
        end_offset: int | None = None,
        skip_emptied: bool = False,
    ) -> bytes:
        """`read` from the batch holding Kafka offset `kafka_offset`, as clients see it:
        Raft's own batches left out, base offsets rewritten to Kafka offsets. `end_offset`
        is a Raft offset (the high watermark)."""
        offset = self.raft_offset(kafka_offset)
        internal = self.internal_offsets()
        data = self.read(
            offset,
            bytes_max=bytes_max,
            end_offset=end_offset,
            skip_emptied=skip_emptied,
            internal=frozenset(internal) if skip_emptied else frozenset(),
        )
        return kafka_offsets.to_kafka_batches(
            data, first=int(self.first_offset()), kafka_start=self.kafka_start, internal=internal
        )

    # --- entries <-> batches ------------------------------------------------------------

    def _batch_for(self, entry: Entry) -> bytes:
        if entry.kind is EntryKind.DATA and _is_plain_batch(entry.data, entry.offset_count):
            return entry.data
        assert entry.kind in _CONTROL_BY_KIND, entry.kind
        control = _CONTROL_BY_KIND[entry.kind]
        batch = encode_control_batch(control, entry.data, timestamp_ms=self.clock.now_ms())
        return _with_offset_count(batch, entry.offset_count)

    def _check_term(self, entry: Entry) -> None:
        """A batch's leader epoch (its Raft term) lies outside its CRC: a flipped bit there
        would change an entry's term unseen, so each read is checked against the epoch
        checkpoint, which knows every term's first offset."""
        expected = self.term_at(entry.offset)
        if entry.term != expected:
            segment = self.log.read(entry.offset, bytes_max=1)
            raise CorruptBatchError(
                f"the batch at offset {entry.offset} carries leader epoch {entry.term}, the "
                f"epoch checkpoint says {expected}",
                path=segment.segment_path,
                position=segment.position,
            )

    def _entry_from(self, header: BatchHeader, view: memoryview) -> Entry:
        term, offset = Term(header.partition_leader_epoch), Offset(header.base_offset)
        if header.is_control:
            control, value = decode_control_batch(view, path=self.directory)
            kind = _KIND_BY_CONTROL.get(control)
            if kind is not None:
                return Entry(term, offset, header.offset_count, kind, value)
        return Entry(term, offset, header.offset_count, EntryKind.DATA, bytes(view))

    # --- the leader-epoch cache ---------------------------------------------------------

    def _note_appends(self, entries: Sequence[Entry]) -> bool:
        """Record new terms and CONFIG entries; True when the checkpoint changed."""
        changed = False
        for entry in entries:
            if not self._epoch_terms or entry.term != self._epoch_terms[-1]:
                assert not self._epoch_terms or entry.term > self._epoch_terms[-1], entry
                self._epoch_terms.append(entry.term)
                self._epoch_starts.append(entry.offset)
                changed = True
            if entry.kind is EntryKind.CONFIG:
                self._config_offsets.append(entry.offset)
                changed = True
            elif entry.kind is EntryKind.NOOP:
                self._noop_offsets.append(entry.offset)
                changed = True
        if changed:
            self._internal = None
        return changed

    def _forget_from(self, offset: int) -> None:
        """Drop what the cache says about offsets >= `offset` (after a truncation)."""
        self._drop_from(offset)
        self._save_checkpoint()

    def _drop_from(self, offset: int) -> None:
        kept = bisect.bisect_left(self._epoch_starts, offset)
        del self._epoch_terms[kept:], self._epoch_starts[kept:]
        assert not self._epoch_starts or self._epoch_starts[-1] < offset
        self._config_offsets = [o for o in self._config_offsets if o < offset]
        self._noop_offsets = [o for o in self._noop_offsets if o < offset]
        self._internal = None

    def _checkpoint_path(self) -> str:
        return os.path.join(self.directory, CHECKPOINT_FILE_NAME)

    def _save_checkpoint(self, *, defer: bool = False) -> None:
        body = json.dumps(
            {
                "epochs": list(zip(self._epoch_terms, self._epoch_starts, strict=True)),
                "configs": self._config_offsets,
                "noops": self._noop_offsets,
            },
            separators=(",", ":"),
        ).encode()
        self._checkpoint_version += 1
        data = _CRC.pack(crc32c(body)) + body
        if defer:
            self._checkpoint_pending = (self._checkpoint_version, data)
        else:
            self._checkpoint_pending = None  # this newer version replaces it
            self._write_checkpoint(self._checkpoint_version, data)

    def _write_pending_checkpoint(self) -> None:
        pending, self._checkpoint_pending = self._checkpoint_pending, None
        if pending is not None:
            self._write_checkpoint(*pending)

    def _write_checkpoint(self, version: int, data: bytes) -> None:
        """Any thread: replace the file unless a newer version is already there."""
        with self._checkpoint_lock:
            if version <= self._checkpoint_written:
                return
            write_file_atomically(self.files, self._checkpoint_path(), data)
            self._checkpoint_written = version

    def _load_checkpoint(self) -> bool:
        """Load, cut back to the log and check the checkpoint; False if it cannot be used."""
        path = self._checkpoint_path()
        if not self.files.exists(path):
            return self.log.log_end_offset == self.log.log_start_offset
        data = read_whole_file(self.files, path)
        if len(data) < _CRC.size or _CRC.unpack_from(data)[0] != crc32c(data[_CRC.size :]):
            log.warning("%s fails its CRC32C: rebuilding it from the log", path)
            return False
        raw = json.loads(data[_CRC.size :])
        if "noops" not in raw:
            return False  # written before no-ops were listed: the scan lists them
        pairs = [(t, s) for t, s in raw["epochs"] if s < self.log.log_end_offset]
        self._epoch_terms = [t for t, _ in pairs]
        self._epoch_starts = [s for _, s in pairs]
        first, end = self.first_offset(), self.log.log_end_offset
        self._config_offsets = [o for o in raw["configs"] if first <= o < end]
        self._noop_offsets = [o for o in raw["noops"] if first <= o < end]
        self._internal = None
        # The checkpoint covers what was fsynced: it is written before each sync's fsyncs. A
        # crash may leave unsynced batches past that (a torn tail keeps a prefix), and a
        # CONFIG or NOOP entry among them in the same term changes no epoch, so nothing
        # below would notice it missing: the tail is scanned again.
        synced_end = self.log.synced_end_at_open
        if synced_end is None:
            return False  # a damaged log: rebuilt whole
        tail_start = max(int(first), synced_end)
        scanned_tail = tail_start < end
        if scanned_tail:
            self._drop_from(tail_start)
            self._note_batches_from(tail_start)
        if not self._checkpoint_matches_log():
            return False
        if (
            scanned_tail
            or len(pairs) != len(raw["epochs"])
            or len(self._config_offsets) != len(raw["configs"])
            or len(self._noop_offsets) != len(raw["noops"])
        ):
            # Persist the cut at once: a later append in the same term writes no checkpoint,
            # and the dropped entries must not come back when the log grows past them again.
            self._save_checkpoint()
        return True

    def _checkpoint_matches_log(self) -> bool:
        if self.last_offset() < self.first_offset():
            return True
        if not self._epoch_starts or self._epoch_starts[0] > self.first_offset():
            return False
        last = self.log.read(self.last_offset(), bytes_max=1).headers[0]
        return self.term_at(self.last_offset()) == last.partition_leader_epoch

    def _note_batches_from(self, offset: int) -> None:
        """Note the terms, CONFIG and NOOP entries of every batch header from `offset` on."""
        while offset < self.log.log_end_offset:
            for header, view in self.log.batches(offset, bytes_max=self.log.config.read_bytes_max):
                entry = self._entry_from(header, view) if header.is_control else None
                kind = EntryKind.DATA if entry is None else entry.kind
                base = Offset(header.base_offset)
                stub = Entry(Term(header.partition_leader_epoch), base, 1, kind, b"")
                self._note_appends([stub])
                offset = header.last_offset + 1

    def _rebuild_checkpoint(self) -> None:
        """Scan every batch header from the first offset (rare: the file was lost)."""
        self._epoch_terms, self._epoch_starts, self._config_offsets = [], [], []
        self._noop_offsets, self._internal = [], None
        self._note_batches_from(self.log.log_start_offset)
        self._config_offsets = [o for o in self._config_offsets if o >= self.first_offset()]
        self._noop_offsets = [o for o in self._noop_offsets if o >= self.first_offset()]
        self._internal = None
        self._save_checkpoint()

    # --- the snapshot file --------------------------------------------------------------

    def _snapshot_path(self) -> str:
        return os.path.join(self.directory, SNAPSHOT_FILE_NAME)

    def _save_snapshot(self, snapshot: Snapshot) -> None:
        membership = snapshot.meta.membership.encode()
        body = _SNAPSHOT_HEAD.pack(
            _SNAPSHOT_MAGIC, 0, snapshot.meta.offset, snapshot.meta.term, len(membership)
        )[8:]
        body += membership + snapshot.data
        data = _SNAPSHOT_MAGIC + _CRC.pack(crc32c(body)) + body
        assert self._snapshot is None or snapshot.meta.offset > self._snapshot.meta.offset
        write_file_atomically(self.files, self._snapshot_path(), data)
        self._snapshot = snapshot

    def _load_snapshot(self) -> Snapshot | None:
        path = self._snapshot_path()
        if not self.files.exists(path):
            return None
        data = read_whole_file(self.files, path)
        if len(data) < _SNAPSHOT_HEAD.size:
            raise StorageError(f"corrupt snapshot {path}: {len(data)} bytes")
        magic, crc, offset, term, membership_bytes = _SNAPSHOT_HEAD.unpack_from(data)
        if magic != _SNAPSHOT_MAGIC or crc != crc32c(data[8:]):
            raise StorageError(f"corrupt snapshot {path}: bad magic {magic!r} or CRC32C")
        start = _SNAPSHOT_HEAD.size
        membership = Membership.decode(data[start : start + membership_bytes])
        meta = SnapshotMeta(Offset(offset), Term(term), membership)
        return Snapshot(meta, data[start + membership_bytes :])

    def _discard_for_repair(self, cause: str) -> None:
        path = self._snapshot_path()
        self.log.discard_for_repair(cause, path=path)
        if self.files.exists(path):
            self.files.remove(path)
            self.files.sync_directory(self.directory)
        self._snapshot = None

    def _finish_snapshot(self) -> None:
        """Redo what a crash may have cut short after a snapshot was written: the log must
        start at a batch boundary at or below `snapshot.offset + 1` and reach it."""
        if self._snapshot is None:
            return
        first = self._snapshot.meta.offset + 1
        log = self.log
        if log.log_start_offset < first < log.log_end_offset:
            base = log.read(first, bytes_max=1).base_offset
            if base != first:  # a batch of an older history straddles the snapshot
                log.truncate_from(base)
        if log.log_end_offset <= first:
            log.delete_segments_before(first)
        assert log.log_start_offset <= first <= log.log_end_offset, (first, log)


def _is_plain_batch(data: bytes, offset_count: int) -> bool:
    """Whether `data` is exactly one non-control batch spanning `offset_count` offsets
    (the CRC is checked by the log's append)."""
    try:
        header = parse_header(data)
    except StorageError:
        return False
    if header.size_bytes != len(data) or header.offset_count != offset_count:
        return False
    if not header.is_control:
        return True
    # A transaction marker is stored as the partition leader built it: a control batch
    # that takes a Kafka offset and reaches clients (raftlog.storage.control_batches).
    if not header.is_transactional:
        return False
    try:
        return decode_txn_marker(data) is not None
    except StorageError:
        return False


def _with_offset_count(batch: bytes, offset_count: int) -> bytes:
    """`batch` widened to occupy `offset_count` offsets (last_offset_delta lies inside the
    CRC, so the CRC is recomputed); Kafka allows a batch's offsets to have gaps."""
    if offset_count == 1:
        return batch
    widened = bytearray(batch)
    _LAST_OFFSET_DELTA.pack_into(widened, _LAST_OFFSET_DELTA_FIELD, offset_count - 1)
    _CRC.pack_into(widened, CRC_FIELD, crc32c(memoryview(widened)[CRC_START:]))
    assert parse_header(widened).offset_count == offset_count
    return bytes(widened)
