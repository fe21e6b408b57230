"""The aborted-transaction index: one `.txnindex` file beside each segment (Kafka's
TransactionIndex), which read_committed fetches and the log cleaner read.

Theory of operation. When a partition replica applies an ABORT marker that ends an open
transaction (partition/producer_state.py), it appends the entry (producer id, the
transaction's first offset, the marker's offset) to the index file of the segment that holds
the marker. Markers are applied in offset order, so every file is sorted by marker offset
and the files, taken in segment order, are too. A segment without such a marker has no file.

File (big-endian), 28-byte entries, appended:
    producer_id i64, first_offset i64, last_offset i64 (the marker), crc32c u32 of the 24 bytes

Reading (`collect(start, end)`, Kafka's Log.collectAbortedTransactions): the entries whose
marker is at or after `start` and whose first offset is before `end`. Their markers lie in
the segment holding `start` or later ones, so the scan starts there and goes forward. It
goes on to the last segment: Kafka stops at the first entry whose marker is at or after
`end`, but a transaction that started before `end` may end after a later-starting one did
(first 10, marker 1000 after first 500, marker 600), so a stop there could miss it.

Lifecycle. The file goes with its segment, in the storage layer: `Segment.delete` removes it
(retention, snapshot install, a truncation dropping whole segments, a repair), a truncation
inside a segment cuts its entries whose marker is at or after the cut
(`truncate_txn_index`, from `SegmentedLog.truncate_from`, after the segment itself), and
`SegmentedLog.open` removes a file whose segment is gone. Compaction keeps the file: a
cleaned segment has the same offsets and its markers stay.

Durability and recovery (the design the replica relies on; partition/replica.py).
* `append` writes without fsync; `flush` fsyncs every file written since the last flush, and
  the directory when it created one. The replica flushes the index before it saves a
  checkpoint at applied offset C, so every entry whose marker is <= C is durable whenever
  the checkpoint is. An entry not yet synced has its marker above C.
* After a crash the replica re-applies the log after C, which re-derives the entries above C.
  `append` skips an entry its segment's file already holds (the file's last marker is at or
  after the new one's): re-applying is idempotent.
* A checkpoint also carries how many entries each segment's file held up to its offset
  (`entry_counts`), and a start compares the files with it (`missing_entries`): a file
  deleted, or cut at an entry boundary, while the node was down holds fewer, and the replica
  then re-applies as for damage below.
* `recover` checks every file once, at start, before anything is applied. It cuts, silently,
  a partial last entry (a torn append: never synced, so above C) and entries whose marker is
  at or after their segment's end (a crash between cutting a segment and cutting its index).
  An entry that fails its CRC or is out of order is damage: the file is cut before it and
  `recover` answers False; the replica then distrusts its checkpoint and re-applies from its
  snapshot (or the log start), which re-derives every entry that can still matter (those
  whose marker is at or after the log start).
The partition checkpoint does not carry the entries (only the few its producer table
accounts for above its offset: partition/replica.py), so no number of aborted transactions
keeps a checkpoint from being written.

Memory. The entries of recently read segments are cached, at most `cached_entries_max` in
all, a segment without entries counting one (the least recently read segments go first; a
segment with more is read from its file on each use). With each cached segment goes the
smallest first offset of its entries, so a scan skips, without reading them, the later
segments whose transactions all start at or past the range's end. The storage layer
counts its removals and cuts (`removal_count`): when it changed, the cache is dropped.
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

from raftlog.errors import StorageError
from raftlog.storage.batch import crc32c
from raftlog.storage.file_system import FileSystem
from raftlog.storage.segment import TXN_INDEX_SUFFIX, parse_segment_name, segment_name

__all__ = [
    "ENTRY_BYTES",
    "INDEXED_SEGMENTS_MAX",
    "AbortedTxn",
    "SegmentLayout",
    "TransactionIndex",
    "decode_entries",
    "encode_entry",
    "truncate_txn_index",
]

log = logging.getLogger(__name__)

_ENTRY = struct.Struct(">qqq")
ENTRY_BYTES = _ENTRY.size + 4
# Segments whose entry counts a checkpoint carries (`entry_counts`): the most recent ones,
# 12 bytes each; older ones go unchecked (retention usually removes them first).
INDEXED_SEGMENTS_MAX = 10_000


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    """An aborted transaction: its first offset and its ABORT marker's offset (Kafka's
    AbortedTxn, the aborted-transaction index entry), in Raft offsets."""

    producer_id: int
    first_offset: int
    last_offset: int

    def __post_init__(self) -> None:
        assert 0 <= self.first_offset < self.last_offset, self


def encode_entry(txn: AbortedTxn) -> bytes:
    body = _ENTRY.pack(txn.producer_id, txn.first_offset, txn.last_offset)
    return body + struct.pack(">I", crc32c(body))


@dataclass(frozen=True, slots=True)
class DecodedEntries:
    """A file's sound prefix, and why it stops where it does (None: the file ends)."""

    entries: list[AbortedTxn]
    torn: bool  # a partial last entry follows the prefix
    damage: str | None  # an entry failed its CRC or is out of order


def decode_entries(data: bytes, *, base_offset: int) -> DecodedEntries:
    """The entries of a file of the segment at `base_offset`, up to the first bad one."""
    entries: list[AbortedTxn] = []
    whole = len(data) - len(data) % ENTRY_BYTES
    for position in range(0, whole, ENTRY_BYTES):
        body = data[position : position + _ENTRY.size]
        (crc,) = struct.unpack_from(">I", data, position + _ENTRY.size)
        if crc != crc32c(body):
            return DecodedEntries(entries, False, f"CRC32C mismatch at byte {position}")
        producer_id, first, last = _ENTRY.unpack(body)
        previous = entries[-1].last_offset if entries else base_offset - 1
        if not (0 <= first < last and last > previous and producer_id >= 0):
            return DecodedEntries(
                entries, False, f"entry ({producer_id}, {first}, {last}) out of order"
            )
        entries.append(AbortedTxn(producer_id, first, last))
    return DecodedEntries(entries, whole != len(data), None)


def _path(directory: str, base_offset: int) -> str:
    return os.path.join(directory, segment_name(base_offset, TXN_INDEX_SUFFIX))


def truncate_txn_index(files: FileSystem, directory: str, base_offset: int, offset: int) -> None:
    """Cut the entries of the segment at `base_offset` whose marker is at or after `offset`,
    durably (a Raft truncation of the log from `offset`)."""
    path = _path(directory, base_offset)
    if not files.exists(path):
        return
    handle = files.open(path)
    try:
        decoded = decode_entries(handle.read_at(handle.size_bytes(), 0), base_offset=base_offset)
        kept = bisect.bisect_left(decoded.entries, offset, key=lambda a: a.last_offset)
        if kept * ENTRY_BYTES != handle.size_bytes():
            handle.truncate(kept * ENTRY_BYTES)
            handle.sync()
    finally:
        handle.close()


class SegmentLayout(Protocol):
    """What the index asks of its log (`raftlog.storage.log.SegmentedLog`)."""

    files: FileSystem
    directory: str

    @property
    def segment_base_offsets(self) -> tuple[int, ...]: ...

    @property
    def log_end_offset(self) -> int: ...

    @property
    def removal_count(self) -> int:
        """How many times segments were removed or cut: a cache of their files compares it."""
        ...


class _Segment:
    """A segment's entries as cached, with the smallest first offset among them (a scan
    skips a segment whose transactions all start at or after the range's end)."""

    __slots__ = ("entries", "first_min")

    def __init__(self, entries: list[AbortedTxn]) -> None:
        self.entries = entries
        self.first_min = min((a.first_offset for a in entries), default=2**63 - 1)

    def add(self, txn: AbortedTxn) -> None:
        self.entries.append(txn)
        self.first_min = min(self.first_min, txn.first_offset)

    @property
    def cost(self) -> int:
        """What it counts against the bound: a segment without entries counts one."""
        return max(len(self.entries), 1)


class TransactionIndex:
    """The `.txnindex` files of one log; see the module docstring."""

    def __init__(self, layout: SegmentLayout, *, cached_entries_max: int) -> None:
        assert cached_entries_max >= 0, cached_entries_max
        self._layout = layout
        self._cached_entries_max = cached_entries_max
        # Segment base offset -> its entries, least recently read first.
        self._cache: OrderedDict[int, _Segment] = OrderedDict()
        self._cached_entries = 0
        self._seen_removals = layout.removal_count
        # Segments whose files were written since the last flush; whether one was created.
        self._unsynced: set[int] = set()
        self._created = False

    @property
    def directory(self) -> str:
        return self._layout.directory

    def _segment_of(self, offset: int) -> int | None:
        """The base offset of the segment holding `offset`; None below the first one."""
        bases = self._layout.segment_base_offsets
        index = bisect.bisect_right(bases, offset) - 1
        return bases[index] if index >= 0 else None

    def _check_removals(self) -> None:
        if self._layout.removal_count != self._seen_removals:
            self._seen_removals = self._layout.removal_count
            self._cache.clear()
            self._cached_entries = 0

    # -- writing -------------------------------------------------------------------------

    def append(self, txn: AbortedTxn) -> bool:
        """Index `txn` in the file of the segment holding its marker; False when that file
        already holds it (a replay) or the marker is below the log's first segment."""
        assert txn.last_offset < self._layout.log_end_offset, (txn, self._layout.log_end_offset)
        self._check_removals()
        base = self._segment_of(txn.last_offset)
        if base is None:
            return False
        path = _path(self.directory, base)
        files = self._layout.files
        created = not files.exists(path)
        handle = files.open(path, create=created)
        try:
            size_bytes = handle.size_bytes()
            if size_bytes % ENTRY_BYTES:
                raise StorageError(f"{path}: {size_bytes} bytes, not whole entries")
            if size_bytes:
                last = decode_entries(
                    handle.read_at(ENTRY_BYTES, size_bytes - ENTRY_BYTES), base_offset=0
                )
                if last.damage is not None:
                    raise StorageError(f"{path}: {last.damage}")
                if last.entries[0].last_offset >= txn.last_offset:
                    return False
            handle.append([encode_entry(txn)])
        finally:
            handle.close()
        self._created = self._created or created
        self._unsynced.add(base)
        cached = self._cache.pop(base, None)
        if cached is not None:
            self._cached_entries -= cached.cost
            cached.add(txn)
            self._cache[base] = cached
            self._cached_entries += cached.cost
            self._evict()
        return True

    def flush(self) -> None:
        """Make every entry appended so far durable (before a checkpoint is saved)."""
        files = self._layout.files
        for base in sorted(self._unsynced):
            path = _path(self.directory, base)
            if not files.exists(path):
                continue  # its segment was removed since
            handle = files.open(path)
            try:
                handle.sync()
            finally:
                handle.close()
        if self._created:
            files.sync_directory(self.directory)
        self._unsynced.clear()
        self._created = False

    # -- reading -------------------------------------------------------------------------

    def collect(self, start_offset: int, end_offset: int) -> list[AbortedTxn]:
        """The entries whose marker is at or after `start_offset` and whose first offset is
        before `end_offset`, in marker order. The scan starts at the segment holding
        `start_offset` and goes forward: a transaction that starts before `end_offset` may
        end (and be indexed) in any later segment."""
        self._check_removals()
        bases = self._layout.segment_base_offsets
        first = max(bisect.bisect_right(bases, start_offset) - 1, 0)
        found: list[AbortedTxn] = []
        for base in bases[first:]:
            segment = self._segment(base)
            if segment.first_min >= end_offset:
                continue
            entries = segment.entries
            begin = bisect.bisect_left(entries, start_offset, key=lambda a: a.last_offset)
            found.extend(a for a in entries[begin:] if a.first_offset < end_offset)
        return found

    def _segment(self, base: int) -> _Segment:
        cached = self._cache.get(base)
        if cached is not None:
            self._cache.move_to_end(base)
            return cached
        segment = _Segment(self._read(base))
        if segment.cost <= self._cached_entries_max:
            self._cache[base] = segment
            self._cached_entries += segment.cost
            self._evict()
        return segment

    def _read(self, base: int) -> list[AbortedTxn]:
        path = _path(self.directory, base)
        files = self._layout.files
        if not files.exists(path):
            return []
        handle = files.open(path)
        try:
            data = handle.read_at(handle.size_bytes(), 0)
        finally:
            handle.close()
        decoded = decode_entries(data, base_offset=base)
        if decoded.damage is not None or decoded.torn:
            raise StorageError(f"{path}: {decoded.damage or 'a partial entry at its end'}")
        return decoded.entries

    def _evict(self) -> None:
        while self._cached_entries > self._cached_entries_max and self._cache:
            _, segment = self._cache.popitem(last=False)
            self._cached_entries -= segment.cost

    @property
    def cached_entries(self) -> int:
        """What the cache holds against its bound (a segment without entries counts one)."""
        return self._cached_entries

    # -- checking against a checkpoint ---------------------------------------------------

    def entry_counts(self, upto_offset: int) -> tuple[tuple[int, int], ...]:
        """For each of the last `INDEXED_SEGMENTS_MAX` segments holding entries whose marker
        is at or below `upto_offset` (a checkpoint's offset, after `flush`): its base offset
        and how many; what `missing_entries` checks at the next start. A segment wholly below
        `upto_offset` counts its whole file; the one holding it, its entries up to there."""
        self._check_removals()
        bases = self._layout.segment_base_offsets
        last = bisect.bisect_right(bases, upto_offset) - 1
        if last < 0:
            return ()
        present = self._files_present()
        counts: list[tuple[int, int]] = []
        for base in reversed(bases[: last + 1]):
            if len(counts) == INDEXED_SEGMENTS_MAX:
                break
            if base not in present:
                continue
            if base == bases[last]:
                entries = self._segment(base).entries
                count = bisect.bisect_right(entries, upto_offset, key=lambda a: a.last_offset)
            else:
                count = self._entries_in_file(base)
            if count:
                counts.append((base, count))
        counts.reverse()
        return tuple(counts)

    def missing_entries(self, counts: tuple[tuple[int, int], ...]) -> str | None:
        """After `recover`: None when every segment still in the log holds at least the
        entries `counts` (`entry_counts` at a checkpoint) says it had, else what is short.
        Entries are sorted by marker and the counted ones are a file's first, so a file that
        still holds as many holds those: a file deleted, or cut at an entry boundary (which
        no CRC can tell), while the node was down shows here."""
        present = set(self._layout.segment_base_offsets)
        for base, count in counts:
            assert count > 0, (base, count)
            if base not in present:
                continue  # removed since (retention, a snapshot install): so is its file
            held = self._entries_in_file(base)
            if held < count:
                path = _path(self.directory, base)
                return f"{path}: {held} entries, the checkpoint counted {count}"
        return None

    def _files_present(self) -> set[int]:
        """Base offsets of the segments that have an index file (one directory listing)."""
        names = self._layout.files.list_directory(self.directory)
        found = (parse_segment_name(name, TXN_INDEX_SUFFIX) for name in names)
        return {base for base in found if base is not None}

    def _entries_in_file(self, base: int) -> int:
        path = _path(self.directory, base)
        files = self._layout.files
        if not files.exists(path):
            return 0
        handle = files.open(path)
        try:
            return handle.size_bytes() // ENTRY_BYTES
        finally:
            handle.close()

    # -- recovery ------------------------------------------------------------------------

    def recover(self) -> bool:
        """Check and repair every file once, before anything is applied (module docstring);
        False when one was damaged (entries it held may be gone)."""
        self._cache.clear()
        self._cached_entries = 0
        self._seen_removals = self._layout.removal_count
        bases = self._layout.segment_base_offsets
        ends = (*bases[1:], self._layout.log_end_offset)
        sound = True
        for base, end in zip(bases, ends, strict=True):
            sound = self._recover_file(base, end) and sound
        return sound

    def _recover_file(self, base: int, end: int) -> bool:
        path = _path(self.directory, base)
        files = self._layout.files
        if not files.exists(path):
            return True
        handle = files.open(path)
        try:
            size_bytes = handle.size_bytes()
            decoded = decode_entries(handle.read_at(size_bytes, 0), base_offset=base)
            kept = bisect.bisect_left(decoded.entries, end, key=lambda a: a.last_offset)
            if kept * ENTRY_BYTES != size_bytes:
                if decoded.damage is not None:
                    log.warning("%s: %s; cut to %d entries", path, decoded.damage, kept)
                handle.truncate(kept * ENTRY_BYTES)
                handle.sync()
        finally:
            handle.close()
        return decoded.damage is None
