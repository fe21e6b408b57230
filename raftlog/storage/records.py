"""Kafka RecordBatch v2 records: build batches from records and read records back out.

Theory of operation. `raftlog.storage.batch` owns the 61-byte header and the CRC; this module
owns what follows it. Clients call it (producers encode, consumers decode); the broker path
never does, it only verifies and patches headers. After the header come `record_count`
records, compressed as one stream when the codec bits say so (`raftlog.storage.compression`).
Each record is, with zig-zag varints (varint: int32, at most 5 bytes; varlong: int64, 10):

    length          varint   bytes of the record after this field
    attributes      int8     unused in v2, written as 0
    timestampDelta  varlong  timestamp - batch first_timestamp
    offsetDelta     varint   offset - batch base_offset
    keyLength       varint   -1 = null key
    key             bytes
    valueLength     varint   -1 = null value
    value           bytes
    headersCount    varint
    headers         headersCount x (keyLength varint, key utf-8,
                                    valueLength varint (-1 = null), value)

Encoding gives record i the offset delta i, so `last_offset_delta = count - 1`; the batch's
first_timestamp is the *smallest* record timestamp (deltas are never negative) and
max_timestamp the largest. A worked example: records at 1000, 990 and 1005 ms encode
first_timestamp 990, max_timestamp 1005 and deltas 10, 0, 15.

Decoding trusts nothing: after `verify_batch` (length, magic, CRC) every varint is bounded in
size and range, every length is checked against the end of its record, a record's fields must
fill exactly its length, the header's `record_count` must match the records present with no
trailing bytes, offset deltas must rise within `[0, last_offset_delta]` (compaction may leave
gaps) and a compressed section may expand to at most `decompressed_bytes_max` bytes. Every
rejection is a `CorruptBatchError` whose `position` is the absolute byte in the buffer where the
fault lies, or, for a compressed batch, the batch's own position, the reason then naming the
byte within the decompressed records. Under LOG_APPEND_TIME (timestamp type 1) every record
reads as the batch's max_timestamp, as Kafka defines it.

Validation without decoding: `validate_records` walks the same framing (varint lengths,
offset deltas, header counts, UTF-8 header keys, decompression within its bound) and accepts
exactly the batches `decode_batch` accepts, without building a `Record` or slicing a key or a
value. The leader runs it once on a client's produce so that no bytes a consumer cannot
decode are ever stored and served; replication and fetch never run it.

Control batches (attribute bit 5) carry one record whose key is version int16 + type int16,
big-endian, and whose value is the type's payload: a new Raft leader's no-op is a
LEADER_CHANGE batch, a membership change a VOTERS batch (as in Kafka's KRaft).

Speed (clients run this in Python, per record): varints of one and two bytes take a fast
path, and the encoder reads the varints of 0..8191 from a table; records are joined from their
parts a chunk of about 32 KiB at a time and the CRC runs chunk by chunk, so the batch is
assembled by a single join of the chunks; uncompressed `bytes` are parsed in place, keys and
values sliced straight out of the buffer. Big fresh buffers are avoided because on this class
of machine a megabyte of new pages costs more in page faults than the bytes cost to move.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import crc32c as _crc32c

from raftlog.config import LogConfig
from raftlog.errors import CorruptBatchError
from raftlog.storage.batch import (
    ATTR_CONTROL,
    ATTR_TIMESTAMP_TYPE,
    ATTR_TRANSACTIONAL,
    BATCH_HEADER_BYTES,
    CRC_START,
    LOG_OVERHEAD_BYTES,
    MAGIC_V2,
    BatchHeader,
    Compression,
    crc32c,
    parse_header,
    verify_batch,
)
from raftlog.storage.compression import CompressionError, compress, decompress

__all__ = [
    "CONTROL_ABORT",
    "CONTROL_COMMIT",
    "CONTROL_KEY_VERSION",
    "CONTROL_LEADER_CHANGE",
    "CONTROL_VOTERS",
    "DecodedBatch",
    "Headers",
    "Record",
    "RecordFields",
    "RecordInput",
    "decode_batch",
    "decode_batch_fields",
    "decode_control_batch",
    "decode_varint",
    "encode_batch",
    "encode_control_batch",
    "encode_unsigned_varint",
    "encode_varint",
    "validate_records",
]

CONTROL_ABORT = 0
CONTROL_COMMIT = 1
CONTROL_LEADER_CHANGE = 2  # a new Raft leader's no-op (Raft §8)
CONTROL_VOTERS = 6  # a membership change (Raft dissertation §4.1)
CONTROL_KEY_VERSION = 0
_CONTROL_KEY = struct.Struct(">hh")

Headers = tuple[tuple[str, bytes | None], ...]

_INT16 = (-(2**15), 2**15 - 1)
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
_VARINT_BYTES_MAX = 5
_VARLONG_BYTES_MAX = 10
# length, attributes, timestampDelta, offsetDelta, keyLength, valueLength, headersCount:
# seven fields of at least one byte each.
_RECORD_BYTES_MIN = 7
_DEFAULT_DECOMPRESSED_BYTES_MAX = LogConfig().decompressed_bytes_max

# The header split at the CRC: the prefix lies outside the CRC's range, the tail inside it.
_HEADER_PREFIX = struct.Struct(">qiibI")
_HEADER_TAIL = struct.Struct(">hiqqqhii")
assert _HEADER_PREFIX.size == CRC_START
assert _HEADER_PREFIX.size + _HEADER_TAIL.size == BATCH_HEADER_BYTES

# Zig-zag values 0..127 (numbers -64..63) encode as one byte; most lengths and deltas do.
_ONE_BYTE_VARINTS = tuple(bytes((zigzag,)) for zigzag in range(0x80))
_NULL_LENGTH = _ONE_BYTE_VARINTS[1]  # zig-zag(-1)
_NULL_LENGTH_BYTE = _NULL_LENGTH[0]
_NO_HEADERS = _ONE_BYTE_VARINTS[0]  # a headers count of 0
_RECORD_ATTRIBUTES = b"\x00"
# The encoder's pieces: records are joined (and CRC'd) about this many bytes at a time, well
# below the allocator's mmap threshold (128 KiB), whose fresh pages cost page faults.
_CHUNK_BYTES = 32 * 1024


class RecordInput(NamedTuple):
    """A record to encode; its offset is its place in the batch.

    A NamedTuple, so a plain tuple of the same four fields (`RecordFields`) encodes as well:
    the producer keeps each record it buffers as a plain tuple, cheaper to build, and one the
    cyclic garbage collector stops tracking (an exact tuple of bytes and ints), where each
    tracked object held in a buffer of small records is walked again by every collection.
    """

    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    headers: Headers = ()


# What `encode_batch` reads of a record: key, value, timestamp_ms, headers (a RecordInput).
RecordFields = tuple[bytes | None, bytes | None, int, Headers]


@dataclass(frozen=True, slots=True)
class Record:
    """A decoded record, with its absolute offset and timestamp."""

    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: Headers

    def as_input(self) -> RecordInput:
        return RecordInput(self.key, self.value, self.timestamp_ms, self.headers)


# What `decode_batch_fields` gives for a record: offset, key, value, timestamp_ms, headers.
RecordOutFields = tuple[int, bytes | None, bytes | None, int, Headers]


@dataclass(frozen=True, slots=True)
class DecodedBatch:
    header: BatchHeader
    records: tuple[Record, ...]


class _Malformed(Exception):
    """A fault at byte `at` of a records section; decode_batch turns it into an absolute one."""

    def __init__(self, reason: str, at: int):
        super().__init__(reason)
        self.reason = reason
        self.at = at


# --- varints ---------------------------------------------------------------------------------


def encode_varint(value: int) -> bytes:
    """Zig-zag varint of a signed 64-bit integer (Kafka's varint and varlong)."""
    assert _INT64[0] <= value <= _INT64[1], value
    zigzag = (value << 1) ^ (value >> 63)
    if zigzag < 0x80:
        return _ONE_BYTE_VARINTS[zigzag]
    if zigzag < 0x4000:
        return bytes((zigzag & 0x7F | 0x80, zigzag >> 7))
    return encode_unsigned_varint(zigzag)


def encode_unsigned_varint(value: int) -> bytes:
    """Plain base-128 varint of a non-negative integer (protobuf's lengths and tags, Kafka's
    unsigned varints): seven bits a byte, low first, the high bit set on all but the last."""
    assert 0 <= value < 2**64, value
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# Varints of the numbers 0..8191 (one or two bytes), built once (about 350 KiB): a record's
# lengths and deltas are nearly always among them, and a table read costs less than a build.
_SMALL_VARINTS_LIMIT = 8192
_SMALL_VARINTS = tuple(encode_varint(number) for number in range(_SMALL_VARINTS_LIMIT))


def decode_varint(
    data: bytes, position: int = 0, *, bytes_max: int = _VARLONG_BYTES_MAX
) -> tuple[int, int]:
    """Decode a zig-zag varint at `position`: `(value, next_position)`.

    Raises `CorruptBatchError` naming the position for a truncated or over-long varint.
    """
    assert bytes_max in (_VARINT_BYTES_MAX, _VARLONG_BYTES_MAX), bytes_max
    try:
        return _read_varint(data, position, bytes_max)
    except IndexError:
        raise CorruptBatchError("truncated varint", position=position) from None
    except _Malformed as error:
        raise CorruptBatchError(error.reason, position=error.at) from None


def _read_varint(data: bytes, pos: int, bytes_max: int) -> tuple[int, int]:
    # An IndexError here means the varint runs off the end of `data`; callers catch it.
    byte = data[pos]
    if byte < 0x80:
        return (byte >> 1) ^ -(byte & 1), pos + 1
    # Two bytes hold zig-zag values below 16384: KiB-sized lengths and most deltas.
    second = data[pos + 1]
    if second < 0x80:
        zigzag = (byte & 0x7F) | (second << 7)
        return (zigzag >> 1) ^ -(zigzag & 1), pos + 2
    return _read_varint_multibyte(data, pos, bytes_max)


def _read_varint_multibyte(data: bytes, start: int, bytes_max: int) -> tuple[int, int]:
    zigzag = 0
    shift = 0
    pos = start
    while True:
        if pos - start == bytes_max:
            raise _Malformed(f"varint longer than {bytes_max} bytes", start)
        byte = data[pos]
        zigzag |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            break
        shift += 7
    bits = 32 if bytes_max == _VARINT_BYTES_MAX else 64
    if zigzag >> bits:
        raise _Malformed(f"varint overflows {bits} bits", start)
    assert pos - start <= bytes_max
    return (zigzag >> 1) ^ -(zigzag & 1), pos


# --- encoding --------------------------------------------------------------------------------


def encode_batch(
    records: Sequence[RecordFields],
    *,
    base_offset: int = 0,
    leader_epoch: int = 0,
    compression: Compression = Compression.NONE,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    timestamp_type: int = 0,
    is_transactional: bool = False,
) -> bytes:
    """Build one RecordBatch v2 holding `records` at offsets `base_offset + i`.

    Raises `ValueError` naming the argument for an empty batch, a value out of its field's
    range, or a codec raftlog cannot write (SNAPPY).
    """
    _require_range("producer_id", producer_id, _INT64)
    _require_range("producer_epoch", producer_epoch, _INT16)
    _require_range("base_sequence", base_sequence, _INT32)
    if timestamp_type not in (0, 1):
        raise ValueError(
            f"timestamp_type must be 0 (create) or 1 (log append), got {timestamp_type}"
        )
    attributes = int(compression)
    attributes |= ATTR_TIMESTAMP_TYPE if timestamp_type else 0
    attributes |= ATTR_TRANSACTIONAL if is_transactional else 0
    return _build_batch(
        records,
        attributes=attributes,
        base_offset=base_offset,
        leader_epoch=leader_epoch,
        producer=(producer_id, producer_epoch, base_sequence),
    )


def encode_control_batch(
    control_type: int,
    value: bytes,
    *,
    timestamp_ms: int,
    base_offset: int = 0,
    leader_epoch: int = 0,
) -> bytes:
    """A control batch of one record: key = (CONTROL_KEY_VERSION, control_type), the value."""
    _require_range("control_type", control_type, _INT16)
    key = _CONTROL_KEY.pack(CONTROL_KEY_VERSION, control_type)
    record = RecordInput(key, value, timestamp_ms)
    return _build_batch(
        (record,),
        attributes=ATTR_CONTROL,
        base_offset=base_offset,
        leader_epoch=leader_epoch,
        producer=(-1, -1, -1),
    )


def _build_batch(
    records: Sequence[RecordFields],
    *,
    attributes: int,
    base_offset: int,
    leader_epoch: int,
    producer: tuple[int, int, int],
) -> bytes:
    if not records:
        raise ValueError("a record batch needs at least one record")
    _require_range("base_offset", base_offset, (0, _INT64[1]))
    _require_range("leader_epoch", leader_epoch, (-1, _INT32[1]))
    _require_range("record count", len(records), (1, _INT32[1]))
    timestamps_ms = [record[2] for record in records]  # timestamp_ms
    first_timestamp_ms = min(timestamps_ms)
    max_timestamp_ms = max(timestamps_ms)
    _require_range("smallest timestamp_ms", first_timestamp_ms, _INT64)
    _require_range("largest timestamp_ms", max_timestamp_ms, _INT64)
    _require_range("timestamp spread", max_timestamp_ms - first_timestamp_ms, _INT64)
    section = _encode_records(records, first_timestamp_ms)
    codec = Compression(attributes & 0x07)
    if codec is not Compression.NONE:
        section = [compress(codec, b"".join(section))]
    tail = _HEADER_TAIL.pack(
        attributes, len(records) - 1, first_timestamp_ms, max_timestamp_ms, *producer, len(records)
    )
    # The CRC runs piece by piece so that the batch is assembled by one join, its only copy:
    # a fresh megabyte costs more in page faults than in bytes moved.
    crc = crc32c(tail)
    for piece in section:
        crc = _crc32c.crc32c(piece, crc)
    batch_length = BATCH_HEADER_BYTES + sum(map(len, section)) - LOG_OVERHEAD_BYTES
    _require_range("batch_length", batch_length, (0, _INT32[1]))
    prefix = _HEADER_PREFIX.pack(base_offset, batch_length, leader_epoch, MAGIC_V2, crc)
    batch = b"".join([prefix, tail, *section])
    assert parse_header(batch).record_count == len(records)
    return batch


def _encode_records(records: Sequence[RecordFields], first_timestamp_ms: int) -> list[bytes]:
    """The records section in pieces of about `_CHUNK_BYTES` (whole records, in order).

    A record's parts go into a flat list and a chunk of records is joined at once: one join
    and (in `_build_batch`) one CRC call per chunk instead of per record, and each piece is
    still small enough to be copied in cache-warm memory. Lengths and deltas, nearly always
    below `_SMALL_VARINTS_LIMIT`, come from a table instead of being built.
    """
    small = _SMALL_VARINTS
    limit = _SMALL_VARINTS_LIMIT
    varint = encode_varint
    chunks: list[bytes] = []
    parts: list[bytes] = []
    extend = parts.extend
    chunk_bytes = 0
    for offset_delta, (key, value, timestamp_ms, record_headers) in enumerate(records):
        delta = timestamp_ms - first_timestamp_ms  # >= 0: first is the smallest
        timestamp_delta = small[delta] if delta < limit else varint(delta)
        offset = small[offset_delta] if offset_delta < limit else varint(offset_delta)
        if key is None:
            key, key_length = b"", _NULL_LENGTH
        else:
            key_length = small[len(key)] if len(key) < limit else varint(len(key))
        if value is None:
            value, value_length = b"", _NULL_LENGTH
        else:
            value_length = small[len(value)] if len(value) < limit else varint(len(value))
        headers = _encode_headers(record_headers) if record_headers else _NO_HEADERS
        record_bytes = 1 + len(timestamp_delta) + len(offset) + len(key_length) + len(key)
        record_bytes += len(value_length) + len(value) + len(headers)
        if record_bytes > _INT32[1]:
            raise ValueError(f"record {offset_delta} of {record_bytes} bytes is over int32")
        length = small[record_bytes] if record_bytes < limit else varint(record_bytes)
        extend(
            (
                length,
                _RECORD_ATTRIBUTES,
                timestamp_delta,
                offset,
                key_length,
                key,
                value_length,
                value,
                headers,
            )
        )
        chunk_bytes += record_bytes
        if chunk_bytes >= _CHUNK_BYTES:
            chunks.append(b"".join(parts))
            parts.clear()
            chunk_bytes = 0
    if parts:
        chunks.append(b"".join(parts))
    assert records and chunks, "a batch holds at least one record"
    return chunks


def _encode_headers(headers: Headers) -> bytes:
    parts = [encode_varint(len(headers))]
    for header_key, header_value in headers:
        key_utf8 = header_key.encode("utf-8")
        parts.append(encode_varint(len(key_utf8)))
        parts.append(key_utf8)
        if header_value is None:
            parts.append(_NULL_LENGTH)
        else:
            parts.append(encode_varint(len(header_value)))
            parts.append(header_value)
    assert len(parts) >= 1 + 3 * len(headers)
    return b"".join(parts)


def _require_range(name: str, value: int, bounds: tuple[int, int]) -> None:
    low, high = bounds
    if not low <= value <= high:
        raise ValueError(f"{name} {value} is outside [{low}, {high}]")


# --- decoding --------------------------------------------------------------------------------


def decode_batch(
    buf: bytes | bytearray | memoryview,
    position: int = 0,
    *,
    path: str | None = None,
    batch_bytes_max: int | None = None,
    decompressed_bytes_max: int = _DEFAULT_DECOMPRESSED_BYTES_MAX,
) -> DecodedBatch:
    """Verify the batch at `position` (length, magic, CRC) and decode its records.

    Raises `CrcMismatchError` or `CorruptBatchError` naming `path` and the position of the
    fault (see the module docstring); nothing is returned from a batch that fails.
    """
    header, fields = decode_batch_fields(
        buf,
        position,
        path=path,
        batch_bytes_max=batch_bytes_max,
        decompressed_bytes_max=decompressed_bytes_max,
    )
    return DecodedBatch(header, tuple(Record(o, t, k, v, h) for o, k, v, t, h in fields))


def decode_batch_fields(
    buf: bytes | bytearray | memoryview,
    position: int = 0,
    *,
    path: str | None = None,
    batch_bytes_max: int | None = None,
    decompressed_bytes_max: int = _DEFAULT_DECOMPRESSED_BYTES_MAX,
) -> tuple[BatchHeader, list[RecordOutFields]]:
    """`decode_batch`, each record as a plain tuple `(offset, key, value, timestamp_ms,
    headers)`: the consumer's path. A consumer record is these after its topic and
    partition, so the client builds one in one step; and a plain tuple of bytes and ints is
    cheap to build and untracked by the cyclic garbage collector at its first pass, where a
    `Record` stays tracked (collections over buffered records took ~13% of a consumer's CPU).
    """
    header = verify_batch(buf, position, batch_bytes_max=batch_bytes_max, path=path)
    start = position + BATCH_HEADER_BYTES
    end = position + header.size_bytes
    codec = header.compression
    try:
        data, begin, stop = _records_section(buf, start, end, codec, decompressed_bytes_max)
        fields = _decode_records(data, begin, stop, header)
    except CompressionError as error:
        raise CorruptBatchError(str(error), path=path, position=position) from None
    except _Malformed as error:
        if codec is Compression.NONE:
            # `data` is `buf` itself (begin == start) or a copy of the section (begin == 0).
            at = error.at + start - begin
            raise CorruptBatchError(error.reason, path=path, position=at) from None
        reason = f"{error.reason} (at byte {error.at} of the {codec.name}-decompressed records)"
        raise CorruptBatchError(reason, path=path, position=position) from None
    assert len(fields) == header.record_count
    return header, fields


def _records_section(
    buf: bytes | bytearray | memoryview,
    start: int,
    end: int,
    codec: Compression,
    decompressed_bytes_max: int,
) -> tuple[bytes, int, int]:
    """`(data, begin, stop)`: the records, decompressed, are `data[begin:stop]`."""
    if codec is not Compression.NONE:
        data = decompress(codec, memoryview(buf)[start:end], bytes_max=decompressed_bytes_max)
        return data, 0, len(data)
    if isinstance(buf, bytes):
        # Parse in place: keys and values are sliced straight out of `buf`, sparing a copy of
        # the whole batch (a fresh megabyte costs more in page faults than in bytes moved).
        return buf, start, end
    return bytes(buf[start:end]), 0, end - start


def decode_control_batch(
    buf: bytes | bytearray | memoryview, position: int = 0, *, path: str | None = None
) -> tuple[int, bytes]:
    """The `(control_type, value)` of the control batch at `position`.

    Raises `CorruptBatchError` if it is not a control batch of one well-formed control record.
    """
    batch = decode_batch(buf, position, path=path)
    if not batch.header.is_control or batch.header.record_count != 1:
        raise CorruptBatchError(
            f"not a control batch of one record (control={batch.header.is_control}, "
            f"record_count={batch.header.record_count})",
            path=path,
            position=position,
        )
    record = batch.records[0]
    if record.key is None or len(record.key) != _CONTROL_KEY.size or record.value is None:
        raise CorruptBatchError(
            f"control record needs a {_CONTROL_KEY.size}-byte key and a value, got key "
            f"{record.key!r} and {'no' if record.value is None else 'a'} value",
            path=path,
            position=position,
        )
    version, control_type = _CONTROL_KEY.unpack(record.key)
    if version < 0:
        raise CorruptBatchError(
            f"control record key version {version} is negative", path=path, position=position
        )
    return control_type, record.value


def _decode_records(
    data: bytes, begin: int, end: int, header: BatchHeader
) -> list[RecordOutFields]:
    """The records in `data[begin:end]`; `_Malformed` positions are indices into `data`."""
    assert 0 <= begin <= end <= len(data), (begin, end, len(data))
    count = header.record_count
    if count > (end - begin) // _RECORD_BYTES_MIN:
        raise _Malformed(
            f"record_count {count} cannot fit in {end - begin} bytes of records", begin
        )
    base_offset = header.base_offset
    last_offset_delta = header.last_offset_delta
    log_append_time = bool(header.attributes & ATTR_TIMESTAMP_TYPE)
    # Hoisted out of the loop: a consumer decodes every record it reads here.
    records: list[RecordOutFields] = []
    append = records.append
    pos = begin
    previous_delta = -1
    for index in range(count):
        if pos == end:
            raise _Malformed(f"record_count is {count} but the records end after {index}", pos)
        try:
            offset_delta, timestamp_delta, key, value, headers, record_end = _decode_record(
                data, pos, end
            )
        except IndexError:
            raise _Malformed(f"record {index} runs past the end of the records", pos) from None
        if not previous_delta < offset_delta <= last_offset_delta:
            raise _Malformed(
                f"record {index} has offset delta {offset_delta}, outside "
                f"({previous_delta}, {last_offset_delta}]",
                pos,
            )
        previous_delta = offset_delta
        timestamp_ms = (
            header.max_timestamp if log_append_time else header.first_timestamp + timestamp_delta
        )
        append((base_offset + offset_delta, key, value, timestamp_ms, headers))
        pos = record_end
    if pos != end:
        raise _Malformed(
            f"{end - pos} trailing bytes after the {count} records of record_count", pos
        )
    return records


def _decode_record(
    data: bytes, start: int, limit: int
) -> tuple[int, int, bytes | None, bytes | None, Headers, int]:
    """`(offset_delta, timestamp_delta, key, value, headers, end)` of the record at `start`.

    Varints may be read past `limit` (the end of the records) while the record is parsed,
    never past its own end unnoticed: its fields must end exactly at `end <= limit`.
    One-byte varints (most deltas, a null key, no headers) are read inline: a call per
    field was half the cost of decoding a record.
    """
    byte = data[start]
    if byte < 0x80:
        length, pos = (byte >> 1) ^ -(byte & 1), start + 1
    elif (second := data[start + 1]) < 0x80:
        zigzag = (byte & 0x7F) | (second << 7)
        length, pos = (zigzag >> 1) ^ -(zigzag & 1), start + 2
    else:
        length, pos = _read_varint_multibyte(data, start, _VARINT_BYTES_MAX)
    end = pos + length
    if length < 0 or end > limit:
        raise _Malformed(f"record length {length} does not fit the {limit - pos} bytes left", start)
    body = pos
    pos += 1  # attributes: unused in v2 (Kafka ignores them too)
    byte = data[pos]
    if byte < 0x80:
        timestamp_delta = (byte >> 1) ^ -(byte & 1)
        pos += 1
    else:
        timestamp_delta, pos = _read_varint(data, pos, _VARLONG_BYTES_MAX)
    byte = data[pos]
    if byte < 0x80:
        offset_delta = (byte >> 1) ^ -(byte & 1)
        pos += 1
    else:
        offset_delta, pos = _read_varint(data, pos, _VARINT_BYTES_MAX)
    if data[pos] == _NULL_LENGTH_BYTE:
        key, pos = None, pos + 1
    else:
        key, pos = _read_nullable(data, pos, end, "key")
    # A value of 1..8191 bytes: its length (one or two varint bytes) read inline.
    byte = data[pos]
    if byte & 1 or not byte:  # null, empty or negative: checked and reported below
        value_start = value_end = end + 1
    elif byte < 0x80:
        value_start = pos + 1
        value_end = value_start + (byte >> 1)
    elif (second := data[pos + 1]) < 0x80:
        value_start = pos + 2
        value_end = value_start + (((byte & 0x7F) | (second << 7)) >> 1)
    else:
        value_start = value_end = end + 1
    value: bytes | None
    if value_end <= end:
        value, pos = data[value_start:value_end], value_end
    else:
        value, pos = _read_nullable(data, pos, end, "value")
    if data[pos] == 0 and pos + 1 == end:
        return offset_delta, timestamp_delta, key, value, (), end  # no headers
    header_count_at = pos
    header_count, pos = _read_varint(data, pos, _VARINT_BYTES_MAX)
    headers: Headers = ()
    if header_count:
        # Each header takes at least two bytes (two lengths), which bounds the loop.
        if not 0 <= header_count <= (end - pos) // 2:
            raise _Malformed(
                f"header count {header_count} does not fit the {end - pos} bytes left",
                header_count_at,
            )
        headers, pos = _read_headers(data, pos, end, header_count)
    if pos != end:
        raise _Malformed(f"record length is {length} but its fields take {pos - body}", start)
    return offset_delta, timestamp_delta, key, value, headers, end


def _read_nullable(data: bytes, at: int, end: int, field: str) -> tuple[bytes | None, int]:
    length, pos = _read_varint(data, at, _VARINT_BYTES_MAX)
    if length < 0:
        if length == -1:
            return None, pos
        raise _Malformed(f"{field} length {length} is negative", at)
    if pos + length > end:
        raise _Malformed(f"{field} length {length} runs past the end of its record", at)
    return data[pos : pos + length], pos + length


def _read_headers(data: bytes, pos: int, end: int, count: int) -> tuple[Headers, int]:
    assert 0 < count <= (end - pos) // 2, (count, end, pos)
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(count):
        key_at = pos
        key_utf8, pos = _read_nullable(data, pos, end, "header key")
        if key_utf8 is None:
            raise _Malformed("header key is null", key_at)
        try:
            key = key_utf8.decode("utf-8")
        except UnicodeDecodeError:
            raise _Malformed(f"header key {key_utf8!r} is not UTF-8", pos - len(key_utf8)) from None
        value, pos = _read_nullable(data, pos, end, "header value")
        headers.append((key, value))
    return tuple(headers), pos


# --- validation without decoding (the leader's produce path) ---------------------------------


def validate_records(
    batch: bytes,
    header: BatchHeader,
    *,
    decompressed_bytes_max: int = _DEFAULT_DECOMPRESSED_BYTES_MAX,
) -> None:
    """Check that the records of `batch` (one batch at position 0, already CRC-verified into
    `header`) are well framed: `decode_batch` would return `header.record_count` records.

    Raises `CorruptBatchError` naming the record index and the byte of the fault (absolute in
    `batch`; for a compressed batch the byte within the decompressed records).
    """
    assert header.size_bytes == len(batch), (header.size_bytes, len(batch))
    codec = header.compression
    try:
        data, begin, stop = _records_section(
            batch, BATCH_HEADER_BYTES, len(batch), codec, decompressed_bytes_max
        )
        _walk_records(data, begin, stop, header)
    except CompressionError as error:
        raise CorruptBatchError(str(error), position=0) from None
    except _Malformed as error:
        if codec is Compression.NONE:
            at = error.at + BATCH_HEADER_BYTES - begin
            raise CorruptBatchError(error.reason, position=at) from None
        reason = f"{error.reason} (at byte {error.at} of the {codec.name}-decompressed records)"
        raise CorruptBatchError(reason, position=0) from None


_NOT_PLAIN = (0, -1)


def _skip_plain_record(data: bytes, start: int, limit: int) -> tuple[int, int]:
    """`(offset_delta, end)` of the record at `start` if it is *plain* (varints of one or two
    bytes, key and value null or of a non-negative length, no headers: what producers send)
    and well framed within `limit`; `_NOT_PLAIN` (end -1) otherwise, for `_skip_record` to
    decide and explain. It runs on every produced record, so each field is read inline: a
    call per field cost more than the fields. Any test that fails, or an IndexError (a field
    past the end of `data`), means not plain; so this only decides quickly what
    `_skip_record` would decide, and every refusal comes from `_skip_record`."""
    try:
        byte = data[start]
        if byte < 0x80:
            zigzag, at = byte, start + 1
        elif data[start + 1] < 0x80:
            zigzag, at = (byte & 0x7F) | (data[start + 1] << 7), start + 2
        else:
            return _NOT_PLAIN
        end = at + (zigzag >> 1)
        if zigzag & 1 or end > limit:
            return _NOT_PLAIN  # a negative length, or one past the records
        at += 1  # attributes
        at += 1 if data[at] < 0x80 else 2 if data[at + 1] < 0x80 else limit  # timestampDelta
        byte = data[at]
        if byte < 0x80:
            offset_delta, at = (byte >> 1) ^ -(byte & 1), at + 1
        elif data[at + 1] < 0x80:
            zigzag = (byte & 0x7F) | (data[at + 1] << 7)
            offset_delta, at = (zigzag >> 1) ^ -(zigzag & 1), at + 2
        else:
            return _NOT_PLAIN
        for _ in _KEY_VALUE:  # their lengths: -1 is null, any other negative a fault
            byte = data[at]
            if byte < 0x80:
                at += 1 if byte == 1 else limit if byte & 1 else 1 + (byte >> 1)
            elif data[at + 1] < 0x80 and not byte & 1:
                at += 2 + (((byte & 0x7F) | (data[at + 1] << 7)) >> 1)
            else:
                return _NOT_PLAIN
        if at + 1 != end or data[at] != 0:  # one byte of header count, saying none
            return _NOT_PLAIN
    except IndexError:
        return _NOT_PLAIN
    return offset_delta, end


def _walk_records(
    data: bytes,
    begin: int,
    end: int,
    header: BatchHeader,
    skip_plain: Callable[[bytes, int, int], tuple[int, int]] = _skip_plain_record,
) -> None:
    """`_decode_records`' checks, building nothing; `_Malformed` names the record index.

    Each record is first offered to `skip_plain` (`_skip_plain_record`, the fast path for
    what producers send); a record it does not take goes to `_skip_record`, which accepts or
    refuses it, naming the fault. A `skip_plain` that takes nothing gives the plain
    per-record walk (the tests compare the two).
    """
    assert 0 <= begin <= end <= len(data), (begin, end, len(data))
    count = header.record_count
    if count > (end - begin) // _RECORD_BYTES_MIN:
        raise _Malformed(
            f"record_count {count} cannot fit in {end - begin} bytes of records", begin
        )
    pos = begin
    previous_delta = -1
    last_offset_delta = header.last_offset_delta
    for index in range(count):
        if pos == end:
            raise _Malformed(f"record_count is {count} but the records end after {index}", pos)
        offset_delta, record_end = skip_plain(data, pos, end)
        if record_end < 0:
            try:
                offset_delta, record_end = _skip_record(data, pos, end)
            except IndexError:
                raise _Malformed(f"record {index} runs past the end of the records", pos) from None
            except _Malformed as error:
                raise _Malformed(f"record {index}: {error.reason}", error.at) from None
        if not previous_delta < offset_delta <= last_offset_delta:
            raise _Malformed(
                f"record {index} has offset delta {offset_delta}, outside "
                f"({previous_delta}, {last_offset_delta}]",
                pos,
            )
        previous_delta = offset_delta
        pos = record_end
    if pos != end:
        raise _Malformed(
            f"{end - pos} trailing bytes after the {count} records of record_count", pos
        )


_KEY_VALUE = ("key", "value")


def _skip_record(data: bytes, start: int, limit: int) -> tuple[int, int]:
    """`(offset_delta, end)` of the record at `start`, checked as `_decode_record` checks it."""
    read = _read_varint
    length, pos = read(data, start, _VARINT_BYTES_MAX)
    end = pos + length
    if length < 0 or end > limit:
        raise _Malformed(f"record length {length} does not fit the {limit - pos} bytes left", start)
    body = pos
    _, pos = read(data, pos + 1, _VARLONG_BYTES_MAX)  # after the attributes: timestampDelta
    offset_delta, pos = read(data, pos, _VARINT_BYTES_MAX)
    # Key then value, inline: `_skip_nullable` for each would cost a call per field.
    for field in _KEY_VALUE:
        field_at = pos
        field_length, pos = read(data, pos, _VARINT_BYTES_MAX)
        if field_length >= 0:
            pos += field_length
        if field_length < -1 or pos > end:
            pos = _skip_nullable(data, field_at, end, field)  # raises, naming the fault
    header_count_at = pos
    header_count, pos = read(data, pos, _VARINT_BYTES_MAX)
    if header_count:
        if not 0 <= header_count <= (end - pos) // 2:
            raise _Malformed(
                f"header count {header_count} does not fit the {end - pos} bytes left",
                header_count_at,
            )
        pos = _skip_headers(data, pos, end, header_count)
    if pos != end:
        raise _Malformed(f"record length is {length} but its fields take {pos - body}", start)
    return offset_delta, end


def _skip_nullable(data: bytes, at: int, end: int, field: str) -> int:
    length, pos = _read_varint(data, at, _VARINT_BYTES_MAX)
    if length < 0:
        if length == -1:
            return pos
        raise _Malformed(f"{field} length {length} is negative", at)
    if pos + length > end:
        raise _Malformed(f"{field} length {length} runs past the end of its record", at)
    return pos + length


def _skip_headers(data: bytes, pos: int, end: int, count: int) -> int:
    # Header keys are the one field a consumer turns into text, so they are decoded here too.
    assert 0 < count <= (end - pos) // 2, (count, end, pos)
    for _ in range(count):
        key_at = pos
        length, key_start = _read_varint(data, pos, _VARINT_BYTES_MAX)
        if length == -1:
            raise _Malformed("header key is null", key_at)
        pos = _skip_nullable(data, pos, end, "header key")
        try:
            data[key_start:pos].decode("utf-8")
        except UnicodeDecodeError:
            raise _Malformed(
                f"header key {data[key_start:pos]!r} is not UTF-8", key_start
            ) from None
        pos = _skip_nullable(data, pos, end, "header value")
    return pos
