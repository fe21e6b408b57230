"""In-memory implementations of the core's storage ports: the test fake and the simulator's
disk model.

Theory of operation. `MemoryStorage` is a list of entries after an optional snapshot. It
satisfies `DurableLog`: `append` drops every entry at or after the first new offset, `compact`
drops a prefix, `install_snapshot` replaces everything. To let a simulator model crashes, it
also remembers what was durable at the last `sync()`: `crash()` throws away everything
appended (or truncated) since, as a power loss would. `MemoryHardStateStore.save` is durable
at once, as the protocol requires of the real store.

Lookups are by base offset with `bisect`; `term_at` finds the entry containing an offset.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from raftlog.raft.types import NO_OFFSET, Entry, EntryKind, HardState, Snapshot
from raftlog.types import Offset, Term

__all__ = ["MemoryHardStateStore", "MemoryStorage"]


class MemoryStorage:
    """A `DurableLog` held in memory (entries are immutable and shared, never copied)."""

    def __init__(self) -> None:
        self._entries: list[Entry] = []
        self._snapshot: Snapshot | None = None
        # What survives crash(): the state at the last sync().
        self._durable_entries: list[Entry] = []
        self._durable_snapshot: Snapshot | None = None
        self.sync_count = 0

    # --- LogStorage ---

    def first_offset(self) -> Offset:
        return Offset(self._snapshot_offset() + 1)

    def _snapshot_offset(self) -> Offset:
        return NO_OFFSET if self._snapshot is None else self._snapshot.meta.offset

    def last_offset(self) -> Offset:
        if self._entries:
            return self._entries[-1].last_offset
        return self._snapshot_offset()

    def _index_containing(self, offset: Offset) -> int | None:
        index = bisect.bisect_right(self._entries, offset, key=lambda e: e.offset) - 1
        if index < 0 or self._entries[index].last_offset < offset:
            return None
        return index

    def term_at(self, offset: Offset) -> Term | None:
        if offset == self._snapshot_offset():
            return Term(0) if self._snapshot is None else self._snapshot.meta.term
        if offset < self.first_offset():
            return None
        index = self._index_containing(offset)
        return None if index is None else self._entries[index].term

    def entries(self, start: Offset, *, bytes_max: int) -> Sequence[Entry]:
        index = self._index_containing(start)
        if start < self.first_offset() or index is None or self._entries[index].offset != start:
            raise LookupError(
                f"no entry based at offset {start} (log holds "
                f"[{self.first_offset()}, {self.last_offset()}])"
            )
        result = [self._entries[index]]
        size_bytes = result[0].size_bytes
        for entry in self._entries[index + 1 :]:
            if size_bytes + entry.size_bytes > bytes_max:
                break
            result.append(entry)
            size_bytes += entry.size_bytes
        return result

    def config_entries(self) -> Sequence[Entry]:
        return [entry for entry in self._entries if entry.kind is EntryKind.CONFIG]

    def snapshot(self) -> Snapshot | None:
        return self._snapshot

    # --- DurableLog ---

    def append(self, entries: Sequence[Entry]) -> None:
        if not entries:
            return
        first = entries[0].offset
        if not self.first_offset() <= first <= self.last_offset() + 1:
            raise LookupError(
                f"cannot append at offset {first}: log holds "
                f"[{self.first_offset()}, {self.last_offset()}]"
            )
        index = bisect.bisect_left(self._entries, first, key=lambda e: e.offset)
        assert index == len(self._entries) or self._entries[index].offset == first, (
            f"append at {first} splits an entry"
        )
        del self._entries[index:]
        for entry in entries:
            assert entry.offset == self.last_offset() + 1, (entry.offset, self.last_offset())
            self._entries.append(entry)

    def install_snapshot(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot
        self._entries = []
        assert self.last_offset() == snapshot.meta.offset

    def compact(self, snapshot: Snapshot) -> None:
        offset = snapshot.meta.offset
        if not self._snapshot_offset() < offset <= self.last_offset():
            raise LookupError(
                f"cannot compact to {offset}: log holds [{self.first_offset()}, "
                f"{self.last_offset()}]"
            )
        assert self.term_at(offset) == snapshot.meta.term, (offset, snapshot.meta.term)
        index = self._index_containing(offset)
        assert index is not None and self._entries[index].last_offset == offset, (
            f"snapshot offset {offset} must end an entry"
        )
        del self._entries[: index + 1]
        self._snapshot = snapshot

    def sync(self) -> None:
        self._durable_entries = list(self._entries)
        self._durable_snapshot = self._snapshot
        self.sync_count += 1

    # --- simulation ---

    def crash(self) -> None:
        """Lose everything not synced, as a power failure would."""
        self._entries = list(self._durable_entries)
        self._snapshot = self._durable_snapshot


class MemoryHardStateStore:
    def __init__(self, hard_state: HardState | None = None) -> None:
        self._hard_state = hard_state or HardState()
        self.save_count = 0

    def load(self) -> HardState:
        return self._hard_state

    def save(self, hard_state: HardState) -> None:
        assert hard_state.term >= self._hard_state.term, (
            f"hard state term went back from {self._hard_state.term} to {hard_state.term}"
        )
        self._hard_state = hard_state
        self.save_count += 1
