"""Reading records back out of a verified RecordBatch v2 (consumers). Decoding trusts
nothing: raftlog.storage.records lists every check and how a rejection names its byte."""

from __future__ import annotations

from raftlog.errors import CorruptBatchError
from raftlog.storage.batch import (
    ATTR_TIMESTAMP_TYPE,
    BATCH_HEADER_BYTES,
    BatchHeader,
    Compression,
    verify_batch,
)
from raftlog.storage.compression import CompressionError, decompress
from raftlog.storage.record_format import (
    DEFAULT_DECOMPRESSED_BYTES_MAX,
    NULL_LENGTH_BYTE,
    RECORD_BYTES_MIN,
    VARINT_BYTES_MAX,
    VARLONG_BYTES_MAX,
    DecodedBatch,
    Headers,
    Malformed,
    Record,
    RecordOutFields,
)
from raftlog.storage.varints import read_varint, read_varint_multibyte

__all__ = ["decode_batch", "decode_batch_fields", "records_section"]


def decode_batch(
    buf: bytes | bytearray | memoryview,
    position: int = 0,
    *,
    path: str | None = None,
    batch_bytes_max: int | None = None,
    decompressed_bytes_max: int = DEFAULT_DECOMPRESSED_BYTES_MAX,
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
    decompressed_bytes_max: int = DEFAULT_DECOMPRESSED_BYTES_MAX,
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
        data, begin, stop = records_section(buf, start, end, codec, decompressed_bytes_max)
        fields = _decode_records(data, begin, stop, header)
    except CompressionError as error:
        raise CorruptBatchError(str(error), path=path, position=position) from None
    except Malformed as error:
        if codec is Compression.NONE:
            # `data` is `buf` itself (begin == start) or a copy of the section (begin == 0).
            at = error.at + start - begin
            raise CorruptBatchError(error.reason, path=path, position=at) from None
        reason = f"{error.reason} (at byte {error.at} of the {codec.name}-decompressed records)"
        raise CorruptBatchError(reason, path=path, position=position) from None
    assert len(fields) == header.record_count
    return header, fields


def records_section(
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


def _decode_records(
    data: bytes, begin: int, end: int, header: BatchHeader
) -> list[RecordOutFields]:
    """The records in `data[begin:end]`; `Malformed` positions are indices into `data`."""
    assert 0 <= begin <= end <= len(data), (begin, end, len(data))
    count = header.record_count
    if count > (end - begin) // RECORD_BYTES_MIN:
        raise Malformed(f"record_count {count} cannot fit in {end - begin} bytes of records", begin)
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
            raise Malformed(f"record_count is {count} but the records end after {index}", pos)
        try:
            offset_delta, timestamp_delta, key, value, headers, record_end = _decode_record(
                data, pos, end
            )
        except IndexError:
            raise Malformed(f"record {index} runs past the end of the records", pos) from None
        if not previous_delta < offset_delta <= last_offset_delta:
            raise Malformed(
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
        raise Malformed(
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
        length, pos = read_varint_multibyte(data, start, VARINT_BYTES_MAX)
    end = pos + length
    if length < 0 or end > limit:
        raise Malformed(f"record length {length} does not fit the {limit - pos} bytes left", start)
    body = pos
    pos += 1  # attributes: unused in v2 (Kafka ignores them too)
    byte = data[pos]
    if byte < 0x80:
        timestamp_delta = (byte >> 1) ^ -(byte & 1)
        pos += 1
    else:
        timestamp_delta, pos = read_varint(data, pos, VARLONG_BYTES_MAX)
    byte = data[pos]
    if byte < 0x80:
        offset_delta = (byte >> 1) ^ -(byte & 1)
        pos += 1
    else:
        offset_delta, pos = read_varint(data, pos, VARINT_BYTES_MAX)
    if data[pos] == NULL_LENGTH_BYTE:
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
    header_count, pos = read_varint(data, pos, VARINT_BYTES_MAX)
    headers: Headers = ()
    if header_count:
        # Each header takes at least two bytes (two lengths), which bounds the loop.
        if not 0 <= header_count <= (end - pos) // 2:
            raise Malformed(
                f"header count {header_count} does not fit the {end - pos} bytes left",
                header_count_at,
            )
        headers, pos = _read_headers(data, pos, end, header_count)
    if pos != end:
        raise Malformed(f"record length is {length} but its fields take {pos - body}", start)
    return offset_delta, timestamp_delta, key, value, headers, end


def _read_nullable(data: bytes, at: int, end: int, field: str) -> tuple[bytes | None, int]:
    length, pos = read_varint(data, at, VARINT_BYTES_MAX)
    if length < 0:
        if length == -1:
            return None, pos
        raise Malformed(f"{field} length {length} is negative", at)
    if pos + length > end:
        raise Malformed(f"{field} length {length} runs past the end of its record", at)
    return data[pos : pos + length], pos + length


def _read_headers(data: bytes, pos: int, end: int, count: int) -> tuple[Headers, int]:
    assert 0 < count <= (end - pos) // 2, (count, end, pos)
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(count):
        key_at = pos
        key_utf8, pos = _read_nullable(data, pos, end, "header key")
        if key_utf8 is None:
            raise Malformed("header key is null", key_at)
        try:
            key = key_utf8.decode("utf-8")
        except UnicodeDecodeError:
            raise Malformed(f"header key {key_utf8!r} is not UTF-8", pos - len(key_utf8)) from None
        value, pos = _read_nullable(data, pos, end, "header value")
        headers.append((key, value))
    return tuple(headers), pos
