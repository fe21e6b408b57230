"""The Kafka RecordBatch v2 header: what a broker needs without decoding records.

Theory of operation. A record batch is the unit on disk and on the wire, laid out byte for
byte as Kafka's RecordBatch v2 (magic 2), big-endian:

    offset  size  field
         0     8  base_offset             patched by the leader when it appends
         8     4  batch_length            bytes after this field (total size - 12)
        12     4  partition_leader_epoch  the Raft term of the entry; patched by the leader
        16     1  magic                   always 2
        17     4  crc                     CRC32C of bytes [21, end)
        21     2  attributes              bits 0-2 codec, 3 timestamp type, 4 txn, 5 control
        23     4  last_offset_delta       the batch occupies [base, base + delta]
        27     8  first_timestamp
        35     8  max_timestamp
        43     8  producer_id
        51     2  producer_epoch
        53     4  base_sequence
        57     4  record_count
        61     .  records (varint encoded; see raftlog.storage.records)

The two fields a broker patches, base offset and leader epoch, lie *before* the CRC's range,
so patching never invalidates the checksum and never needs the records decoded. The hot path
is therefore: `verify_batch` (bounds, magic, CRC) then `patch_base_offset_and_epoch`.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import crc32c as _crc32c

from raftlog.errors import CorruptBatchError, CrcMismatchError

__all__ = [
    "BATCH_HEADER_BYTES",
    "LOG_OVERHEAD_BYTES",
    "MAGIC_V2",
    "BatchHeader",
    "Compression",
    "crc32c",
    "iter_batches",
    "parse_header",
    "patch_base_offset_and_epoch",
    "verify_batch",
]

MAGIC_V2 = 2
# base_offset + batch_length: the bytes not counted by batch_length.
LOG_OVERHEAD_BYTES = 12
BATCH_HEADER_BYTES = 61
# The CRC covers everything from the attributes field to the end of the batch.
CRC_START = 21
CRC_FIELD = 17
EPOCH_FIELD = 12

_HEADER = struct.Struct(">qiibIhiqqqhii")
assert _HEADER.size == BATCH_HEADER_BYTES
_BASE_OFFSET = struct.Struct(">q")
_EPOCH = struct.Struct(">i")

ATTR_COMPRESSION_MASK = 0x07
ATTR_TIMESTAMP_TYPE = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20


class Compression(enum.IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """CRC32C (Castagnoli), computed in C."""
    return _crc32c.crc32c(data)


@dataclass(frozen=True, slots=True)
class BatchHeader:
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size_bytes(self) -> int:
        return self.batch_length + LOG_OVERHEAD_BYTES

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def offset_count(self) -> int:
        """How many offsets the batch occupies."""
        return self.last_offset_delta + 1

    @property
    def compression(self) -> Compression:
        return Compression(self.attributes & ATTR_COMPRESSION_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def timestamp_type(self) -> int:
        return 1 if self.attributes & ATTR_TIMESTAMP_TYPE else 0


def parse_header(
    buf: bytes | bytearray | memoryview,
    position: int = 0,
    *,
    batch_bytes_max: int | None = None,
    path: str | None = None,
) -> BatchHeader:
    """Parse and bounds-check the header at `position`; the CRC is not checked here.

    Raises `CorruptBatchError` naming `path` and `position` for a short buffer, a length
    below the header size or above `batch_bytes_max` (or past the end of `buf`), wrong magic,
    an unknown codec or a negative offset delta or record count.
    """
    available = len(buf) - position
    if available < BATCH_HEADER_BYTES:
        raise CorruptBatchError(
            f"truncated header: {available} bytes, need {BATCH_HEADER_BYTES}",
            path=path,
            position=position,
        )
    header = BatchHeader(*_HEADER.unpack_from(buf, position))
    size = header.size_bytes
    if size < BATCH_HEADER_BYTES:
        raise CorruptBatchError(
            f"batch_length {header.batch_length} is below the header size",
            path=path,
            position=position,
        )
    if batch_bytes_max is not None and size > batch_bytes_max:
        raise CorruptBatchError(
            f"batch of {size} bytes exceeds batch_bytes_max={batch_bytes_max}",
            path=path,
            position=position,
        )
    if size > available:
        raise CorruptBatchError(
            f"truncated batch: header says {size} bytes, {available} present",
            path=path,
            position=position,
        )
    if header.magic != MAGIC_V2:
        raise CorruptBatchError(
            f"wrong magic {header.magic}, expected {MAGIC_V2}", path=path, position=position
        )
    if header.attributes & ATTR_COMPRESSION_MASK > Compression.ZSTD:
        raise CorruptBatchError(
            f"unknown compression codec {header.attributes & ATTR_COMPRESSION_MASK}",
            path=path,
            position=position,
        )
    if header.last_offset_delta < 0 or header.record_count < 0:
        raise CorruptBatchError(
            f"negative last_offset_delta ({header.last_offset_delta}) or record_count "
            f"({header.record_count})",
            path=path,
            position=position,
        )
    return header


def verify_batch(
    buf: bytes | bytearray | memoryview,
    position: int = 0,
    *,
    batch_bytes_max: int | None = None,
    path: str | None = None,
) -> BatchHeader:
    """`parse_header` plus the CRC32C check. A batch that fails is never returned to a reader."""
    header = parse_header(buf, position, batch_bytes_max=batch_bytes_max, path=path)
    end = position + header.size_bytes
    actual = crc32c(memoryview(buf)[position + CRC_START : end])
    if actual != header.crc:
        raise CrcMismatchError(
            f"CRC32C mismatch: stored {header.crc:#010x}, computed {actual:#010x}",
            path=path,
            position=position,
        )
    return header


def patch_base_offset_and_epoch(
    buf: bytearray | memoryview, position: int, *, base_offset: int, leader_epoch: int
) -> None:
    """Rewrite the two broker-owned fields in place; both lie outside the CRC's range."""
    assert base_offset >= 0, base_offset
    assert 0 <= leader_epoch < 2**31, leader_epoch
    _BASE_OFFSET.pack_into(buf, position, base_offset)
    _EPOCH.pack_into(buf, position + EPOCH_FIELD, leader_epoch)


def iter_batches(
    buf: bytes | bytearray | memoryview,
    *,
    batch_bytes_max: int | None = None,
    path: str | None = None,
    base_position: int = 0,
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield `(position, header)` for each verified batch in a buffer of whole batches.

    `base_position` is added to reported positions (for errors naming a file offset).
    Raises on the first batch that does not verify; nothing after it is yielded.
    """
    position = 0
    view = memoryview(buf)
    while position < len(view):
        try:
            header = verify_batch(view, position, batch_bytes_max=batch_bytes_max)
        except CorruptBatchError as error:
            raise type(error)(error.reason, path=path, position=base_position + position) from None
        yield position, header
        position += header.size_bytes
