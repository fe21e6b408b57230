"""A batch recompressed for a topic's compression.type: the same records and header fields
(producer id, epoch, sequence, timestamps, offsets), a valid CRC, in the codec asked; a
control batch and a batch already in the codec are left as they are."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.storage.batch import Compression, parse_header, verify_batch
from raftlog.storage.compression import CompressionError
from raftlog.storage.recompression import recompress_batch
from raftlog.storage.record_decoder import decode_batch
from raftlog.storage.records import RecordInput, encode_batch, encode_txn_marker

WRITABLE = list(Compression)
BOUND = 1 << 20


def _records(batch: bytes) -> list[tuple[int, bytes | None, bytes | None, int]]:
    return [(r.offset, r.key, r.value, r.timestamp_ms) for r in decode_batch(batch).records]


@settings(max_examples=60, deadline=None)
@given(
    source=st.sampled_from(WRITABLE),
    target=st.sampled_from(WRITABLE),
    values=st.lists(st.binary(max_size=300), min_size=1, max_size=20),
    transactional=st.booleans(),
)
def test_recompression_keeps_every_record_and_field(
    source: Compression, target: Compression, values: list[bytes], transactional: bool
) -> None:
    batch = encode_batch(
        [RecordInput(str(i).encode(), v, 1_000 + i) for i, v in enumerate(values)],
        base_offset=7,
        leader_epoch=3,
        compression=source,
        producer_id=42,
        producer_epoch=5,
        base_sequence=100,
        is_transactional=transactional,
    )
    header = parse_header(batch)
    rewritten = recompress_batch(batch, header, target, decompressed_bytes_max=BOUND)
    after = verify_batch(rewritten, batch_bytes_max=BOUND)  # the CRC holds
    assert after.compression is target
    assert _records(rewritten) == _records(batch)
    same = [
        "base_offset",
        "last_offset_delta",
        "first_timestamp",
        "max_timestamp",
        "producer_id",
        "producer_epoch",
        "base_sequence",
        "record_count",
        "partition_leader_epoch",
        "is_transactional",
    ]
    assert {f: getattr(after, f) for f in same} == {f: getattr(header, f) for f in same}
    if target is source:
        assert rewritten is batch


def test_control_batches_stay_as_written() -> None:
    marker = encode_txn_marker(
        commit=True, producer_id=9, producer_epoch=1, coordinator_epoch=0, timestamp_ms=5
    )
    header = parse_header(marker)
    assert recompress_batch(marker, header, Compression.ZSTD, decompressed_bytes_max=BOUND) is (
        marker
    )


def test_a_section_past_the_bound_is_refused_not_inflated() -> None:
    batch = encode_batch([RecordInput(None, b"x" * 50_000, 0)], compression=Compression.ZSTD)
    header = parse_header(batch)
    with pytest.raises(CompressionError):
        recompress_batch(batch, header, Compression.NONE, decompressed_bytes_max=1_000)
