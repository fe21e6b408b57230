"""RaftLog (unstable suffix over storage) against a plain list model (Raft §5.3 truncation,
§7 snapshots): whatever mix of appends, truncations, Ready persistence, applying, compaction
and snapshot installs happens, the view equals the model, read from any entry on, whether
the entries come from the stable cache, from storage or from both."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from raftlog.raft.memory import MemoryStorage
from raftlog.raft.raft_log import RaftLog
from raftlog.raft.types import (
    ENTRY_OVERHEAD_BYTES,
    Entry,
    EntryKind,
    Membership,
    Snapshot,
    SnapshotMeta,
)
from raftlog.types import NodeId, Offset, Term

MEMBERSHIP = Membership(frozenset({NodeId(1)}))
# Room for three of the model's one-byte entries: reads hit the cache, storage, and both.
CACHE_BYTES_MAX = 3 * (1 + ENTRY_OVERHEAD_BYTES)


class RaftLogModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.storage = MemoryStorage()
        self.log = RaftLog(self.storage, stable_cache_bytes_max=CACHE_BYTES_MAX)
        self.model: list[Entry] = []  # entries after the snapshot
        self.snapshot_offset, self.snapshot_term = Offset(-1), Term(0)
        self.term = 1

    def _last(self) -> Offset:
        return self.model[-1].last_offset if self.model else self.snapshot_offset

    @rule(back=st.integers(0, 3), count=st.integers(1, 3), bump=st.booleans())
    def append(self, back: int, count: int, bump: bool) -> None:
        keep = max(0, len(self.model) - back)
        start = Offset(self.model[keep - 1].last_offset + 1 if keep else self.snapshot_offset + 1)
        self.term += int(bump)
        entry = Entry(Term(self.term), start, count, EntryKind.DATA, b"e")
        self.log.append([entry])
        self.model = [*self.model[:keep], entry]

    @rule()
    def persist(self) -> None:
        """What process_ready does with a Ready's snapshot and entries, then advance()."""
        snapshot, entries = self.log.pending_snapshot, tuple(self.log.unstable)
        if snapshot is not None:
            self.storage.install_snapshot(snapshot)
        if entries:
            self.storage.append(entries)
        self.log.stable_to(snapshot=snapshot, entries=entries)
        assert not self.log.unstable and self.log.pending_snapshot is None

    @rule(index=st.integers(0, 5))
    def apply(self, index: int) -> None:
        """The driver applied the model's first entries: the cache lets them go."""
        if index < len(self.model):
            self.log.applied_to(self.model[index].last_offset)

    @precondition(lambda self: not self.log.unstable and self.log.pending_snapshot is None)
    @rule(index=st.integers(0, 5))
    def compact(self, index: int) -> None:
        """The driver compacts a durable prefix ending at an entry's end."""
        if index >= len(self.model):
            return
        end = self.model[index]
        meta = SnapshotMeta(end.last_offset, end.term, MEMBERSHIP)
        self.storage.compact(Snapshot(meta))
        self.model = self.model[index + 1 :]
        self.snapshot_offset, self.snapshot_term = end.last_offset, end.term

    @rule(ahead=st.integers(0, 5))
    def restore(self, ahead: int) -> None:
        """A leader's snapshot replaces the whole log (Raft §7)."""
        self.term += 1
        offset = Offset(max(self._last() + ahead, 0))  # a snapshot covers at least offset 0
        meta = SnapshotMeta(offset, Term(self.term), MEMBERSHIP)
        self.log.restore(Snapshot(meta))
        self.model = []
        self.snapshot_offset, self.snapshot_term = offset, Term(self.term)

    @invariant()
    def view_matches_model(self) -> None:
        assert self.log.last_offset() == self._last()
        assert self.log.first_offset() == self.snapshot_offset + 1
        assert self.log.term_at(self.snapshot_offset) == self.snapshot_term
        for entry in self.model:
            assert self.log.term_at(entry.offset) == entry.term
            assert self.log.term_at(entry.last_offset) == entry.term
        assert self.log.term_at(Offset(self._last() + 1)) is None
        if self.model:
            got = self.log.entries(self.model[0].offset, bytes_max=10**9)
            assert got == self.model
        assert self.log.durable_last_offset() <= max(self.storage.last_offset(), self._last())

    @invariant()
    def reads_from_any_entry_match_model(self) -> None:
        for index, entry in enumerate(self.model):
            assert self.log.entries(entry.offset, bytes_max=1) == [entry]
            two = self.log.entries(entry.offset, bytes_max=2 * entry.size_bytes)
            assert two == self.model[index : index + 2]

    @invariant()
    def cache_holds_persisted_model_entries_within_bound(self) -> None:
        cache = list(self.log.stable_cache)
        assert self.log.stable_cache_bytes == sum(e.size_bytes for e in cache)
        assert self.log.stable_cache_bytes <= CACHE_BYTES_MAX
        for entry in cache:
            assert entry.last_offset < self.log.unstable_offset
            if entry.offset > self.snapshot_offset:
                assert entry in self.model, (entry, self.model)

    @invariant()
    def term_search_finds_run_starts(self) -> None:
        for entry in self.model:
            start = self.log.first_offset_of_term_at_least(entry.term)
            first_of_term = next(e.offset for e in self.model if e.term >= entry.term)
            if self.snapshot_term >= entry.term:
                first_of_term = self.snapshot_offset
            assert start == first_of_term, (start, first_of_term, entry)


TestRaftLogModel = RaftLogModel.TestCase
TestRaftLogModel.settings = settings(max_examples=50, stateful_step_count=30, deadline=None)
