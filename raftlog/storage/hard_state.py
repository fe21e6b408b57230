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
"""

from __future__ import annotations

import os
import struct

from raftlog.errors import StorageError
from raftlog.raft.types import HardState
from raftlog.storage.batch import crc32c
from raftlog.storage.files import FileSystem, OsFileSystem, read_whole_file, write_file_atomically
from raftlog.types import NodeId, Term

__all__ = ["HARD_STATE_FILE_NAME", "FileHardStateStore", "decode_hard_state", "encode_hard_state"]

HARD_STATE_FILE_NAME = "hard-state"
_MAGIC = b"RLHS"
_VERSION = 1
_BODY = struct.Struct(">4sBQq")
_TAIL = struct.Struct(">II")
_FILE_BYTES = _BODY.size + _TAIL.size
_NO_VOTE = -1


def encode_hard_state(hard_state: HardState) -> bytes:
    assert hard_state.term >= 0, hard_state
    assert hard_state.vote is None or hard_state.vote >= 0, hard_state
    vote = _NO_VOTE if hard_state.vote is None else hard_state.vote
    body = _BODY.pack(_MAGIC, _VERSION, hard_state.term, vote)
    return body + _TAIL.pack(crc32c(body), 0)


def decode_hard_state(data: bytes, *, path: str) -> HardState:
    """Parse the file's bytes; raises StorageError naming `path` and what is wrong."""
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

    def load(self) -> HardState:
        if not self.files.exists(self.path):
            self._last = HardState()
        else:
            self._last = decode_hard_state(read_whole_file(self.files, self.path), path=self.path)
        return self._last

    def save(self, hard_state: HardState) -> None:
        # Raft §5.1: currentTerm only increases; a vote changes only with the term.
        last = self._last
        assert (
            last is None
            or hard_state.term > last.term
            or (hard_state.term == last.term and last.vote in (None, hard_state.vote))
        ), f"{self.path}: hard state {last} may not become {hard_state}"
        data = encode_hard_state(hard_state)
        write_file_atomically(self.files, self.path, data)
        assert decode_hard_state(data, path=self.path) == hard_state
        self._last = hard_state
