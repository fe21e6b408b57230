"""A record batch with a new records section: the cleaner's rewrite of a batch with fewer
records, and the leader's recompression for a topic's `compression.type` (Kafka's).

Every header field but the length, the record count, the attributes' codec bits and the CRC
stays as the producer wrote it: base offset, `last_offset_delta`, timestamps, producer id,
epoch and base sequence (so idempotence and transactions see the same batch), the
partition leader epoch. Only the records section is decoded, never a record.
"""

from __future__ import annotations

from raftlog.storage.batch import (
    ATTR_COMPRESSION_MASK,
    BATCH_HEADER_BYTES,
    LOG_OVERHEAD_BYTES,
    MAGIC_V2,
    BatchHeader,
    Compression,
    crc32c,
    parse_header,
)
from raftlog.storage.compression import compress
from raftlog.storage.record_decoder import records_section
from raftlog.storage.record_format import HEADER_PREFIX, HEADER_TAIL

__all__ = ["rebuild_batch", "recompress_batch"]


def rebuild_batch(header: BatchHeader, attributes: int, section: bytes, record_count: int) -> bytes:
    """`header`'s batch holding `section` (its records, in the codec `attributes` name)."""
    tail = HEADER_TAIL.pack(
        attributes,
        header.last_offset_delta,
        header.first_timestamp,
        header.max_timestamp,
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        record_count,
    )
    crc = crc32c(tail + section)
    batch_length = BATCH_HEADER_BYTES + len(section) - LOG_OVERHEAD_BYTES
    prefix = HEADER_PREFIX.pack(
        header.base_offset, batch_length, header.partition_leader_epoch, MAGIC_V2, crc
    )
    batch = prefix + tail + section
    rebuilt = parse_header(batch)
    assert rebuilt.last_offset == header.last_offset, (rebuilt, header)
    assert rebuilt.partition_leader_epoch == header.partition_leader_epoch
    return batch


def recompress_batch(
    batch: bytes, header: BatchHeader, codec: Compression, *, decompressed_bytes_max: int
) -> bytes:
    """`batch` with its records in `codec` (NONE: uncompressed); the batch itself when it is
    in `codec` already, or is a control batch (markers stay as written, as in Kafka).
    Raises CompressionError for a section that does not decompress within the bound."""
    if header.compression is codec or header.is_control or header.record_count == 0:
        return batch
    data, begin, stop = records_section(
        batch, BATCH_HEADER_BYTES, len(batch), header.compression, decompressed_bytes_max
    )
    section = bytes(data[begin:stop])
    attributes = header.attributes & ~ATTR_COMPRESSION_MASK
    if codec is not Compression.NONE:
        section = compress(codec, section)
        attributes |= codec.value
    return rebuild_batch(header, attributes, section, header.record_count)
