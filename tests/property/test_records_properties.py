"""Properties of the record layer: every batch we encode decodes to what went in, under every
codec we write; and no damage to a batch's records makes the decoder fail with anything but a
`CorruptBatchError` (it never crashes, hangs or returns records from a batch it rejects).
"""

from __future__ import annotations

import struct

import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftlog.errors import CorruptBatchError
from raftlog.storage.batch import Compression, iter_batches, verify_batch
from raftlog.storage.records import (
    RecordInput,
    decode_batch,
    decode_control_batch,
    decode_varint,
    encode_batch,
    encode_control_batch,
    encode_varint,
)

CODECS = [Compression.NONE, Compression.GZIP, Compression.LZ4, Compression.ZSTD]
INT64 = (-(2**63), 2**63 - 1)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

nullable_bytes = st.none() | st.binary(max_size=300)
headers = st.lists(st.tuples(st.text(max_size=12), nullable_bytes), max_size=4).map(tuple)
# A spread of at most 2**62 keeps every timestamp delta inside int64.
timestamps_ms = st.integers(-(2**61), 2**61)
record_inputs = st.builds(RecordInput, nullable_bytes, nullable_bytes, timestamps_ms, headers)
batches_of_inputs = st.lists(record_inputs, min_size=1, max_size=12)


@SETTINGS
@given(st.integers(*INT64))
def test_varint_round_trip(value: int) -> None:
    encoded = encode_varint(value)
    assert decode_varint(encoded) == (value, len(encoded))
    assert 1 <= len(encoded) <= 10


@SETTINGS
@given(
    inputs=batches_of_inputs,
    codec=st.sampled_from(CODECS),
    base_offset=st.integers(0, 2**62),
    leader_epoch=st.integers(-1, 2**31 - 1),
    producer=st.tuples(
        st.integers(*INT64), st.integers(-(2**15), 2**15 - 1), st.integers(-1, 2**31 - 1)
    ),
    is_transactional=st.booleans(),
)
def test_round_trip(
    inputs: list[RecordInput],
    codec: Compression,
    base_offset: int,
    leader_epoch: int,
    producer: tuple[int, int, int],
    is_transactional: bool,
) -> None:
    batch = encode_batch(
        inputs,
        base_offset=base_offset,
        leader_epoch=leader_epoch,
        compression=codec,
        producer_id=producer[0],
        producer_epoch=producer[1],
        base_sequence=producer[2],
        is_transactional=is_transactional,
    )
    decoded = decode_batch(batch)
    assert [record.as_input() for record in decoded.records] == inputs
    assert [record.offset for record in decoded.records] == [
        base_offset + i for i in range(len(inputs))
    ]
    header = decoded.header
    assert header == verify_batch(batch)
    assert header.size_bytes == len(batch)
    assert (header.base_offset, header.partition_leader_epoch) == (base_offset, leader_epoch)
    assert (header.compression, header.is_transactional) == (codec, is_transactional)
    assert not header.is_control
    assert (header.record_count, header.last_offset_delta) == (len(inputs), len(inputs) - 1)
    assert header.first_timestamp == min(record.timestamp_ms for record in inputs)
    assert header.max_timestamp == max(record.timestamp_ms for record in inputs)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == producer


@SETTINGS
@given(inputs=batches_of_inputs, codec=st.sampled_from(CODECS))
def test_log_append_time_round_trip(inputs: list[RecordInput], codec: Compression) -> None:
    decoded = decode_batch(encode_batch(inputs, compression=codec, timestamp_type=1))
    max_timestamp_ms = max(record.timestamp_ms for record in inputs)
    assert [record.timestamp_ms for record in decoded.records] == [max_timestamp_ms] * len(inputs)
    assert [(r.key, r.value, r.headers) for r in decoded.records] == [
        (r.key, r.value, r.headers) for r in inputs
    ]


@SETTINGS
@given(
    control_type=st.integers(-(2**15), 2**15 - 1),
    value=st.binary(max_size=200),
    timestamp_ms=st.integers(*INT64),
    base_offset=st.integers(0, 2**62),
)
def test_control_round_trip(
    control_type: int, value: bytes, timestamp_ms: int, base_offset: int
) -> None:
    batch = encode_control_batch(
        control_type, value, timestamp_ms=timestamp_ms, base_offset=base_offset
    )
    assert decode_control_batch(batch) == (control_type, value)
    header = verify_batch(batch)
    assert header.is_control and header.first_timestamp == header.max_timestamp == timestamp_ms


@SETTINGS
@given(st.lists(st.tuples(batches_of_inputs, st.sampled_from(CODECS)), min_size=1, max_size=4))
def test_concatenated_batches_decode_in_place(
    batches: list[tuple[list[RecordInput], Compression]],
) -> None:
    log = b"".join(encode_batch(inputs, compression=codec) for inputs, codec in batches)
    decoded = [decode_batch(log, position) for position, _ in iter_batches(log)]
    assert [[r.as_input() for r in batch.records] for batch in decoded] == [
        inputs for inputs, _ in batches
    ]


# --- damage -------------------------------------------------------------------------------

# Bytes that read as small lengths, -1 and varint continuations find the parser's edges far
# more often than uniform bytes do.
VARINT_EDGE_BYTES = [0, 1, 2, 3, 4, 0x0C, 0x7F, 0x80, 0xFF]
damage_bytes = st.sampled_from(VARINT_EDGE_BYTES) | st.integers(0, 255)


def with_fresh_crc(batch: bytearray) -> bytes:
    """Recompute length and CRC so that damage reaches the record parser."""
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return bytes(batch)


def decodes_or_rejects(batch: bytes) -> None:
    try:
        decode_batch(batch)
    except CorruptBatchError as error:
        assert error.position is not None
        assert 0 <= error.position <= len(batch)


@SETTINGS
@given(
    inputs=batches_of_inputs,
    codec=st.sampled_from(CODECS),
    damage=st.lists(st.tuples(st.integers(0), damage_bytes), min_size=1, max_size=4),
)
def test_damaged_records_are_decoded_or_rejected(
    inputs: list[RecordInput], codec: Compression, damage: list[tuple[int, int]]
) -> None:
    batch = bytearray(encode_batch(inputs, compression=codec))
    for index, byte in damage:
        batch[61 + index % (len(batch) - 61)] = byte
    decodes_or_rejects(with_fresh_crc(batch))


@SETTINGS
@given(inputs=batches_of_inputs, codec=st.sampled_from(CODECS), cut=st.integers(1))
def test_truncated_records_are_rejected(
    inputs: list[RecordInput], codec: Compression, cut: int
) -> None:
    batch = bytearray(encode_batch(inputs, compression=codec))
    kept = 61 + cut % (len(batch) - 61)
    truncated = with_fresh_crc(batch[:kept])
    try:
        decode_batch(truncated)
    except CorruptBatchError:
        return
    raise AssertionError(f"a batch cut to {kept} of {len(batch)} bytes decoded")


varint_heavy_bytes = st.lists(st.sampled_from(VARINT_EDGE_BYTES), max_size=60)


@SETTINGS
@given(
    section=st.binary(max_size=200) | varint_heavy_bytes.map(bytes),
    record_count=st.integers(0, 40),
    last_offset_delta=st.integers(0, 40),
    codec=st.sampled_from(CODECS),
)
def test_arbitrary_sections_are_decoded_or_rejected(
    section: bytes, record_count: int, last_offset_delta: int, codec: Compression
) -> None:
    header = struct.pack(
        ">qiibIhiqqqhii",
        0,
        0,
        0,
        2,
        0,
        int(codec),
        last_offset_delta,
        0,
        0,
        -1,
        -1,
        -1,
        record_count,
    )
    decodes_or_rejects(with_fresh_crc(bytearray(header + section)))


small_inputs = st.lists(
    st.builds(
        RecordInput,
        st.none() | st.binary(max_size=6),
        st.none() | st.binary(max_size=6),
        st.integers(0, 300),
        st.lists(st.tuples(st.text(max_size=3), st.none() | st.binary(max_size=3)), max_size=2).map(
            tuple
        ),
    ),
    min_size=1,
    max_size=4,
)


@settings(SETTINGS, max_examples=40)
@given(inputs=small_inputs)
def test_every_single_byte_edit_is_decoded_or_rejected(inputs: list[RecordInput]) -> None:
    # A sweep rather than a sample: every byte of the records, set to every edge value.
    batch = encode_batch(inputs)
    for index in range(61, len(batch)):
        for byte in VARINT_EDGE_BYTES:
            damaged = bytearray(batch)
            damaged[index] = byte
            decodes_or_rejects(with_fresh_crc(damaged))
