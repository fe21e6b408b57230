"""What a JetStream server had on disk when it died: strace's record, power loss, file damage.

Theory of operation. A Go binary makes its system calls itself, so an LD_PRELOAD shim sees
nothing; instead each server runs under `strace -f -y` tracing the calls that change a
file's contents or make them durable (`raftlog.chaos.jetstream_cluster.STRACE_SYSCALLS`).
`DurabilityTracker` replays that trace over the sizes the store's files had when the server
started (all durable: the store was at rest) and keeps, per file, its `size` now and the
size its last fsync made `durable`:

    openat(O_TRUNC)             size 0, durable 0 (the truncation is taken as durable: the
                                gentler choice, it loses nothing that was synced)
    openat(O_CREAT), new file   size 0, durable 0
    write / pwrite64            size grows to the end of the write (write: at the fd's
                                position); through an O_SYNC fd durable grows with it
    fsync / fdatasync           durable = size
    ftruncate(n)                size n, durable min(durable, n)
    renameat / unlinkat         the file's record moves / goes

A write that overwrites bytes already durable is not modelled (JetStream appends to its
message blocks and replaces index files by writing a temporary one and renaming it), so the
cut is never harsher than a real power loss. `cut_to_durable` then cuts every file back to
its durable length, as a power loss would. `corrupt_one` is the file-damage fault: it picks
one message block (a stream's or a Raft log's `*.blk`; any file when there is none) and
flips bytes in its middle, truncates it or deletes it.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DurabilityTracker", "FileState", "corrupt_one", "cut_to_durable", "snapshot_sizes"]

_LINE = re.compile(r"^(?P<pid>\d+)\s+(?P<body>.*)$")
_CALL = re.compile(r"^(?P<call>\w+)\((?P<args>.*)\)\s+=\s+(?P<ret>-?\d+)(?:<(?P<ret_path>[^>]*)>)?")
_FD = re.compile(r"^(?P<fd>\d+)<(?P<path>[^>]*)>")
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
_INTS_AT_END = re.compile(r"(\d+)(?:, (\d+))?$")
_UNFINISHED = " <unfinished ...>"
_RESUMED = re.compile(r"^<\.\.\. (?P<call>\w+) resumed>(?P<rest>.*)$")
FLIP_BYTES_MAX = 8
DAMAGES = ("flip", "truncate", "delete")


@dataclass(slots=True)
class FileState:
    size: int
    durable: int

    def check(self) -> None:
        """Assert 0 <= durable <= size."""
        assert 0 <= self.durable <= self.size, (self.durable, self.size)


@dataclass(slots=True)
class _Fd:
    path: str
    position: int
    sync: bool


def snapshot_sizes(directory: Path) -> dict[str, int]:
    """Every regular file under `directory` and its size (the store at rest)."""
    return {str(p): p.stat().st_size for p in directory.rglob("*") if p.is_file()}


class DurabilityTracker:
    def __init__(self, baseline: dict[str, int]) -> None:
        self.files = {path: FileState(size, size) for path, size in baseline.items()}
        self._fds: dict[int, _Fd] = {}
        self._pending: dict[str, str] = {}  # pid -> the first half of an interrupted call

    def feed(self, lines: Iterable[str]) -> None:
        """Replay strace lines (`strace -f -y` output) over the files' sizes, joining calls strace
        split into unfinished and resumed halves; lines it does not know are skipped."""
        for line in lines:
            matched = _LINE.match(line.rstrip("\n"))
            if matched is None:
                continue
            pid, body = matched["pid"], matched["body"]
            if body.endswith(_UNFINISHED):
                self._pending[pid] = body[: -len(_UNFINISHED)]
                continue
            resumed = _RESUMED.match(body)
            if resumed is not None:
                first = self._pending.pop(pid, None)
                if first is None:
                    continue  # its first half came before the trace began
                body = first + resumed["rest"]
            self._apply(body)

    def _file(self, path: str) -> FileState:
        return self.files.setdefault(path, FileState(0, 0))

    def _apply(self, body: str) -> None:
        call = _CALL.match(body)
        if call is None or int(call["ret"]) < 0:
            return  # a failed call changed nothing
        name, args, ret = call["call"], call["args"], int(call["ret"])
        if name == "openat":
            self._open(args, ret, call["ret_path"])
            return
        if name in ("renameat", "rename"):
            paths = _QUOTED.findall(args)
            if len(paths) == 2 and paths[0] in self.files:
                self.files[paths[1]] = self.files.pop(paths[0])
            return
        if name == "unlinkat":
            paths = _QUOTED.findall(args)
            if paths:
                self.files.pop(paths[0], None)
            return
        fd_match = _FD.match(args)
        if fd_match is None:
            return
        self._on_fd(name, int(fd_match["fd"]), fd_match["path"], args, ret)

    def _open(self, args: str, fd: int, path: str | None) -> None:
        paths = _QUOTED.findall(args)
        if path is None or not paths:
            return
        flags = args.split(",")[2] if args.count(",") >= 2 else ""
        state = self._file(path)
        if "O_TRUNC" in flags:
            state.size = state.durable = 0
        position = state.size if "O_APPEND" in flags else 0
        self._fds[fd] = _Fd(path, position, "O_SYNC" in flags or "O_DSYNC" in flags)

    def _on_fd(self, name: str, fd: int, path: str, args: str, ret: int) -> None:
        known = self._fds.get(fd)
        if known is None or known.path != path:
            known = self._fds[fd] = _Fd(path, self._file(path).size, sync=False)
        state = self._file(path)
        ints = _INTS_AT_END.search(args)
        if name == "write":
            known.position += ret
            state.size = max(state.size, known.position)
        elif name == "pwrite64" and ints is not None and ints[2] is not None:
            state.size = max(state.size, int(ints[2]) + ret)
        elif name in ("fsync", "fdatasync"):
            state.durable = state.size
        elif name == "ftruncate" and ints is not None:
            state.size = int(ints[1])
            state.durable = min(state.durable, state.size)
        if known.sync and name in ("write", "pwrite64"):
            state.durable = state.size
        state.check()


def cut_to_durable(tracker: DurabilityTracker, root: Path) -> dict[str, Any]:
    """Cut every file under `root` longer than its durable length back to it; what was cut
    (paths relative to `root`)."""
    cut: dict[str, int] = {}
    for path, state in tracker.files.items():
        file = Path(path)
        if not file.is_relative_to(root) or not file.is_file():
            continue
        size = file.stat().st_size
        if size > state.durable:
            os.truncate(file, state.durable)
            cut[str(file.relative_to(root))] = size - state.durable
    return {"files_cut": len(cut), "bytes_cut": sum(cut.values()), "cut": dict(sorted(cut.items()))}


def corrupt_one(root: Path, rng: random.Random) -> dict[str, Any] | None:
    """Damage one data file under `root` (see the module docstring); None if there is none."""
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.stat().st_size > 0)
    blocks = [p for p in files if p.suffix == ".blk"]
    if not (blocks or files):
        return None
    target = rng.choice(blocks or files)
    damage = rng.choice(DAMAGES)
    size = target.stat().st_size
    detail: dict[str, Any] = {"size": size}
    if damage == "delete":
        target.unlink()
    elif damage == "truncate":
        length = int(size * rng.uniform(0.1, 0.9))
        os.truncate(target, length)
        detail["length"] = length
    else:
        positions = sorted({rng.randrange(size // 4, max(size // 4 + 1, 3 * size // 4))
                            for _ in range(rng.randint(1, FLIP_BYTES_MAX))})  # fmt: skip
        with target.open("r+b") as handle:
            for position in positions:
                handle.seek(position)
                (old,) = handle.read(1)
                handle.seek(position)
                handle.write(bytes([old ^ rng.randrange(1, 256)]))
        detail["offsets"] = positions
    return {"file": str(target.relative_to(root)), "damage": damage, "detail": detail}
