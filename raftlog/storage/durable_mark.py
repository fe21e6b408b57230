"""The durable mark: how far a log had been fsynced, kept apart from the log it describes.

Theory of operation. Recovery must tell a torn tail (bytes written after the last fsync, cut
short by a crash: harmless, nothing was acknowledged on their behalf) from damage (bytes that
had been fsynced and acknowledged, then lost to a bad sector, a firmware bug, a misdirected
write or an operator's `truncate`). The log's own bytes cannot tell them apart: a file cut
at 60% looks exactly like a torn write. So every log keeps `durable-end`, whose record says
"every offset below `end_offset` was fsynced". A flush writes one after the log's fsync
returned and fsyncs it (on the same disk thread, before anything is acknowledged), so a
record never claims more than the log holds: a crash between the two fsyncs leaves the
previous record, which claims less. Recovery then compares: a log that ends below its mark
lost synced data, and the replica must not act as if its log were whole
(`raftlog.storage.log.LogDamage`, `docs/storage-faults.md`).

Cost. The record is overwritten in place, so its fdatasync changes no file size and needs
no journal commit on ext4 or XFS: a fraction of the log's own fsync
(`benchmarks/suites/storage_faults.py` measures it). The file is two slots of one sector
each, written alternately with a growing sequence number, so a write torn by a power loss
damages at most the slot it was writing and the other still answers:

    slot at byte 0 and at byte 512, each:
    offset  size  field
         0     4  magic b"RLDM"
         4     1  version (2)
         5     1  flags: bit 0 = repairing (the log lost synced data and has not yet been
                  repaired from a leader; `end_offset` is then the end it had reached)
         6     2  reserved, zero
         8     8  sequence     u64, +1 per write; the valid slot with the larger one is in force
        16     8  end_offset   i64
        24   484  zero
       508     4  crc32c of bytes [0, 508)

Neither slot valid, a file of the wrong size, or a missing file beside a log that holds
batches is damage of the mark itself: recovery cannot know how far the log had been synced
and reports that; it never reads a default.
"""

from __future__ import annotations

import os
import struct
import threading
from dataclasses import dataclass

from raftlog.errors import StorageError
from raftlog.storage.batch import crc32c
from raftlog.storage.file_system import (
    FileHandle,
    FileSystem,
    read_whole_file,
    write_file_atomically,
)

__all__ = ["DURABLE_MARK_FILE_NAME", "FILE_BYTES", "DurableMark", "MarkRecord", "decode_marks"]

DURABLE_MARK_FILE_NAME = "durable-end"
SLOT_BYTES = 512
FILE_BYTES = 2 * SLOT_BYTES
_MAGIC = b"RLDM"
_VERSION = 2
_REPAIRING = 0x01
_BODY = struct.Struct(">4sBBHQq")
_CRC = struct.Struct(">I")
_CRC_AT = SLOT_BYTES - _CRC.size


@dataclass(frozen=True, slots=True)
class MarkRecord:
    """What the log durably reached, and whether it is still being repaired."""

    end_offset: int
    repairing: bool = False


def _encode(record: MarkRecord, sequence: int) -> bytes:
    assert record.end_offset >= 0 and sequence >= 0, (record, sequence)
    flags = _REPAIRING if record.repairing else 0
    body = _BODY.pack(_MAGIC, _VERSION, flags, 0, sequence, record.end_offset)
    body += bytes(_CRC_AT - len(body))
    return body + _CRC.pack(crc32c(body))


def _decode_slot(slot: bytes) -> tuple[int, MarkRecord] | None:
    assert len(slot) == SLOT_BYTES, len(slot)
    if _CRC.unpack_from(slot, _CRC_AT)[0] != crc32c(slot[:_CRC_AT]):
        return None
    magic, version, flags, _reserved, sequence, end_offset = _BODY.unpack_from(slot)
    if magic != _MAGIC or version != _VERSION or end_offset < 0 or flags & ~_REPAIRING:
        return None
    return sequence, MarkRecord(end_offset, bool(flags & _REPAIRING))


def decode_marks(data: bytes, *, path: str) -> tuple[int, MarkRecord] | str:
    """(sequence, record) in force, or a sentence saying what is wrong with the file."""
    if len(data) != FILE_BYTES:
        return f"{path} is {len(data)} bytes, a durable mark is {FILE_BYTES}"
    slots = [_decode_slot(data[start : start + SLOT_BYTES]) for start in (0, SLOT_BYTES)]
    valid = [slot for slot in slots if slot is not None]
    if not valid:
        return f"{path}: neither slot passes its checks (CRC32C, magic)"
    return max(valid, key=lambda found: found[0])


class DurableMark:
    """The `durable-end` file of one log. `write` may run on a disk thread."""

    def __init__(self, files: FileSystem, directory: str) -> None:
        self.files = files
        self.path = os.path.join(directory, DURABLE_MARK_FILE_NAME)
        self._lock = threading.Lock()
        self._sequence = 0
        self._handle: FileHandle | None = None
        self.last: MarkRecord | None = None  # what this process last read or wrote

    def exists(self) -> bool:
        return self.files.exists(self.path)

    def load(self) -> MarkRecord | str:
        """The record in force, or what is wrong (a missing file included)."""
        if not self.exists():
            return f"{self.path} is missing"
        found = decode_marks(read_whole_file(self.files, self.path), path=self.path)
        if isinstance(found, str):
            return found
        self._sequence, self.last = found
        return self.last

    def write(self, record: MarkRecord) -> None:
        """Make `record` the one in force, durably: the slot the previous write did not use
        is overwritten and fsynced (the whole file replaced atomically the first time)."""
        with self._lock:
            if record == self.last:
                return  # nothing new: an idle flush costs no fsync
            self._sequence += 1
            slot = _encode(record, self._sequence)
            if self._handle is None and not self._usable():
                write_file_atomically(self.files, self.path, slot + slot)
            else:
                handle = self._open()
                handle.write_at(slot, (self._sequence % 2) * SLOT_BYTES)
                handle.sync()
            self.last = record

    def _usable(self) -> bool:
        """Whether the file is there, whole, to be written in place (else it is replaced)."""
        if not self.files.exists(self.path) or self.last is None:
            return False
        handle = self._open()
        if handle.size_bytes() != FILE_BYTES:
            raise StorageError(f"{self.path} changed size under the log: damaged")
        return True

    def _open(self) -> FileHandle:
        if self._handle is None:
            self._handle = self.files.open(self.path)
        return self._handle

    def close(self) -> None:
        with self._lock:
            if self._handle is not None:
                self._handle.close()
                self._handle = None
