"""The chaos file system: the real one, plus a record of what a power loss would leave.

Theory of operation. A node started with --chaos wraps its `OsFileSystem` in
`ChaosFileSystem`, which keeps a manifest beside the data (`DURABILITY_MANIFEST_NAME`) of
what is durable: each file's length at its last sync and the directory entries made durable.
After a SIGKILL the chaos suite calls `cut_to_durable` to cut the files back to that, as a
crash that loses unsynced writes would. See `ChaosFileSystem` for why the manifest itself
needs no fsync and for the deliberately unsafe node (`skip_sync`).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from raftlog.errors import StorageError
from raftlog.storage.file_system import Buffer, FileHandle, FileSystem, read_whole_file

__all__ = [
    "DURABILITY_MANIFEST_NAME",
    "UNSAFE_UNSYNCED_DIRECTORY",
    "ChaosFileSystem",
    "CutReport",
    "DurabilityManifest",
    "cut_to_durable",
    "load_durability_manifest",
]

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
