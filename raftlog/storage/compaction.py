"""Log compaction (Kafka's log cleaner): the latest record of every key, over closed segments.

Theory of operation. A cleaning pass covers a prefix of closed segments that its caller
chose (wholly below the high watermark and the applied offset, see
`raftlog.partition.cleaning`). It reads them twice: `build_offset_map` records, per key, the
offset of its latest record; `write_cleaned_segment` then copies each segment, keeping a
record only if it is its key's latest one and is not a tombstone (null value) whose
timestamp is older than `delete_retention_ms`. Records without a key are kept (a compacted
topic refuses them on produce; older data keeps what it has).

The batch invariant. Cleaning never adds, removes or moves a batch: every batch keeps its
base offset, last offset delta, leader epoch (the Raft term), producer id, epoch and base
sequence, and timestamps; only records inside it go, and `record_count` shrinks, possibly
to 0 (Kafka keeps such empty batches for the producer state; so do we, always). Hence every
segment keeps its `[base_offset, end_offset)`, the log stays dense *in batches*, and
recovery, the scrubber, `term_at`, Raft's log matching (§5.3) and a follower's catch-up work
on a cleaned log unchanged; an offset inside a batch without its record is a gap that a
reader steps over (it reads on at the batch's last offset + 1). A follower that fetches a
cleaned batch appends exactly what the leader holds. The price is 61 bytes per batch that
lost all its records, which bounds how small a cleaned log gets (docs/compaction.md).
Kept records are copied byte for byte (their offset and timestamp deltas are relative to
the unchanged header); a compressed batch is recompressed with its codec (an empty batch
becomes uncompressed).

Transactions (Kafka's cleaner): a batch of an aborted transaction (`BatchAborted`, which the
caller answers from the aborted-transaction index, `raftlog.storage.txn_index`) loses every
record and adds no key to the offset map, so it never shadows a committed record of its
key; transaction markers, as every control batch, stay, and so does each segment's
`.txnindex` file. The caller cleans nothing at or above the last stable offset, so
no batch of an open transaction is ever judged.

The swap (`swap_in_cleaned`), crash-safe at every step: cleaned segments are written,
indexed and fsynced under `cleaner/` with their final names. Then (1) the old segments'
index files are removed, directory synced; (2) each cleaned `.log` is renamed over the old
one (one atomic rename each), directory synced; (3) the new index files are renamed in,
directory synced. A crash before (2) leaves the old segment (an index file lost is rebuilt
from its segment at open), after (2) the new one; never a mix within a segment or a hole,
since every segment keeps its offsets. Opening a log removes what `cleaner/` still holds.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from raftlog.config import LogConfig
from raftlog.errors import CorruptBatchError
from raftlog.storage.batch import (
    ATTR_COMPRESSION_MASK,
    BATCH_HEADER_BYTES,
    BatchHeader,
    Compression,
    parse_header,
)
from raftlog.storage.compression import CompressionError, compress
from raftlog.storage.file_system import FileSystem
from raftlog.storage.recompression import rebuild_batch
from raftlog.storage.record_decoder import records_section
from raftlog.storage.record_format import (
    DEFAULT_DECOMPRESSED_BYTES_MAX,
    VARINT_BYTES_MAX,
    VARLONG_BYTES_MAX,
    Malformed,
)
from raftlog.storage.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    Segment,
    announced_bytes,
    segment_name,
    verified_batches,
)
from raftlog.storage.varints import read_varint

__all__ = [
    "CLEANER_DIRECTORY",
    "CleanedSegment",
    "SegmentToClean",
    "build_offset_map",
    "clean_batch",
    "discard_leftovers",
    "swap_in_cleaned",
    "write_cleaned_segment",
]

CLEANER_DIRECTORY = "cleaner"
_READ_CHUNK_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class SegmentToClean:
    """A closed segment as the log listed it when the pass was planned."""

    path: str
    base_offset: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class CleanedSegment:
    """A cleaned copy written under `cleaner/`, ready for `swap_in_cleaned`."""

    base_offset: int
    end_offset: int
    bytes_before: int
    bytes_after: int
    records_removed: int


# One record of a batch: (start, end, offset_delta, timestamp_delta, key, is_tombstone), its
# bytes being data[start:end]. A plain tuple: the cleaner reads every record twice.
_Span = tuple[int, int, int, int, bytes | None, bool]

# Decides whether a record stays: (offset, key, is_tombstone, timestamp_ms) -> keep.
KeepRecord = Callable[[int, bytes | None, bool, int], bool]


def _records(batch: bytes, header: BatchHeader) -> tuple[bytes, list[_Span]]:
    """The batch's decompressed records section and each record's span in it, reading only
    the fields cleaning needs (the value's length, not the value). Raises `Malformed` (or
    IndexError) for records that do not frame; the caller then leaves the batch alone."""
    data, begin, stop = records_section(
        batch, BATCH_HEADER_BYTES, len(batch), header.compression, DEFAULT_DECOMPRESSED_BYTES_MAX
    )
    spans: list[_Span] = []
    position = begin
    read = read_varint
    for _ in range(header.record_count):
        # One-byte varints (deltas, most key lengths) inline: this runs for every record.
        length, body = read(data, position, VARINT_BYTES_MAX)
        end = body + length
        byte = data[body + 1]
        if byte < 0x80:
            timestamp_delta, at = (byte >> 1) ^ -(byte & 1), body + 2
        else:
            timestamp_delta, at = read(data, body + 1, VARLONG_BYTES_MAX)
        byte = data[at]
        if byte < 0x80:
            offset_delta, at = (byte >> 1) ^ -(byte & 1), at + 1
        else:
            offset_delta, at = read(data, at, VARINT_BYTES_MAX)
        byte = data[at]
        if byte < 0x80:
            key_length, at = (byte >> 1) ^ -(byte & 1), at + 1
        else:
            key_length, at = read(data, at, VARINT_BYTES_MAX)
        key = None if key_length < 0 else data[at : at + key_length]
        # The value's length is negative (null, a tombstone) only if its first byte is odd.
        is_tombstone = bool(data[at + max(key_length, 0)] & 1)
        if length < 0 or end > stop:
            raise Malformed(f"record length {length} does not fit", position)
        spans.append((position, end, offset_delta, timestamp_delta, key, is_tombstone))
        position = end
    if position != stop:
        raise Malformed(f"{stop - position} bytes after the records", position)
    return data, spans


def _parsed(batch: bytes, header: BatchHeader) -> tuple[bytes, list[_Span]] | None:
    """`_records`, or None for a batch whose records do not frame (stored under
    produce_record_validation="crc"): cleaning leaves such a batch as it is."""
    try:
        return _records(batch, header)
    except (Malformed, IndexError, CompressionError):
        return None


def _segment_batches(files: FileSystem, path: str, pace: Callable[[int], None]) -> Iterator[bytes]:
    """Every verified batch of a closed segment, in order; a bad one raises. `pace` is
    called after each batch: a cleaner on a thread of the node's process sleeps there, which
    also hands the interpreter lock back to the event loop after every batch rather than
    after the interpreter's 5 ms switch interval (each of the loop's blocking calls would
    otherwise wait that long for the lock while the cleaner works)."""
    handle = files.open(path)
    try:
        size_bytes, position = handle.size_bytes(), 0
        while position < size_bytes:
            chunk_bytes = max(_READ_CHUNK_BYTES, announced_bytes(handle, position))
            chunk = handle.read_at(chunk_bytes, position)
            used = 0
            for at, _base, _last, batch_bytes, _max_ms in verified_batches(chunk):
                yield chunk[at : at + batch_bytes]
                used = at + batch_bytes
                pace(batch_bytes)
            if used == 0:
                raise CorruptBatchError("batch fails its checks", path=path, position=position)
            position += used
    finally:
        handle.close()


# Whether a batch belongs to an aborted transaction (its records are to be dropped).
BatchAborted = Callable[[BatchHeader], bool]


def _never_aborted(header: BatchHeader) -> bool:
    return False


def build_offset_map(
    files: FileSystem,
    segments: Sequence[SegmentToClean],
    pace: Callable[[int], None],
    aborted: BatchAborted = _never_aborted,
) -> dict[bytes, int]:
    """Key -> offset of its latest record in `segments` (control batches hold no keys, nor
    do aborted transactions' batches count)."""
    latest: dict[bytes, int] = {}
    for segment in segments:
        for batch in _segment_batches(files, segment.path, pace):
            header = parse_header(batch)
            if header.is_control or header.record_count == 0 or aborted(header):
                continue
            parsed = _parsed(batch, header)
            for _start, _end, offset_delta, _ts, key, _tomb in parsed[1] if parsed else ():
                if key is not None:
                    latest[key] = header.base_offset + offset_delta
    return latest


def clean_batch(
    batch: bytes, keep: KeepRecord, aborted: BatchAborted = _never_aborted
) -> tuple[bytes, int]:
    """`(batch without the records keep refuses, how many it refused)`; an aborted
    transaction's batch keeps none. The header keeps every field but the length, record
    count, CRC (and codec, for an emptied batch)."""
    header = parse_header(batch)
    if header.is_control or header.record_count == 0:
        # Membership and leader changes stay (Raft needs them), and transaction markers
        # (readers need them to end a transaction).
        return batch, 0
    parsed = _parsed(batch, header)
    if parsed is None:
        return batch, 0
    data, spans = parsed
    base, first_ms = header.base_offset, header.first_timestamp
    if aborted(header):
        kept = []
    else:
        kept = [s for s in spans if keep(base + s[2], s[4], s[5], first_ms + s[3])]
    if len(kept) == len(spans):
        return batch, 0
    section = b"".join(data[s[0] : s[1]] for s in kept)
    attributes = header.attributes
    codec = header.compression
    if not kept:
        attributes &= ~ATTR_COMPRESSION_MASK
    elif codec is not Compression.NONE:
        section = compress(codec, section)
    cleaned = rebuild_batch(header, attributes, section, len(kept))
    return cleaned, len(spans) - len(kept)


def latest_record_keeper(
    latest: dict[bytes, int], *, now_ms: int, delete_retention_ms: int
) -> KeepRecord:
    """Keep a record that is its key's latest, unless it is a tombstone older than
    `delete_retention_ms` (readers had that long to see the delete)."""
    horizon_ms = now_ms - delete_retention_ms

    def keep(offset: int, key: bytes | None, is_tombstone: bool, timestamp_ms: int) -> bool:
        if key is None:
            return True
        if offset < latest.get(key, offset):
            return False
        return not (is_tombstone and timestamp_ms < horizon_ms)

    return keep


def write_cleaned_segment(
    files: FileSystem,
    directory: str,
    segment: SegmentToClean,
    config: LogConfig,
    keep: KeepRecord,
    pace: Callable[[int], None],
    aborted: BatchAborted = _never_aborted,
) -> CleanedSegment | None:
    """Write the cleaned copy of `segment` and its index files under `cleaner/`, fsynced;
    None when cleaning would remove nothing (no copy is written)."""
    batches, removed, before = [], 0, 0
    for batch in _segment_batches(files, segment.path, pace):
        cleaned, count = clean_batch(batch, keep, aborted)
        batches.append(cleaned)
        removed += count
        before += len(batch)
    if removed == 0:
        return None
    out_directory = os.path.join(directory, CLEANER_DIRECTORY)
    files.make_directory(out_directory)
    out_path = os.path.join(out_directory, segment_name(segment.base_offset, LOG_SUFFIX))
    handle = files.open(out_path, create=True)
    try:
        handle.truncate(0)
        handle.append(batches)
        handle.sync()
    finally:
        handle.close()
    # Read back and indexed by the same scan recovery runs: what goes in is what was meant.
    copy = Segment.recover(files, out_directory, segment.base_offset, config, now_ms=0)
    try:
        if copy.end_offset != segment.end_offset:
            raise CorruptBatchError(
                f"cleaned copy ends at {copy.end_offset}, expected {segment.end_offset}",
                path=out_path,
                position=copy.size_bytes,
            )
        copy.close_for_roll()
        after = copy.size_bytes
    finally:
        copy.close()
    files.sync_directory(out_directory)
    assert after < before, (after, before)
    return CleanedSegment(segment.base_offset, segment.end_offset, before, after, removed)


def swap_in_cleaned(files: FileSystem, directory: str, base_offsets: Sequence[int]) -> None:
    """Put the cleaned copies of these segments in place, in the crash-safe order of the
    module docstring. The caller reopens the segments afterwards."""
    out_directory = os.path.join(directory, CLEANER_DIRECTORY)
    index_suffixes = (INDEX_SUFFIX, TIME_INDEX_SUFFIX)
    for base in base_offsets:
        for suffix in index_suffixes:
            path = os.path.join(directory, segment_name(base, suffix))
            if files.exists(path):
                files.remove(path)
    files.sync_directory(directory)
    for suffixes in ((LOG_SUFFIX,), index_suffixes):
        for base in base_offsets:
            for suffix in suffixes:
                name = segment_name(base, suffix)
                files.rename(os.path.join(out_directory, name), os.path.join(directory, name))
        files.sync_directory(directory)
    files.sync_directory(out_directory)


def discard_leftovers(files: FileSystem, directory: str) -> None:
    """Remove what an interrupted pass left under `cleaner/` (never part of the log)."""
    out_directory = os.path.join(directory, CLEANER_DIRECTORY)
    if not files.exists(out_directory):
        return
    names = files.list_directory(out_directory)
    for name in names:
        files.remove(os.path.join(out_directory, name))
    if names:
        files.sync_directory(out_directory)
