"""Unit tests of the record layer: a batch written by hand from Kafka's published format,
control batches, argument checks, and one test per kind of malformed input.

Malformed batches are built here with struct and a correct CRC, independently of the encoder,
so each test reaches the record parser rather than stopping at the CRC check.
"""

from __future__ import annotations

import struct

import cramjam
import crc32c
import lz4.frame
import pytest
import zstandard

from raftlog.config import LogConfig
from raftlog.errors import ConfigError, CorruptBatchError, CrcMismatchError
from raftlog.storage.batch import Compression, verify_batch
from raftlog.storage.compression import CompressionError, compress, decompress
from raftlog.storage.records import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    CONTROL_LEADER_CHANGE,
    CONTROL_VOTERS,
    Record,
    RecordInput,
    decode_batch,
    decode_control_batch,
    decode_varint,
    encode_batch,
    encode_control_batch,
    encode_unsigned_varint,
    encode_varint,
)

# Kafka's header, field by field (see kafka.apache.org/documentation/#recordbatch):
# baseOffset int64, batchLength int32, partitionLeaderEpoch int32, magic int8, crc uint32,
# attributes int16, lastOffsetDelta int32, baseTimestamp int64, maxTimestamp int64,
# producerId int64, producerEpoch int16, baseSequence int32, records count int32.
HEADER = struct.Struct(">qiibIhiqqqhii")
JUNK_BYTES = 5  # batches under test sit after junk, so a position 0 would be a wrong answer


def handmade_batch(
    section: bytes,
    *,
    record_count: int,
    last_offset_delta: int,
    attributes: int = 0,
    base_offset: int = 0,
    leader_epoch: int = 0,
    first_timestamp: int = 0,
    max_timestamp: int = 0,
    magic: int = 2,
    producer: tuple[int, int, int] = (-1, -1, -1),
) -> bytes:
    """A batch around `section` with a correct length and CRC32C."""
    fields = [
        base_offset,
        HEADER.size + len(section) - 12,
        leader_epoch,
        magic,
        0,
        attributes,
        last_offset_delta,
        first_timestamp,
        max_timestamp,
        *producer,
        record_count,
    ]
    header = bytearray(HEADER.pack(*fields))
    crc = crc32c.crc32c(bytes(header[21:]) + section)
    struct.pack_into(">I", header, 17, crc)
    return bytes(header) + section


# --- the batch written by hand -----------------------------------------------------------

FIRST_TS = 1_600_000_000_000
# Record 0: attributes 0, timestampDelta 0, offsetDelta 0, key "k" (length 1 -> zig-zag 0x02),
# value "hello" (length 5 -> 0x0a), no headers. Body of 12 bytes -> length varint 0x18.
RECORD_0 = b"\x18" + b"\x00" + b"\x00" + b"\x00" + b"\x02k" + b"\x0ahello" + b"\x00"
# Record 1: timestampDelta 5 (0x0a), offsetDelta 1 (0x02), null key (-1 -> 0x01), a value of
# 200 bytes (zig-zag 400 = 0b11_0010000 -> 0x90 0x03, a two-byte varint), two headers:
# ("h", b"v") and ("n", null). Body of 214 bytes -> zig-zag 428 -> 0xac 0x03.
RECORD_1 = (
    b"\xac\x03"
    + b"\x00"
    + b"\x0a"
    + b"\x02"
    + b"\x01"
    + b"\x90\x03"
    + b"x" * 200
    + b"\x04"
    + b"\x02h\x02v"
    + b"\x02n\x01"
)
HANDMADE = handmade_batch(
    RECORD_0 + RECORD_1,
    record_count=2,
    last_offset_delta=1,
    base_offset=7,
    leader_epoch=3,
    first_timestamp=FIRST_TS,
    max_timestamp=FIRST_TS + 5,
)
HANDMADE_INPUTS = [
    RecordInput(b"k", b"hello", FIRST_TS),
    RecordInput(None, b"x" * 200, FIRST_TS + 5, (("h", b"v"), ("n", None))),
]


def test_handmade_lengths_match_the_format_description() -> None:
    assert len(RECORD_0) == 1 + 12
    assert len(RECORD_1) == 2 + 214
    assert len(HANDMADE) == 61 + 13 + 216


def test_decodes_a_batch_written_by_hand() -> None:
    batch = decode_batch(HANDMADE)
    assert batch.header.base_offset == 7
    assert batch.header.partition_leader_epoch == 3
    assert batch.header.record_count == 2
    assert batch.records == (
        Record(7, FIRST_TS, b"k", b"hello", ()),
        Record(8, FIRST_TS + 5, None, b"x" * 200, (("h", b"v"), ("n", None))),
    )


def test_encodes_the_handmade_batch_byte_for_byte() -> None:
    assert encode_batch(HANDMADE_INPUTS, base_offset=7, leader_epoch=3) == HANDMADE


def test_header_fields_follow_the_records() -> None:
    inputs = [
        RecordInput(None, b"a", 1000),
        RecordInput(None, b"b", 990),
        RecordInput(None, b"c", 1005),
    ]
    header = decode_batch(encode_batch(inputs)).header
    assert (header.first_timestamp, header.max_timestamp) == (990, 1005)
    assert (header.record_count, header.last_offset_delta) == (3, 2)
    assert [r.timestamp_ms for r in decode_batch(encode_batch(inputs)).records] == [1000, 990, 1005]


def test_log_append_time_reads_every_record_at_max_timestamp() -> None:
    inputs = [RecordInput(None, b"a", 10), RecordInput(None, b"b", 30)]
    batch = decode_batch(encode_batch(inputs, timestamp_type=1))
    assert batch.header.timestamp_type == 1
    assert [r.timestamp_ms for r in batch.records] == [30, 30]


def test_decodes_at_a_position_inside_a_larger_buffer() -> None:
    buf = b"\xee" * JUNK_BYTES + HANDMADE + b"\xee" * 3
    assert decode_batch(buf, JUNK_BYTES).records == decode_batch(HANDMADE).records


# --- varints ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, b"\x00"),
        (-1, b"\x01"),
        (1, b"\x02"),
        (63, b"\x7e"),
        (-64, b"\x7f"),
        (64, b"\x80\x01"),
        (8191, b"\xfe\x7f"),
        (8192, b"\x80\x80\x01"),
        (2**31 - 1, b"\xfe\xff\xff\xff\x0f"),
        (-(2**31), b"\xff\xff\xff\xff\x0f"),
        (-(2**63), b"\xff" * 9 + b"\x01"),
    ],
)
def test_varint_vectors(value: int, encoded: bytes) -> None:
    assert encode_varint(value) == encoded
    assert decode_varint(encoded) == (value, len(encoded))


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, b"\x00"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (300, b"\xac\x02"),  # protobuf's own example (protobuf.dev, encoding)
        (2**20, b"\x80\x80\x40"),
        (2**64 - 1, b"\xff" * 9 + b"\x01"),
    ],
)
def test_unsigned_varint_vectors(value: int, encoded: bytes) -> None:
    assert encode_unsigned_varint(value) == encoded


def test_varint_rejections_name_the_position() -> None:
    with pytest.raises(CorruptBatchError, match="longer than 10 bytes") as error:
        decode_varint(b"\x00" + b"\xff" * 11, 1)
    assert error.value.position == 1
    with pytest.raises(CorruptBatchError, match="overflows 32 bits"):
        decode_varint(b"\xff\xff\xff\xff\x1f", bytes_max=5)
    with pytest.raises(CorruptBatchError, match="truncated varint") as error:
        decode_varint(b"\x00\x80\x80", 1)
    assert error.value.position == 1


# --- control batches ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "control_type", [CONTROL_ABORT, CONTROL_COMMIT, CONTROL_LEADER_CHANGE, CONTROL_VOTERS]
)
def test_control_batch_round_trip(control_type: int) -> None:
    batch = encode_control_batch(
        control_type, b"payload", timestamp_ms=42, base_offset=9, leader_epoch=4
    )
    assert decode_control_batch(batch) == (control_type, b"payload")
    header = verify_batch(batch)
    assert header.is_control and not header.is_transactional
    assert (header.base_offset, header.partition_leader_epoch, header.record_count) == (9, 4, 1)
    assert decode_batch(batch).records[0].key == struct.pack(">hh", 0, control_type)


def test_control_decode_rejects_a_data_batch() -> None:
    with pytest.raises(CorruptBatchError, match="not a control batch") as error:
        decode_control_batch(b"\xee" * JUNK_BYTES + HANDMADE, JUNK_BYTES)
    assert error.value.position == JUNK_BYTES


def test_control_decode_rejects_a_bad_key() -> None:
    # A control batch (attribute bit 5) whose one record has a 3-byte key.
    section = b"\x14" + b"\x00\x00\x00" + b"\x06abc" + b"\x02v" + b"\x00"
    batch = handmade_batch(section, record_count=1, last_offset_delta=0, attributes=0x20)
    with pytest.raises(CorruptBatchError, match="4-byte key"):
        decode_control_batch(batch)


# --- encoder arguments ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"timestamp_type": 2}, "timestamp_type"),
        ({"producer_epoch": 2**15}, "producer_epoch"),
        ({"base_sequence": 2**31}, "base_sequence"),
        ({"base_offset": -1}, "base_offset"),
        ({"leader_epoch": -2}, "leader_epoch"),
    ],
)
def test_encode_rejects_out_of_range_arguments(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        encode_batch([RecordInput(None, b"v", 0)], **kwargs)  # type: ignore[arg-type]


def test_encode_rejects_an_empty_batch_and_a_timestamp_spread_past_int64() -> None:
    with pytest.raises(ValueError, match="at least one record"):
        encode_batch([])
    spread = [RecordInput(None, None, -(2**62) - 1), RecordInput(None, None, 2**62 + 1)]
    with pytest.raises(ValueError, match="timestamp spread"):
        encode_batch(spread)


def test_config_requires_decompressed_bound_to_hold_a_batch() -> None:
    with pytest.raises(ConfigError, match="decompressed_bytes_max"):
        LogConfig(batch_bytes_max=2048, decompressed_bytes_max=1024).validate()


# --- rejections of the header and CRC ---------------------------------------------------------


def in_junk(batch: bytes) -> bytes:
    return b"\xee" * JUNK_BYTES + batch


def test_rejects_wrong_magic() -> None:
    batch = handmade_batch(RECORD_0, record_count=1, last_offset_delta=0, magic=1)
    with pytest.raises(CorruptBatchError, match="wrong magic 1") as error:
        decode_batch(in_junk(batch), JUNK_BYTES, path="00000.log")
    assert error.value.position == JUNK_BYTES
    assert "in 00000.log at byte 5" in str(error.value)


def test_rejects_negative_and_oversized_lengths() -> None:
    negative = bytearray(HANDMADE)
    struct.pack_into(">i", negative, 8, -1)
    with pytest.raises(CorruptBatchError, match="below the header size") as error:
        decode_batch(in_junk(bytes(negative)), JUNK_BYTES)
    assert error.value.position == JUNK_BYTES
    oversized = bytearray(HANDMADE)
    struct.pack_into(">i", oversized, 8, len(HANDMADE))
    with pytest.raises(CorruptBatchError, match="truncated batch") as error:
        decode_batch(in_junk(bytes(oversized)), JUNK_BYTES)
    assert error.value.position == JUNK_BYTES
    with pytest.raises(CorruptBatchError, match="exceeds batch_bytes_max=100"):
        decode_batch(HANDMADE, batch_bytes_max=100)


def test_rejects_crc_mismatch() -> None:
    damaged = bytearray(in_junk(HANDMADE))
    damaged[-30] ^= 0x01
    with pytest.raises(CrcMismatchError, match="CRC32C mismatch") as error:
        decode_batch(damaged, JUNK_BYTES)
    assert error.value.position == JUNK_BYTES


# --- rejections inside the records, each naming the absolute position ----------------------------

RECORDS_START = JUNK_BYTES + 61


def rejection(
    section: bytes, *, record_count: int = 1, last_offset_delta: int = 0
) -> CorruptBatchError:
    batch = handmade_batch(section, record_count=record_count, last_offset_delta=last_offset_delta)
    with pytest.raises(CorruptBatchError) as error:
        decode_batch(in_junk(batch), JUNK_BYTES)
    assert not isinstance(error.value, CrcMismatchError)
    # bytes are parsed in place, other buffers from a copy: the positions must agree.
    with pytest.raises(CorruptBatchError) as from_copy:
        decode_batch(memoryview(bytearray(in_junk(batch))), JUNK_BYTES)
    assert (from_copy.value.reason, from_copy.value.position) == (
        error.value.reason,
        error.value.position,
    )
    return error.value


@pytest.mark.parametrize(
    ("section", "record_count", "message", "at"),
    [
        # The record's length says 24 bytes but only 8 follow.
        (RECORD_0[:9], 1, "does not fit the 8 bytes left", 0),
        # The second record is cut inside its value.
        (RECORD_0 + RECORD_1[:100], 2, "does not fit the 98 bytes left", 13),
        # The last record has length 0 and its fields run off the end of the records.
        (RECORD_0 + b"\x00", 2, "record 1 runs past the end of the records", 13),
        # A length varint that never ends.
        (b"\xff" * 12, 1, "longer than 5 bytes", 0),
        # A 5-byte length whose last byte carries bits past 32.
        (b"\xff\xff\xff\xff\x7f" + b"\x00" * 7, 1, "overflows 32 bits", 0),
        # A negative record length (-1).
        (b"\x01" + b"\x00" * 7, 1, "record length -1", 0),
        # The header counts two records, the section holds one.
        (RECORD_0 + b"\x00" * 7, 1, "7 trailing bytes", 13),
        (RECORD_0, 2, "cannot fit in 13 bytes", 0),
        # Key length 5 inside a record of 7 bytes.
        (b"\x0e\x00\x00\x00\x0a\x00\x00\x00", 1, "key length 5 runs past", 4),
        # Key length -2.
        (b"\x0e\x00\x00\x00\x03\x01\x00\x00", 1, "key length -2 is negative", 4),
        # Record length says 7 bytes, its fields take 6 (a trailing byte inside the record).
        (b"\x0e\x00\x00\x00\x01\x01\x00\x00", 1, "record length is 7 but its fields take 6", 0),
        # Header key is null.
        (b"\x10\x00\x00\x00\x01\x01\x02\x01\x00", 1, "header key is null", 7),
        # Header key is not UTF-8.
        (b"\x12\x00\x00\x00\x01\x01\x02\x02\xff\x00", 1, "not UTF-8", 8),
        # Header count larger than the bytes left in the record.
        (b"\x0e\x00\x00\x00\x01\x01\x14\x00", 1, "header count 10 does not fit", 6),
        # Offset delta 1 in a batch whose last_offset_delta is 0.
        (b"\x0c\x00\x00\x02\x01\x01\x00", 1, "offset delta 1", 0),
    ],
)
def test_rejects_malformed_records(
    section: bytes, record_count: int, message: str, at: int
) -> None:
    error = rejection(section, record_count=record_count, last_offset_delta=record_count - 1)
    assert message in error.reason
    assert error.position == RECORDS_START + at
    assert f"at byte {RECORDS_START + at}" in str(error)


def test_rejects_record_count_above_the_records_present() -> None:
    section = RECORD_0 + b"\x0e\x00\x00\x02\x01\x02v\x00"
    error = rejection(section, record_count=3, last_offset_delta=2)
    assert "record_count is 3 but the records end after 2" in error.reason
    assert error.position == RECORDS_START + len(section)


def test_rejects_offset_deltas_that_do_not_rise() -> None:
    section = RECORD_0 + RECORD_0
    error = rejection(section, record_count=2, last_offset_delta=1)
    assert "offset delta 0, outside (0, 1]" in error.reason
    assert error.position == RECORDS_START + len(RECORD_0)


def test_accepts_offset_gaps_left_by_compaction() -> None:
    # Records at deltas 0 and 2 of a batch whose last_offset_delta is 3.
    section = RECORD_0 + b"\x0c\x00\x00\x04\x01\x01\x00"
    batch = handmade_batch(section, record_count=2, last_offset_delta=3, base_offset=10)
    assert [r.offset for r in decode_batch(batch).records] == [10, 12]


# --- rejections of compressed sections --------------------------------------------------------


def test_rejects_records_that_expand_past_the_bound() -> None:
    batch = encode_batch([RecordInput(None, b"z" * 10_000, 0)], compression=Compression.LZ4)
    assert len(batch) < 1000
    with pytest.raises(CorruptBatchError, match="decompressed_bytes_max=4096") as error:
        decode_batch(in_junk(batch), JUNK_BYTES, decompressed_bytes_max=4096)
    assert error.value.position == JUNK_BYTES


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.LZ4, Compression.ZSTD])
def test_rejects_damaged_compressed_streams(codec: Compression) -> None:
    stream = compress(codec, RECORD_0 * 50)
    for damaged in (stream[: len(stream) // 2], stream + b"\x00\x01", b"not a stream"):
        batch = handmade_batch(damaged, record_count=1, last_offset_delta=0, attributes=codec)
        with pytest.raises(CorruptBatchError, match=codec.name) as error:
            decode_batch(in_junk(batch), JUNK_BYTES)
        assert error.value.position == JUNK_BYTES


def test_malformed_compressed_records_name_the_decompressed_byte() -> None:
    stream = compress(Compression.ZSTD, RECORD_0 + b"\x01" + b"\x00" * 7)
    batch = handmade_batch(stream, record_count=2, last_offset_delta=1, attributes=Compression.ZSTD)
    with pytest.raises(CorruptBatchError, match="at byte 13 of the ZSTD-decompressed") as error:
        decode_batch(in_junk(batch), JUNK_BYTES)
    assert error.value.position == JUNK_BYTES


def _xerial(blocks: list[bytes]) -> bytes:
    """snappy-java's stream framing, as Kafka's JVM client writes it."""
    framed = [len(b).to_bytes(4, "big") + b for b in blocks]
    return b"\x82SNAPPY\x00" + (1).to_bytes(4, "big") * 2 + b"".join(framed)


def test_decodes_snappy_raw_as_librdkafka_writes_it_and_xerial_framed() -> None:
    section = RECORD_0 + RECORD_1
    raw = bytes(cramjam.snappy.compress_raw(section))
    split = [bytes(cramjam.snappy.compress_raw(part)) for part in (RECORD_0, RECORD_1)]
    for stream in (raw, _xerial([raw]), _xerial(split)):
        batch = handmade_batch(
            stream,
            record_count=2,
            last_offset_delta=1,
            attributes=Compression.SNAPPY,
            base_offset=7,
            first_timestamp=FIRST_TS,
        )
        assert decode_batch(batch).records == decode_batch(HANDMADE).records


@pytest.mark.parametrize(
    ("stream", "message"),
    [
        (b"\x05ab", "SNAPPY stream is damaged"),
        (b"\x82SNAPPY\x00\x00", "xerial header is truncated"),
        (_xerial([b"\x05ab"])[:-1], "empty or truncated"),
        (bytes(cramjam.snappy.compress_raw(b"x" * 5000)), "expand past"),
    ],
)
def test_damaged_or_oversized_snappy_is_refused(stream: bytes, message: str) -> None:
    with pytest.raises(CompressionError, match=message):
        decompress(Compression.SNAPPY, stream, bytes_max=4096)


def test_decodes_streams_written_the_jvm_way() -> None:
    # The JVM client's LZ4 frames record no content size and its zstd stream encoder leaves
    # the frame content size out too; our decoders must not depend on either.
    section = RECORD_0 + RECORD_1
    lz4_stream = lz4.frame.compress(section, store_size=False, block_linked=False)
    zstd_stream = zstandard.ZstdCompressor(write_content_size=False).compress(section)
    assert zstandard.frame_content_size(zstd_stream) == -1
    for codec, stream in ((Compression.LZ4, lz4_stream), (Compression.ZSTD, zstd_stream)):
        batch = handmade_batch(
            stream,
            record_count=2,
            last_offset_delta=1,
            attributes=codec,
            base_offset=7,
            first_timestamp=FIRST_TS,
        )
        assert decode_batch(batch).records == decode_batch(HANDMADE).records


def test_snappy_is_written_xerial_framed_in_blocks_that_cramjam_and_kafka_python_read() -> None:
    """raftlog writes snappy as Kafka's JVM code does: the xerial header, then 32 KiB blocks;
    kafka-python's decoder (what it uses for any snappy batch) reads it back."""
    snappy_codec = pytest.importorskip("kafka.codec")
    section = bytes(range(256)) * 300  # 76,800 bytes: three blocks
    stream = compress(Compression.SNAPPY, section)
    assert stream.startswith(b"\x82SNAPPY\x00" + (1).to_bytes(4, "big") * 2)
    assert decompress(Compression.SNAPPY, stream, bytes_max=len(section)) == section
    assert snappy_codec.snappy_decode(stream) == section
    blocks, position = [], 16
    while position < len(stream):
        length = int.from_bytes(stream[position : position + 4], "big")
        blocks.append(
            bytes(cramjam.snappy.decompress_raw(stream[position + 4 : position + 4 + length]))
        )
        position += 4 + length
    assert [len(b) for b in blocks] == [32768, 32768, 11264] and b"".join(blocks) == section
    assert decompress(Compression.SNAPPY, compress(Compression.SNAPPY, b""), bytes_max=0) == b""
