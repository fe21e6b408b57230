"""Cross-checks of the record layer against an independent implementation: kafka-python's
`kafka.record` (DefaultRecordBatch reads, DefaultRecordBatchBuilder writes).

Both directions: kafka-python reads every batch we write with the same records and a valid
CRC, and every batch kafka-python writes decodes with ours and re-encodes to the same bytes.

Two differences in how the builders choose bytes, so the byte-for-byte checks feed inputs on
which they agree: kafka-python's first_timestamp is the *first* record's timestamp (ours is the
smallest, so timestamps are fed in rising order), and kafka-python silently stores a batch
uncompressed when compression does not shrink it (we re-encode with the codec its header
names). Its gzip stamps the current time into the stream, so gzip is compared by records only.
kafka-python checks the CRC only when asked: `DefaultRecordBatch.validate_crc()`, which must be
called before iterating.
"""

from __future__ import annotations

import operator
import warnings

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

with warnings.catch_warnings():
    # Importing any kafka module runs kafka/__init__, whose admin client calls the deprecated
    # importlib.resources.read_text at import time: a third-party warning, raised once here.
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import (
        ControlRecord,
        DefaultRecordBatch,
        DefaultRecordBatchBuilder,
    )
    from kafka.record.memory_records import MemoryRecords
    from kafka.record.util import decode_varint as kafka_decode_varint
    from kafka.record.util import encode_varint as kafka_encode_varint

from raftlog.errors import CrcMismatchError
from raftlog.storage.batch import Compression
from raftlog.storage.records import (
    CONTROL_COMMIT,
    CONTROL_LEADER_CHANGE,
    RecordInput,
    decode_batch,
    decode_varint,
    encode_batch,
    encode_control_batch,
    encode_varint,
)

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
INT64 = (-(2**63), 2**63 - 1)

# Repeated units compress well, so most lz4 and zstd batches stay compressed under
# kafka-python too; arbitrary binary is mixed in for the codecs' other branches.
repetitive = st.builds(operator.mul, st.binary(min_size=1, max_size=8), st.integers(0, 100))
nullable_bytes = st.none() | st.binary(max_size=120) | repetitive | repetitive
headers = st.lists(st.tuples(st.text(max_size=10), nullable_bytes), max_size=3).map(tuple)
record_inputs = st.builds(
    RecordInput, nullable_bytes, nullable_bytes, st.integers(0, 2**50), headers
)
batches_of_inputs = st.lists(record_inputs, min_size=1, max_size=10)


def kafka_build(
    inputs: list[RecordInput],
    codec: Compression,
    *,
    producer: tuple[int, int, int] = (-1, -1, -1),
) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=int(codec),
        is_transactional=False,
        producer_id=producer[0],
        producer_epoch=producer[1],
        base_sequence=producer[2],
        batch_size=1 << 30,
    )
    for offset, record in enumerate(inputs):
        metadata = builder.append(
            offset, record.timestamp_ms, record.key, record.value, list(record.headers)
        )
        assert metadata is not None
    return bytes(builder.build())


def kafka_read(batch: bytes) -> list[tuple[int, int, bytes | None, bytes | None, list[object]]]:
    parsed = DefaultRecordBatch(batch)
    assert parsed.validate_crc()
    return [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in parsed]


def expected(inputs: list[RecordInput], base_offset: int) -> list[object]:
    return [
        (base_offset + i, r.timestamp_ms, r.key, r.value, list(r.headers))
        for i, r in enumerate(inputs)
    ]


# --- ours -> kafka-python -----------------------------------------------------------------------


@SETTINGS
@given(
    inputs=batches_of_inputs,
    codec=st.sampled_from([Compression.NONE, Compression.LZ4, Compression.GZIP, Compression.ZSTD]),
    base_offset=st.integers(0, 2**40),
    leader_epoch=st.integers(0, 2**31 - 1),
)
def test_kafka_python_reads_our_batches(
    inputs: list[RecordInput], codec: Compression, base_offset: int, leader_epoch: int
) -> None:
    batch = encode_batch(
        inputs, compression=codec, base_offset=base_offset, leader_epoch=leader_epoch
    )
    parsed = DefaultRecordBatch(batch)
    assert (parsed.base_offset, parsed.leader_epoch) == (base_offset, leader_epoch)
    assert (parsed.compression_type, parsed.records_count) == (int(codec), len(inputs))
    assert parsed.last_offset_delta == len(inputs) - 1
    assert parsed.max_timestamp == max(r.timestamp_ms for r in inputs)
    assert kafka_read(batch) == expected(inputs, base_offset)


def test_kafka_python_iterates_a_log_of_our_batches() -> None:
    first = [RecordInput(b"k%d" % i, b"plain %d" % i, 1000 + i) for i in range(5)]
    second = [RecordInput(None, b"lz4 " * 100, 2000 + i, (("h", b"v"),)) for i in range(5)]
    log = encode_batch(first, base_offset=0) + encode_batch(
        second, base_offset=5, compression=Compression.LZ4
    )
    batches = list(MemoryRecords(log))
    assert [b.compression_type for b in batches] == [0, int(Compression.LZ4)]
    values = [r.value for batch in batches for r in batch]
    assert values == [r.value for r in first + second]


def test_kafka_python_reads_our_control_batches() -> None:
    for control_type in (CONTROL_COMMIT, CONTROL_LEADER_CHANGE):
        batch = encode_control_batch(
            control_type, b"\x00\x00\x00\x00\x00\x07", timestamp_ms=5, base_offset=3
        )
        parsed = DefaultRecordBatch(batch)
        assert parsed.validate_crc() and parsed.is_control_batch
        (record,) = list(parsed)
        assert isinstance(record, ControlRecord)
        assert (record.version, record.type, record.offset) == (0, control_type, 3)
        assert record.value == b"\x00\x00\x00\x00\x00\x07"


def test_both_crc_checks_reject_the_same_damage() -> None:
    batch = bytearray(encode_batch([RecordInput(b"k", b"value", 1)]))
    batch[-3] ^= 0x40
    assert not DefaultRecordBatch(bytes(batch)).validate_crc()
    try:
        decode_batch(batch)
    except CrcMismatchError as error:
        assert error.position == 0
    else:
        raise AssertionError("a batch with a damaged value decoded")


# --- kafka-python -> ours -----------------------------------------------------------------------


@SETTINGS
@given(
    inputs=batches_of_inputs,
    codec=st.sampled_from([Compression.NONE, Compression.LZ4, Compression.ZSTD]),
    producer=st.sampled_from([(-1, -1, -1), (42, 1, 7)]),
)
def test_kafka_python_batches_decode_and_re_encode_byte_for_byte(
    inputs: list[RecordInput], codec: Compression, producer: tuple[int, int, int]
) -> None:
    rising = sorted(inputs, key=lambda record: record.timestamp_ms)
    built = kafka_build(rising, codec, producer=producer)
    decoded = decode_batch(built)
    assert [r.as_input() for r in decoded.records] == rising
    header = decoded.header
    event(f"kafka-python stored {codec.name} as {header.compression.name}")
    re_encoded = encode_batch(
        rising,
        compression=header.compression,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
    )
    assert re_encoded == built


@SETTINGS
@given(inputs=batches_of_inputs)
def test_kafka_python_gzip_batches_decode(inputs: list[RecordInput]) -> None:
    built = kafka_build(inputs, Compression.GZIP)
    assert [r.as_input() for r in decode_batch(built).records] == inputs


def test_kafka_python_lz4_batch_byte_for_byte() -> None:
    # A fixed batch that lz4 certainly shrinks, so kafka-python keeps it compressed.
    inputs = [
        RecordInput(b"key-%d" % i, b"payload " * 64, 1_700_000_000_000 + i, (("trace", b"x"),))
        for i in range(20)
    ]
    built = kafka_build(inputs, Compression.LZ4)
    decoded = decode_batch(built)
    assert decoded.header.compression is Compression.LZ4
    assert [r.as_input() for r in decoded.records] == inputs
    assert encode_batch(inputs, compression=Compression.LZ4) == built


@SETTINGS
@given(st.integers(*INT64))
def test_varints_match_kafka_python(value: int) -> None:
    theirs = bytearray()
    kafka_encode_varint(value, theirs.append)
    assert encode_varint(value) == bytes(theirs)
    assert decode_varint(bytes(theirs)) == kafka_decode_varint(theirs, 0)


def test_a_batch_of_many_chunks_matches_kafka_python_byte_for_byte() -> None:
    # The encoder joins about 32 KiB of records at a time and reads the varints of 0..8191
    # from a table: this batch spans many chunks, and its lengths, offset deltas and
    # timestamp deltas fall on both sides of 63/64 (one or two bytes) and of 8191/8192.
    sizes = [0, 63, 64, 8191, 8192, 8193, 20_000]
    inputs = []
    for index in range(9000):
        size = sizes[index // 50 % len(sizes)] if index % 50 == 0 else index % 130
        key = None if index % 3 == 0 else b"k" * (index % 70)
        value = None if index % 7 == 0 else bytes([index % 256]) * size
        headers = (("h", b"v"),) if index % 11 == 0 else ()
        inputs.append(RecordInput(key, value, 1_700_000_000_000 + 2 * index, headers))
    ours = encode_batch(inputs, producer_id=7, producer_epoch=1, base_sequence=0)
    assert ours == kafka_build(inputs, Compression.NONE, producer=(7, 1, 0))
    assert len(ours) > 8 * 32 * 1024
