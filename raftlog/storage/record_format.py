"""The RecordBatch v2 record framing shared by the encoder, decoder and validation walk:
field ranges, varint sizes, control keys, and the record types clients build and read
(raftlog.storage.records describes the format)."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple

from raftlog.config import LogConfig
from raftlog.storage.batch import BATCH_HEADER_BYTES, CRC_START, BatchHeader

__all__ = [
    "CHUNK_BYTES",
    "CONTROL_ABORT",
    "CONTROL_COMMIT",
    "CONTROL_KEY",
    "CONTROL_KEY_VERSION",
    "CONTROL_LEADER_CHANGE",
    "CONTROL_VOTERS",
    "DEFAULT_DECOMPRESSED_BYTES_MAX",
    "HEADER_PREFIX",
    "HEADER_TAIL",
    "INT16",
    "INT32",
    "INT64",
    "NO_HEADERS",
    "NULL_LENGTH",
    "NULL_LENGTH_BYTE",
    "ONE_BYTE_VARINTS",
    "RECORD_ATTRIBUTES",
    "RECORD_BYTES_MIN",
    "VARINT_BYTES_MAX",
    "VARLONG_BYTES_MAX",
    "DecodedBatch",
    "Headers",
    "Malformed",
    "Record",
    "RecordFields",
    "RecordInput",
    "RecordOutFields",
]

CONTROL_ABORT = 0
CONTROL_COMMIT = 1
CONTROL_LEADER_CHANGE = 2  # a new Raft leader's no-op (Raft §8)
CONTROL_VOTERS = 6  # a membership change (Raft dissertation §4.1)
CONTROL_KEY_VERSION = 0
CONTROL_KEY = struct.Struct(">hh")

Headers = tuple[tuple[str, bytes | None], ...]

INT16 = (-(2**15), 2**15 - 1)
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
VARINT_BYTES_MAX = 5
VARLONG_BYTES_MAX = 10
# length, attributes, timestampDelta, offsetDelta, keyLength, valueLength, headersCount:
# seven fields of at least one byte each.
RECORD_BYTES_MIN = 7
DEFAULT_DECOMPRESSED_BYTES_MAX = LogConfig().decompressed_bytes_max

# The header split at the CRC: the prefix lies outside the CRC's range, the tail inside it.
HEADER_PREFIX = struct.Struct(">qiibI")
HEADER_TAIL = struct.Struct(">hiqqqhii")
assert HEADER_PREFIX.size == CRC_START
assert HEADER_PREFIX.size + HEADER_TAIL.size == BATCH_HEADER_BYTES

# Zig-zag values 0..127 (numbers -64..63) encode as one byte; most lengths and deltas do.
ONE_BYTE_VARINTS = tuple(bytes((zigzag,)) for zigzag in range(0x80))
NULL_LENGTH = ONE_BYTE_VARINTS[1]  # zig-zag(-1)
NULL_LENGTH_BYTE = NULL_LENGTH[0]
NO_HEADERS = ONE_BYTE_VARINTS[0]  # a headers count of 0
RECORD_ATTRIBUTES = b"\x00"
# The encoder's pieces: records are joined (and CRC'd) about this many bytes at a time, well
# below the allocator's mmap threshold (128 KiB), whose fresh pages cost page faults.
CHUNK_BYTES = 32 * 1024


class RecordInput(NamedTuple):
    """A record to encode; its offset is its place in the batch.

    A NamedTuple, so a plain tuple of the same four fields (`RecordFields`) encodes as well:
    the producer keeps each record it buffers as a plain tuple, cheaper to build, and one the
    cyclic garbage collector stops tracking (an exact tuple of bytes and ints), where each
    tracked object held in a buffer of small records is walked again by every collection.
    """

    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    headers: Headers = ()


# What `encode_batch` reads of a record: key, value, timestamp_ms, headers (a RecordInput).
RecordFields = tuple[bytes | None, bytes | None, int, Headers]


@dataclass(frozen=True, slots=True)
class Record:
    """A decoded record, with its absolute offset and timestamp."""

    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: Headers

    def as_input(self) -> RecordInput:
        return RecordInput(self.key, self.value, self.timestamp_ms, self.headers)


# What `decode_batch_fields` gives for a record: offset, key, value, timestamp_ms, headers.
RecordOutFields = tuple[int, bytes | None, bytes | None, int, Headers]


@dataclass(frozen=True, slots=True)
class DecodedBatch:
    header: BatchHeader
    records: tuple[Record, ...]


class Malformed(Exception):
    """A fault at byte `at` of a records section; decode_batch turns it into an absolute one."""

    def __init__(self, reason: str, at: int):
        super().__init__(reason)
        self.reason = reason
        self.at = at
