"""Ports between the pure Raft core and the world that persists its log.

`LogStorage` is the read-only view the core consults (the etcd `Storage` idea): it holds
what earlier Readys persisted. The core never writes through it; drivers apply a Ready's
entries, snapshot and hard state through `DurableLog` and `HardStateStore`, then call
`RaftNode.advance`. Both a production implementation (segmented log on disk) and
`raftlog.raft.memory.MemoryStorage` (the fake, also used by the simulator's disk model)
satisfy these protocols and pass the same conformance tests.

Ownership and errors: returned entries are immutable and may be kept. Reads below
`first_offset()` (compacted) return None / raise `LookupError`; they are expected after a
snapshot and the core answers them by sending a snapshot instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from raftlog.raft.types import Entry, HardState, Snapshot
from raftlog.types import Offset, Term

__all__ = ["DurableLog", "HardStateStore", "LogStorage"]


class LogStorage(Protocol):
    def first_offset(self) -> Offset:
        """First offset held in the log (snapshot.offset + 1; 0 for a fresh log)."""
        ...

    def last_offset(self) -> Offset:
        """Last offset held; the snapshot's offset when the log is empty after it; -1 if fresh."""
        ...

    def term_at(self, offset: Offset) -> Term | None:
        """Term of the entry containing `offset`; the snapshot's term at its offset; 0 at -1;
        None when `offset` is compacted away or beyond the last offset."""
        ...

    def entries(self, start: Offset, *, bytes_max: int) -> Sequence[Entry]:
        """Entries from the one whose base offset is `start`, in order, up to `bytes_max`
        (counting `Entry.size_bytes`) but always at least one when any exists.
        Raises LookupError when `start` is compacted or not an entry's base offset."""
        ...

    def config_entries(self) -> Sequence[Entry]:
        """The CONFIG entries held after the snapshot, in offset order (a handful)."""
        ...

    def snapshot(self) -> Snapshot | None:
        """The latest snapshot, or None if the log was never compacted."""
        ...


class DurableLog(LogStorage, Protocol):
    """The write side a driver uses while processing a Ready."""

    def append(self, entries: Sequence[Entry]) -> None:
        """Drop every entry at offset >= entries[0].offset, then append `entries` (buffered)."""
        ...

    def install_snapshot(self, snapshot: Snapshot) -> None:
        """Replace the whole log with `snapshot` (entries it covers, and any after it, go)."""
        ...

    def compact(self, snapshot: Snapshot) -> None:
        """Record `snapshot` and drop entries at offsets <= snapshot.meta.offset."""
        ...

    def sync(self) -> None:
        """Make every append so far durable (one fsync for many appends)."""
        ...


class HardStateStore(Protocol):
    def load(self) -> HardState: ...

    def save(self, hard_state: HardState) -> None:
        """Replace the stored hard state atomically and durably."""
        ...
