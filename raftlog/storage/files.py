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
import json
import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from raftlog.errors import StorageError

__all__ = [
    "DATA_DIRECTORY_MODE",
    "DATA_FILE_MODE",
    "DURABILITY_MANIFEST_NAME",
    "UNSAFE_UNSYNCED_DIRECTORY",
    "Buffer",
    "ChaosFileSystem",
    "Clock",
    "CutReport",
    "DurabilityManifest",
    "FileHandle",
    "FileSystem",
    "ManualClock",
    "OsFileSystem",
    "SimFileSystem",
    "SystemClock",
    "cut_to_durable",
    "load_durability_manifest",
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


# --- the chaos wrapper: what a crash that loses unsynced writes would leave (issue 8) -------

# The manifest's name in a node's data directory (only nodes started with --chaos write it).
DURABILITY_MANIFEST_NAME = "chaos-durability.json"
# Where the unsafe node (ChaosFileSystem skip_sync) never syncs: its partition logs.
UNSAFE_UNSYNCED_DIRECTORY = "partitions"


@dataclass
class DurabilityManifest:
    """What of a node's files would survive a power loss right now, as JSON-able data.

    `files` maps each path the node has (relative to the manifest's directory) to its file
    identity and its durable length: its size at its last sync, lowered by any truncation
    since (the truncation may reach the disk, the appends after it may not). `durable_names`
    maps each path whose directory entry was made durable (by `sync_directory`, or because
    the file predates the manifest) to the identity it names. `pending_rename` is a rename
    announced but maybe not done when the node died (`cut_to_durable` checks the disk).
    """

    files: dict[str, tuple[int, int]] = field(default_factory=dict)  # path: (id, durable bytes)
    durable_names: dict[str, int] = field(default_factory=dict)
    next_id: int = 0
    pending_rename: tuple[str, str] | None = None

    def encode(self) -> bytes:
        return json.dumps(
            {
                "files": {p: list(v) for p, v in sorted(self.files.items())},
                "durable_names": dict(sorted(self.durable_names.items())),
                "next_id": self.next_id,
                "pending_rename": self.pending_rename,
            }
        ).encode()

    @classmethod
    def decode(cls, data: bytes, *, path: str) -> DurabilityManifest:
        try:
            raw = json.loads(data)
            pending = raw["pending_rename"]
            return cls(
                files={str(p): (int(v[0]), int(v[1])) for p, v in raw["files"].items()},
                durable_names={str(p): int(i) for p, i in raw["durable_names"].items()},
                next_id=int(raw["next_id"]),
                pending_rename=None if pending is None else (str(pending[0]), str(pending[1])),
            )
        except (ValueError, KeyError, TypeError, IndexError) as error:
            raise StorageError(f"{path}: not a durability manifest: {error!r}") from error

    def register(self, path: str, *, size_bytes: int, durable_name: bool) -> None:
        """A file not seen before: new (nothing durable) or found on disk (all durable)."""
        file_id = self.next_id
        self.next_id += 1
        self.files[path] = (file_id, size_bytes)
        if durable_name:
            self.durable_names[path] = file_id

    def path_of(self, file_id: int) -> str | None:
        return next((p for p, (i, _) in self.files.items() if i == file_id), None)

    def synced(self, file_id: int, size_bytes: int) -> None:
        path = self.path_of(file_id)
        if path is not None:  # else removed while open: nothing of it survives
            self.files[path] = (file_id, size_bytes)

    def truncated(self, file_id: int, size_bytes: int) -> None:
        path = self.path_of(file_id)
        if path is not None:
            self.files[path] = (file_id, min(self.files[path][1], size_bytes))

    def renamed(self, source: str, target: str) -> None:
        self.files[target] = self.files.pop(source)
        self.pending_rename = None

    def removed(self, path: str) -> None:
        # Its durable name stays: the file was durable, but its bytes are gone from the disk
        # (the cut cannot bring it back; a real crash might).
        self.files.pop(path, None)

    def directory_synced(self, directory: str) -> None:
        directory = "" if directory == "." else directory  # the root, as dirname gives it
        for path in [p for p in self.durable_names if os.path.dirname(p) == directory]:
            del self.durable_names[path]
        for path, (file_id, _) in self.files.items():
            if os.path.dirname(path) == directory:
                self.durable_names[path] = file_id


class _ChaosFileHandle:
    """An `_OsFileHandle` (or any handle) whose syncs and truncations the manifest records."""

    def __init__(
        self, owner: ChaosFileSystem, inner: FileHandle, file_id: int, *, skip_sync: bool
    ) -> None:
        self._owner = owner
        self._inner = inner
        self._file_id = file_id  # not its path: a rename while open must not lose track
        self._skip_sync = skip_sync

    @property
    def path(self) -> str:
        return self._inner.path

    def append(self, buffers: Sequence[Buffer]) -> None:
        self._inner.append(buffers)

    def read_at(self, size_bytes: int, position: int) -> bytes:
        return self._inner.read_at(size_bytes, position)

    def write_at(self, data: Buffer, position: int) -> None:
        # In place, inside the synced length: a cut to the durable size keeps the bytes
        # (what a power loss after the write's own fsync would, too; the mark it serves
        # never claims more than is synced).
        self._inner.write_at(data, position)

    def size_bytes(self) -> int:
        return self._inner.size_bytes()

    def sync(self) -> None:
        if self._skip_sync:
            return  # the deliberately unsafe node: the bytes stay in the page cache only
        # The size before the sync: the sync covers every byte written by then, while bytes
        # the loop appends during a sync on a disk thread are not covered.
        size_bytes = self._inner.size_bytes()
        self._inner.sync()
        # Recorded after the sync returns and before the caller can act on it (acknowledge,
        # vote): a kill in between understates what is durable, which loses nothing acked.
        self._owner.record(lambda m: m.synced(self._file_id, size_bytes))

    def truncate(self, size_bytes: int) -> None:
        # Recorded first: a kill in between cuts to the shorter length, a legal outcome.
        self._owner.record(lambda m: m.truncated(self._file_id, size_bytes))
        self._inner.truncate(size_bytes)

    def close(self) -> None:
        self._inner.close()


class ChaosFileSystem:
    """A `FileSystem` for nodes started with --chaos: `inner` does the work, and a manifest
    beside the data (`DURABILITY_MANIFEST_NAME` in `root`) records what is durable, so the
    chaos suite can kill the node and cut its files back to that (`cut_to_durable`).

    The manifest is rewritten (temporary file, rename; no fsync) after every change of what
    is durable. It needs no fsync: the fault it serves is SIGKILL, after which the kernel
    still writes out the page cache; only the node's own syncs model a power loss.
    `skip_sync` makes the deliberately unsafe node of the suite: the appended files of its
    partition logs (under `UNSAFE_UNSYNCED_DIRECTORY`) are never synced, so it acknowledges
    writes before they are durable (as Kafka does by default, trusting replication). Its
    metadata log and its atomically replaced small files (hard state, checkpoints) stay
    honest, so a cut node still starts: it just comes back without those writes.
    """

    def __init__(self, inner: FileSystem, root: str, *, skip_sync: bool = False) -> None:
        self._inner = inner
        self.root = os.path.abspath(root)
        self.skip_sync = skip_sync
        self.manifest_path = os.path.join(self.root, DURABILITY_MANIFEST_NAME)
        self.manifest = load_durability_manifest(inner, self.manifest_path)
        self._lock = threading.Lock()

    def _key(self, path: str) -> str:
        return os.path.relpath(os.path.abspath(path), self.root)

    def record(self, change: Callable[[DurabilityManifest], None]) -> None:
        # Syncs run on disk threads (several at once) while the loop opens and renames.
        with self._lock:
            change(self.manifest)
            temporary = self.manifest_path + ".tmp"
            handle = self._inner.open(temporary, create=True)
            try:
                handle.truncate(0)
                handle.append([self.manifest.encode()])
            finally:
                handle.close()
            self._inner.rename(temporary, self.manifest_path)

    def _known(self, path: str) -> str:
        """The manifest key of an existing file, registering it (as durable) if unseen."""
        key = self._key(path)
        if key not in self.manifest.files:
            size_bytes = _size_of(self._inner, path)
            self.record(lambda m: m.register(key, size_bytes=size_bytes, durable_name=True))
        return key

    def open(self, path: str, *, create: bool = False) -> FileHandle:
        if self._inner.exists(path):
            key = self._known(path)
        else:
            key = self._key(path)
            if create:  # recorded first: a kill before the manifest write leaves no stray file
                self.record(lambda m: m.register(key, size_bytes=0, durable_name=False))
        inner = self._inner.open(path, create=create)  # raises for a missing file
        skip_sync = (
            self.skip_sync
            and key.startswith(UNSAFE_UNSYNCED_DIRECTORY + os.sep)
            and not key.endswith(".tmp")
        )
        return _ChaosFileHandle(self, inner, self.manifest.files[key][0], skip_sync=skip_sync)

    def exists(self, path: str) -> bool:
        return self._inner.exists(path)

    def list_directory(self, directory: str) -> list[str]:
        names = self._inner.list_directory(directory)
        if os.path.abspath(directory) == self.root:
            hidden = {DURABILITY_MANIFEST_NAME, DURABILITY_MANIFEST_NAME + ".tmp"}
            names = [name for name in names if name not in hidden]
        return names

    def make_directory(self, directory: str) -> None:
        self._inner.make_directory(directory)

    def remove(self, path: str) -> None:
        self._inner.remove(path)
        self.record(lambda m: m.removed(self._key(path)))

    def rename(self, source: str, target: str) -> None:
        source_key, target_key = self._known(source), self._key(target)

        def announce(m: DurabilityManifest) -> None:
            m.pending_rename = (source_key, target_key)

        self.record(announce)
        self._inner.rename(source, target)
        self.record(lambda m: m.renamed(source_key, target_key))

    def sync_directory(self, directory: str) -> None:
        self._inner.sync_directory(directory)
        self.record(lambda m: m.directory_synced(self._key(directory)))


def _size_of(files: FileSystem, path: str) -> int:
    handle = files.open(path)
    try:
        return handle.size_bytes()
    finally:
        handle.close()


def load_durability_manifest(files: FileSystem, path: str) -> DurabilityManifest:
    """The manifest at `path`, or an empty one (every file found is then taken as durable)."""
    if not files.exists(path):
        return DurabilityManifest()
    return DurabilityManifest.decode(read_whole_file(files, path), path=path)


@dataclass
class CutReport:
    """What `cut_to_durable` did, for the chaos history."""

    truncated: dict[str, int] = field(default_factory=dict)  # path: bytes cut off
    removed: list[str] = field(default_factory=list)  # never durably created
    restored: list[tuple[str, str]] = field(default_factory=list)  # (from, to): renames undone

    def describe(self) -> dict[str, object]:
        return {
            "bytes_cut": sum(self.truncated.values()),
            "files_truncated": len(self.truncated),
            "files_removed": len(self.removed),
            "renames_undone": len(self.restored),
        }


def cut_to_durable(files: FileSystem, root: str) -> CutReport:
    """Turn the dead node's files under `root` into what a power loss would have left, as its
    manifest knows it: renames whose directory was never synced are undone (unless the
    durable file they replaced is gone: then the rename stays, also a legal outcome), files
    whose creation was never made durable are removed, and every file is cut back to its
    durable length. Then the manifest is removed: everything left is durable."""
    manifest_path = os.path.join(root, DURABILITY_MANIFEST_NAME)
    manifest = load_durability_manifest(files, manifest_path)
    report = CutReport()

    def full(key: str) -> str:
        return os.path.join(root, key)

    if manifest.pending_rename is not None:  # the node died during a rename: did it happen?
        source, target = manifest.pending_rename
        if not files.exists(full(source)) and source in manifest.files:
            manifest.renamed(source, target)
    current = {k: v for k, v in manifest.files.items() if files.exists(full(k))}
    by_id = {file_id: key for key, (file_id, _) in current.items()}
    # final[name] = the file (by its current path) that a power loss would leave at `name`.
    final: dict[str, str] = {}
    for name, file_id in sorted(manifest.durable_names.items()):
        holder = by_id.get(file_id)
        if holder is not None and holder not in final.values():
            final[name] = holder  # the durable file, moved back if renamed since
    for name, file_id in sorted(manifest.durable_names.items()):
        if file_id not in by_id and name in current and name not in final.values():
            # The durable file was replaced by a rename and is gone from the disk: the
            # rename stands (a legal outcome too; the old bytes cannot be brought back).
            final.setdefault(name, name)
    for key in sorted(set(current) - set(final.values())):
        files.remove(full(key))  # its creation (or rename into place) never became durable
        report.removed.append(key)
    destination = {source: name for name, source in final.items()}
    # Undo renames through temporary names, so two files swapping places cannot collide.
    moves = sorted((s, t) for s, t in destination.items() if s != t)
    for source, _ in moves:
        files.rename(full(source), full(source) + ".chaos-undo")
    for source, target in moves:
        assert not files.exists(full(target)), f"{target}: every other file has moved away"
        files.rename(full(source) + ".chaos-undo", full(target))
        report.restored.append((source, target))
    for source, target in destination.items():
        durable_bytes = current[source][1]
        handle = files.open(full(target))
        try:
            extra_bytes = handle.size_bytes() - durable_bytes
            if extra_bytes > 0:
                handle.truncate(durable_bytes)
                handle.sync()
                report.truncated[target] = extra_bytes
        finally:
            handle.close()
    if files.exists(manifest_path):
        files.remove(manifest_path)
    return report
