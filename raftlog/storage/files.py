"""Ports for the effects the log has on the world: files and the wall clock.

Theory of operation. The segmented log and the hard-state store never call `os` directly;
they go through a `FileSystem` (paths, directories) and the `FileHandle`s it opens. Two
implementations exist:

* `OsFileSystem`: the real thing. Appends use `os.writev`, reads `os.pread`, syncs
  `os.fdatasync` (the size of the file is metadata needed to read it back, so fdatasync covers
  appends and truncations), and directory syncs `fsync` an `O_RDONLY` descriptor of the folder.
* `SimFileSystem`: a model of a POSIX file system under power loss. Every file keeps its
  *durable* bytes (as of its last sync) and its *current* bytes (what reads see); every
  directory keeps its durable and current name tables (creations, renames and removals
  become durable with `sync_directory`). `crash()` throws away everything not synced: the
  name tables revert, each file reverts to its durable bytes or, when its unsynced change was
  an append, keeps a torn prefix of the appended bytes. Choices come from a seeded
  `random.Random`, so a failing test replays from its seed.

The `Clock` port gives wall-clock milliseconds (segment age, retention); `ManualClock` is
the simulated one.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from raftlog.errors import StorageError

__all__ = [
    "DATA_DIRECTORY_MODE",
    "DATA_FILE_MODE",
    "Buffer",
    "Clock",
    "FileHandle",
    "FileSystem",
    "ManualClock",
    "OsFileSystem",
    "SimFileSystem",
    "SystemClock",
    "read_whole_file",
    "write_file_atomically",
]

Buffer = bytes | bytearray | memoryview
# os.writev takes at most IOV_MAX buffers per call (1024 on Linux).
_IOV_MAX = 1024


class FileHandle(Protocol):
    """An open file. Writes only ever append; truncation shortens."""

    @property
    def path(self) -> str: ...

    def append(self, buffers: Sequence[Buffer]) -> None:
        """Write `buffers`, in order, at the end of the file (not durable until `sync`)."""
        ...

    def read_at(self, size_bytes: int, position: int) -> bytes:
        """Up to `size_bytes` bytes from `position`; shorter only at the end of the file."""
        ...

    def size_bytes(self) -> int: ...

    def sync(self) -> None:
        """Make every append and truncation so far durable."""
        ...

    def truncate(self, size_bytes: int) -> None: ...

    def close(self) -> None: ...


class FileSystem(Protocol):
    def open(self, path: str, *, create: bool = False) -> FileHandle:
        """Open `path` for reading and appending; create it empty when `create` and absent."""
        ...

    def exists(self, path: str) -> bool: ...

    def list_directory(self, directory: str) -> list[str]:
        """Names (not paths) in `directory`, sorted."""
        ...

    def make_directory(self, directory: str) -> None:
        """Create `directory` and its parents if absent (durably)."""
        ...

    def remove(self, path: str) -> None: ...

    def rename(self, source: str, target: str) -> None:
        """Atomically replace `target` by `source` (durable after `sync_directory`)."""
        ...

    def sync_directory(self, directory: str) -> None: ...


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock time in milliseconds since the Unix epoch."""
        ...


# --- the real implementations ----------------------------------------------------------


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class _OsFileHandle:
    def __init__(self, path: str, fd: int) -> None:
        self._path = path
        self._fd = fd

    @property
    def path(self) -> str:
        return self._path

    def _descriptor(self) -> int:
        if self._fd < 0:
            raise StorageError(f"{self._path} is closed")
        return self._fd

    def append(self, buffers: Sequence[Buffer]) -> None:
        # The descriptor is O_APPEND; loop because writev may write less than asked.
        pending = [memoryview(b).cast("B") for b in buffers if len(b)]
        total_bytes = sum(len(view) for view in pending)
        first = 0
        with _os_errors(self._path, "append to"):
            while first < len(pending):
                written = os.writev(self._descriptor(), pending[first : first + _IOV_MAX])
                total_bytes -= written
                while first < len(pending) and written >= len(pending[first]):
                    written -= len(pending[first])
                    first += 1
                if written:
                    pending[first] = pending[first][written:]
        assert total_bytes == 0, f"{self._path}: {total_bytes} bytes left unwritten"

    def read_at(self, size_bytes: int, position: int) -> bytes:
        assert size_bytes >= 0 and position >= 0, (size_bytes, position)
        with _os_errors(self._path, "read"):
            return self._read_at(size_bytes, position)

    def _read_at(self, size_bytes: int, position: int) -> bytes:
        data = os.pread(self._descriptor(), size_bytes, position)
        if len(data) == size_bytes or not data:
            return data
        parts = [data]  # a short read before the end of file: keep reading
        got = len(data)
        while got < size_bytes:
            more = os.pread(self._descriptor(), size_bytes - got, position + got)
            if not more:
                break
            parts.append(more)
            got += len(more)
        return b"".join(parts)

    def size_bytes(self) -> int:
        return os.fstat(self._descriptor()).st_size

    def sync(self) -> None:
        # A failed fdatasync may have dropped the dirty pages (Linux): never retried, the
        # error reaches the owner, which must stop using the log.
        with _os_errors(self._path, "fdatasync"):
            os.fdatasync(self._descriptor())

    def truncate(self, size_bytes: int) -> None:
        assert size_bytes >= 0, size_bytes
        with _os_errors(self._path, "truncate"):
            os.ftruncate(self._descriptor(), size_bytes)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


@contextlib.contextmanager
def _os_errors(path: str, action: str) -> Iterator[None]:
    """Turn an OSError into a StorageError that names the file and what failed."""
    try:
        yield
    except OSError as error:
        raise StorageError(f"cannot {action} {path}: {error.strerror or error}") from error


# Modes of the data files and directories a node creates (issue 10): owner-only.
DATA_FILE_MODE = 0o600
DATA_DIRECTORY_MODE = 0o700


class OsFileSystem:
    def open(self, path: str, *, create: bool = False) -> FileHandle:
        flags = os.O_RDWR | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        if create:
            flags |= os.O_CREAT
        try:
            # Owner-only (issue 10): a log holds a company's data.
            return _OsFileHandle(path, os.open(path, flags, DATA_FILE_MODE))
        except OSError as error:
            raise StorageError(f"cannot open {path}: {error.strerror}") from error

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def list_directory(self, directory: str) -> list[str]:
        return sorted(os.listdir(directory))

    def make_directory(self, directory: str) -> None:
        if not os.path.isdir(directory):
            os.makedirs(directory, mode=DATA_DIRECTORY_MODE, exist_ok=True)
            self.sync_directory(os.path.dirname(os.path.abspath(directory)))

    def remove(self, path: str) -> None:
        os.remove(path)

    def rename(self, source: str, target: str) -> None:
        os.replace(source, target)

    def sync_directory(self, directory: str) -> None:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# --- the simulated implementations -----------------------------------------------------


@dataclass
class ManualClock:
    """A clock that moves only when told to."""

    time_ms: int = 0

    def now_ms(self) -> int:
        return self.time_ms

    def advance(self, delta_ms: int) -> None:
        assert delta_ms >= 0, delta_ms
        self.time_ms += delta_ms


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


# --- helpers over the port ---------------------------------------------------------------


def write_file_atomically(files: FileSystem, path: str, data: bytes) -> None:
    """Replace `path` by `data` so a crash leaves either the old or the new file, never a mix:
    write a temporary file, sync it, rename it over `path`, sync the directory."""
    temporary = path + ".tmp"
    if files.exists(temporary):
        files.remove(temporary)
    handle = files.open(temporary, create=True)
    try:
        handle.append([data])
        handle.sync()
    finally:
        handle.close()
    files.rename(temporary, path)
    files.sync_directory(os.path.dirname(path) or ".")


def read_whole_file(files: FileSystem, path: str) -> bytes:
    handle = files.open(path)
    try:
        return handle.read_at(handle.size_bytes(), 0)
    finally:
        handle.close()
