"""One segment of the log: a `.log` file of whole record batches and its two indexes.

Theory of operation. A segment is named by its base offset, the offset of its first batch,
in 20 digits (`00000000000000000042.log`, `.index`, `.timeindex`, and `.txnindex` when an
aborted transaction ended in it: `raftlog.storage.txn_index`). Batches inside it are
contiguous in offset: each starts at the previous batch's last offset + 1. A segment is either

* *active* (the last one): it takes appends. Appends wait in `_pending` (user space) and go
  to the OS in one writev when a flush comes, a reader needs them, or the buffer reaches
  `append_buffer_bytes_max`. A split flush (`prepare_sync`) hands that writev, with the
  fsync after it, to a disk thread (`SegmentSync`): the event loop does not copy a pass's
  appends into the page cache. Until the loop has seen that write finish, the bytes count
  as in flight; whatever needs the file's tail (a read of them, a drain, a truncation, a
  close) first waits for the write, or does it itself if no thread has started it.
  Its indexes live in memory only; recovery rebuilds them by scanning the file, which it
  must read anyway to cut a torn tail. After a clean shutdown there is no tail to cut: the
  log's close wrote the segment's index files and its `state` (`clean_state`), and the next
  open resumes from them without reading the file (`resume_clean`, Kafka's clean-shutdown
  marker); or
* *closed*: read-only, fsynced, with its index files written and fsynced when it closed.
  Opening a closed segment reads nothing: its indexes load on first use and are checked
  then; a missing or damaged index file is rebuilt from the segment (`CorruptIndexError`).
  Its `end_offset` is the next segment's base offset, supplied by the log.

Sizes: `size_bytes` counts pending and in-flight bytes too; `_written_bytes` only what the
loop knows the OS has. Invariant: `_written_bytes + in-flight + _pending_bytes == size_bytes`.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from raftlog.config import LogConfig
from raftlog.errors import CorruptBatchError, StorageError
from raftlog.storage.batch import (
    BATCH_HEADER_BYTES,
    CRC_START,
    LOG_OVERHEAD_BYTES,
    MAGIC_V2,
    BatchHeader,
    crc32c,
    verify_batch,
)
from raftlog.storage.file_system import Buffer, FileHandle, FileSystem, read_whole_file
from raftlog.storage.index import CorruptIndexError, OffsetIndex, TimeIndex

__all__ = [
    "INDEX_SUFFIX",
    "LOG_SUFFIX",
    "TIME_INDEX_SUFFIX",
    "TXN_INDEX_SUFFIX",
    "Segment",
    "SegmentSync",
    "announced_bytes",
    "parse_segment_name",
    "segment_name",
    "verified_batches",
]

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
# The aborted-transaction index beside the segment (raftlog.storage.txn_index), written by
# the partition replica; a segment only deletes it with itself.
TXN_INDEX_SUFFIX = ".txnindex"
_NAME_DIGITS = 20
# Recovery reads the active segment in chunks of this size (at least one batch more).
_SCAN_CHUNK_BYTES = 8 * 1024 * 1024
# The header layout of raftlog.storage.batch, unpacked here without its bounds checks so a
# reader can hop from header to header reading 61 bytes each (the CRC is checked on read).
_HEADER = struct.Struct(">qiibIhiqqqhii")
_TIMESTAMP_NONE = -1


def segment_name(base_offset: int, suffix: str) -> str:
    assert 0 <= base_offset < 10**_NAME_DIGITS, base_offset
    return f"{base_offset:0{_NAME_DIGITS}d}{suffix}"


def parse_segment_name(name: str, suffix: str) -> int | None:
    """The base offset a file name encodes, or None when it is not a segment file."""
    stem = name[: -len(suffix)]
    if not name.endswith(suffix) or len(stem) != _NAME_DIGITS or not stem.isdigit():
        return None
    return int(stem)


@dataclass(frozen=True, slots=True)
class SegmentRead:
    """Whole verified batches read from one segment."""

    data: bytes
    position: int
    headers: tuple[BatchHeader, ...]


class SegmentSync:
    """Appends of one segment handed off by `Segment.prepare_sync`, and the fsync after them.

    `run` (a disk thread) writes the buffers in one writev, then fsyncs. The write happens
    exactly once, by whoever comes first: the thread, or the loop when it needs the bytes in
    the file before the thread got to them (`write`; the lock makes the loop wait while the
    thread is at it, and a ticket that never runs cannot strand the appends)."""

    __slots__ = ("_buffers", "_error", "_handle", "_lock", "size_bytes", "synced", "written")

    def __init__(self, handle: FileHandle, buffers: list[Buffer], size_bytes: int) -> None:
        assert size_bytes == sum(len(buffer) for buffer in buffers), size_bytes
        self._handle = handle
        self._buffers = buffers
        self.size_bytes = size_bytes
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self.written = False
        self.synced = False

    def write(self) -> None:
        """Write the buffers unless already written (any thread); re-raises a failed write."""
        with self._lock:
            if not self.written:
                try:
                    if self._buffers:
                        self._handle.append(self._buffers)
                except BaseException as error:
                    self._error = error
                    raise
                finally:
                    self.written = True
                    self._buffers = []  # the page cache has them (or the write failed)
            elif self._error is not None:
                raise self._error

    def run(self) -> None:
        """On a disk thread: the write, then the fsync that makes it durable."""
        self.write()
        self._handle.sync()
        self.synced = True


class Segment:
    def __init__(
        self, files: FileSystem, directory: str, base_offset: int, config: LogConfig
    ) -> None:
        self.files = files
        self.directory = directory
        self.base_offset = base_offset
        self.config = config
        self.path = os.path.join(directory, segment_name(base_offset, LOG_SUFFIX))
        self.end_offset = base_offset
        self.size_bytes = 0
        self.is_dirty = False
        self.rolling_base_ms = _TIMESTAMP_NONE
        self._handle: FileHandle | None = None
        self._written_bytes = 0
        self._pending: list[Buffer] = []
        self._pending_bytes = 0
        self._in_flight: SegmentSync | None = None  # appends handed to a disk thread
        self._offset_index: OffsetIndex | None = None
        self._time_index: TimeIndex | None = None
        self._max_timestamp_ms: int | None = None
        self._max_timestamp_offset = base_offset
        self._bytes_since_index_entry = 0
        # What recovery cut off the end of the file, in words (None: nothing).
        self.recovery_cut: str | None = None

    # --- construction -------------------------------------------------------------------

    @classmethod
    def create(
        cls, files: FileSystem, directory: str, base_offset: int, config: LogConfig
    ) -> Segment:
        """A new, empty active segment (an old file of that name is emptied)."""
        segment = cls(files, directory, base_offset, config)
        segment._handle = files.open(segment.path, create=True)
        segment._handle.truncate(0)
        segment._start_fresh_indexes()
        return segment

    @classmethod
    def open_closed(
        cls, files: FileSystem, directory: str, base_offset: int, end_offset: int, config: LogConfig
    ) -> Segment:
        """A closed segment ending before `end_offset`; reads only its size."""
        assert end_offset > base_offset, (base_offset, end_offset)
        segment = cls(files, directory, base_offset, config)
        segment._handle = files.open(segment.path)
        segment.size_bytes = segment._written_bytes = segment._handle.size_bytes()
        segment.end_offset = end_offset
        return segment

    @classmethod
    def recover(
        cls, files: FileSystem, directory: str, base_offset: int, config: LogConfig, now_ms: int
    ) -> Segment:
        """Open the active segment: scan every batch (length, magic, CRC, offsets), cut the
        file at the first that fails, and rebuild the indexes in memory."""
        segment = cls(files, directory, base_offset, config)
        segment._handle = handle = files.open(segment.path)
        segment._index_from_scan(now_ms)
        if handle.size_bytes() != segment.size_bytes:
            segment.recovery_cut = segment._describe_cut(handle.size_bytes())
            handle.truncate(segment.size_bytes)  # the torn or corrupt tail goes
        handle.sync()  # what recovery kept is now durable, whatever the OS had cached
        assert handle.size_bytes() == segment.size_bytes == segment._written_bytes
        return segment

    @classmethod
    def resume_clean(
        cls,
        files: FileSystem,
        directory: str,
        base_offset: int,
        config: LogConfig,
        state: dict[str, int],
        now_ms: int,
    ) -> Segment | None:
        """Open the active segment as a clean shutdown left it (`clean_state`): its indexes
        from their files, nothing of the file read. None if the file or the index files do not
        match `state` (the caller then recovers by scanning)."""
        segment = cls(files, directory, base_offset, config)
        segment._handle = handle = files.open(segment.path)
        try:
            if handle.size_bytes() != state["size_bytes"] or state["end_offset"] < base_offset:
                raise StorageError(f"{segment.path} changed since the clean shutdown")
            segment.size_bytes = segment._written_bytes = state["size_bytes"]
            segment.end_offset = state["end_offset"]
            segment._offset_index, segment._time_index = segment._read_index_files()
        except (CorruptIndexError, StorageError):
            segment.close()
            return None
        segment._max_timestamp_ms = state["max_timestamp_ms"]
        segment._max_timestamp_offset = state["max_timestamp_offset"]
        segment._bytes_since_index_entry = state["bytes_since_index_entry"]
        # As after a scan: a non-empty segment's age counts from now on the log's clock.
        segment.rolling_base_ms = now_ms if segment.size_bytes > 0 else _TIMESTAMP_NONE
        return segment

    def clean_state(self) -> dict[str, int]:
        """Close time, active segment: sync, write the index files, and return what
        `resume_clean` needs besides them."""
        offset_index, time_index = self._offset_index, self._time_index
        assert offset_index is not None and time_index is not None
        assert self._max_timestamp_ms is not None
        self.sync()
        self._write_index_file(INDEX_SUFFIX, offset_index.to_bytes())
        self._write_index_file(TIME_INDEX_SUFFIX, time_index.to_bytes())
        return {
            "base_offset": self.base_offset,
            "size_bytes": self.size_bytes,
            "end_offset": self.end_offset,
            "max_timestamp_ms": self._max_timestamp_ms,
            "max_timestamp_offset": self._max_timestamp_offset,
            "bytes_since_index_entry": self._bytes_since_index_entry,
        }

    def _describe_cut(self, file_bytes: int) -> str:
        """Why the scan stopped at `size_bytes` in a file of `file_bytes` (before the cut)."""
        position = self.size_bytes
        handle = self._require_handle()
        raw = handle.read_at(BATCH_HEADER_BYTES, position)
        if len(raw) < BATCH_HEADER_BYTES:
            return f"{self.path} ends at byte {file_bytes}, inside a batch header at {position}"
        header = BatchHeader(*_HEADER.unpack_from(raw))
        if header.size_bytes < BATCH_HEADER_BYTES or header.magic != MAGIC_V2:
            return (
                f"{self.path}: no batch at byte {position} (length {header.size_bytes}, "
                f"magic {header.magic})"
            )
        if header.base_offset != self.end_offset:
            return (
                f"{self.path}: batch at byte {position} has base offset "
                f"{header.base_offset}, expected {self.end_offset}"
            )
        if position + header.size_bytes > file_bytes:
            return f"{self.path}: batch at byte {position} runs past the file's end {file_bytes}"
        try:
            verify_batch(handle.read_at(header.size_bytes, position))
        except CorruptBatchError as error:
            return f"{self.path}: batch at byte {position}: {error.reason}"
        return f"{self.path}: batch at byte {position} stopped the scan"

    def _index_from_scan(self, now_ms: int) -> None:
        """Rebuild the in-memory state (indexes, size, end offset) from the verified batches
        of the file; everything after the first bad batch is outside the segment."""
        # Room for one entry per possible batch: a segment written under a larger
        # index_entries_max must still open (it then rolls at its next append).
        batches_max = self._require_handle().size_bytes() // BATCH_HEADER_BYTES + 2
        self._start_fresh_indexes(max(self.config.index_entries_max, batches_max))
        self.rolling_base_ms = _TIMESTAMP_NONE
        self.size_bytes, self.end_offset = 0, self.base_offset
        for position, base_offset, last_offset, size_bytes, max_timestamp_ms in self._scan(0):
            self._index_batch(position, base_offset, size_bytes, max_timestamp_ms, now_ms)
            self.size_bytes = position + size_bytes
            self.end_offset = last_offset + 1
        self._written_bytes = self.size_bytes
        assert self.end_offset >= self.base_offset

    def _start_fresh_indexes(self, entries_max: int | None = None) -> None:
        entries_max = entries_max or self.config.index_entries_max
        self._offset_index = OffsetIndex(self.base_offset, entries_max=entries_max)
        self._time_index = TimeIndex(self.base_offset, entries_max=entries_max)
        self._max_timestamp_ms = _TIMESTAMP_NONE
        self._bytes_since_index_entry = 0

    # --- scanning -----------------------------------------------------------------------

    def _scan(self, position: int) -> Iterator[tuple[int, int, int, int, int]]:
        """Yield `(position, base_offset, last_offset, size_bytes, max_timestamp_ms)` of each
        verified batch from `position`, reading in chunks; stop silently at the end of the
        file or at the first batch that fails verification or breaks offset contiguity
        (recovery cuts the file there). Plain tuples: this loop bounds recovery time."""
        handle = self._require_handle()
        expected_offset = self.base_offset
        while True:
            # Read at least the batch the next header announces: a batch written under a
            # larger batch_bytes_max must not be cut as if torn.
            chunk_bytes = max(_SCAN_CHUNK_BYTES, announced_bytes(handle, position))
            chunk = handle.read_at(chunk_bytes, position)
            used = 0
            for batch_position, base_offset, last_offset, size, max_ms in verified_batches(chunk):
                if base_offset != expected_offset:
                    return  # offsets must be contiguous from the segment's base
                expected_offset = last_offset + 1
                yield position + batch_position, base_offset, last_offset, size, max_ms
                used = batch_position + size
            if len(chunk) < chunk_bytes or used == 0:
                return  # end of file, or a batch that failed inside a full chunk
            position += used

    # --- appending ----------------------------------------------------------------------

    def append(self, parts: Sequence[Buffer], header: BatchHeader, now_ms: int) -> int:
        """Buffer a verified, patched batch, given as consecutive parts that nobody changes
        until they are written; returns its position in the file."""
        assert header.base_offset == self.end_offset, (header.base_offset, self.end_offset)
        size_bytes = sum(len(part) for part in parts)
        assert size_bytes == header.size_bytes, (size_bytes, header)
        position = self.size_bytes
        self._index_batch(position, header.base_offset, size_bytes, header.max_timestamp, now_ms)
        self._pending.extend(parts)
        self._pending_bytes += size_bytes
        self.size_bytes += size_bytes
        self.end_offset = header.last_offset + 1
        self.is_dirty = True
        if self._pending_bytes >= self.config.append_buffer_bytes_max:
            self.drain()
        return position

    def _index_batch(
        self, position: int, base_offset: int, size_bytes: int, max_timestamp_ms: int, now_ms: int
    ) -> None:
        offset_index, time_index = self._offset_index, self._time_index
        assert offset_index is not None and time_index is not None, "active segments index"
        assert self._max_timestamp_ms is not None
        if self.rolling_base_ms == _TIMESTAMP_NONE:
            # A segment's age counts on the log's clock from its first batch (from recovery,
            # after a restart). Not from batch timestamps as Kafka does: those come from
            # producers' clocks, and one old timestamp would roll a segment per append.
            self.rolling_base_ms = now_ms
        if max_timestamp_ms > self._max_timestamp_ms:
            self._max_timestamp_ms = max_timestamp_ms
            self._max_timestamp_offset = base_offset
        if self._bytes_since_index_entry >= self.config.index_interval_bytes:
            offset_index.append(base_offset, position)
            time_index.maybe_append(self._max_timestamp_ms, self._max_timestamp_offset)
            self._bytes_since_index_entry = 0
        self._bytes_since_index_entry += size_bytes

    def is_full_for(self, batch_bytes: int, last_offset: int) -> bool:
        """Whether a batch of this size ending at `last_offset` must go to a new segment."""
        assert self._offset_index is not None and self._time_index is not None
        return self.size_bytes > 0 and (
            self.size_bytes + batch_bytes > self.config.segment_bytes_max
            or last_offset - self.base_offset >= 2**32 - 1
            or self._offset_index.is_full
            or self._time_index.is_full
        )

    def drain(self) -> None:
        """Hand pending appends to the OS (one writev); not durable until `sync`."""
        self.finish_in_flight()  # O_APPEND: these must land after the appends in flight
        if self._pending:
            self._require_handle().append(self._pending)
            self._written_bytes += self._pending_bytes
            self._pending, self._pending_bytes = [], 0
        assert self._written_bytes == self.size_bytes

    def sync(self) -> None:
        self.drain()
        if self.is_dirty:
            self._require_handle().sync()
            self.is_dirty = False

    def prepare_sync(self) -> SegmentSync | None:
        """Hand the pending appends and the fsync to another thread (or None: all synced).

        The segment counts as clean from here: the caller must run the returned sync before
        it treats anything appended so far as durable (`SegmentedLog.prepare_flush`)."""
        self.finish_in_flight()
        if not self.is_dirty:
            return None
        self.is_dirty = False
        handoff = SegmentSync(self._require_handle(), self._pending, self._pending_bytes)
        self._in_flight = handoff
        self._pending, self._pending_bytes = [], 0
        return handoff

    def finish_in_flight(self) -> None:
        """Count the appends handed to a disk thread as written, writing them here if no
        thread has yet (waiting while one is at it). Loop thread only."""
        handoff = self._in_flight
        if handoff is None:
            return
        handoff.write()
        self._written_bytes += handoff.size_bytes
        self._in_flight = None
        if not handoff.synced:
            self.is_dirty = True  # the next sync must fsync them: that ticket may never run
        assert self._written_bytes + self._pending_bytes == self.size_bytes

    def close_for_roll(self) -> None:
        """Turn the active segment into a closed one: sync it, then write and sync its index
        files, before the log creates the next segment (so a crash never leaves a closed
        segment with a torn tail: recovery only scans the last segment)."""
        offset_index, time_index = self._offset_index, self._time_index
        assert offset_index is not None and time_index is not None
        assert self._max_timestamp_ms is not None
        self.sync()
        time_index.maybe_append(self._max_timestamp_ms, self._max_timestamp_offset)
        self._write_index_file(INDEX_SUFFIX, offset_index.to_bytes())
        self._write_index_file(TIME_INDEX_SUFFIX, time_index.to_bytes())
        assert time_index.max_timestamp_ms == self._max_timestamp_ms

    def _write_index_file(self, suffix: str, data: bytes) -> None:
        handle = self.files.open(self._sibling(suffix), create=True)
        try:
            handle.truncate(0)
            handle.append([data])
            handle.sync()
        finally:
            handle.close()

    # --- reading ------------------------------------------------------------------------

    def locate(self, offset: int) -> tuple[int, BatchHeader]:
        """Position and header of the batch containing `offset` (index lookup, then a hop
        from header to header). A wrong index entry means a damaged index: rebuild, retry."""
        assert self.base_offset <= offset < self.end_offset, (offset, self.base_offset)
        try:
            return self._locate(offset)
        except CorruptIndexError:
            self._rebuild_indexes()
            return self._locate(offset)

    def _locate(self, offset: int) -> tuple[int, BatchHeader]:
        indexed_offset, position = self._require_offset_index().lookup(offset)
        header = self._peek_header(position)
        if header is None or header.base_offset != indexed_offset:
            raise CorruptIndexError(
                self._sibling(INDEX_SUFFIX), f"no batch {indexed_offset} at byte {position}"
            )
        while header.last_offset < offset:
            position += header.size_bytes
            expected = header.last_offset + 1
            header = self._peek_header(position)
            # The base offset lies outside the CRC: contiguity is its only check once the
            # segment was not scanned (closed, or resumed after a clean shutdown).
            if header is None or header.base_offset != expected:
                raise CorruptBatchError(
                    f"no batch holds offset {offset}", path=self.path, position=position
                )
        return position, header

    def _peek_header(self, position: int) -> BatchHeader | None:
        """The header at `position` if it looks like one (CRC unchecked), else None."""
        if position + BATCH_HEADER_BYTES > self.size_bytes:
            return None
        self._ensure_written(position + BATCH_HEADER_BYTES)
        raw = self._require_handle().read_at(BATCH_HEADER_BYTES, position)
        if len(raw) < BATCH_HEADER_BYTES:
            return None
        header = BatchHeader(*_HEADER.unpack_from(raw))
        if header.magic != MAGIC_V2 or header.size_bytes < BATCH_HEADER_BYTES:
            return None
        return header

    def read(self, position: int, first: BatchHeader, bytes_max: int) -> SegmentRead:
        """Whole batches from `position` (where `first` starts) up to `bytes_max` bytes, at
        least the first; each batch's CRC is checked and none after a bad one is returned."""
        size = min(max(bytes_max, first.size_bytes), self.size_bytes - position)
        self._ensure_written(position + size)
        data = self._require_handle().read_at(size, position)
        headers: list[BatchHeader] = []
        end = 0
        view = memoryview(data)
        for batch_position, header in _whole_batches(data):
            batch_end = batch_position + header.size_bytes
            if headers and header.base_offset != headers[-1].last_offset + 1:
                break  # a base offset (outside the CRC) off the sequence: never served
            # The header was unpacked and bounds-checked by _whole_batches: only the CRC
            # remains (verify_batch would parse the header a second time).
            crc = crc32c(view[batch_position + CRC_START : batch_end])
            if header.magic != MAGIC_V2 or crc != header.crc:
                if headers:
                    break  # return what verified; the next read reports this batch
                self._raise_corrupt(data, batch_position, position)
            headers.append(header)
            end = batch_end
        if not headers:
            raise CorruptBatchError(
                f"batch of {first.size_bytes} bytes runs past the end of the segment",
                path=self.path,
                position=position,
            )
        assert headers[0].base_offset == first.base_offset, (position, first)
        return SegmentRead(data[:end] if end < len(data) else data, position, tuple(headers))

    def _raise_corrupt(self, data: bytes, batch_position: int, position: int) -> None:
        """Raise verify_batch's precise error for a batch known to be bad, at its file byte."""
        try:
            verify_batch(data, batch_position)
        except CorruptBatchError as error:
            file_position = position + batch_position
            raise type(error)(error.reason, path=self.path, position=file_position) from None
        raise AssertionError(f"{self.path} at byte {position}: bad CRC yet verify_batch passed")

    def _ensure_written(self, end_position: int) -> None:
        if end_position > self._written_bytes:
            self.drain()

    # --- timestamps ---------------------------------------------------------------------

    @property
    def max_timestamp_ms(self) -> int:
        """The largest batch timestamp in the segment (-1 when none); for a closed segment,
        the last entry of its time index, read on first use."""
        if self._max_timestamp_ms is None:
            self._max_timestamp_ms = self._require_time_index().max_timestamp_ms
        return self._max_timestamp_ms

    def offset_for_timestamp(
        self, timestamp_ms: int, *, skip: Callable[[int], bool] | None = None
    ) -> int | None:
        """Base offset of the first batch with `max_timestamp >= timestamp_ms` whose base
        offset `skip` does not leave out, or None."""
        if self.max_timestamp_ms < timestamp_ms:
            return None
        position, header = self.locate(self._require_time_index().lookup(timestamp_ms))
        while header.max_timestamp < timestamp_ms or (
            skip is not None and skip(header.base_offset)
        ):
            position += header.size_bytes
            next_header = self._peek_header(position)
            if next_header is None:
                return None
            header = next_header
        return header.base_offset

    # --- truncation and removal ---------------------------------------------------------

    def truncate_from(self, offset: int, now_ms: int) -> None:
        """Drop batches at offsets >= `offset` (a batch boundary); sync; become active."""
        assert self.base_offset <= offset <= self.end_offset, (offset, self.base_offset)
        self.drain()  # the scan below reads the whole file
        position = self.size_bytes
        if offset < self.end_offset:
            position, header = self.locate(offset)
            if header.base_offset != offset:
                raise StorageError(
                    f"cannot truncate {self.path} at offset {offset}: it lies inside the "
                    f"batch [{header.base_offset}, {header.last_offset}] at byte {position}"
                )
            self.drain()
            handle = self._require_handle()
            handle.truncate(position)
            handle.sync()
            self.size_bytes = self._written_bytes = position
            self.end_offset = offset
            self.is_dirty = False
        # Re-indexing by a scan is simple and always right (a closed segment becoming active
        # again needs in-memory indexes too); truncation is rare and reads one segment.
        self._index_from_scan(now_ms)
        if self.end_offset != offset:
            raise CorruptBatchError(
                f"segment holds verified batches only up to offset {self.end_offset}, "
                f"expected {offset}",
                path=self.path,
                position=self.size_bytes,
            )
        assert self.size_bytes == position and not self._pending

    def delete(self) -> None:
        """Close and remove the segment's files (the caller syncs the directory)."""
        self.close()
        for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
            path = self._sibling(suffix)
            if self.files.exists(path):
                self.files.remove(path)

    def close(self) -> None:
        if self._handle is not None:
            self.finish_in_flight()  # never close the file under a disk thread's write
            self._handle.close()
            self._handle = None

    # --- indexes of closed segments -----------------------------------------------------

    def _require_offset_index(self) -> OffsetIndex:
        if self._offset_index is None:
            self._load_indexes()
        assert self._offset_index is not None
        return self._offset_index

    def _require_time_index(self) -> TimeIndex:
        if self._time_index is None:
            self._load_indexes()
        assert self._time_index is not None
        return self._time_index

    def _load_indexes(self) -> None:
        try:
            self._offset_index, self._time_index = self._read_index_files()
        except (CorruptIndexError, StorageError):
            self._rebuild_indexes()

    def _read_index_files(self) -> tuple[OffsetIndex, TimeIndex]:
        entries_max = self.config.index_entries_max
        offset_path, time_path = self._sibling(INDEX_SUFFIX), self._sibling(TIME_INDEX_SUFFIX)
        offset_index = OffsetIndex.load(
            read_whole_file(self.files, offset_path),
            base_offset=self.base_offset,
            entries_max=entries_max,
            path=offset_path,
            log_bytes=self.size_bytes,
        )
        time_index = TimeIndex.load(
            read_whole_file(self.files, time_path),
            base_offset=self.base_offset,
            entries_max=entries_max,
            path=time_path,
            offset_span=self.end_offset - self.base_offset,
        )
        return offset_index, time_index

    def _rebuild_indexes(self) -> None:
        """Index a closed segment from its batches and rewrite its index files."""
        end_offset = self.end_offset
        self._index_from_scan(now_ms=_TIMESTAMP_NONE)
        # A closed segment keeps its size and end even if a batch inside is damaged: readers
        # then get a CorruptBatchError naming it, rather than silently missing offsets.
        self.size_bytes = self._written_bytes = self._require_handle().size_bytes()
        self.end_offset = end_offset
        assert self._offset_index is not None and self._time_index is not None
        assert self._max_timestamp_ms is not None
        self._time_index.maybe_append(self._max_timestamp_ms, self._max_timestamp_offset)
        self._write_index_file(INDEX_SUFFIX, self._offset_index.to_bytes())
        self._write_index_file(TIME_INDEX_SUFFIX, self._time_index.to_bytes())

    def index_files_exist(self) -> bool:
        return all(self.files.exists(self._sibling(s)) for s in (INDEX_SUFFIX, TIME_INDEX_SUFFIX))

    def ensure_index_files(self) -> None:
        """Rebuild missing index files now (open calls this for closed segments)."""
        if not self.index_files_exist():
            self._rebuild_indexes()

    # --- helpers ------------------------------------------------------------------------

    def _sibling(self, suffix: str) -> str:
        return os.path.join(self.directory, segment_name(self.base_offset, suffix))

    def _require_handle(self) -> FileHandle:
        if self._handle is None:
            raise StorageError(f"{self.path} is closed")
        return self._handle


def _whole_batches(data: bytes) -> Iterator[tuple[int, BatchHeader]]:
    """`(position, header)` of each batch that lies wholly inside `data` (headers only)."""
    position = 0
    while position + BATCH_HEADER_BYTES <= len(data):
        header = BatchHeader(*_HEADER.unpack_from(data, position))
        if header.size_bytes < BATCH_HEADER_BYTES or position + header.size_bytes > len(data):
            return
        yield position, header
        position += header.size_bytes


def announced_bytes(handle: FileHandle, position: int) -> int:
    """The size the header at `position` claims (0 when there is none), capped at 2 GiB."""
    raw = handle.read_at(BATCH_HEADER_BYTES, position)
    if len(raw) < BATCH_HEADER_BYTES:
        return 0
    return min(BatchHeader(*_HEADER.unpack_from(raw)).size_bytes, 2**31)


def verified_batches(chunk: bytes) -> Iterator[tuple[int, int, int, int, int]]:
    """`(position, base_offset, last_offset, size_bytes, max_timestamp_ms)` of each batch
    from the start of `chunk` that checks out (magic, length, offset delta, CRC32C); stops
    before a partial or bad one. The checks of verify_batch, minus building a BatchHeader:
    recovery runs this once per batch of the active segment."""
    view = memoryview(chunk)
    limit = len(chunk)
    unpack = _HEADER.unpack_from
    position = 0
    while position + BATCH_HEADER_BYTES <= limit:
        fields = unpack(chunk, position)
        end = position + fields[1] + LOG_OVERHEAD_BYTES
        if end - position < BATCH_HEADER_BYTES or end > limit or fields[3] != MAGIC_V2:
            return
        if fields[6] < 0 or crc32c(view[position + CRC_START : end]) != fields[4]:
            return
        yield position, fields[0], fields[0] + fields[6], end - position, fields[8]
        position = end
