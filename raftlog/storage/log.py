"""The segmented log: an append-only sequence of record batches in offset order.

Theory of operation. A partition's (and a Raft group's) log lives in one directory as
segments named by base offset (see `raftlog.storage.segment`). Offsets are dense: each batch
starts where the previous one ended, so `log_end_offset` (the next offset to assign) is the
active segment's end, and a closed segment ends where the next one begins.

Durability is explicit. `append` only buffers; `flush` hands everything to the OS and runs
one fdatasync for all of it (group commit), then `durable_end_offset == log_end_offset`.
Everything below `durable_end_offset` survives any crash; appends above it may be lost or
torn, and recovery cuts them. The invariant is

    log_start_offset <= durable_end_offset <= log_end_offset

Rolling (by size `segment_bytes_max`, age `segment_age_ms_max`, or a full index) syncs the
old segment and writes its index files *before* creating the next file, so only the last
segment can ever hold a torn tail. Opening therefore trusts closed segments (their indexes
load lazily), and scans only the last: open time depends on the active segment, not the log.
After a clean `close` it scans nothing: close fsyncs, writes the active segment's index files
and then the clean-shutdown marker (`raftlog.storage.clean_shutdown`), which open takes.

Removing data.
* `truncate_from(offset)` drops the suffix at offsets >= `offset` (Raft §5.3: a follower
  drops a conflicting suffix). Later segments go newest first, then the segment holding
  `offset` is cut and synced, so a crash part-way leaves a log between the old and the new.
* `delete_segments_before(offset)` drops whole segments whose every offset is below
  `offset` (snapshots, §7). The log start becomes the first kept segment's base offset: it
  is derived from the directory alone, never from a separate checkpoint that could disagree
  with it, so it may stay below `offset`. Worked example: segments at 0, 100, 200 (end 250);
  `delete_segments_before(150)` deletes segment 0 only and `log_start_offset` is 100;
  offsets 100..149 stay readable, which is harmless (they are valid, committed batches). A
  caller with a logical start (the Raft adapter's snapshot offset + 1) keeps it itself. When
  `offset >= log_end_offset` every batch goes and the log restarts empty at `offset`: closed
  segments are deleted oldest first, the active one is emptied and synced, an empty segment
  at `offset` is created, then the old one deleted. A crash at any point leaves a contiguous
  log whose end is the old active base or `offset` (opening drops an empty segment that is
  not the last, as it holds nothing); a caller that must not regress (Raft, whose snapshot
  says where the log starts) persists its snapshot first and repeats the call after a crash.
* A segment's files go with it: the log, its two indexes and its aborted-transaction index
  (`.txnindex`, `raftlog.storage.txn_index`, written by the partition replica), which a
  truncation inside the segment cuts too; `removal_count` counts these changes for the
  replica's cache of it.
* `apply_retention(now_ms)` deletes a prefix of closed segments by bytes and age
  (`raftlog.storage.retention`).

  `retention_point(now_ms)` says where that cut would fall, so a Raft log can record a
  snapshot there first (`RaftLogStorage.compact`) and only then drop the segments.

Reads return raw bytes of whole, CRC-verified batches from one segment, with the segment's
path and the file position (a server could sendfile them). A batch whose CRC fails is never
returned: the read stops before it, or raises `CrcMismatchError` naming file and position.

A log has one owner (its Raft group's driver) and is not thread-safe.
"""

from __future__ import annotations

import bisect
import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass

from raftlog.config import LogConfig
from raftlog.errors import (
    BatchTooLargeError,
    CorruptBatchError,
    LogClosedError,
    OffsetOutOfRangeError,
    StorageError,
)
from raftlog.storage.batch import (
    CRC_FIELD,
    CRC_START,
    EPOCH_FIELD,
    BatchHeader,
    patch_base_offset_and_epoch,
    verify_batch,
)
from raftlog.storage.clean_shutdown import take_clean_shutdown, write_clean_shutdown
from raftlog.storage.compaction import CleanedSegment, discard_leftovers, swap_in_cleaned
from raftlog.storage.durable_mark import (
    DurableMark,
    MarkRecord,
    MarkSyncer,
)
from raftlog.storage.file_system import (
    FileSystem,
    OsFileSystem,
)
from raftlog.storage.retention import SegmentSummary, expired_segment_count
from raftlog.storage.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    Segment,
    SegmentSync,
    parse_segment_name,
)
from raftlog.storage.txn_index import truncate_txn_index
from raftlog.storage.wall_clock import SystemWallClock, WallClock

__all__ = [
    "AppendInfo",
    "FlushTicket",
    "LogDamage",
    "ReadResult",
    "SegmentedLog",
]

# The bytes of a batch that append rewrites (base offset, length, leader epoch): all before the
# CRC's range, so the rest is written from the caller's bytes as they are.
_PATCHED_PREFIX_BYTES = EPOCH_FIELD + 4
assert _PATCHED_PREFIX_BYTES <= CRC_FIELD < CRC_START


@dataclass(frozen=True, slots=True)
class LogDamage:
    """Synced data the log no longer holds: offsets from `first_offset` up to `end_offset`
    (None: unknown, the durable mark itself was lost) are gone, found in `path`."""

    path: str
    first_offset: int
    end_offset: int | None
    cause: str

    def describe(self) -> str:
        if self.end_offset is not None and self.end_offset <= self.first_offset:
            return f"{self.path}: {self.cause}"
        end = "an unknown end" if self.end_offset is None else str(self.end_offset)
        return (
            f"{self.path}: synced offsets from {self.first_offset} to {end} are lost or "
            f"damaged ({self.cause})"
        )


@dataclass(slots=True)
class FlushTicket:
    """The writes and fsyncs of one `prepare_flush`; `run` may be called from any thread."""

    syncs: tuple[SegmentSync, ...]
    segments: tuple[Segment, ...]  # whose syncs these are (read on the caller's thread only)
    directory: str | None
    files: FileSystem
    end_offset: int
    done: bool = False
    # Durable work of the log's owner that must precede these fsyncs (RaftLogStorage's
    # leader-epoch checkpoint), run on the same disk thread instead of on the event loop.
    prelude: Callable[[], None] | None = None
    # Recorded after the fsyncs, so the mark never claims more than the log holds; its own
    # fsync is the mark's syncer's (raftlog.storage.durable_mark, "When the record is fsynced").
    mark: DurableMark | None = None
    mark_record: MarkRecord | None = None

    def run(self) -> None:
        if self.prelude is not None:
            self.prelude()
        for sync in self.syncs:
            sync.run()
        if self.directory is not None:
            self.files.sync_directory(self.directory)
        if self.mark is not None and self.mark_record is not None:
            self.mark.advance(self.mark_record)
        self.done = True


@dataclass(frozen=True, slots=True)
class AppendInfo:
    base_offset: int
    last_offset: int
    size_bytes: int
    max_timestamp_ms: int


@dataclass(frozen=True, slots=True)
class ReadResult:
    """Whole batches from one segment: `data` is the file's bytes at `position`."""

    data: bytes
    segment_path: str
    position: int
    headers: tuple[BatchHeader, ...]

    @property
    def base_offset(self) -> int:
        """First offset of the first batch (at or below the offset asked for)."""
        return self.headers[0].base_offset if self.headers else -1

    @property
    def next_offset(self) -> int:
        """The offset after the last batch returned."""
        return self.headers[-1].last_offset + 1 if self.headers else -1


class SegmentedLog:
    def __init__(
        self,
        directory: str,
        config: LogConfig,
        files: FileSystem,
        clock: WallClock,
        mark_syncer: MarkSyncer | None = None,
    ) -> None:
        # Use SegmentedLog.open(); this only sets fields.
        self.directory = directory
        self.config = config
        self.files = files
        self.clock = clock
        self._segments: list[Segment] = []
        self._base_offsets: list[int] = []
        self._durable_end_offset = 0
        self._directory_dirty = False
        self._closed = False
        self.mark = DurableMark(files, directory, mark_syncer)
        # Set while the log lost synced data and has not been repaired: the end it had
        # reached, kept in the mark (flagged) so a restart before the repair knows it too.
        self._repair_end_offset: int | None = None
        self.damage: LogDamage | None = None  # what open found, for the owner to report
        # How far the log was fsynced before this open, by its mark (None: damaged). Batches
        # past it survived a crash unsynced (a torn tail's whole prefix): what an owner's
        # derived files (RaftLogStorage's checkpoint) cover only up to here.
        self.synced_end_at_open: int | None = None
        # Counts removals and cuts of segments: a cache of their sidecar files (the
        # aborted-transaction index) drops itself when it changed.
        self._removal_count = 0

    # --- opening ------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        *,
        config: LogConfig,
        files: FileSystem | None = None,
        clock: WallClock | None = None,
        mark_syncer: MarkSyncer | None = None,
    ) -> SegmentedLog:
        """Open (or create) the log in `directory`, recovering from a crash if needed.
        `mark_syncer` runs the durable mark's deferred fsyncs (the default: at once)."""
        config.validate()
        files, clock = files or OsFileSystem(), clock or SystemWallClock()
        log = cls(os.fspath(directory), config, files, clock, mark_syncer)
        log.files.make_directory(log.directory)
        discard_leftovers(log.files, log.directory)
        base_offsets = log._list_segments()
        if not base_offsets and not log.mark.exists():
            # A fresh log: the mark first, so no crash leaves batches without one.
            log.mark.write(MarkRecord(0))
            log._segments = [Segment.create(log.files, log.directory, 0, config)]
            log.files.sync_directory(log.directory)
        elif not base_offsets:
            log._segments = [Segment.create(log.files, log.directory, 0, config)]
            log.files.sync_directory(log.directory)
        else:
            log._open_segments(base_offsets)
        log._base_offsets = [s.base_offset for s in log._segments]
        log._durable_end_offset = log.log_end_offset  # recovery synced what it kept
        log._check_mark(cut=log._segments[-1].recovery_cut)
        log._check_invariants()
        return log

    def _check_mark(self, *, cut: str | None) -> None:
        """Compare the log with its durable mark; record damage and start the repair."""
        found = self.mark.load()
        end = self.log_end_offset
        if not isinstance(found, str) and not found.repairing:
            self.synced_end_at_open = min(found.end_offset, end)
        if isinstance(found, str):
            damage = LogDamage(self.mark.path, end, None, f"durable mark unusable: {found}")
        elif found.repairing:
            cause = (
                f"the log ends at {end}; a repair from the leader toward offset "
                f"{found.end_offset} had not finished before this restart"
            )
            damage = LogDamage(self.directory, end, max(found.end_offset, end), cause)
        elif found.end_offset > end:
            where = self._active().path
            cause = cut or f"{where} ends at byte {self._active().size_bytes}"
            damage = LogDamage(where, end, found.end_offset, cause)
        else:
            return
        self.damage = damage
        self._repair_end_offset = end if damage.end_offset is None else damage.end_offset
        self.mark.write(self._mark_record(end))

    # --- repair -------------------------------------------------------------------------

    @property
    def repair_end_offset(self) -> int | None:
        """While repairing: the end the log had durably reached before it lost data."""
        return self._repair_end_offset

    @property
    def is_repairing(self) -> bool:
        """Whether the log lost synced data and was not yet refilled from a leader."""
        return self._repair_end_offset is not None

    def _mark_record(self, end_offset: int) -> MarkRecord:
        if self._repair_end_offset is None:
            return MarkRecord(end_offset)
        return MarkRecord(max(end_offset, self._repair_end_offset), repairing=True)

    def start_repair(self, offset: int, cause: str, *, path: str) -> LogDamage:
        """Synced data at `offset` turned out damaged (a read or the scrubber found it):
        record that durably, then drop the log from there; a leader refills it."""
        self._check_open()
        end = max(self._durable_end_offset, self.log_end_offset, self._repair_end_offset or 0)
        self._repair_end_offset = end
        self.mark.write(self._mark_record(end))
        self.damage = LogDamage(path, offset, end, cause)
        cut = max(offset, self.log_start_offset)
        self.truncate_from(cut)
        assert self.is_repairing and self.log_end_offset == cut, (self.log_end_offset, cut)
        return self.damage

    def discard_for_repair(self, cause: str, *, path: str) -> LogDamage:
        """What the log starts from is lost (its snapshot): drop every batch and start over,
        empty at offset 0, repairing; a leader sends its snapshot and entries again. The
        repairing mark goes first, so a crash part-way is found damaged again."""
        self._check_open()
        end = max(self._durable_end_offset, self.log_end_offset, self._repair_end_offset or 0)
        self._repair_end_offset = end
        self.mark.write(self._mark_record(end))
        self.damage = LogDamage(path, self.log_start_offset, end, cause)
        self._removal_count += 1
        for segment in self._segments:  # oldest first: a crash leaves a suffix
            segment.delete()
        self.files.sync_directory(self.directory)
        fresh = Segment.create(self.files, self.directory, 0, self.config)
        fresh.sync()
        self.files.sync_directory(self.directory)
        self._segments, self._base_offsets = [fresh], [0]
        self._durable_end_offset = 0
        self._check_invariants()
        return self.damage

    def finish_repair(self) -> None:
        """A leader that the other replicas elected refilled the log: the mark is plain again."""
        self._check_open()
        self._repair_end_offset = None
        self.damage = None
        self.mark.write(self._mark_record(self._durable_end_offset))

    def _list_segments(self) -> list[int]:
        """Base offsets of the segments present; removes leftovers of interrupted writes
        (temporary files, index files whose segment is gone)."""
        names = self.files.list_directory(self.directory)
        bases = sorted(
            base for name in names if (base := parse_segment_name(name, LOG_SUFFIX)) is not None
        )
        present = set(bases)
        stale = [
            name
            for name in names
            if any(
                (base := parse_segment_name(name, suffix)) is not None and base not in present
                for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)
            )
        ]
        for name in stale:
            self.files.remove(os.path.join(self.directory, name))
        if stale:
            self.files.sync_directory(self.directory)
        return bases

    def _open_segments(self, base_offsets: list[int]) -> None:
        for base, next_base in itertools.pairwise(base_offsets):
            segment = Segment.open_closed(self.files, self.directory, base, next_base, self.config)
            if segment.size_bytes == 0:
                # Only an interrupted restart (see delete_segments_before) leaves an empty
                # segment before the last; it holds no offsets.
                segment.delete()
                self.files.sync_directory(self.directory)
                continue
            segment.ensure_index_files()
            self._segments.append(segment)
        now_ms = self.clock.now_ms()
        state = take_clean_shutdown(self.files, self.directory)
        last = None
        if state is not None and state["base_offset"] == base_offsets[-1]:
            last = Segment.resume_clean(
                self.files, self.directory, base_offsets[-1], self.config, state, now_ms
            )
        if last is None:
            last = Segment.recover(
                self.files, self.directory, base_offsets[-1], self.config, now_ms
            )
        self._segments.append(last)

    # --- state --------------------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return self._segments[0].base_offset

    @property
    def log_end_offset(self) -> int:
        """The offset the next appended batch gets."""
        return self._segments[-1].end_offset

    @property
    def durable_end_offset(self) -> int:
        """Every offset below this one is on disk (fsynced)."""
        return self._durable_end_offset

    @property
    def removal_count(self) -> int:
        """How many times segments were removed or cut so far."""
        return self._removal_count

    @property
    def segment_base_offsets(self) -> tuple[int, ...]:
        return tuple(self._base_offsets)

    def closed_segments(self) -> list[tuple[str, int, int]]:
        """`(path, base_offset, end_offset)` of every closed segment (the scrubber's work)."""
        return [(s.path, s.base_offset, s.end_offset) for s in self._segments[:-1]]

    def closed_segment_stats(self) -> list[tuple[str, int, int, int, int]]:
        """(path, base, end, size_bytes, max_timestamp_ms) of each closed segment."""
        return [
            (s.path, s.base_offset, s.end_offset, s.size_bytes, s.max_timestamp_ms)
            for s in self._segments[:-1]
        ]

    def install_cleaned(self, cleaned: list[CleanedSegment]) -> int:
        """Swap in the cleaned copies the cleaner wrote (`raftlog.storage.compaction`) of
        segments still closed with the same offsets; returns how many went in."""
        self._check_open()
        by_base = {s.base_offset: (i, s) for i, s in enumerate(self._segments[:-1])}
        chosen = [
            c
            for c in cleaned
            if c.base_offset in by_base and by_base[c.base_offset][1].end_offset == c.end_offset
        ]
        swap_in_cleaned(self.files, self.directory, [c.base_offset for c in chosen])
        for c in chosen:
            index, old = by_base[c.base_offset]
            old.close()
            segment = Segment.open_closed(
                self.files, self.directory, c.base_offset, c.end_offset, self.config
            )
            assert segment.size_bytes == c.bytes_after, (segment.size_bytes, c)
            self._segments[index] = segment
        discard_leftovers(self.files, self.directory)
        self._check_invariants()
        return len(chosen)

    @property
    def size_bytes(self) -> int:
        return sum(segment.size_bytes for segment in self._segments)

    @property
    def is_closed(self) -> bool:
        return self._closed

    def _active(self) -> Segment:
        return self._segments[-1]

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError(f"the log in {self.directory} is closed")

    def _check_invariants(self) -> None:
        assert self._base_offsets == [s.base_offset for s in self._segments]
        assert self.log_start_offset <= self._durable_end_offset <= self.log_end_offset, (
            self.log_start_offset,
            self._durable_end_offset,
            self.log_end_offset,
        )

    # --- appending ----------------------------------------------------------------------

    def append(
        self,
        batch: bytes | bytearray | memoryview,
        *,
        leader_epoch: int,
        base_offset: int | None = None,
    ) -> AppendInfo:
        """Verify one batch, give it `base_offset` (default: `log_end_offset`; a follower
        passes the leader's, which must equal `log_end_offset`) and `leader_epoch`, and
        buffer it. Durable only after `flush`."""
        self._check_open()
        if len(batch) > self.config.batch_bytes_max:
            raise BatchTooLargeError(len(batch), batch_bytes_max=self.config.batch_bytes_max)
        if base_offset is not None and base_offset != self.log_end_offset:
            raise StorageError(
                f"append at base_offset {base_offset} to {self.directory}, but the log ends "
                f"at {self.log_end_offset}: truncate first or append at the end"
            )
        if not isinstance(batch, bytes):
            batch = bytes(batch)  # buffered until written: the caller must not change it
        header = verify_batch(batch)
        if header.size_bytes != len(batch):
            raise CorruptBatchError(
                f"{len(batch) - header.size_bytes} bytes after the batch",
                position=header.size_bytes,
            )
        offset = self.log_end_offset
        # No copy of the batch: its first bytes, patched, then a view of the rest (base offset
        # and epoch lie outside the CRC, which covers only bytes after both).
        prefix = bytearray(batch[:_PATCHED_PREFIX_BYTES])
        patch_base_offset_and_epoch(prefix, 0, base_offset=offset, leader_epoch=leader_epoch)
        parts = (prefix, memoryview(batch)[_PATCHED_PREFIX_BYTES:])
        last_offset = offset + header.last_offset_delta
        now_ms = self.clock.now_ms()
        self._maybe_roll(len(batch), last_offset, now_ms)
        self._active().append(parts, _patched(header, offset, leader_epoch), now_ms)
        assert self.log_end_offset == last_offset + 1
        assert self._durable_end_offset <= offset, "a new append is not durable yet"
        return AppendInfo(offset, last_offset, len(batch), header.max_timestamp)

    def _maybe_roll(self, batch_bytes: int, last_offset: int, now_ms: int) -> None:
        active = self._active()
        too_old = (
            active.size_bytes > 0
            and now_ms - active.rolling_base_ms >= self.config.segment_age_ms_max
        )
        if too_old or active.is_full_for(batch_bytes, last_offset):
            self.roll()

    def roll(self) -> None:
        """Close the active segment and start a new one at `log_end_offset` (no-op if the
        active segment is empty)."""
        self._check_open()
        active = self._active()
        if active.size_bytes == 0:
            return
        active.close_for_roll()
        # The closing segment's name (created at the previous roll) and its new index files
        # become durable with the directory; then everything below its end is on disk.
        self.files.sync_directory(self.directory)
        self._directory_dirty = False
        self._durable_end_offset = active.end_offset
        segment = Segment.create(self.files, self.directory, active.end_offset, self.config)
        self._segments.append(segment)
        self._base_offsets.append(segment.base_offset)
        self._directory_dirty = True
        self._check_invariants()

    def flush(self) -> int:
        """Make every append so far durable with one fdatasync; returns durable_end_offset."""
        self._check_open()
        for segment in self._segments[-2:]:
            segment.sync()  # only the active one has unsynced appends (rolls sync)
        if self._directory_dirty:
            self.files.sync_directory(self.directory)
            self._directory_dirty = False
        self._durable_end_offset = self.log_end_offset
        self.mark.advance(self._mark_record(self._durable_end_offset))
        self._check_invariants()
        assert not any(segment.is_dirty for segment in self._segments[-2:])
        return self._durable_end_offset

    def prepare_flush(self) -> FlushTicket:
        """`flush` in three steps, so the copy into the page cache and the fsyncs can run off
        the event loop: this takes the buffered appends (on the caller's thread),
        `FlushTicket.run` writes and fsyncs them (any thread; it touches only file
        descriptors and the buffers handed over), `complete_flush` records durability (on
        the caller's thread). Nothing may truncate the log between the first and the last
        step; appends may (they are simply not covered), and reads of bytes in flight wait
        for their write (`Segment.finish_in_flight`)."""
        self._check_open()
        segments, syncs = [], []
        for segment in self._segments[-2:]:
            sync = segment.prepare_sync()
            if sync is not None:
                segments.append(segment)
                syncs.append(sync)
        directory = self.directory if self._directory_dirty else None
        self._directory_dirty = False
        end_offset = self.log_end_offset
        return FlushTicket(
            tuple(syncs),
            tuple(segments),
            directory,
            self.files,
            end_offset,
            mark=self.mark,
            mark_record=self._mark_record(end_offset),
        )

    def complete_flush(self, ticket: FlushTicket) -> int:
        assert ticket.done, "complete_flush before the ticket ran"
        assert ticket.end_offset <= self.log_end_offset, "truncated during a flush"
        for segment in ticket.segments:
            segment.finish_in_flight()  # written by the ticket: only counts them
        self._durable_end_offset = max(self._durable_end_offset, ticket.end_offset)
        self._check_invariants()
        return self._durable_end_offset

    # --- reading ------------------------------------------------------------------------

    def _segment_for(self, offset: int) -> Segment:
        if not self.log_start_offset <= offset < self.log_end_offset:
            raise OffsetOutOfRangeError(
                offset, log_start_offset=self.log_start_offset, log_end_offset=self.log_end_offset
            )
        segment = self._segments[bisect.bisect_right(self._base_offsets, offset) - 1]
        assert segment.base_offset <= offset < segment.end_offset, (offset, segment.base_offset)
        return segment

    def read(self, offset: int, *, bytes_max: int) -> ReadResult:
        """Raw bytes of whole batches from the one containing `offset`, within one segment,
        up to `bytes_max` (capped by `read_bytes_max`) but always at least one batch.
        At `log_end_offset` the result is empty; outside the log, OffsetOutOfRangeError."""
        self._check_open()
        assert bytes_max > 0, bytes_max
        if offset == self.log_end_offset and offset >= self.log_start_offset:
            return ReadResult(b"", self._active().path, self._active().size_bytes, ())
        segment = self._segment_for(offset)
        position, header = segment.locate(offset)
        bytes_max = min(bytes_max, self.config.read_bytes_max)
        result = segment.read(position, header, bytes_max)
        assert result.headers[0].base_offset <= offset <= result.headers[0].last_offset
        assert len(result.data) == sum(h.size_bytes for h in result.headers), "whole batches"
        return ReadResult(result.data, segment.path, position, result.headers)

    def batches(self, start_offset: int, *, bytes_max: int) -> list[tuple[BatchHeader, memoryview]]:
        """The batches of `read(start_offset)`, each with a view of its bytes."""
        result = self.read(start_offset, bytes_max=bytes_max)
        view = memoryview(result.data)
        batches: list[tuple[BatchHeader, memoryview]] = []
        position = 0
        for header in result.headers:
            batches.append((header, view[position : position + header.size_bytes]))
            position += header.size_bytes
        assert position == len(view)
        return batches

    def offset_for_timestamp(
        self, timestamp_ms: int, *, skip: Callable[[int], bool] | None = None
    ) -> int | None:
        """Base offset of the first batch whose max_timestamp >= `timestamp_ms` (batch
        granularity: the segments index batches; `RaftLogStorage` decodes the batch found for
        its record) and whose base offset `skip` does not leave out (Raft's own entries), or
        None when there is none."""
        self._check_open()
        for segment in self._segments:
            if segment.size_bytes and segment.max_timestamp_ms >= timestamp_ms:
                offset = segment.offset_for_timestamp(timestamp_ms, skip=skip)
                if offset is not None:
                    return offset
        return None

    # --- removing -----------------------------------------------------------------------

    def truncate_from(self, offset: int) -> None:
        """Drop every batch at offsets >= `offset`, a batch boundary; durable on return."""
        self._check_open()
        if offset == self.log_end_offset:
            return
        if self._repair_end_offset is None and offset < self._durable_end_offset:
            # Lowered first: a crash part-way then leaves a log at or above its mark.
            self.mark.write(MarkRecord(offset))
        self._removal_count += 1
        segment = self._segment_for(offset)
        index = self._segments.index(segment)
        doomed = self._segments[index + 1 :]
        if offset == segment.base_offset and index > 0:
            doomed.insert(0, segment)  # the whole segment goes; the one before becomes active
            segment = self._segments[index - 1]
        for dropped in reversed(doomed):  # newest first: a crash leaves a prefix
            dropped.delete()
        self._segments = self._segments[: self._segments.index(segment) + 1]
        self._base_offsets = [s.base_offset for s in self._segments]
        if doomed:
            self.files.sync_directory(self.directory)
        segment.truncate_from(min(offset, segment.end_offset), self.clock.now_ms())
        # After the segment: a crash between the two leaves index entries past the
        # segment's end, which TransactionIndex.recover cuts.
        truncate_txn_index(self.files, self.directory, segment.base_offset, offset)
        self._durable_end_offset = min(self._durable_end_offset, offset)
        self._check_invariants()
        assert self.log_end_offset == offset, (self.log_end_offset, offset)

    def delete_segments_before(self, offset: int) -> int:
        """Delete whole segments whose offsets are all below `offset`; returns how many.
        See the module docstring for where the log start ends up."""
        self._check_open()
        assert offset >= 0, offset
        if offset >= self.log_end_offset and (
            self._active().size_bytes or offset > self._active().base_offset
        ):
            return self._restart_at(offset)
        count = 0
        while count < len(self._segments) - 1 and self._segments[count].end_offset <= offset:
            count += 1
        self._delete_oldest(count)
        # Postcondition: the first kept segment holds `offset` or later ones, or is the last.
        assert offset < self._segments[0].end_offset or len(self._segments) == 1, (offset, self)
        return count

    def _delete_oldest(self, count: int) -> None:
        assert 0 <= count < len(self._segments), count
        if count == 0:
            return
        self._removal_count += 1
        for segment in self._segments[:count]:  # oldest first: a crash leaves a suffix
            segment.delete()
        self.files.sync_directory(self.directory)
        del self._segments[:count]
        del self._base_offsets[:count]
        self._durable_end_offset = max(self._durable_end_offset, self.log_start_offset)
        self._check_invariants()

    def _restart_at(self, offset: int) -> int:
        """Drop every batch and restart the log, empty, at `offset` (>= log_end_offset)."""
        count = len(self._segments)
        self._delete_oldest(count - 1)
        self._removal_count += 1
        old = self._active()
        old.truncate_from(old.base_offset, self.clock.now_ms())  # emptied and synced
        fresh = Segment.create(self.files, self.directory, offset, self.config)
        fresh.sync()
        self.files.sync_directory(self.directory)
        # A crash before the next line leaves two empty segments; open drops the older.
        old.delete()
        self.files.sync_directory(self.directory)
        self._segments, self._base_offsets = [fresh], [offset]
        self._durable_end_offset = offset
        self.mark.write(self._mark_record(offset))
        self._check_invariants()
        return count

    def apply_retention(self, now_ms: int) -> int:
        """Delete the oldest closed segments beyond `retention_bytes` or older than
        `retention_ms`; never the active segment. Returns how many were deleted."""
        start_offset = self.log_start_offset
        count = self._expired_count(now_ms)
        self._delete_oldest(count)
        assert self._segments and self.log_start_offset >= start_offset, "never the active"
        return count

    def retention_point(self, now_ms: int) -> int | None:
        """The base offset of the first segment retention would keep, if it would delete
        any: a Raft log records a snapshot there first
        (raftlog.storage.raft_log_storage.compact)."""
        count = self._expired_count(now_ms)
        assert count < len(self._segments), "retention never reaches the active segment"
        return self._base_offsets[count] if count else None

    def segment_start_at_or_below(self, offset: int) -> int | None:
        """The base offset of the segment holding `offset` (the active one past the end), if
        segments lie wholly below it: the cut a log start moved to `offset` allows."""
        self._check_open()
        holding = min(bisect.bisect_right(self._base_offsets, offset), len(self._segments)) - 1
        return self._base_offsets[holding] if holding > 0 else None

    def _expired_count(self, now_ms: int) -> int:
        self._check_open()
        closed = self._segments[:-1]
        return expired_segment_count(
            [SegmentSummary(s.base_offset, s.size_bytes) for s in closed],
            total_bytes=self.size_bytes,
            now_ms=now_ms,
            retention_bytes=self.config.retention_bytes,
            retention_ms=self.config.retention_ms,
            max_timestamp_ms=lambda i: closed[i].max_timestamp_ms,
        )

    def close(self) -> None:
        """Flush and release the files; further use raises LogClosedError."""
        if self._closed:
            return
        self.flush()
        # Written after the fsyncs it vouches for (flush, then the index files).
        write_clean_shutdown(self.files, self.directory, self._active().clean_state())
        for segment in self._segments:
            segment.close()
        self.mark.close()
        self._closed = True

    def __repr__(self) -> str:
        return (
            f"SegmentedLog({self.directory!r}, start={self.log_start_offset}, "
            f"durable_end={self._durable_end_offset}, end={self.log_end_offset}, "
            f"segments={len(self._segments)})"
        )


def _patched(header: BatchHeader, base_offset: int, leader_epoch: int) -> BatchHeader:
    """`header` with the two fields append patched (positional: dataclasses.replace costs
    several times more, and this runs once per appended batch)."""
    h = header
    return BatchHeader(
        base_offset,
        h.batch_length,
        leader_epoch,
        h.magic,
        h.crc,
        h.attributes,
        h.last_offset_delta,
        h.first_timestamp,
        h.max_timestamp,
        h.producer_id,
        h.producer_epoch,
        h.base_sequence,
        h.record_count,
    )
