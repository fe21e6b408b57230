"""Fetch responses to Arrow record batches, without a Python object per record.

Theory of operation. A Fetch answer is a run of whole RecordBatch v2 batches (see
`raftlog.storage.records` for the layout). `decode_fetch` turns the records of one answer
whose offsets lie in `[offset_from, offset_to)` into one `pyarrow.RecordBatch` with Spark's
Kafka schema, in three steps:

1. Batches, in Python, one step per *batch*: `iter_batches` checks bounds, magic and CRC32C;
   control batches (Kafka's own, such as transaction markers) are skipped but their offsets are
   consumed; a compressed batch is decompressed (bounded by `decompressed_bytes_max`) and its
   records appended to a side buffer so every record section lies in one buffer.
2. Record starts, in Python, the only step per *record*: a record begins with its length
   varint, so the next record starts at `start + size(varint) + length`. This sequential walk
   is a few bytecodes per record (one- and two-byte varints take an inline path) and appends
   one int to a list; it also checks every record ends inside its batch and the batch ends
   exactly after `record_count` records.
3. Fields, in numpy, one step per *field* over all records at once: varints are decoded
   byte-column by byte-column with masks (most are one or two bytes, so two or three rounds),
   keys and values are gathered out of the buffer with one fancy index, offsets and
   timestamps are `base + delta`, and the Arrow arrays are built straight from those buffers.
   The same pass checks what the Python decoder checks: lengths >= -1, offset deltas rising
   inside `[0, last_offset_delta]`, a record's fields ending exactly at its end.

Headers (only with `includeHeaders`) are the exception: a record that has them is read in
Python, since header-heavy records are rare and short.

The caller promises `high_watermark`: every batch must end below it (the server never
sends uncommitted data; this re-checks it, since a record above the high watermark could
be lost by a leader change and must never reach Spark).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from raftlog.client._fetcher import AbortedFilter
from raftlog.client.errors import ClientError
from raftlog.errors import CorruptBatchError
from raftlog.storage.batch import BATCH_HEADER_BYTES, BatchHeader, Compression, iter_batches
from raftlog.storage.compression import decompress
from raftlog.storage.records import decode_varint

__all__ = ["FetchDecoded", "arrow_schema", "decode_fetch"]

_HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
_VARINT_BYTES_MAX = 5
_VARLONG_BYTES_MAX = 10
_LOG_APPEND_TIME = 1


def arrow_schema(*, include_headers: bool) -> pa.Schema:
    """The Arrow form of Spark's Kafka source schema (what Spark checks yielded batches against)."""
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(pa.field("headers", _HEADER_TYPE))
    return pa.schema(fields)


@dataclass(frozen=True, slots=True)
class FetchDecoded:
    """The records of one Fetch answer in range, and where the next Fetch starts."""

    batch: pa.RecordBatch | None  # None when no record of the answer is in range
    next_offset: int  # one past the last batch used (control batches count)


@dataclass(slots=True)
class _Sections:
    """Record sections of the data batches, with per-batch values repeated per record."""

    pieces: list[tuple[bytes, int, int]]  # per batch: (bytes, begin, end) of its records
    starts: list[np.ndarray]  # per batch, its records' starts within its piece's bytes
    headers: list[BatchHeader]
    compressed: bool = False


def decode_fetch(
    data: bytes,
    *,
    topic: str,
    partition: int,
    offset_from: int,
    offset_to: int,
    high_watermark: int,
    include_headers: bool,
    decompressed_bytes_max: int = 64 * 1024 * 1024,
    aborted: Iterable[tuple[int, int]] = (),
) -> FetchDecoded:
    """Records of `data` with `offset_from <= offset < offset_to` as one Arrow batch, without
    control batches and without the batches of `aborted`'s transactions ((producer id, first
    offset) pairs from a read_committed Fetch; the same walk as the Consumer's).

    Raises `CorruptBatchError` (with the byte position) for bytes that are not valid batches
    and `ClientError` for a batch that is not below `high_watermark`.
    """
    assert 0 <= offset_from <= offset_to, (offset_from, offset_to)
    return _decode(
        data,
        topic,
        partition,
        (offset_from, offset_to),
        high_watermark,
        include_headers,
        decompressed_bytes_max,
        AbortedFilter(aborted),
    )


def _decode(
    data: bytes,
    topic: str,
    partition: int,
    offset_range: tuple[int, int],
    high_watermark: int,
    include_headers: bool,
    decompressed_bytes_max: int,
    aborted: AbortedFilter,
) -> FetchDecoded:
    offset_from, offset_to = offset_range
    sections = _Sections([], [], [])
    next_offset = offset_from
    for position, header in iter_batches(data):
        if header.last_offset >= high_watermark:
            raise ClientError(
                f"fetch {topic}/{partition}: batch at offset {header.base_offset}..."
                f"{header.last_offset} is not below the high watermark {high_watermark}"
            )
        if header.base_offset >= offset_to:
            break
        skipped = aborted.skips(header)  # fed every batch in order; skips control batches
        if header.last_offset >= offset_from and not skipped:
            _add_section(data, position, header, sections, decompressed_bytes_max)
        next_offset = max(next_offset, header.last_offset + 1)
    if not sections.starts:
        return FetchDecoded(None, next_offset)
    buffer = _one_buffer(data, sections)
    batch = _columns(buffer, sections, topic, partition, offset_range, include_headers)
    assert batch is None or batch.num_rows <= sum(map(len, sections.starts))
    return FetchDecoded(batch, next_offset)


def _add_section(
    data: bytes,
    position: int,
    header: BatchHeader,
    sections: _Sections,
    decompressed_bytes_max: int,
) -> None:
    begin = position + BATCH_HEADER_BYTES
    end = position + header.size_bytes
    section = data
    if header.compression is not Compression.NONE:
        section = decompress(
            header.compression, memoryview(data)[begin:end], bytes_max=decompressed_bytes_max
        )
        begin, end = 0, len(section)
        sections.compressed = True
    starts = _predicted_starts(section, begin, end, header.record_count)
    if starts is None:
        starts = _record_starts(section, begin, end, header.record_count, position)
    sections.pieces.append((section, begin, end))
    sections.starts.append(starts)
    sections.headers.append(header)


def _one_buffer(data: bytes, sections: _Sections) -> bytes:
    """One buffer holding every record section in offset order (what `_binary` needs), with
    `sections.starts` made relative to it. Without compression that is `data` itself."""
    if not sections.compressed:
        return data
    base = 0
    for index, (_, begin, end) in enumerate(sections.pieces):
        sections.starts[index] = sections.starts[index] - begin + base
        base += end - begin
    buffer = b"".join(memoryview(piece)[begin:end] for piece, begin, end in sections.pieces)
    assert len(buffer) == base
    return buffer


def _varint_sizes(values: np.ndarray) -> np.ndarray:
    """Bytes of the zig-zag varint of each non-negative value (zig-zag of v >= 0 is 2v)."""
    zigzag = values * 2
    sizes = np.ones(len(values), np.int64)
    for bits in (7, 14, 21, 28, 35):
        sizes += zigzag >= (1 << bits)
    return sizes


def _predicted_starts(data: bytes, begin: int, end: int, count: int) -> np.ndarray | None:
    """Starts if records differ only in the size of their offset delta varint.

    A producer's records of equal key, value and header sizes and close timestamps differ in
    exactly that: offset delta i takes one byte below 64, two below 8192. So record i's length
    is the first one's plus the extra bytes of varint(i), and the starts follow by a cumulative
    sum. The guess is confirmed by decoding every length varint at the guessed starts (then the
    records tile the section exactly as a walk would find them); else None, and the caller
    walks."""
    if count == 0 or begin >= end:
        return None
    try:
        first_length, first_body = decode_varint(data, begin, bytes_max=_VARINT_BYTES_MAX)
    except CorruptBatchError:
        return None
    if first_length < 0 or first_body - begin != _varint_sizes(np.array([first_length]))[0]:
        return None
    lengths = first_length + _varint_sizes(np.arange(count, dtype=np.int64)) - 1
    sizes = _varint_sizes(lengths) + lengths
    starts = np.empty(count, np.int64)
    starts[0] = begin
    np.cumsum(sizes[:-1], out=starts[1:])
    starts[1:] += begin
    if int(starts[-1] + sizes[-1]) != end:
        return None
    actual, bodies = _varints(np.frombuffer(data, np.uint8), starts, _VARINT_BYTES_MAX)
    if not (np.array_equal(actual, lengths) and np.array_equal(bodies - starts, sizes - lengths)):
        return None
    return starts


def _record_starts(data: bytes, begin: int, end: int, count: int, batch_at: int) -> np.ndarray:
    """Start of each of the `count` records in `data[begin:end]` (step 2 of the docstring)."""
    starts: list[int] = []
    append = starts.append
    pos = begin
    try:
        for _ in range(count):
            first = data[pos]
            if first < 0x80:
                following = pos + 1 + ((first >> 1) ^ -(first & 1))
            elif (second := data[pos + 1]) < 0x80:
                zigzag = (first & 0x7F) | (second << 7)
                following = pos + 2 + ((zigzag >> 1) ^ -(zigzag & 1))
            else:
                length, body = decode_varint(data, pos, bytes_max=_VARINT_BYTES_MAX)
                following = body + length
            if following <= pos or following > end:
                raise CorruptBatchError(
                    f"record at byte {pos} overruns its batch", position=batch_at
                )
            append(pos)
            pos = following
    except IndexError:
        raise CorruptBatchError("truncated record length", position=batch_at) from None
    if pos != end:
        raise CorruptBatchError(
            f"{end - pos} bytes left after record_count={count} records", position=batch_at
        )
    assert len(starts) == count
    return np.asarray(starts, np.int64)


def _varints(buf: np.ndarray, at: np.ndarray, bytes_max: int) -> tuple[np.ndarray, np.ndarray]:
    """Zig-zag varints at positions `at`, all at once: `(values, positions after them)`."""
    last = len(buf) - 1
    value = np.zeros(len(at), np.uint64)
    size = np.zeros(len(at), np.int64)
    active = np.ones(len(at), bool)
    for k in range(bytes_max):
        byte = buf[np.minimum(at + k, last)].astype(np.uint64)
        value |= np.where(active, (byte & 0x7F) << np.uint64(7 * k), 0).astype(np.uint64)
        ended = active & (byte < 0x80)
        size[ended] = k + 1
        active &= ~ended
        if not active.any():
            break
    if active.any():
        first_bad = int(at[np.argmax(active)])
        raise CorruptBatchError(f"varint longer than {bytes_max} bytes at byte {first_bad}")
    signed = (value >> np.uint64(1)).astype(np.int64) ^ -(value & np.uint64(1)).astype(np.int64)
    return signed, at + size


def _per_record(values: list[int], counts: np.ndarray) -> np.ndarray:
    return np.repeat(np.asarray(values, np.int64), counts)


@dataclass(frozen=True, slots=True)
class _Fields:
    ends: np.ndarray
    offsets: np.ndarray
    timestamps_ms: np.ndarray
    timestamp_types: np.ndarray
    key_at: np.ndarray
    key_lengths: np.ndarray
    value_at: np.ndarray
    value_lengths: np.ndarray
    header_at: np.ndarray
    header_counts: np.ndarray


def _fields(buf: np.ndarray, sections: _Sections) -> _Fields:
    """Every record's fields, checked (step 3 of the docstring)."""
    starts = np.concatenate(sections.starts)
    counts = np.asarray([len(s) for s in sections.starts], np.int64)
    lengths, at = _varints(buf, starts, _VARINT_BYTES_MAX)
    ends = at + lengths
    timestamp_deltas, at = _varints(buf, at + 1, _VARLONG_BYTES_MAX)  # +1: attributes
    offset_deltas, at = _varints(buf, at, _VARINT_BYTES_MAX)
    key_lengths, key_at = _varints(buf, at, _VARINT_BYTES_MAX)
    value_lengths, value_at = _varints(buf, key_at + np.maximum(key_lengths, 0), _VARINT_BYTES_MAX)
    header_counts, header_at = _varints(
        buf, value_at + np.maximum(value_lengths, 0), _VARINT_BYTES_MAX
    )
    headers = sections.headers
    batch_index = np.repeat(np.arange(len(headers)), counts)
    _check_fields(
        starts,
        ends,
        (key_lengths, value_lengths, header_counts, header_at),
        offset_deltas,
        batch_index,
        _per_record([h.last_offset_delta for h in headers], counts),
    )
    types = _per_record([h.timestamp_type for h in headers], counts)
    created = _per_record([h.first_timestamp for h in headers], counts) + timestamp_deltas
    appended = _per_record([h.max_timestamp for h in headers], counts)
    return _Fields(
        ends=ends,
        offsets=_per_record([h.base_offset for h in headers], counts) + offset_deltas,
        timestamps_ms=np.where(types == _LOG_APPEND_TIME, appended, created),
        timestamp_types=types.astype(np.int32),
        key_at=key_at,
        key_lengths=key_lengths,
        value_at=value_at,
        value_lengths=value_lengths,
        header_at=header_at,
        header_counts=header_counts,
    )


def _check_fields(
    starts: np.ndarray,
    ends: np.ndarray,
    sizes: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    offset_deltas: np.ndarray,
    batch_index: np.ndarray,
    last_deltas: np.ndarray,
) -> None:
    key_lengths, value_lengths, header_counts, header_at = sizes
    bad = (key_lengths < -1) | (value_lengths < -1) | (header_counts < 0)
    bad |= np.where(header_counts == 0, header_at != ends, header_at >= ends)
    bad |= (offset_deltas < 0) | (offset_deltas > last_deltas)
    same_batch = batch_index[1:] == batch_index[:-1]
    bad[1:] |= same_batch & (offset_deltas[1:] <= offset_deltas[:-1])
    if bad.any():
        first = int(np.argmax(bad))
        raise CorruptBatchError(
            f"record at byte {int(starts[first])}: lengths (key {int(key_lengths[first])}, "
            f"value {int(value_lengths[first])}), header count {int(header_counts[first])} or "
            f"offset delta {int(offset_deltas[first])} do not fit the record or its batch"
        )


class _Scratch(threading.local):
    """Per-thread scratch arrays, kept between calls: a fresh multi-megabyte temporary on
    every call costs more in page faults than the work done in it (the first decode in a
    process runs several times slower than the following ones)."""

    def __init__(self) -> None:
        self.marks = np.zeros(0, np.int8)
        self.inside = np.zeros(0, np.int8)

    def arrays(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        if len(self.marks) < size:
            self.marks = np.zeros(size, np.int8)
            self.inside = np.zeros(size, np.int8)
        return self.marks[:size], self.inside[:size]


_scratch = _Scratch()


def _gather(buf: np.ndarray, at: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """`buf[at[i] : at[i] + sizes[i]]` for all i, concatenated (ranges in buffer order)."""
    nonempty = sizes > 0
    starts = at[nonempty]
    if len(starts) == 0:
        return np.zeros(0, np.uint8)
    assert np.all(np.diff(starts) > 0), "ranges must lie in buffer order"
    # +1 where a range starts, -1 where it ends: the running sum is 1 exactly on wanted
    # bytes (ranges never overlap) and a boolean compress keeps them, in order. One pass
    # over the buffer, cheaper than building an index per byte (np.repeat) by half.
    stops = starts + sizes[nonempty]
    low, high = int(starts[0]), int(stops[-1])
    marks, inside = _scratch.arrays(high - low + 1)
    marks[:] = 0
    marks[starts - low] += 1
    marks[stops - low] -= 1
    np.cumsum(marks[:-1], dtype=np.int8, out=inside[:-1])
    gathered: np.ndarray = buf[low:high][inside[:-1].view(bool)]
    return gathered


def _binary(buf: np.ndarray, at: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """A binary array of `buf[at[i] : at[i] + lengths[i]]`, null where the length is -1."""
    valid = lengths >= 0
    sizes = np.where(valid, lengths, 0)
    offsets = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    assert offsets[-1] < 2**31, offsets[-1]
    gathered = _gather(buf, at, sizes)
    assert len(gathered) == offsets[-1]
    null_count = int(len(valid) - np.count_nonzero(valid))
    validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if null_count else None
    return pa.Array.from_buffers(
        pa.binary(),
        len(sizes),
        [validity, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(gathered)],
        null_count=null_count,
    )


def _constant_string(text: str, count: int) -> pa.Array:
    encoded = text.encode("utf-8")
    offsets = np.arange(count + 1, dtype=np.int64) * len(encoded)
    assert offsets[-1] < 2**31
    return pa.Array.from_buffers(
        pa.string(),
        count,
        [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(encoded * count)],
    )


def _headers(buffer: bytes, fields: _Fields, chosen: np.ndarray) -> pa.Array:
    """The headers column: null for a record without headers (as Spark's Kafka source)."""
    column: list[list[tuple[str, bytes | None]] | None] = []
    for index in chosen.tolist():
        count = int(fields.header_counts[index])
        if count == 0:
            column.append(None)
            continue
        column.append(_read_headers(buffer, int(fields.header_at[index]), count))
    return pa.array(column, type=_HEADER_TYPE)


def _read_headers(buffer: bytes, pos: int, count: int) -> list[tuple[str, bytes | None]]:
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(count):
        key_length, pos = decode_varint(buffer, pos, bytes_max=_VARINT_BYTES_MAX)
        if key_length < 0:
            raise CorruptBatchError(f"header key length {key_length} at byte {pos}")
        key = buffer[pos : pos + key_length].decode("utf-8", errors="strict")
        value_length, pos = decode_varint(buffer, pos + key_length, bytes_max=_VARINT_BYTES_MAX)
        value = None if value_length < 0 else buffer[pos : pos + max(value_length, 0)]
        pos += max(value_length, 0)
        headers.append((key, value))
    assert len(headers) == count
    return headers


def _columns(
    buffer: bytes,
    sections: _Sections,
    topic: str,
    partition: int,
    offset_range: tuple[int, int],
    include_headers: bool,
) -> pa.RecordBatch | None:
    buf = np.frombuffer(buffer, np.uint8)
    fields = _fields(buf, sections)
    offset_from, offset_to = offset_range
    chosen = np.flatnonzero((fields.offsets >= offset_from) & (fields.offsets < offset_to))
    count = len(chosen)
    if count == 0:
        return None
    if include_headers and fields.header_counts.any():
        headers = _headers(buffer, fields, chosen)
    else:
        headers = pa.nulls(count, _HEADER_TYPE)
    arrays = [
        _binary(buf, fields.key_at[chosen], fields.key_lengths[chosen]),
        _binary(buf, fields.value_at[chosen], fields.value_lengths[chosen]),
        _constant_string(topic, count),
        pa.array(np.full(count, partition, np.int32)),
        pa.array(fields.offsets[chosen]),
        pa.array(fields.timestamps_ms[chosen] * 1000, pa.timestamp("us", tz="UTC")),
        pa.array(fields.timestamp_types[chosen]),
    ]
    if include_headers:
        arrays.append(headers)
    batch = pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(include_headers=include_headers))
    assert batch.num_rows == count
    return batch
