"""Raft's hard state (current term, vote) in its own small file, replaced atomically.

Theory of operation. Raft §5.1 requires `currentTerm` and `votedFor` to be on stable storage
before a node answers an RPC. They change rarely (once per election), are tiny, and must
never be seen half-written, so they live apart from the log in `hard-state`, replaced with
`write_file_atomically` (temporary file, sync, rename, sync the directory): after a crash the
file holds either the old or the new state. The file is 29 bytes, big-endian:

    offset  size  field
         0     4  magic b"RLHS"
         4     1  version (1)
         5     8  term          u64
        13     8  vote          i64, -1 for none
        21     4  crc32c        of bytes [0, 21)
        25     4  reserved      zero

Every save goes to two copies, `hard-state` and `hard-state.copy`, and counts as durable only
once both are: a disk that damages or loses one file (a flipped bit, a bad sector, an
operator's `rm`) costs nothing, the other copy answers and the next save rewrites the bad
one. Both copies missing is a fresh group (term 0, no vote); both unusable raises
`StorageError` naming them, never a default, because silently forgetting a vote or a term
could elect two leaders or let a deposed leader commit (docs/storage-faults.md).

Many groups at once (an election of 1,000 partitions): creating and renaming a file per save
contends for the file system's journal with every fsync in flight. So a node's host saves
with `begin_save`/`HardStateWrite.finish` instead: once the file exists, the new state is
*appended* to it as one more 29-byte record and only `fdatasync` runs on a disk thread; the
last record is the state. The first save (no file yet) and the save that finds
`HARD_STATE_RECORDS_MAX` records replace the file atomically by one record, on the disk
thread. An appended record cut short by a crash (a partial tail after complete records: its
save never finished, nothing was answered on its behalf) is ignored; a complete record that
fails its checks is corruption.
"""

from __future__ import annotations

import logging
import os
import struct

from raftlog.errors import StorageError
from raftlog.raft.types import HardState
from raftlog.storage.batch import crc32c
from raftlog.storage.file_system import (
    FileHandle,
    FileSystem,
    OsFileSystem,
    read_whole_file,
    write_file_atomically,
)
from raftlog.types import NodeId, Term

log = logging.getLogger(__name__)

__all__ = [
    "HARD_STATE_FILE_NAME",
    "FileHardStateStore",
    "HardStateWrite",
    "decode_hard_state",
    "decode_hard_state_file",
    "encode_hard_state",
]

HARD_STATE_FILE_NAME = "hard-state"
# The second copy of every record, so one damaged or deleted file loses nothing.
COPY_SUFFIX = ".copy"
_MAGIC = b"RLHS"
_VERSION = 1
_BODY = struct.Struct(">4sBQq")
_TAIL = struct.Struct(">II")
_FILE_BYTES = _BODY.size + _TAIL.size
_NO_VOTE = -1
# Appended records before the file is rewritten as one (bounds the file at ~1.8 KiB).
HARD_STATE_RECORDS_MAX = 64


def encode_hard_state(hard_state: HardState) -> bytes:
    assert hard_state.term >= 0, hard_state
    assert hard_state.vote is None or hard_state.vote >= 0, hard_state
    vote = _NO_VOTE if hard_state.vote is None else hard_state.vote
    body = _BODY.pack(_MAGIC, _VERSION, hard_state.term, vote)
    return body + _TAIL.pack(crc32c(body), 0)


def decode_hard_state_file(data: bytes, *, path: str) -> HardState:
    """The last of the file's records (a partial record after the first is a torn append
    and ignored); every complete record must pass its checks."""
    if len(data) < _FILE_BYTES:
        return decode_hard_state(data, path=path)  # raises: too short
    complete = len(data) - len(data) % _FILE_BYTES
    state = HardState()
    for start in range(0, complete, _FILE_BYTES):
        state = decode_hard_state(data[start : start + _FILE_BYTES], path=path)
    return state


def decode_hard_state(data: bytes, *, path: str) -> HardState:
    """Parse one record's bytes; raises StorageError naming `path` and what is wrong."""
    if len(data) != _FILE_BYTES:
        raise StorageError(f"corrupt hard state {path}: {len(data)} bytes, expected {_FILE_BYTES}")
    magic, version, term, vote = _BODY.unpack_from(data)
    stored_crc, _reserved = _TAIL.unpack_from(data, _BODY.size)
    actual_crc = crc32c(data[: _BODY.size])
    if stored_crc != actual_crc:
        raise StorageError(
            f"corrupt hard state {path}: CRC32C stored {stored_crc:#010x}, "
            f"computed {actual_crc:#010x}"
        )
    if magic != _MAGIC or version != _VERSION:
        raise StorageError(f"corrupt hard state {path}: magic {magic!r} version {version}")
    if vote < _NO_VOTE:
        raise StorageError(f"corrupt hard state {path}: vote {vote}")
    return HardState(Term(term), None if vote == _NO_VOTE else NodeId(vote))


class FileHardStateStore:
    """`raftlog.raft.ports.HardStateStore` over two copies in `directory` (see the module doc).

    Every save goes to both `hard-state` and `hard-state.copy` and is durable only once both
    are: one damaged or deleted copy (a bad sector, an operator's mistake) is then answered
    by the other, logged, and rewritten by the next save. Both damaged is beyond the fault
    model this survives, and `load` raises StorageError naming both files."""

    def __init__(self, directory: str | os.PathLike[str], *, files: FileSystem | None = None):
        self.directory = os.fspath(directory)
        self.files = files or OsFileSystem()
        self.path = os.path.join(self.directory, HARD_STATE_FILE_NAME)
        self.copy_path = self.path + COPY_SUFFIX
        self.files.make_directory(self.directory)
        self._last: HardState | None = None  # what this store last loaded or saved
        # Records in each file (appends grow it, a replace makes it 1; 0: replace next time).
        self._records = {self.path: 0, self.copy_path: 0}

    def load(self) -> HardState:
        found = {path: self._read(path) for path in (self.path, self.copy_path)}
        states = [state for state, _ in found.values() if state is not None]
        problems = [problem for _, problem in found.values() if problem is not None]
        if not states:
            if _missing(found) < 2:
                raise StorageError("; ".join(problems))
            states = [HardState()]  # a fresh group: neither copy was ever written
        elif problems:
            # A crash between the first save's two replaces leaves one copy missing; a
            # damaged copy is the disk's fault. Either way the other copy answers.
            log.warning("%s; the other copy answers and the next save rewrites it", problems[0])
        for path, (state, _) in found.items():
            if state is None:
                self._records[path] = 0
        # A crash between the two copies' saves leaves one a save ahead: the newer wins.
        self._last = max(states, key=lambda hs: (hs.term, hs.vote is not None))
        return self._last

    def _read(self, path: str) -> tuple[HardState | None, str | None]:
        """(state, None), or (None, what is wrong with the file)."""
        if not self.files.exists(path):
            return None, f"{path} is missing"
        data = read_whole_file(self.files, path)
        if not data:
            return None, f"corrupt hard state {path}: empty"
        try:
            state = decode_hard_state_file(data, path=path)
        except StorageError as error:
            return None, str(error)
        self._records[path] = len(data) // _FILE_BYTES
        return state, None

    def save(self, hard_state: HardState) -> None:
        self._check_order(hard_state)
        data = encode_hard_state(hard_state)
        assert decode_hard_state(data, path=self.path) == hard_state
        for path in (self.path, self.copy_path):
            write_file_atomically(self.files, path, data)
            self._records[path] = 1
        self._last = hard_state

    def begin_save(self, hard_state: HardState) -> HardStateWrite:
        """Start saving `hard_state`; the returned write's `finish`, run on a disk thread,
        makes it durable in both copies. Usually an append to each (buffered here; `finish`
        only fdatasyncs); the first save of a copy, or of a full one, is an atomic replace
        done entirely by `finish` (creating and renaming files here would wait on the file
        system's journal, on the event loop)."""
        self._check_order(hard_state)
        data = encode_hard_state(hard_state)
        assert decode_hard_state(data, path=self.path) == hard_state
        self._last = hard_state  # the next save is checked against this one
        write = HardStateWrite(self.files, data)
        try:
            for path in (self.path, self.copy_path):
                write.add(path, self._begin_copy(path, data))
        except BaseException:
            write.abandon()
            raise
        return write

    def _begin_copy(self, path: str, data: bytes) -> FileHandle | None:
        """Append `data` to the copy at `path` (its handle), or None: replace it whole."""
        records = self._records[path]
        if records == 0 or records >= HARD_STATE_RECORDS_MAX:
            self._records[path] = 1
            return None
        handle = self.files.open(path)
        try:
            complete_bytes = records * _FILE_BYTES
            if handle.size_bytes() < complete_bytes:
                raise StorageError(f"corrupt hard state {path}: shrank to {handle.size_bytes()}")
            if handle.size_bytes() > complete_bytes:
                # The partial tail of an append a crash cut short: records must stay aligned.
                handle.truncate(complete_bytes)
            handle.append([data])
        except BaseException:
            handle.close()
            raise
        self._records[path] = records + 1
        return handle

    def _check_order(self, hard_state: HardState) -> None:
        # Raft §5.1: currentTerm only increases; a vote changes only with the term.
        last = self._last
        assert (
            last is None
            or hard_state.term > last.term
            or (hard_state.term == last.term and last.vote in (None, hard_state.vote))
        ), f"{self.path}: hard state {last} may not become {hard_state}"


def _missing(found: dict[str, tuple[HardState | None, str | None]]) -> int:
    return sum(1 for _, problem in found.values() if problem and problem.endswith("is missing"))


class HardStateWrite:
    """The durable half of `FileHardStateStore.begin_save`: for each copy, fdatasync an
    appended record, or replace the file atomically (write_file_atomically) when there was
    nothing to append to."""

    __slots__ = ("_copies", "_data", "_done", "_files")

    def __init__(self, files: FileSystem, data: bytes) -> None:
        self._files = files
        self._data = data
        self._copies: list[tuple[str, FileHandle | None]] = []  # None: replace the file
        self._done = False

    def add(self, path: str, handle: FileHandle | None) -> None:
        self._copies.append((path, handle))

    def abandon(self) -> None:
        for _, handle in self._copies:
            if handle is not None:
                handle.close()
        self._copies = []

    def finish(self) -> None:
        """Run on a disk thread; a crash before it returns leaves the old state in place in
        a copy not yet synced (an appended record is then a partial or complete tail; a
        partial one is ignored)."""
        assert not self._done, "hard state write finished twice"
        assert len(self._copies) == 2, self._copies
        try:
            for path, handle in self._copies:
                if handle is None:
                    write_file_atomically(self._files, path, self._data)
                else:
                    handle.sync()
        finally:
            self.abandon()
        self._done = True
