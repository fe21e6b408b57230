"""The node's view of its log: durable storage plus an unstable suffix (etcd's raftLog).

Theory of operation. `storage` holds what earlier Readys persisted; the core only reads it.
New entries (a leader's proposals, a follower's appends) first go into `unstable`, which
covers offsets `[unstable_offset, last_offset]`; the next Ready hands them to the driver and
`stable_to` moves them into storage once it has written them. Entries of storage at or above
`unstable_offset` are being replaced by the unstable ones and are hidden from every read: that
is how a follower truncates a conflicting suffix (Raft §5.3) before the driver has done it.
A snapshot received from a leader (Raft §7) waits in `pending_snapshot` the same way.

Entries `stable_to` moves out of `unstable` are kept a while longer in `stable_cache`, the
newest persisted entries, ending right below `unstable_offset`: committed entries are applied
(and lagging followers served) from memory instead of being read back from storage. Applied
entries leave it (`applied_to`), and it holds at most `stable_cache_bytes_max` bytes (the
oldest go first); whatever is not in it is read from storage, which holds the same entries.
A truncation or a snapshot drops what it covers.

Offsets are ranges: an entry covers `[offset, last_offset]`, and `term_at(o)` is the term of
the entry containing `o`. Terms never decrease along the log, so the first offset of a term
is found by binary search over `term_at` (Kafka's leader-epoch lookup, without a cache).

Worked example: storage holds [0..2]@1 [3..3]@1 [4..6]@2, a new leader of term 3 sends
prev=3@1 with [4..5]@3. term_at(4) is 2 != 3, so the conflict starts at 4: unstable becomes
[4..5]@3, unstable_offset 4, and the storage entry [4..6]@2 is hidden until the driver
appends (dropping every stored entry at offset >= 4).
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from collections.abc import Iterable, Sequence

from raftlog.raft.ports import LogStorage
from raftlog.raft.types import NO_OFFSET, Entry, Snapshot
from raftlog.types import Offset, Term

__all__ = ["RaftLog"]


def _offset(entry: Entry) -> Offset:
    return entry.offset


def _take_within(
    entries: Iterable[Entry], bytes_max: int, result: list[Entry], size_bytes: int
) -> None:
    """Append `entries` to `result` (already `size_bytes` long) while they fit `bytes_max`;
    the first always goes in when `result` is empty (a read returns at least one entry)."""
    for entry in entries:
        if result and size_bytes + entry.size_bytes > bytes_max:
            return
        result.append(entry)
        size_bytes += entry.size_bytes


class RaftLog:
    __slots__ = (
        "pending_snapshot",
        "stable_cache",
        "stable_cache_bytes",
        "stable_cache_bytes_max",
        "storage",
        "unstable",
        "unstable_offset",
    )

    def __init__(self, storage: LogStorage, *, stable_cache_bytes_max: int) -> None:
        assert stable_cache_bytes_max > 0, stable_cache_bytes_max
        self.storage = storage
        self.unstable: list[Entry] = []
        self.unstable_offset = Offset(storage.last_offset() + 1)
        self.pending_snapshot: Snapshot | None = None
        # Persisted entries kept in memory, contiguous, the last ending at unstable_offset - 1.
        self.stable_cache: deque[Entry] = deque()
        self.stable_cache_bytes = 0
        self.stable_cache_bytes_max = stable_cache_bytes_max
        assert self.unstable_offset >= storage.first_offset(), (
            "storage.last_offset() is below storage.first_offset() - 1"
        )

    # --- reads ---

    def first_offset(self) -> Offset:
        if self.pending_snapshot is not None:
            return Offset(self.pending_snapshot.meta.offset + 1)
        return self.storage.first_offset()

    def last_offset(self) -> Offset:
        if self.unstable:
            return self.unstable[-1].last_offset
        return Offset(self.unstable_offset - 1)

    def durable_last_offset(self) -> Offset:
        """Last offset that storage holds and no unstable entry replaces."""
        return Offset(self.unstable_offset - 1)

    def last_term(self) -> Term:
        term = self.term_at(self.last_offset())
        assert term is not None, "the last offset always has a term"
        return term

    def snapshot(self) -> Snapshot | None:
        if self.pending_snapshot is not None:
            return self.pending_snapshot
        return self.storage.snapshot()

    def _unstable_index(self, offset: Offset) -> int | None:
        """Index in `unstable` of the entry containing `offset`, if any."""
        index = bisect.bisect_right(self.unstable, offset, key=lambda e: e.offset) - 1
        if index < 0 or self.unstable[index].last_offset < offset:
            return None
        return index

    def term_at(self, offset: Offset) -> Term | None:
        """Term of the entry containing `offset` (0 at -1); None if compacted or beyond."""
        if offset >= self.unstable_offset:
            index = self._unstable_index(offset)
            return None if index is None else self.unstable[index].term
        if self.pending_snapshot is not None:
            meta = self.pending_snapshot.meta
            return meta.term if offset == meta.offset else None
        if offset == NO_OFFSET:
            return Term(0)
        return self.storage.term_at(offset)

    def matches(self, offset: Offset, term: Term) -> bool:
        return self.term_at(offset) == term

    def entries(self, start: Offset, *, bytes_max: int) -> list[Entry]:
        """Entries from the one based at `start`, up to `bytes_max` but at least one."""
        assert self.first_offset() <= start <= self.last_offset(), (start, self.last_offset())
        result: list[Entry] = []
        size_bytes = 0
        if start < self.unstable_offset:
            for entry in self._stable_entries(start, bytes_max=bytes_max):
                if entry.offset >= self.unstable_offset:
                    break
                result.append(entry)
                size_bytes += entry.size_bytes
            assert result and result[0].offset == start, f"storage has no entry based at {start}"
            stopped_early = result[-1].last_offset + 1 < self.unstable_offset
            if size_bytes >= bytes_max or stopped_early or not self.unstable:
                return result
            start = Offset(result[-1].last_offset + 1)
        index = self._unstable_index(start)
        assert index is not None and self.unstable[index].offset == start, start
        _take_within(itertools.islice(self.unstable, index, None), bytes_max, result, size_bytes)
        assert result, "entries() returns at least one entry"
        return result

    def _stable_entries(self, start: Offset, *, bytes_max: int) -> Sequence[Entry]:
        """Persisted entries from the one based at `start`, up to `bytes_max` but at least
        one: from the cache when it holds `start`, else from storage. Both hold the same
        entries: the cache keeps what the driver wrote, and a truncation or a snapshot drops
        the part it covers."""
        cache = self.stable_cache
        if not cache or start < cache[0].offset:
            return self.storage.entries(start, bytes_max=bytes_max)
        # Applying reads from the cache's first entry; a lagging follower's catch-up may not.
        index = 0 if cache[0].offset == start else bisect.bisect_left(cache, start, key=_offset)
        assert index < len(cache) and cache[index].offset == start, (start, cache[0].offset)
        result: list[Entry] = []
        _take_within(itertools.islice(cache, index, None), bytes_max, result, 0)
        return result

    def first_offset_of_term_at_least(self, term: Term) -> Offset:
        """Smallest offset in [first - 1, last] whose term is >= `term` (an entry's base, or
        first - 1 when the snapshot already has such a term); last + 1 when none has."""
        low, high = Offset(self.first_offset() - 1), Offset(self.last_offset() + 1)
        while low < high:
            middle = Offset((low + high) // 2)
            middle_term = self.term_at(middle)
            assert middle_term is not None, middle
            if middle_term >= term:
                high = middle
            else:
                low = Offset(middle + 1)
        assert low <= self.last_offset() + 1
        return low

    # --- writes ---

    def find_conflict(self, entries: Sequence[Entry]) -> int | None:
        """Index of the first entry that this log does not hold (Raft §5.3): two entries
        with the same base offset and term are the same batch, by log matching."""
        for index, entry in enumerate(entries):
            if self.term_at(entry.offset) != entry.term:
                return index
        return None

    def append(self, entries: Sequence[Entry]) -> None:
        """Append `entries`, replacing whatever this log holds from entries[0].offset on."""
        assert entries, "append needs entries"
        first = entries[0].offset
        assert first <= self.last_offset() + 1, (first, self.last_offset())
        assert first >= self.first_offset(), (first, self.first_offset())
        if first < self.unstable_offset:
            self.unstable = list(entries)
            self.unstable_offset = first
            self._drop_cached_from(first)
        else:
            index = bisect.bisect_left(self.unstable, first, key=lambda e: e.offset)
            del self.unstable[index:]
            self.unstable.extend(entries)
        assert self.last_offset() == entries[-1].last_offset

    def restore(self, snapshot: Snapshot) -> None:
        """Replace the whole log with `snapshot` (Raft §7 InstallSnapshot)."""
        self.pending_snapshot = snapshot
        self.unstable = []
        self.unstable_offset = Offset(snapshot.meta.offset + 1)
        self.stable_cache.clear()
        self.stable_cache_bytes = 0
        assert self.last_offset() == snapshot.meta.offset

    def stable_to(self, *, snapshot: Snapshot | None, entries: Sequence[Entry]) -> None:
        """The driver persisted a Ready's `snapshot` and `entries`: move them to storage."""
        if snapshot is not None and self.pending_snapshot is snapshot:
            self.pending_snapshot = None
        if not entries:
            return
        last = entries[-1]
        index = self._unstable_index(last.offset)
        if index is None or self.unstable[index] != last:
            return  # replaced since that Ready: the newer entries go out in the next one
        self._cache(self.unstable[: index + 1])
        del self.unstable[: index + 1]
        self.unstable_offset = Offset(last.last_offset + 1)
        assert self.storage.last_offset() >= self.durable_last_offset(), (
            f"storage ends at {self.storage.last_offset()} after persisting up to "
            f"{self.durable_last_offset()}"
        )
        self._check_cache()

    # --- the stable cache ---

    def applied_to(self, offset: Offset) -> None:
        """Entries up to `offset` are applied: the cache need not keep them."""
        cache = self.stable_cache
        while cache and cache[0].last_offset <= offset:
            self.stable_cache_bytes -= cache.popleft().size_bytes
        self._check_cache()

    def _cache(self, stabilized: Sequence[Entry]) -> None:
        """Keep entries just persisted (they start at `unstable_offset`), then trim the
        oldest to the byte bound."""
        assert not stabilized or stabilized[0].offset == self.unstable_offset, stabilized
        cache = self.stable_cache
        cache.extend(stabilized)
        self.stable_cache_bytes += sum(entry.size_bytes for entry in stabilized)
        while self.stable_cache_bytes > self.stable_cache_bytes_max:
            self.stable_cache_bytes -= cache.popleft().size_bytes

    def _drop_cached_from(self, offset: Offset) -> None:
        """A truncation from `offset` (Raft §5.3): cached entries there are replaced."""
        cache = self.stable_cache
        while cache and cache[-1].last_offset >= offset:
            self.stable_cache_bytes -= cache.pop().size_bytes
        if cache and cache[-1].last_offset + 1 != offset:
            cache.clear()  # cut inside an entry: nothing cached may stay beside the gap
            self.stable_cache_bytes = 0
        self._check_cache()

    def _check_cache(self) -> None:
        """O(1): the cache ends right below the unstable entries and respects its bound."""
        cache = self.stable_cache
        assert 0 <= self.stable_cache_bytes <= self.stable_cache_bytes_max, (
            self.stable_cache_bytes,
            self.stable_cache_bytes_max,
        )
        assert not cache or cache[-1].last_offset + 1 == self.unstable_offset, (
            cache[-1],
            self.unstable_offset,
        )
        assert bool(cache) or self.stable_cache_bytes == 0
