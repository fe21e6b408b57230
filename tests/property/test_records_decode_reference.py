"""The record decoder reads short varints inline (its hot path); here it (`decode_batch`, and
`decode_batch_fields`, the consumer's) must agree with a plain reference decoder, written
from Kafka's record layout with nothing but `decode_varint`, on every batch: the same records
from a good batch, and a rejection where the reference finds the records malformed. Values
and keys straddle the one- and two-byte varint lengths (63/64 bytes, 8191/8192) the inline
reads switch on, and damage lands on the length bytes.
"""

from __future__ import annotations

import struct

import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftlog.errors import CorruptBatchError
from raftlog.storage.batch import verify_batch
from raftlog.storage.records import (
    RecordInput,
    decode_batch,
    decode_batch_fields,
    decode_varint,
    encode_batch,
)

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
EDGE_SIZES = [0, 1, 2, 63, 64, 65, 127, 128, 8191, 8192, 8193]
RECORDS_AT = 61  # the records follow the 61-byte batch header

sized_bytes = st.none() | st.sampled_from(EDGE_SIZES).map(bytes) | st.binary(max_size=200)
record_inputs = st.builds(
    RecordInput,
    sized_bytes,
    sized_bytes,
    st.integers(0, 2**40),
    st.lists(st.tuples(st.text(max_size=4), st.none() | st.binary(max_size=4)), max_size=2).map(
        tuple
    ),
)
# Damage lands on lengths often only in small records: sizes up to the two-byte edge.
small_sized_bytes = st.none() | st.sampled_from(EDGE_SIZES[:8]).map(bytes) | st.binary(max_size=8)
small_record_inputs = st.builds(
    RecordInput,
    small_sized_bytes,
    small_sized_bytes,
    st.integers(0, 300),
    st.lists(st.tuples(st.text(max_size=2), st.none() | st.binary(max_size=2)), max_size=1).map(
        tuple
    ),
)
# Edits aimed at the bytes a length or a delta is read from.
EDIT_BYTES = [0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x7E, 0x7F, 0x80, 0x81, 0x82, 0xFE, 0xFF]
edge_byte = st.sampled_from(EDIT_BYTES)


class Malformed(Exception):
    pass


def reference_records(batch: bytes) -> list[tuple[int, int, bytes | None, bytes | None, object]]:
    """(offset, timestamp_ms, key, value, headers) of each record, the slow and plain way."""
    header = verify_batch(batch)
    data, pos, end = batch, RECORDS_AT, len(batch)
    records = []
    previous_delta = -1
    for _ in range(header.record_count):
        length, pos = read(data, pos, 5)
        record_end = pos + length
        if length < 0 or record_end > end:
            raise Malformed("record length")
        pos += 1  # attributes
        timestamp_delta, pos = read(data, pos, 10)
        offset_delta, pos = read(data, pos, 5)
        if not previous_delta < offset_delta <= header.last_offset_delta:
            raise Malformed("offset delta")
        previous_delta = offset_delta
        key, pos = read_nullable(data, pos, record_end)
        value, pos = read_nullable(data, pos, record_end)
        count, pos = read(data, pos, 5)
        if not 0 <= count <= (record_end - pos) // 2:
            raise Malformed("header count")
        headers = []
        for _ in range(count):
            name, pos = read_nullable(data, pos, record_end)
            if name is None:
                raise Malformed("null header key")
            header_value, pos = read_nullable(data, pos, record_end)
            headers.append((name.decode("utf-8"), header_value))
        if pos != record_end:
            raise Malformed("record length and fields disagree")
        timestamp_ms = header.first_timestamp + timestamp_delta
        records.append(
            (header.base_offset + offset_delta, timestamp_ms, key, value, tuple(headers))
        )
    if pos != end:
        raise Malformed("trailing bytes")
    return records


def read(data: bytes, pos: int, bytes_max: int) -> tuple[int, int]:
    try:
        return decode_varint(data, pos, bytes_max=bytes_max)
    except CorruptBatchError:
        raise Malformed("varint") from None


def read_nullable(data: bytes, pos: int, end: int) -> tuple[bytes | None, int]:
    length, pos = read(data, pos, 5)
    if length == -1:
        return None, pos
    if length < 0 or pos + length > end:
        raise Malformed("length")
    return data[pos : pos + length], pos + length


def with_fresh_crc(batch: bytearray) -> bytes:
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return bytes(batch)


def agree(batch: bytes) -> None:
    try:
        expected = reference_records(batch)
    except (Malformed, UnicodeDecodeError, IndexError):
        expected = None
    try:
        decoded = [
            (r.offset, r.timestamp_ms, r.key, r.value, r.headers)
            for r in decode_batch(batch).records
        ]
    except CorruptBatchError:
        decoded = None
    assert decoded == expected
    try:
        # The consumer's path: the same records, as (offset, key, value, timestamp_ms, headers).
        fields = [(o, t, k, v, h) for o, k, v, t, h in decode_batch_fields(batch)[1]]
    except CorruptBatchError:
        fields = None
    assert fields == expected


@SETTINGS
@given(inputs=st.lists(record_inputs, min_size=1, max_size=6))
def test_good_batches_decode_as_the_reference_reads_them(inputs: list[RecordInput]) -> None:
    batch = encode_batch(inputs, base_offset=1000)
    assert [(r.key, r.value) for r in decode_batch(batch).records] == [
        (i.key, i.value) for i in inputs
    ]
    agree(batch)


@SETTINGS
@given(
    inputs=st.lists(small_record_inputs, min_size=1, max_size=4),
    edits=st.lists(st.tuples(st.integers(0), edge_byte), min_size=1, max_size=3),
)
def test_damaged_batches_are_read_or_rejected_as_the_reference_does(
    inputs: list[RecordInput], edits: list[tuple[int, int]]
) -> None:
    batch = bytearray(encode_batch(inputs))
    for index, byte in edits:
        batch[RECORDS_AT + index % (len(batch) - RECORDS_AT)] = byte
    agree(with_fresh_crc(batch))


@settings(SETTINGS, max_examples=30)
@given(inputs=st.lists(small_record_inputs, min_size=1, max_size=3))
def test_every_single_byte_edit_is_read_or_rejected_as_the_reference_does(
    inputs: list[RecordInput],
) -> None:
    # A sweep rather than a sample: a length made odd (negative) must not pass for a length.
    batch = encode_batch(inputs)
    for index in range(RECORDS_AT, min(len(batch), RECORDS_AT + 80)):
        for byte in EDIT_BYTES:
            damaged = bytearray(batch)
            damaged[index] = byte
            agree(with_fresh_crc(damaged))
