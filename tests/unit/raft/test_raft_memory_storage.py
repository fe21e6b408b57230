"""MemoryStorage passes the DurableLog conformance checks, plus a stateful property test
against a plain list model (and its crash model: unsynced appends are lost)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import storage_conformance
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from raftlog.raft.memory import MemoryHardStateStore, MemoryStorage
from raftlog.raft.ports import DurableLog
from raftlog.raft.types import Entry, HardState
from raftlog.types import NodeId, Offset, Term


@pytest.mark.parametrize("check", storage_conformance.CHECKS, ids=lambda c: c.__name__)
def test_memory_storage_conforms(check: Callable[[Callable[[], DurableLog]], None]) -> None:
    check(MemoryStorage)


def test_crash_loses_what_was_not_synced() -> None:
    storage = MemoryStorage()
    storage.append([storage_conformance.entry(1, 0)])
    storage.sync()
    storage.append([storage_conformance.entry(1, 1, 2)])
    storage.crash()
    assert storage.last_offset() == 0


def test_hard_state_store_refuses_a_term_going_back() -> None:
    store = MemoryHardStateStore(HardState(Term(3), NodeId(1)))
    store.save(HardState(Term(4)))
    assert store.load() == HardState(Term(4))
    with pytest.raises(AssertionError):
        store.save(HardState(Term(2)))


class StorageModel(RuleBasedStateMachine):
    """Appends (with truncation) and syncs against a list of entries; a crash restores
    the model as of the last sync."""

    def __init__(self) -> None:
        super().__init__()
        self.storage = MemoryStorage()
        self.model: list[Entry] = []
        self.synced: list[Entry] = []
        self.term = 1

    @rule(back=st.integers(min_value=0, max_value=3), count=st.integers(1, 3), bump=st.booleans())
    def append(self, back: int, count: int, bump: bool) -> None:
        keep = max(0, len(self.model) - back)
        start = self.model[keep - 1].last_offset + 1 if keep else 0
        self.term += int(bump)
        new = storage_conformance.entry(self.term, start, count)
        self.storage.append([new])
        self.model = [*self.model[:keep], new]

    @rule()
    def sync(self) -> None:
        self.storage.sync()
        self.synced = list(self.model)

    @rule()
    def crash(self) -> None:
        self.storage.crash()
        self.model = list(self.synced)

    @invariant()
    def matches_model(self) -> None:
        last = self.model[-1].last_offset if self.model else -1
        assert self.storage.last_offset() == last
        for model_entry in self.model:
            for offset in range(model_entry.offset, model_entry.last_offset + 1):
                assert self.storage.term_at(Offset(offset)) == model_entry.term
        if self.model:
            got = self.storage.entries(Offset(0), bytes_max=10**9)
            assert list(got) == self.model


TestStorageModel = StorageModel.TestCase
TestStorageModel.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)
