"""The durable mark: how far a log had been fsynced, kept apart from the log it describes.

Theory of operation. Recovery must tell a torn tail (bytes written after the last fsync, cut
short by a crash: harmless, nothing was acknowledged on their behalf) from damage (bytes that
had been fsynced and acknowledged, then lost to a bad sector, a firmware bug, a misdirected
write or an operator's `truncate`). The log's own bytes cannot tell them apart: a file cut
at 60% looks exactly like a torn write. So every log keeps `durable-end`, a file of small
records, each saying "every offset below `end_offset` was fsynced". A flush appends one
after the log's fsync returned and fsyncs it (on the same disk thread, before anything is
acknowledged), so a record never claims more than the log holds: a crash between the two
fsyncs leaves the previous record, which claims less. Recovery then compares: a log that
ends below its mark lost synced data, and the replica must not act as if its log were whole
(`raftlog.storage.log.LogDamage`, `docs/storage-faults.md`).

The file is 24-byte records appended, the last complete one in force; it is replaced
atomically by one record once it holds `RECORDS_MAX`. A record:

    offset  size  field
         0     4  magic b"RLDM"
         4     1  version (1)
         5     1  flags: bit 0 = repairing (the log lost synced data and has not yet been
                  repaired from a leader; `end_offset` is then the end it had reached)
         6     2  reserved, zero
         8     8  end_offset   i64
        16     4  crc32c of bytes [0, 16)
        20     4  reserved, zero

A partial record at the tail is an append a crash cut short (its flush never returned: it
acknowledged nothing) and is ignored. A complete record that fails its checks, or a missing
file beside a log that holds batches, is damage of the mark itself: recovery cannot know how
far the log had been synced and reports that, it never reads it as a default.
"""

from __future__ import annotations

import os
import struct
import threading
from dataclasses import dataclass

from raftlog.errors import StorageError
from raftlog.storage.batch import crc32c
from raftlog.storage.files import FileHandle, FileSystem, read_whole_file, write_file_atomically

__all__ = ["DURABLE_MARK_FILE_NAME", "DurableMark", "MarkRecord", "decode_marks"]

DURABLE_MARK_FILE_NAME = "durable-end"
RECORD_BYTES = 24
# Appended records before the file is rewritten as one (bounds it at 24 KiB).
RECORDS_MAX = 1024
_MAGIC = b"RLDM"
_VERSION = 1
_REPAIRING = 0x01
_BODY = struct.Struct(">4sBBHq")
_TAIL = struct.Struct(">II")
assert _BODY.size + _TAIL.size == RECORD_BYTES


@dataclass(frozen=True, slots=True)
class MarkRecord:
    """What the log durably reached, and whether it is still being repaired."""

    end_offset: int
    repairing: bool = False

    def encode(self) -> bytes:
        assert self.end_offset >= 0, self
        flags = _REPAIRING if self.repairing else 0
        body = _BODY.pack(_MAGIC, _VERSION, flags, 0, self.end_offset)
        return body + _TAIL.pack(crc32c(body), 0)


def decode_marks(data: bytes, *, path: str) -> MarkRecord | str:
    """The record in force, or a sentence saying what is wrong with the file."""
    complete = len(data) - len(data) % RECORD_BYTES
    if complete == 0:
        return f"{path} holds no complete record ({len(data)} bytes)"
    record: MarkRecord | None = None
    for start in range(0, complete, RECORD_BYTES):
        chunk = data[start : start + RECORD_BYTES]
        magic, version, flags, _reserved, end_offset = _BODY.unpack_from(chunk)
        stored_crc, _ = _TAIL.unpack_from(chunk, _BODY.size)
        if stored_crc != crc32c(chunk[: _BODY.size]):
            return f"{path}: record at byte {start} fails its CRC32C"
        if magic != _MAGIC or version != _VERSION or end_offset < 0 or flags & ~_REPAIRING:
            return f"{path}: record at byte {start} is not a durable mark"
        record = MarkRecord(end_offset, bool(flags & _REPAIRING))
    assert record is not None
    return record


class DurableMark:
    """The `durable-end` file of one log. `write` may run on a disk thread."""

    def __init__(self, files: FileSystem, directory: str) -> None:
        self.files = files
        self.path = os.path.join(directory, DURABLE_MARK_FILE_NAME)
        self._lock = threading.Lock()
        self._records = 0
        self.last: MarkRecord | None = None  # what this process last read or wrote

    def exists(self) -> bool:
        return self.files.exists(self.path)

    def load(self) -> MarkRecord | str:
        """The record in force, or what is wrong (a missing file included)."""
        if not self.exists():
            return f"{self.path} is missing"
        data = read_whole_file(self.files, self.path)
        found = decode_marks(data, path=self.path)
        if isinstance(found, MarkRecord):
            self.last = found
            self._records = len(data) // RECORD_BYTES
        return found

    def write(self, record: MarkRecord) -> None:
        """Append `record` and fsync it (or replace the file by it, atomically)."""
        data = record.encode()
        with self._lock:
            if record == self.last:
                return  # nothing new: an idle flush costs no fsync
            if self._records == 0 or self._records >= RECORDS_MAX:
                write_file_atomically(self.files, self.path, data)
                self._records = 1
            else:
                self._append(data)
                self._records += 1
            self.last = record

    def _append(self, data: bytes) -> None:
        handle: FileHandle = self.files.open(self.path)
        try:
            complete_bytes = self._records * RECORD_BYTES
            if handle.size_bytes() < complete_bytes:
                raise StorageError(f"{self.path} lost records while open: damaged")
            if handle.size_bytes() > complete_bytes:
                # The partial tail of an append a crash cut short: keep records aligned.
                handle.truncate(complete_bytes)
            handle.append([data])
            handle.sync()
        finally:
            handle.close()
