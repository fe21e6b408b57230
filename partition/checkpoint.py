"""Partition checkpoints: the replica's state machine saved at an applied offset.

Theory of operation. A partition's state machine is its producer table (the log holds the
rest); it is rebuilt by applying committed batches in offset order. Without a checkpoint a
restart re-reads and re-applies the whole log, which grows with the log (8 s for 2 GiB). So a
replica saves its table, with the offset and term of the last entry applied, every
`LogConfig.checkpoint_interval_bytes` of applied log (Kafka snapshots producer state at
segment rolls), and a restart resumes applying after that offset (the Raft core's
`applied_offset`).

Aborted transactions are not in the checkpoint: they are in the aborted-transaction index
beside each segment (`raftlog.storage.txn_index`), which the replica flushes before it saves
a checkpoint, so every entry up to the checkpoint's offset is on disk with it and a restart
re-derives the later ones by re-applying the log. The table may carry the few entries whose
markers follow the checkpoint's offset (`ProducerStateTable.encode(aborted=...)`). A
checkpoint written before the index listed every aborted transaction; the replica moves
them into the index when it loads one.

Why this is safe: an entry is applied only after it is committed and durable on this node
(the host fsyncs before it applies), and committed entries are never truncated, so the log
on disk still holds every entry up to the checkpoint's offset. `load` then checks that the
log holds that offset in the same term; anything else (file missing, torn, bit-flipped,
oversized, describing a log this node no longer has) answers None, which means "apply from
the snapshot or the start of the log": slower, never wrong.

The checkpoint also counts, per segment, the index entries up to its offset
(`TransactionIndex.entry_counts`): a start that finds a file holding fewer (deleted, or cut
at an entry boundary, while the node was down: no CRC tells) does not resume after the
checkpoint, and re-applying re-derives them.

File (big-endian), replaced atomically (temporary file, fsync, rename, fsync directory):
    b"RLPC", crc32c u32 of the rest, offset i64, term i64, state length u32, state bytes,
    then (absent from checkpoints written before it) count u32 and that many
    (segment base offset i64, index entries u32)
"""

from __future__ import annotations

import logging
import os
import struct
from dataclasses import dataclass

from raftlog.storage.batch import crc32c
from raftlog.storage.file_system import FileSystem, write_file_atomically
from raftlog.storage.txn_index import INDEXED_SEGMENTS_MAX
from raftlog.types import Offset, Term

__all__ = [
    "CHECKPOINT_FILE_NAME",
    "CheckpointStore",
    "PartitionCheckpoint",
    "checkpoint_bytes_max",
]

log = logging.getLogger(__name__)

CHECKPOINT_FILE_NAME = "partition-checkpoint"
_HEAD = struct.Struct(">4sIqqI")  # magic, crc, offset, term, state bytes
_COUNT = struct.Struct(">I")
_INDEX_COUNT = struct.Struct(">qI")  # segment base offset, index entries up to the offset
_MAGIC = b"RLPC"
# An encoded producer (id, epoch, five remembered batches of four integers, its open
# transaction and coordinator epoch) as JSON stays well under this; the bound keeps a
# corrupt length from making load read a huge file.
_PRODUCER_BYTES_MAX = 1024
# Checkpoints written before the aborted-transaction index listed every aborted transaction
# (producer id, first and last offset as JSON): `load` still reads one with up to this many.
_LEGACY_ABORTED_TXNS_MAX = 100_000
_ABORTED_TXN_BYTES_MAX = 64


def checkpoint_bytes_max(producers_max: int) -> int:
    """The largest checkpoint a table of at most `producers_max` producers encodes to."""
    assert producers_max > 0, producers_max
    index_counts_bytes_max = _COUNT.size + INDEXED_SEGMENTS_MAX * _INDEX_COUNT.size
    return _HEAD.size + producers_max * _PRODUCER_BYTES_MAX + index_counts_bytes_max


def _load_bytes_max(producers_max: int) -> int:
    return checkpoint_bytes_max(producers_max) + _LEGACY_ABORTED_TXNS_MAX * _ABORTED_TXN_BYTES_MAX


@dataclass(frozen=True, slots=True)
class PartitionCheckpoint:
    offset: Offset  # the last offset applied: the state covers every entry up to it
    term: Term  # the term of the entry ending at `offset`
    state: bytes  # ProducerStateTable.encode()
    # (segment base offset, aborted-transaction index entries up to `offset`), segments with
    # entries only, in offset order: TransactionIndex.entry_counts.
    index_counts: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        assert self.offset >= 0 and self.term >= 0, (self.offset, self.term)
        assert len(self.index_counts) <= INDEXED_SEGMENTS_MAX, len(self.index_counts)
        assert all(count > 0 for _, count in self.index_counts), self.index_counts

    def encode(self) -> bytes:
        body = _HEAD.pack(_MAGIC, 0, self.offset, self.term, len(self.state))[8:] + self.state
        counts = [_INDEX_COUNT.pack(base, count) for base, count in self.index_counts]
        body += _COUNT.pack(len(counts)) + b"".join(counts)
        return _MAGIC + struct.pack(">I", crc32c(body)) + body

    @classmethod
    def decode(cls, data: bytes) -> PartitionCheckpoint:
        """Raises ValueError naming what is wrong with `data`."""
        if len(data) < _HEAD.size:
            raise ValueError(f"{len(data)} bytes, shorter than the {_HEAD.size}-byte header")
        magic, crc, offset, term, state_bytes = _HEAD.unpack_from(data)
        if magic != _MAGIC:
            raise ValueError(f"bad magic {magic!r}")
        if crc != crc32c(data[8:]):
            raise ValueError("CRC32C mismatch")
        state_end = _HEAD.size + state_bytes
        if state_end > len(data):
            raise ValueError(f"state length {state_bytes} does not match {len(data)} bytes")
        if offset < 0 or term < 0:
            raise ValueError(f"negative offset {offset} or term {term}")
        state = data[_HEAD.size : state_end]
        if state_end == len(data):
            return cls(Offset(offset), Term(term), state)  # written before the index counts
        return cls(Offset(offset), Term(term), state, _decode_index_counts(data[state_end:]))


def _decode_index_counts(data: bytes) -> tuple[tuple[int, int], ...]:
    if len(data) < _COUNT.size:
        raise ValueError(f"{len(data)} bytes after the state, not an index count")
    (count,) = _COUNT.unpack_from(data)
    if count > INDEXED_SEGMENTS_MAX or _COUNT.size + count * _INDEX_COUNT.size != len(data):
        raise ValueError(f"{count} index counts do not match {len(data)} bytes after the state")
    counts = tuple(
        _INDEX_COUNT.unpack_from(data, _COUNT.size + i * _INDEX_COUNT.size) for i in range(count)
    )
    bases = [base for base, _ in counts]
    if any(entries == 0 for _, entries in counts) or bases != sorted(set(bases)):
        raise ValueError(f"index counts not one positive count per segment, in order: {counts}")
    return counts


class CheckpointStore:
    """One partition's checkpoint file, through the storage layer's file-system port."""

    def __init__(self, files: FileSystem, directory: str, *, producers_max: int) -> None:
        self.files = files
        self.path = os.path.join(directory, CHECKPOINT_FILE_NAME)
        self.producers_max = producers_max
        self.bytes_max = _load_bytes_max(producers_max)

    def save(self, checkpoint: PartitionCheckpoint) -> None:
        """Replace the checkpoint. A table of at most `producers_max` producers always fits
        (the entries it carries beside it are those of the apply lag, a few)."""
        data = checkpoint.encode()
        assert len(data) <= self.bytes_max, (len(data), self.bytes_max)
        write_file_atomically(self.files, self.path, data)

    def load(self) -> PartitionCheckpoint | None:
        """The checkpoint on disk, or None when there is none or it cannot be trusted."""
        if not self.files.exists(self.path):
            return None
        handle = self.files.open(self.path)
        try:
            size_bytes = handle.size_bytes()
            if size_bytes > self.bytes_max:
                log.warning("ignoring %s: %d bytes > %d", self.path, size_bytes, self.bytes_max)
                return None
            data = handle.read_at(size_bytes, 0)
        finally:
            handle.close()
        try:
            return PartitionCheckpoint.decode(data)
        except ValueError as error:
            log.warning("ignoring damaged %s: %s", self.path, error)
            return None
