"""Kafka offsets over a Raft log: the offsets clients see, without Raft's own entries.

Theory of operation. A partition's Raft log holds its data batches and two kinds of Raft's
own entries, one offset each: a leader's no-op at the start of its term (Raft §8) and
membership changes. Clients see Kafka offsets: the offsets of the data, numbered as if
Raft's own ("internal") entries were not there, as Redpanda's offset translator does. For a
Raft offset `r` at an entry boundary (or inside a data batch, whose records stay consecutive),

    kafka(r) = kafka_start + (r - first) - #{i in internal : first <= i < r}

where `first` is the log's first offset and `kafka_start` the Kafka offset there: 0 for a
log that starts at 0, carried by the partition's snapshot once retention has cut the log.
Only the internal offsets are stored (a few per leader change), never a map of every batch.

Worked example. A fresh partition's first leader appends its no-op at Raft offset 0, then a
batch of 2 records at 1-2 and one of 3 at 3-5; a second leader's no-op lands at 6, then a
batch of 1 record at 7. internal = [0, 6]; kafka(1) = 0, kafka(3) = 2, kafka(7) = 5, and
with 7 committed the high watermark is kafka(8) = 6: six records at offsets 0-5, whatever
the leader changes. raft_offset(5) = 7 goes back.

`to_kafka_batches` turns raw batches read from the log into what a client may see: internal
batches left out, each data batch's base offset (outside its CRC) rewritten to its Kafka
offset. Records are never decoded; the batch headers are walked once.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Sequence

__all__ = ["kafka_offset", "raft_offset", "to_kafka_batches"]

_BASE_AND_LENGTH = struct.Struct(">qi")  # base offset, batch length (bytes after the field)
_BASE = struct.Struct(">q")
_LENGTH_END = 12  # the base offset (8) and the length field (4) precede the length's bytes


def kafka_offset(raft: int, *, first: int, kafka_start: int, internal: Sequence[int]) -> int:
    """The Kafka offset of Raft offset `raft` (>= `first`); `internal` sorted, all >= first."""
    assert raft >= first, (raft, first)
    below = bisect.bisect_left(internal, raft)
    kafka = kafka_start + (raft - first) - below
    assert kafka >= kafka_start, (raft, first, kafka_start, below)
    return kafka


def raft_offset(kafka: int, *, first: int, kafka_start: int, internal: Sequence[int]) -> int:
    """The Raft offset holding Kafka offset `kafka` (>= `kafka_start`): never an internal
    entry's, the next data offset at or after the one it counts to."""
    assert kafka >= kafka_start, (kafka, kafka_start)
    raft = first + (kafka - kafka_start)
    index = 0
    # Each internal entry at or below the candidate pushes it one offset further.
    while index < len(internal) and internal[index] <= raft:
        raft += 1
        index += 1
    assert kafka_offset(raft, first=first, kafka_start=kafka_start, internal=internal) == kafka
    return raft


def to_kafka_batches(
    data: bytes, *, first: int, kafka_start: int, internal: Sequence[int]
) -> bytes:
    """Whole batches `data` (consecutive, as read from the log) with the internal ones left
    out and every other batch's base offset rewritten to its Kafka offset."""
    if not data:
        return data
    view = memoryview(data)
    # One copy in all: each kept batch is its new base offset and a view of the rest of its
    # bytes, joined once (a bytearray copy patched in place, then frozen, copied twice).
    pieces: list[bytes | memoryview] = []
    next_internal = bisect.bisect_left(internal, _BASE_AND_LENGTH.unpack_from(data)[0])
    position = 0
    while position < len(data):
        base, length = _BASE_AND_LENGTH.unpack_from(data, position)
        size = _LENGTH_END + length
        assert position + size <= len(data), "reads return whole batches"
        while next_internal < len(internal) and internal[next_internal] < base:
            next_internal += 1
        if next_internal < len(internal) and internal[next_internal] == base:
            position += size  # Raft's own entry: clients never see it
            continue
        kafka = kafka_start + (base - first) - next_internal
        pieces.append(_BASE.pack(kafka))
        pieces.append(view[position + _BASE.size : position + size])
        position += size
    return b"".join(pieces)
