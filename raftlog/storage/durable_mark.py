"""The durable mark: how far a log had been fsynced, kept apart from the log it describes.

Theory of operation. Recovery must tell a torn tail (bytes written after the last fsync, cut
short by a crash: harmless, nothing was acknowledged on their behalf) from damage (bytes that
had been fsynced and acknowledged, then lost to a bad sector, a firmware bug, a misdirected
write or an operator's `truncate`). The log's own bytes cannot tell them apart: a file cut
at 60% looks exactly like a torn write. So every log keeps `durable-end`, whose record says
"every offset below `end_offset` was fsynced". A flush writes one (`advance`) after the log's
fsync returned, so a record never claims more than the log holds. Recovery then compares: a
log that ends below its mark lost synced data, and the replica must not act as if its log
were whole (`raftlog.storage.log.LogDamage`, `docs/storage-faults.md`).

When the record is fsynced. The flush writes the record into the page cache before anything
is acknowledged, and leaves its fsync to the `MarkSyncer` (the node's: one thread,
`ThreadMarkSyncer`), so the acknowledgement waits for one fsync, the log's, instead of two in
series (`docs/storage-faults.md`, "What the mark costs", has the measurement). What that
changes, by kind of crash:
- a process crash (SIGKILL, OOM, a bug) keeps the page cache: the mark on disk is the one
  written, covering everything acknowledged, as when its fsync came first;
- a power loss or kernel crash before the deferred fsync leaves an older record, which claims
  less than was synced: the state a crash between the two fsyncs always left. The log's
  synced batches past it are intact and kept (recovery keeps every whole batch); only damage
  confined to those last batches, in that window, would pass for a torn tail.
Writes that must be durable before the log acts on them (a truncation lowering the mark, the
repair flag) use `write`, which fsyncs before it returns. `InlineMarkSyncer` fsyncs at once
(the simulator, unit tests: today's order, deterministic).

Cost. The record is overwritten in place, so its fdatasync changes no file size and needs
no journal commit on ext4 or XFS: a fraction of the log's own fsync
(`benchmarks/suites/storage_faults.py` measures it). The file is two slots of one sector
each. One, the *anchor*, holds a record known to be fsynced; writes go to the other, the
*scratch*, and once a write there is fsynced the two swap roles. Several records may be
written into the scratch while its fsync is pending, but the anchor is never written before
it stops being the anchor, so a write torn by a power loss damages at most the scratch and
the anchor still answers; the valid slot with the larger sequence number is in force:

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

import concurrent.futures
import logging
import os
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from raftlog.errors import StorageError
from raftlog.storage.batch import crc32c
from raftlog.storage.file_system import (
    FileHandle,
    FileSystem,
    read_whole_file,
    write_file_atomically,
)

__all__ = [
    "DURABLE_MARK_FILE_NAME",
    "FILE_BYTES",
    "DurableMark",
    "InlineMarkSyncer",
    "MarkRecord",
    "MarkSyncer",
    "ThreadMarkSyncer",
    "decode_marks",
    "process_mark_syncer",
]

log = logging.getLogger(__name__)

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


def _in_force_slot(data: bytes) -> int | None:
    """Which slot (0 or 1) of a whole mark file is in force, if either is valid."""
    slots = [_decode_slot(data[start : start + SLOT_BYTES]) for start in (0, SLOT_BYTES)]
    valid = [(found[0], index) for index, found in enumerate(slots) if found is not None]
    if not valid:
        return None
    # Equal sequences (a file written whole): the slot its parity names, where it would be.
    return max(valid, key=lambda found: (found[0], found[1] == found[0] % 2))[1]


class MarkSyncer(Protocol):
    """Runs a mark's deferred fsync (`DurableMark.advance`): the port between the flush and
    the thread that makes the record durable."""

    def submit(self, sync: Callable[[], None]) -> None: ...


class InlineMarkSyncer:
    """Runs the fsync at once, on the flushing thread (the simulator, unit tests)."""

    def submit(self, sync: Callable[[], None]) -> None:
        sync()


class ThreadMarkSyncer:
    """One thread that fsyncs the marks of every log of the process, in the order flushed.
    Its queue is bounded by the number of open logs: a mark has at most one sync queued or
    running (`DurableMark._syncing`), and records written meanwhile ride on it."""

    def __init__(self) -> None:
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="durable-mark"
        )

    def submit(self, sync: Callable[[], None]) -> None:
        self._executor.submit(sync)


INLINE_MARK_SYNCER = InlineMarkSyncer()
_process_syncer: ThreadMarkSyncer | None = None
_process_syncer_lock = threading.Lock()


def process_mark_syncer() -> ThreadMarkSyncer:
    """The process's one mark thread, shared by every node in it (in-process test clusters
    too), started on first use."""
    global _process_syncer
    with _process_syncer_lock:
        if _process_syncer is None:
            _process_syncer = ThreadMarkSyncer()
        return _process_syncer


class DurableMark:
    """The `durable-end` file of one log. `write` and `advance` may run on a disk thread."""

    def __init__(self, files: FileSystem, directory: str, syncer: MarkSyncer | None = None) -> None:
        self.files = files
        self.path = os.path.join(directory, DURABLE_MARK_FILE_NAME)
        self._syncer = syncer or INLINE_MARK_SYNCER  # None: fsync at once
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # no sync queued or running
        self._sequence = 0
        self._handle: FileHandle | None = None
        self.last: MarkRecord | None = None  # what this process last read or wrote
        # The slot the next record goes to. The other one, the anchor, holds a record known
        # to be fsynced once `_anchored` (not so after `load`: the page cache a killed
        # process left may be all there is of it, so the first write is fsynced at once).
        self._scratch = 1
        self._anchored = False
        self._dirty = False  # the scratch holds a record not fsynced yet
        self._generation = 0  # +1 per record written into the scratch
        self._syncing = False  # a deferred fsync is queued or running
        self._failure: Exception | None = None  # a deferred fsync's; raised by the next write

    def exists(self) -> bool:
        return self.files.exists(self.path)

    def load(self) -> MarkRecord | str:
        """The record in force, or what is wrong (a missing file included)."""
        if not self.exists():
            return f"{self.path} is missing"
        data = read_whole_file(self.files, self.path)
        found = decode_marks(data, path=self.path)
        if isinstance(found, str):
            return found
        in_force = _in_force_slot(data)
        assert in_force is not None, self.path
        with self._lock:
            self._sequence, self.last = found
            self._scratch = 1 - in_force
            self._anchored = False
        return found[1]

    def write(self, record: MarkRecord) -> None:
        """Make `record` the one in force, durably: fsynced before this returns (the whole
        file replaced atomically the first time)."""
        with self._lock:
            self._raise_failure()
            if record == self.last and self._anchored and not self._dirty:
                return  # nothing new: an idle flush costs no fsync
            if self._put(record):
                self._sync_scratch()

    def advance(self, record: MarkRecord) -> None:
        """Make `record` the one in force, its fsync deferred to the syncer (the module's
        docstring): the flush's write, after the log's own fsync returned."""
        with self._lock:
            self._raise_failure()
            if record == self.last:
                return
            if not self._anchored:
                if self._put(record):
                    self._sync_scratch()
                return
            self._put(record)
            if self._syncing:
                return  # the sync queued or running picks this record up
            self._syncing = True
        try:
            self._syncer.submit(self._sync_deferred)
        except RuntimeError:  # the interpreter is shutting down: no thread takes new work
            self._sync_deferred()
        with self._lock:
            self._raise_failure()  # an inline syncer's failure fails this flush, as in it

    def _put(self, record: MarkRecord) -> bool:
        """Write `record` into the scratch slot (lock held); False when the file was replaced
        whole instead, which is durable already."""
        replace = self._handle is None and not self._usable()
        self._sequence += 1
        slot = _encode(record, self._sequence)
        self.last = record
        if replace:
            write_file_atomically(self.files, self.path, slot + slot)
            self._scratch = 1 - self._sequence % 2
            self._anchored, self._dirty = True, False
            self._generation += 1
            return False
        self._open().write_at(slot, self._scratch * SLOT_BYTES)
        self._dirty = True
        self._generation += 1
        return True

    def _sync_scratch(self) -> None:
        """Fsync the scratch now (lock held) and make it the anchor."""
        self._open().sync()
        self._swap()

    def _swap(self) -> None:
        self._scratch = 1 - self._scratch
        self._anchored, self._dirty = True, False

    def _sync_deferred(self) -> None:
        """On the syncer's thread: fsync until the scratch holds nothing unsynced. The lock
        is not held during the fsync, so flushes keep writing records meanwhile."""
        while True:
            with self._lock:
                if not self._dirty or self._handle is None:
                    self._syncing = False
                    self._idle.notify_all()
                    return
                generation, handle = self._generation, self._handle
            try:
                handle.sync()
            except Exception as error:  # EIO above all; whatever it is, the next write raises
                log.error("%s: deferred fsync failed: %s", self.path, error)
                with self._lock:
                    self._failure = error
                    self._syncing = False
                    self._idle.notify_all()
                return
            with self._lock:
                if self._dirty and self._generation == generation:
                    self._swap()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise StorageError(f"{self.path}: an fsync of the durable mark failed: {self._failure}")

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
        """Close the file once a deferred fsync queued or running has finished."""
        with self._lock:
            while self._syncing:
                self._idle.wait()
            if self._handle is not None:
                self._handle.close()
                self._handle = None
