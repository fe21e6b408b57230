"""A simulated file system: a model of a POSIX file system under power loss.

Theory of operation. Every file keeps its *durable* bytes (as of its last sync) and its
*current* bytes (what reads see); every directory keeps its durable and current name tables
(creations, renames and removals become durable with `sync_directory`). `crash()` throws away
everything not synced: the name tables revert, each file reverts to its durable bytes or,
when its unsynced change was an append, keeps a torn prefix of the appended bytes. Choices
come from a seeded `random.Random`, so a failing test replays from its seed. It implements
the `raftlog.storage.file_system.FileSystem` port; conformance tests hold it to the real one.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from raftlog.errors import StorageError
from raftlog.storage.file_system import Buffer, FileHandle

__all__ = ["SimFileSystem"]


@dataclass(eq=False)
class _SimFile:
    current: bytearray = field(default_factory=bytearray)
    durable: bytearray = field(default_factory=bytearray)


class _SimFileHandle:
    def __init__(self, fs: SimFileSystem, path: str, file: _SimFile) -> None:
        self._fs = fs
        self._path = path
        self._file = file
        self._generation = fs.generation

    @property
    def path(self) -> str:
        return self._path

    def _check(self) -> _SimFile:
        # A handle from before a crash belongs to a process that no longer exists.
        if self._generation != self._fs.generation:
            raise StorageError(f"{self._path}: handle used after a simulated crash")
        return self._file

    def append(self, buffers: Sequence[Buffer]) -> None:
        current = self._check().current
        for buffer in buffers:
            current += buffer

    def read_at(self, size_bytes: int, position: int) -> bytes:
        assert size_bytes >= 0 and position >= 0, (size_bytes, position)
        return bytes(self._check().current[position : position + size_bytes])

    def write_at(self, data: Buffer, position: int) -> None:
        current = self._check().current
        assert position >= 0 and position + len(data) <= len(current), (position, self._path)
        current[position : position + len(data)] = data

    def size_bytes(self) -> int:
        return len(self._check().current)

    def sync(self) -> None:
        file = self._check()
        file.durable = bytearray(file.current)
        self._fs.sync_count += 1

    def truncate(self, size_bytes: int) -> None:
        assert size_bytes >= 0, size_bytes
        file = self._check()
        if size_bytes <= len(file.current):
            del file.current[size_bytes:]
        else:
            file.current += bytes(size_bytes - len(file.current))

    def close(self) -> None:
        pass


class SimFileSystem:
    """An in-memory file system that can lose everything not synced (see the module doc)."""

    def __init__(self, seed: int = 0) -> None:
        self.random = random.Random(seed)
        self.generation = 0
        self.sync_count = 0
        self._current: dict[str, _SimFile] = {}
        self._durable: dict[str, _SimFile] = {}
        self._directories: set[str] = set()

    def open(self, path: str, *, create: bool = False) -> FileHandle:
        path = os.path.normpath(path)
        file = self._current.get(path)
        if file is None:
            if not create or os.path.dirname(path) not in self._directories:
                raise StorageError(f"cannot open {path}: no such file or directory")
            file = self._current[path] = _SimFile()
        return _SimFileHandle(self, path, file)

    def exists(self, path: str) -> bool:
        path = os.path.normpath(path)
        return path in self._current or path in self._directories

    def list_directory(self, directory: str) -> list[str]:
        directory = os.path.normpath(directory)
        return sorted(os.path.basename(p) for p in self._current if os.path.dirname(p) == directory)

    def make_directory(self, directory: str) -> None:
        directory = os.path.normpath(directory)
        while directory not in self._directories and directory not in ("/", ""):
            self._directories.add(directory)  # directories are durable at once: a simplification
            directory = os.path.dirname(directory)

    def remove(self, path: str) -> None:
        path = os.path.normpath(path)
        if self._current.pop(path, None) is None:
            raise StorageError(f"cannot remove {path}: no such file")

    def rename(self, source: str, target: str) -> None:
        source, target = os.path.normpath(source), os.path.normpath(target)
        file = self._current.pop(source, None)
        if file is None:
            raise StorageError(f"cannot rename {source}: no such file")
        self._current[target] = file

    def sync_directory(self, directory: str) -> None:
        directory = os.path.normpath(directory)
        for path in [p for p in self._durable if os.path.dirname(p) == directory]:
            del self._durable[path]
        for path, file in self._current.items():
            if os.path.dirname(path) == directory:
                self._durable[path] = file
        self.sync_count += 1

    def crash(self, *, torn: bool | None = None) -> None:
        """Lose everything not synced. `torn` None: each file picks lost or torn at random."""
        self.generation += 1
        self._current = dict(self._durable)
        crashed: set[int] = set()
        for path in sorted(self._current):  # a fixed order, so a seed replays exactly
            file = self._current[path]
            if id(file) not in crashed:
                crashed.add(id(file))
                _crash_file(file, self.random, torn)

    def corrupt(self, path: str, position: int, data: bytes) -> None:
        """Overwrite bytes in place, durably (a test's model of bit rot or a bad sector)."""
        file = self._current[os.path.normpath(path)]
        assert position + len(data) <= len(file.current), (path, position)
        file.current[position : position + len(data)] = data
        file.durable = bytearray(file.current)

    def file_bytes(self, path: str) -> bytes:
        return bytes(self._current[os.path.normpath(path)].current)


def _crash_file(file: _SimFile, rng: random.Random, torn: bool | None) -> None:
    unsynced = len(file.current) - len(file.durable)
    appended = unsynced > 0 and file.current.startswith(file.durable)
    keep_torn = rng.random() < 0.5 if torn is None else torn
    if appended and keep_torn:
        # A torn write: the disk got some prefix of the unsynced appends.
        del file.current[len(file.durable) + rng.randrange(unsynced + 1) :]
    else:
        file.current = bytearray(file.durable)
    assert file.current.startswith(file.durable), "a crash never loses synced bytes"
