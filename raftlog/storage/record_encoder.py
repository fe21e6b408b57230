"""Building RecordBatch v2 batches from records (producers; raftlog.storage.records describes
the format and the encoder's chunked assembly)."""

from __future__ import annotations

from collections.abc import Sequence

import crc32c as _crc32c

from raftlog.storage.batch import (
    ATTR_TIMESTAMP_TYPE,
    ATTR_TRANSACTIONAL,
    BATCH_HEADER_BYTES,
    LOG_OVERHEAD_BYTES,
    MAGIC_V2,
    Compression,
    crc32c,
    parse_header,
)
from raftlog.storage.compression import compress
from raftlog.storage.record_format import (
    CHUNK_BYTES,
    HEADER_PREFIX,
    HEADER_TAIL,
    INT16,
    INT32,
    INT64,
    NO_HEADERS,
    NULL_LENGTH,
    RECORD_ATTRIBUTES,
    Headers,
    RecordFields,
)
from raftlog.storage.varints import SMALL_VARINTS, SMALL_VARINTS_LIMIT, encode_varint

__all__ = ["build_batch", "encode_batch", "require_range"]


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

    Raises `ValueError` naming the argument for an empty batch or a value out of its
    field's range.
    """
    require_range("producer_id", producer_id, INT64)
    require_range("producer_epoch", producer_epoch, INT16)
    require_range("base_sequence", base_sequence, INT32)
    if timestamp_type not in (0, 1):
        raise ValueError(
            f"timestamp_type must be 0 (create) or 1 (log append), got {timestamp_type}"
        )
    attributes = int(compression)
    attributes |= ATTR_TIMESTAMP_TYPE if timestamp_type else 0
    attributes |= ATTR_TRANSACTIONAL if is_transactional else 0
    return build_batch(
        records,
        attributes=attributes,
        base_offset=base_offset,
        leader_epoch=leader_epoch,
        producer=(producer_id, producer_epoch, base_sequence),
    )


def build_batch(
    records: Sequence[RecordFields],
    *,
    attributes: int,
    base_offset: int,
    leader_epoch: int,
    producer: tuple[int, int, int],
) -> bytes:
    if not records:
        raise ValueError("a record batch needs at least one record")
    require_range("base_offset", base_offset, (0, INT64[1]))
    require_range("leader_epoch", leader_epoch, (-1, INT32[1]))
    require_range("record count", len(records), (1, INT32[1]))
    timestamps_ms = [record[2] for record in records]  # timestamp_ms
    first_timestamp_ms = min(timestamps_ms)
    max_timestamp_ms = max(timestamps_ms)
    require_range("smallest timestamp_ms", first_timestamp_ms, INT64)
    require_range("largest timestamp_ms", max_timestamp_ms, INT64)
    require_range("timestamp spread", max_timestamp_ms - first_timestamp_ms, INT64)
    section = _encode_records(records, first_timestamp_ms)
    codec = Compression(attributes & 0x07)
    if codec is not Compression.NONE:
        section = [compress(codec, b"".join(section))]
    tail = HEADER_TAIL.pack(
        attributes, len(records) - 1, first_timestamp_ms, max_timestamp_ms, *producer, len(records)
    )
    # The CRC runs piece by piece so that the batch is assembled by one join, its only copy:
    # a fresh megabyte costs more in page faults than in bytes moved.
    crc = crc32c(tail)
    for piece in section:
        crc = _crc32c.crc32c(piece, crc)
    batch_length = BATCH_HEADER_BYTES + sum(map(len, section)) - LOG_OVERHEAD_BYTES
    require_range("batch_length", batch_length, (0, INT32[1]))
    prefix = HEADER_PREFIX.pack(base_offset, batch_length, leader_epoch, MAGIC_V2, crc)
    batch = b"".join([prefix, tail, *section])
    assert parse_header(batch).record_count == len(records)
    return batch


def _encode_records(records: Sequence[RecordFields], first_timestamp_ms: int) -> list[bytes]:
    """The records section in pieces of about `CHUNK_BYTES` (whole records, in order).

    A record's parts go into a flat list and a chunk of records is joined at once: one join
    and (in `build_batch`) one CRC call per chunk instead of per record, and each piece is
    still small enough to be copied in cache-warm memory. Lengths and deltas, nearly always
    below `SMALL_VARINTS_LIMIT`, come from a table instead of being built.
    """
    small = SMALL_VARINTS
    limit = SMALL_VARINTS_LIMIT
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
            key, key_length = b"", NULL_LENGTH
        else:
            key_length = small[len(key)] if len(key) < limit else varint(len(key))
        if value is None:
            value, value_length = b"", NULL_LENGTH
        else:
            value_length = small[len(value)] if len(value) < limit else varint(len(value))
        headers = _encode_headers(record_headers) if record_headers else NO_HEADERS
        record_bytes = 1 + len(timestamp_delta) + len(offset) + len(key_length) + len(key)
        record_bytes += len(value_length) + len(value) + len(headers)
        if record_bytes > INT32[1]:
            raise ValueError(f"record {offset_delta} of {record_bytes} bytes is over int32")
        length = small[record_bytes] if record_bytes < limit else varint(record_bytes)
        extend(
            (
                length,
                RECORD_ATTRIBUTES,
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
        if chunk_bytes >= CHUNK_BYTES:
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
            parts.append(NULL_LENGTH)
        else:
            parts.append(encode_varint(len(header_value)))
            parts.append(header_value)
    assert len(parts) >= 1 + 3 * len(headers)
    return b"".join(parts)


def require_range(name: str, value: int, bounds: tuple[int, int]) -> None:
    low, high = bounds
    if not low <= value <= high:
        raise ValueError(f"{name} {value} is outside [{low}, {high}]")
