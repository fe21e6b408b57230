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

A missing file is a fresh node (term 0, no vote); a file that fails any check raises
`StorageError` naming it, because silently forgetting a vote could elect two leaders.

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

import os
import struct

from raftlog.errors import StorageError
from raftlog.raft.types import HardState
from raftlog.storage.batch import crc32c
from raftlog.storage.files import (
    FileHandle,
    FileSystem,
    OsFileSystem,
    read_whole_file,
    write_file_atomically,
)
from raftlog.types import NodeId, Term

__all__ = [
    "HARD_STATE_FILE_NAME",
    "FileHardStateStore",
    "HardStateWrite",
    "decode_hard_state",
    "decode_hard_state_file",
    "encode_hard_state",
]

HARD_STATE_FILE_NAME = "hard-state"
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
    """`raftlog.raft.ports.HardStateStore` over one file in `directory`."""

    def __init__(self, directory: str | os.PathLike[str], *, files: FileSystem | None = None):
        self.directory = os.fspath(directory)
        self.files = files or OsFileSystem()
        self.path = os.path.join(self.directory, HARD_STATE_FILE_NAME)
        self.files.make_directory(self.directory)
        self._last: HardState | None = None  # what this store last loaded or saved
        self._records = 0  # records in the file (appends grow it, `save` rewrites it)

    def load(self) -> HardState:
        if not self.files.exists(self.path):
            self._last = HardState()
            self._records = 0
        else:
            data = read_whole_file(self.files, self.path)
            self._last = decode_hard_state_file(data, path=self.path) if data else HardState()
            self._records = len(data) // _FILE_BYTES
        return self._last

    def save(self, hard_state: HardState) -> None:
        self._check_order(hard_state)
        data = encode_hard_state(hard_state)
        write_file_atomically(self.files, self.path, data)
        assert decode_hard_state(data, path=self.path) == hard_state
        self._last = hard_state
        self._records = 1

    def begin_save(self, hard_state: HardState) -> HardStateWrite:
        """Start saving `hard_state`; the returned write's `finish`, run on a disk thread,
        makes it durable. Usually an append (buffered here; `finish` only fdatasyncs); the
        first save of a fresh store, or of a full file, is an atomic replace done entirely
        by `finish` (creating and renaming files here would wait on the file system's
        journal, on the event loop)."""
        self._check_order(hard_state)
        data = encode_hard_state(hard_state)
        assert decode_hard_state(data, path=self.path) == hard_state
        self._last = hard_state  # the next save is checked against this one
        if self._records == 0 or self._records >= HARD_STATE_RECORDS_MAX:
            self._records = 1
            return HardStateWrite(self.files, None, self.path, data)
        handle = self.files.open(self.path)
        try:
            complete_bytes = self._records * _FILE_BYTES
            assert handle.size_bytes() >= complete_bytes, self.path
            if handle.size_bytes() > complete_bytes:
                # The partial tail of an append a crash cut short: records must stay aligned.
                handle.truncate(complete_bytes)
            handle.append([data])
        except BaseException:
            handle.close()
            raise
        self._records += 1
        return HardStateWrite(self.files, handle, self.path, data)

    def _check_order(self, hard_state: HardState) -> None:
        # Raft §5.1: currentTerm only increases; a vote changes only with the term.
        last = self._last
        assert (
            last is None
            or hard_state.term > last.term
            or (hard_state.term == last.term and last.vote in (None, hard_state.vote))
        ), f"{self.path}: hard state {last} may not become {hard_state}"


class HardStateWrite:
    """The durable half of `FileHardStateStore.begin_save`: fdatasync an appended record,
    or replace the file atomically (write_file_atomically) when there was nothing to append
    to."""

    __slots__ = ("_data", "_done", "_files", "_handle", "_path")

    def __init__(
        self, files: FileSystem, handle: FileHandle | None, path: str, data: bytes
    ) -> None:
        self._files = files
        self._handle = handle  # None: replace the file
        self._path = path
        self._data = data
        self._done = False

    def finish(self) -> None:
        """Run on a disk thread; a crash before it returns leaves the old state in place
        (an appended record is then a partial or complete tail; a partial one is ignored)."""
        assert not self._done, f"{self._path}: write finished twice"
        if self._handle is None:
            write_file_atomically(self._files, self._path, self._data)
        else:
            try:
                self._handle.sync()
            finally:
                self._handle.close()
        self._done = True
