"""Fuzzing the record batch decoder: any bytes either decode or raise CorruptBatchError.

Three sources of input: raw random bytes; valid batches with bytes flipped, cut or appended;
and valid batches whose length field lies. A decode that succeeds on a mutated batch must
return exactly the original records (the CRC covers everything but the base offset and
leader epoch, which the log rewrites on append and which change no record).
"""

from __future__ import annotations

import struct

import crc32c
from hypothesis import given
from hypothesis import strategies as st

from raftlog.errors import CorruptBatchError
from raftlog.storage.batch import iter_batches
from raftlog.storage.compression import Compression
from raftlog.storage.records import RecordInput, decode_batch, encode_batch
from tests.fuzz.budget import fuzz_settings

BATCH_BYTES_MAX = 1 << 20
DECOMPRESSED_BYTES_MAX = 1 << 20

records = st.lists(
    st.builds(
        RecordInput,
        key=st.none() | st.binary(max_size=16),
        value=st.none() | st.binary(max_size=64),
        timestamp_ms=st.integers(0, 2**41),
        headers=st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)),
                         max_size=2).map(tuple),
    ),
    min_size=1,
    max_size=5,
)  # fmt: skip
codecs = st.sampled_from([Compression.NONE, Compression.GZIP, Compression.LZ4, Compression.ZSTD])


def decode_or_refuse(data: bytes) -> object:
    try:
        return decode_batch(
            data, batch_bytes_max=BATCH_BYTES_MAX, decompressed_bytes_max=DECOMPRESSED_BYTES_MAX
        )
    except CorruptBatchError as error:
        assert str(error)  # a refusal always says what was wrong
        return None


@fuzz_settings(300)
@given(st.binary(max_size=512))
def test_random_bytes_never_crash_the_decoder(data: bytes) -> None:
    decode_or_refuse(data)
    try:
        for position, header in iter_batches(data, batch_bytes_max=BATCH_BYTES_MAX):
            assert 0 <= position < len(data) and header.record_count >= 0
    except CorruptBatchError:
        pass


@fuzz_settings(150)
@given(records, codecs, st.data())
def test_mutated_batches_decode_to_the_original_or_are_refused(
    inputs: list[RecordInput], codec: Compression, data: st.DataObject
) -> None:
    batch = bytearray(encode_batch(inputs, compression=codec))
    original = decode_batch(bytes(batch)).records
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(batch) - 1))
        batch[position] ^= data.draw(st.integers(1, 255))
    decoded = decode_or_refuse(bytes(batch))
    if decoded is not None:
        got = decoded.records  # type: ignore[attr-defined]
        assert [(r.key, r.value, r.headers) for r in got] == [
            (r.key, r.value, r.headers) for r in original
        ]


@fuzz_settings(100)
@given(records, codecs, st.integers(0, 400), st.binary(max_size=64))
def test_cut_or_extended_batches_are_refused_or_exact(
    inputs: list[RecordInput], codec: Compression, cut: int, tail: bytes
) -> None:
    batch = encode_batch(inputs, compression=codec)
    shortened = batch[: max(0, len(batch) - 1 - cut)]
    assert decode_or_refuse(shortened) is None  # a torn batch is never served
    extended = decode_or_refuse(batch + tail)  # bytes after a batch belong to the next one
    assert extended is not None


@fuzz_settings(300)
@given(st.sampled_from([0, 1, 2, 3, 4]), st.integers(-1, 6), st.binary(max_size=200))
def test_records_behind_a_valid_crc_decode_or_are_refused(
    codec: int, record_count: int, records: bytes
) -> None:
    """The CRC is made right, so the fuzz reaches the records decoder and decompressors."""
    body = struct.pack(">hiqqqhii", codec, max(record_count - 1, 0), 0, 0, -1, -1, -1, record_count)
    body += records
    header = struct.pack(">qiibI", 0, len(body) + 9, 0, 2, crc32c.crc32c(body))
    decoded = decode_or_refuse(header + body)
    if decoded is not None:
        assert len(decoded.records) == record_count  # type: ignore[attr-defined]
