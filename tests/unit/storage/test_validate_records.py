"""`validate_records`: the leader's produce-path check that a CRC-valid batch's records are
well framed. It must accept exactly what `decode_batch` accepts (a consumer can decode every
batch it lets through, and it refuses nothing a consumer could read), and a refusal names the
record index and the byte of the fault.
"""

from __future__ import annotations

import struct
import warnings

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftlog.errors import CorruptBatchError
from raftlog.storage.batch import Compression, parse_header, verify_batch
from raftlog.storage.records import (
    RecordInput,
    decode_batch,
    encode_batch,
    encode_varint,
    validate_records,
)

with warnings.catch_warnings():
    # kafka/__init__ calls a deprecated importlib.resources function at import time.
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatchBuilder

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CODECS = [Compression.NONE, Compression.GZIP, Compression.LZ4, Compression.ZSTD]

header_items = st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=16))
record_inputs = st.builds(
    RecordInput,
    key=st.none() | st.binary(max_size=32),
    value=st.none() | st.binary(max_size=300),
    timestamp_ms=st.integers(0, 2**45),
    headers=st.lists(header_items, max_size=3).map(tuple),
)


def validate(batch: bytes) -> None:
    validate_records(batch, verify_batch(batch))


def crc_valid_batch(codec: int, last_offset_delta: int, record_count: int, records: bytes) -> bytes:
    """A v2 batch whose header and CRC32C are right around an arbitrary records section."""
    body = struct.pack(">hiqqqhii", codec, last_offset_delta, 0, 0, -1, -1, -1, record_count)
    body += records
    return struct.pack(">qiibI", 0, len(body) + 9, 0, 2, crc32c.crc32c(body)) + body


def kafka_python_batch(inputs: list[RecordInput], codec: Compression) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=int(codec),
        is_transactional=False,
        producer_id=7,
        producer_epoch=0,
        base_sequence=0,
        batch_size=1 << 30,
    )
    for offset, record in enumerate(inputs):
        builder.append(offset, record.timestamp_ms, record.key, record.value, list(record.headers))
    return bytes(builder.build())


@SETTINGS
@given(st.lists(record_inputs, min_size=1, max_size=8), st.sampled_from(CODECS))
def test_batches_from_our_encoder_are_accepted(
    inputs: list[RecordInput], codec: Compression
) -> None:
    validate(encode_batch(inputs, compression=codec))


@SETTINGS
@given(st.lists(record_inputs, min_size=1, max_size=8), st.sampled_from(CODECS))
def test_batches_from_kafka_python_are_accepted(
    inputs: list[RecordInput], codec: Compression
) -> None:
    validate(kafka_python_batch(inputs, codec))


def verdict(action: object, batch: bytes) -> str | None:
    try:
        action(batch)  # type: ignore[operator]
    except CorruptBatchError as error:
        return error.reason
    return None


@SETTINGS
@given(
    st.sampled_from([0, 1, 3, 4]),
    st.integers(-1, 6),
    st.integers(-1, 6),
    st.binary(max_size=120),
)
def test_garbage_behind_a_valid_crc_is_refused_exactly_when_decoding_fails(
    codec: int, last_offset_delta: int, record_count: int, records: bytes
) -> None:
    batch = crc_valid_batch(codec, last_offset_delta, record_count, records)
    try:
        header = verify_batch(batch)
    except CorruptBatchError:
        return  # refused before the records (a header fault): the produce path stops there
    decoded = verdict(decode_batch, batch)
    validated = verdict(lambda b: validate_records(b, header), batch)
    assert (decoded is None) == (validated is None), (decoded, validated)


@SETTINGS
@given(st.lists(record_inputs, min_size=1, max_size=5), st.data())
def test_mutated_records_are_refused_exactly_when_decoding_fails(
    inputs: list[RecordInput], data: st.DataObject
) -> None:
    """Bytes flipped inside the records, with the CRC fixed up so the walk must find them."""
    valid = encode_batch(inputs)
    header = parse_header(valid)
    records = bytearray(valid[61:])
    for _ in range(data.draw(st.integers(1, 3))):
        records[data.draw(st.integers(0, len(records) - 1))] ^= data.draw(st.integers(1, 255))
    batch = crc_valid_batch(0, header.last_offset_delta, header.record_count, bytes(records))
    decoded = verdict(decode_batch, batch)
    validated = verdict(validate, batch)
    assert (decoded is None) == (validated is None), (decoded, validated)


def test_a_refusal_names_the_record_index_and_the_byte() -> None:
    good = encode_batch([RecordInput(b"k", b"v" * 10, 0)] * 3)
    header = parse_header(good)
    records = bytearray(good[61:])
    record_bytes = len(records) // 3
    # Record 2's key length claims 100 bytes: it runs past the end of its record.
    key_length_at = record_bytes * 2 + 4  # length, attributes, timestampDelta, offsetDelta
    records[key_length_at : key_length_at + 1] = encode_varint(100)[:1]
    batch = crc_valid_batch(0, header.last_offset_delta, 3, bytes(records))
    with pytest.raises(CorruptBatchError) as caught:
        validate(batch)
    assert caught.value.position == 61 + key_length_at
    assert "record 2" in str(caught.value) and "key length" in str(caught.value)
    assert f"at byte {61 + key_length_at}" in str(caught.value)


def test_a_compressed_refusal_names_the_byte_in_the_decompressed_records() -> None:
    from raftlog.storage.compression import compress

    records = b"\x00" * 20  # twenty records of length 0: too short for their fields
    batch = crc_valid_batch(3, 0, 1, compress(Compression.LZ4, records))
    with pytest.raises(CorruptBatchError) as caught:
        validate(batch)
    assert caught.value.position == 0
    assert "record 0" in str(caught.value) and "LZ4-decompressed" in str(caught.value)


def test_a_decompression_bomb_is_refused_within_its_bound() -> None:
    batch = encode_batch([RecordInput(None, b"\x00" * 100_000, 0)], compression=Compression.LZ4)
    validate_records(batch, verify_batch(batch), decompressed_bytes_max=200_000)
    with pytest.raises(CorruptBatchError, match="decompressed_bytes_max=50000"):
        validate_records(batch, verify_batch(batch), decompressed_bytes_max=50_000)


def test_the_node_setting_takes_full_or_crc_and_nothing_else() -> None:
    from raftlog.config import NodeConfig
    from raftlog.errors import ConfigError
    from raftlog.runtime.settings import apply_overrides

    assert NodeConfig().log.produce_record_validation == "full"
    relaxed = apply_overrides(NodeConfig(), ["log.produce_record_validation=crc"])
    assert relaxed.log.produce_record_validation == "crc"
    with pytest.raises(ConfigError, match=r"produce_record_validation.*'full' or 'crc'"):
        apply_overrides(NodeConfig(), ["log.produce_record_validation=fast"])
