"""`validate_records`: the leader's produce-path check that a CRC-valid batch's records are
well framed. It must accept exactly what `decode_batch` accepts (a consumer can decode every
batch it lets through, and it refuses nothing a consumer could read), and a refusal names the
record index and the byte of the fault.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
import warnings

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftlog.errors import CorruptBatchError
from raftlog.storage import record_validation as records_module
from raftlog.storage.batch import BatchHeader, Compression, parse_header, verify_batch
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


def flipped_records(
    inputs: list[RecordInput], data: st.DataObject, *, flips_min: int
) -> tuple[BatchHeader, bytes]:
    """The header of `inputs`' batch and its records section with a few bytes flipped."""
    valid = encode_batch(inputs)
    records = bytearray(valid[61:])
    for _ in range(data.draw(st.integers(flips_min, 3))):
        records[data.draw(st.integers(0, len(records) - 1))] ^= data.draw(st.integers(1, 255))
    return parse_header(valid), bytes(records)


@SETTINGS
@given(st.lists(record_inputs, min_size=1, max_size=5), st.data())
def test_mutated_records_are_refused_exactly_when_decoding_fails(
    inputs: list[RecordInput], data: st.DataObject
) -> None:
    """Bytes flipped inside the records, with the CRC fixed up so the walk must find them."""
    header, records = flipped_records(inputs, data, flips_min=1)
    batch = crc_valid_batch(0, header.last_offset_delta, header.record_count, records)
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
    from raftlog.settings import apply_overrides

    assert NodeConfig().log.produce_record_validation == "full"
    relaxed = apply_overrides(NodeConfig(), ["log.produce_record_validation=crc"])
    assert relaxed.log.produce_record_validation == "crc"
    with pytest.raises(ConfigError, match=r"produce_record_validation.*'full' or 'crc'"):
        apply_overrides(NodeConfig(), ["log.produce_record_validation=fast"])


# --- the inline walk against the plain one --------------------------------------------------
# `_walk_records` takes plain records through `_skip_plain_record` and hands every other
# record to `_skip_record`. The reference below is the walk as it was before that fast path:
# `_skip_record` for every record. Both must accept the same records and refuse the same ones
# with the same reason at the same byte.


def _never_plain(data: bytes, start: int, limit: int) -> tuple[int, int]:
    return records_module._NOT_PLAIN


# Every record through `_skip_record`, as the walk was before its inline path.
reference_walk = functools.partial(records_module._walk_records, skip_plain=_never_plain)


def outcome(
    walk: object, data: bytes, header: BatchHeader, *, beyond: bytes = b""
) -> tuple[str, int] | None:
    """How `walk` judges `data` as the records section, with `beyond` after its end (bytes
    the walk must not take as part of a record)."""
    try:
        walk(data + beyond, 0, len(data), header)  # type: ignore[operator]
    except records_module.Malformed as error:
        return error.reason, error.at
    return None


def header_for(record_count: int, last_offset_delta: int) -> BatchHeader:
    """A header saying what the walk is told: the counts need not be ones parse_header would
    let through, since the walk is called here directly."""
    valid = parse_header(encode_batch([RecordInput(None, b"", 0)]))
    return dataclasses.replace(
        valid, record_count=record_count, last_offset_delta=last_offset_delta
    )


def varint_bytes(value: int, padding: int) -> bytes:
    """`value` zig-zag encoded, with `padding` redundant continuation bytes (non-canonical,
    which decoders accept up to the varint's length limit)."""
    encoded = bytearray(encode_varint(value))
    for _ in range(padding):
        encoded[-1] |= 0x80
        encoded.append(0)
    return bytes(encoded)


varints = st.builds(varint_bytes, st.integers(-3, 20_000), st.integers(0, 2) | st.just(0))
fields = st.lists(
    st.one_of(varints, st.binary(min_size=1, max_size=3), st.binary(max_size=40)),
    min_size=1,
    max_size=9,
)


@st.composite
def odd_records(draw: st.DrawFn) -> bytes:
    """A record of fields drawn in roughly the right order, with a length that is right,
    off by a little, or anything."""
    body = b"".join(draw(fields))
    length = draw(st.sampled_from([len(body), len(body) - 1, len(body) + 1, -1, 300]))
    return varint_bytes(length, draw(st.integers(0, 1))) + body


@SETTINGS
@given(st.lists(record_inputs, min_size=1, max_size=6), st.data())
def test_the_inline_walk_agrees_with_the_plain_walk_on_mutated_records(
    inputs: list[RecordInput], data: st.DataObject
) -> None:
    header, records = flipped_records(inputs, data, flips_min=0)
    count = data.draw(st.sampled_from([header.record_count, header.record_count + 1, 1]))
    checked = header_for(count, header.last_offset_delta)
    walked = outcome(records_module._walk_records, records, checked)
    assert walked == outcome(reference_walk, records, checked)


beyond_end = st.sampled_from([b"", b"\x00", b"\x00\x00"]) | st.binary(max_size=3)


@SETTINGS
@given(
    st.lists(odd_records(), min_size=1, max_size=5),
    st.integers(-1, 6),
    st.integers(0, 6),
    beyond_end,
)
def test_the_inline_walk_agrees_with_the_plain_walk_on_odd_encodings(
    records: list[bytes], last_offset_delta: int, count: int, beyond: bytes
) -> None:
    data = b"".join(records)
    checked = header_for(count, last_offset_delta)
    walked = outcome(records_module._walk_records, data, checked, beyond=beyond)
    assert walked == outcome(reference_walk, data, checked, beyond=beyond)


@SETTINGS
@given(st.integers(-1, 6), st.integers(0, 6), st.binary(max_size=160), beyond_end)
def test_the_inline_walk_agrees_with_the_plain_walk_on_garbage(
    last_offset_delta: int, count: int, data: bytes, beyond: bytes
) -> None:
    checked = header_for(count, last_offset_delta)
    walked = outcome(records_module._walk_records, data, checked, beyond=beyond)
    assert walked == outcome(reference_walk, data, checked, beyond=beyond)


def test_a_record_one_byte_short_of_its_fields_is_refused_even_with_bytes_after_the_end() -> None:
    """The records section ends inside the last record's header count; the byte after the
    end would complete it, but it is not the record's to take."""
    plain = encode_batch([RecordInput(None, b"v", 0)])[61:]
    checked = parse_header(encode_batch([RecordInput(None, b"v", 0)]))
    cut = plain[:-1]
    walked = outcome(records_module._walk_records, cut, checked, beyond=b"\x00")
    assert walked is not None and walked == outcome(reference_walk, cut, checked, beyond=b"\x00")
    assert "record 0" in walked[0]


def test_plain_records_are_walked_and_others_still_refused_by_name() -> None:
    """The inline path accepts what producers send (keys, 1 KiB values, two-byte lengths)
    and refuses nothing itself: a negative key length still gets `_skip_record`'s words."""
    plain = encode_batch([RecordInput(b"key", b"v" * 1024, 5)] * 4)
    header = parse_header(plain)
    assert outcome(records_module._walk_records, plain[61:], header) is None
    bad = bytearray(plain[61:])
    bad[5] = encode_varint(-2)[0]  # record 0's key length (length is two bytes here)
    reason, at = outcome(records_module._walk_records, bytes(bad), header) or ("", -1)
    assert reason == "record 0: key length -2 is negative" and at == 5
    # A null key or value (length -1, one byte 0x01) turned into -2 (0x03), all else intact:
    # only the length's sign is wrong, and the walk must not take it for a null.
    for field, batch, at in (
        # length (1 byte), attributes, timestampDelta, offsetDelta, then the key
        ("key", encode_batch([RecordInput(None, b"v" * 10, 0)]), 4),
        ("value", encode_batch([RecordInput(b"k" * 10, None, 0)]), 4 + 1 + 10),
    ):
        nulled = bytearray(batch[61:])
        assert nulled[at] == 0x01, (field, nulled)
        nulled[at] = 0x03
        refused = outcome(records_module._walk_records, bytes(nulled), parse_header(batch))
        assert refused == (f"record 0: {field} length -2 is negative", at)


def test_signs_are_read_in_plain_records() -> None:
    """Zig-zag signs in fields the inline walk reads: a negative offset delta, and a key
    length that is negative in two bytes (its low bit set), each in an otherwise plain
    record, are refused as `_skip_record` refuses them."""
    header = parse_header(encode_batch([RecordInput(None, b"v", 0)]))
    # length, attributes, timestampDelta, offsetDelta -1, null key, value "v", no headers
    body = b"\x00\x00" + encode_varint(-1) + b"\x01" + encode_varint(1) + b"v\x00"
    record = encode_varint(len(body)) + body
    assert outcome(records_module._walk_records, record, header) == outcome(
        reference_walk, record, header
    )
    assert outcome(records_module._walk_records, record, header) == (
        "record 0 has offset delta -1, outside (-1, 0]",
        0,
    )
    minus_100 = encode_varint(-100)  # zig-zag 199: two bytes, low bit set
    assert len(minus_100) == 2
    # 99 bytes follow it: the record lines up if the sign bit is ignored (length 199 >> 1).
    for field, fields in (
        ("key", minus_100 + b"x" * 99 + b"\x01"),
        ("value", b"\x01" + minus_100 + b"x" * 99),
    ):
        body = b"\x00\x00\x00" + fields + b"\x00"
        record = encode_varint(len(body)) + body
        refused = outcome(records_module._walk_records, record, header)
        assert refused == outcome(reference_walk, record, header)
        assert refused is not None and f"{field} length -100 is negative" in refused[0]
