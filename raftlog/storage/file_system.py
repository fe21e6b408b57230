"""The file-system port: how the log touches files, and the operating system's implementation.

Theory of operation. The segmented log and the hard-state store never call `os` directly;
they go through a `FileSystem` (paths, directories) and the `FileHandle`s it opens.
`OsFileSystem` is the real thing: appends use `os.writev`, reads `os.pread`, syncs
`os.fdatasync` (the size of the file is metadata needed to read it back, so fdatasync covers
appends and truncations), and directory syncs `fsync` an `O_RDONLY` descriptor of the folder.
Its twins: `raftlog.storage.sim_file_system` (a model of a POSIX file system under power
loss, for the simulator and the tests) and `raftlog.storage.chaos_file_system` (the real one
plus a record of what is durable, for nodes started with --chaos).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Protocol

from raftlog.errors import StorageError

__all__ = [
    "DATA_DIRECTORY_MODE",
    "DATA_FILE_MODE",
    "Buffer",
    "FileHandle",
    "FileSystem",
    "OsFileSystem",
    "read_whole_file",
    "write_file_atomically",
]

Buffer = bytes | bytearray | memoryview
# os.writev takes at most IOV_MAX buffers per call (1024 on Linux).
_IOV_MAX = 1024


class FileHandle(Protocol):
    """An open file. Writes append, except `write_at`, which overwrites a small record in
    place (the durable mark's slots); truncation shortens."""

    @property
    def path(self) -> str: ...

    def append(self, buffers: Sequence[Buffer]) -> None:
        """Write `buffers`, in order, at the end of the file (not durable until `sync`)."""
        ...

    def read_at(self, size_bytes: int, position: int) -> bytes:
        """Up to `size_bytes` bytes from `position`; shorter only at the end of the file."""
        ...

    def write_at(self, data: Buffer, position: int) -> None:
        """Overwrite `data` at `position`, inside the file (not durable until `sync`)."""
        ...

    def size_bytes(self) -> int: ...

    def sync(self) -> None:
        """Make every write and truncation so far durable."""
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


class _OsFileHandle:
    def __init__(self, path: str, fd: int) -> None:
        self._path = path
        self._fd = fd
        # pwrite on an O_APPEND descriptor appends (Linux): overwrites use a second one,
        # opened on first use. fdatasync on either covers the file.
        self._overwrite_fd = -1

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

    def write_at(self, data: Buffer, position: int) -> None:
        view = memoryview(data).cast("B")
        assert position >= 0 and position + len(view) <= self.size_bytes(), (position, self)
        with _os_errors(self._path, "overwrite"):
            if self._overwrite_fd < 0:
                self._descriptor()
                flags = os.O_WRONLY | getattr(os, "O_CLOEXEC", 0)
                self._overwrite_fd = os.open(self._path, flags)
            written = 0
            while written < len(view):
                written += os.pwrite(self._overwrite_fd, view[written:], position + written)

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
        if self._overwrite_fd >= 0:
            os.close(self._overwrite_fd)
            self._overwrite_fd = -1
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


# Modes of the data files and directories a node creates: owner-only (a log holds a
# company's data).
DATA_FILE_MODE = 0o600
DATA_DIRECTORY_MODE = 0o700


class OsFileSystem:
    def open(self, path: str, *, create: bool = False) -> FileHandle:
        flags = os.O_RDWR | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        if create:
            flags |= os.O_CREAT
        try:
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
