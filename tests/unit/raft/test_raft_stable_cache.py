"""The stable cache: persisted entries are applied from memory, within their byte bound, and
are the same entries storage holds (raftlog.raft.raft_log). Reads of storage are counted
through its port, a MemoryStorage that tallies `entries` calls."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from raftlog.config import RaftConfig
from raftlog.errors import ConfigError
from raftlog.raft.memory import MemoryHardStateStore, MemoryStorage
from raftlog.raft.node import RaftNode
from raftlog.raft.types import ENTRY_OVERHEAD_BYTES, Entry, EntryKind, Membership, Role
from raftlog.runtime.ready import process_ready
from raftlog.types import NodeId, Offset

N1 = NodeId(1)
DATA_BYTES = 100
ENTRY_BYTES = DATA_BYTES + ENTRY_OVERHEAD_BYTES


class CountingStorage(MemoryStorage):
    """The in-memory storage port, counting the reads of entries back from it."""

    def __init__(self) -> None:
        super().__init__()
        self.entries_read = 0

    def entries(self, start: Offset, *, bytes_max: int) -> Sequence[Entry]:
        result = super().entries(start, bytes_max=bytes_max)
        self.entries_read += 1
        return result


class SingleNode:
    """A one-voter group (it commits alone once its own append is durable)."""

    def __init__(self, config: RaftConfig) -> None:
        self.storage = CountingStorage()
        self.store = MemoryHardStateStore()
        self.node = RaftNode(
            node_id=N1,
            config=config,
            storage=self.storage,
            hard_state=self.store.load(),
            rng=random.Random(1),
            bootstrap_membership=Membership(frozenset({N1})),
        )
        self.applied: list[Entry] = []
        self.node.campaign()
        self.drain()
        assert self.node.role is Role.LEADER

    def drain(self) -> None:
        while self.node.has_ready():
            process_ready(
                self.node,
                log=self.storage,
                hard_state_store=self.store,
                send=lambda message: None,
                apply=self.applied.append,
                restore=lambda snapshot: None,
                on_read=lambda read_state: None,
            )

    def propose_each(self, count: int) -> list[bytes]:
        """Propose `count` distinct batches, one Ready each (each is persisted apart)."""
        datas = [bytes([index]) * DATA_BYTES for index in range(count)]
        for data in datas:
            self.node.propose(data, offset_count=1)
            self.drain()
        return datas


def test_committed_entries_are_applied_from_memory_not_read_back() -> None:
    group = SingleNode(RaftConfig())
    group.storage.entries_read = 0
    datas = group.propose_each(5)
    assert [entry.data for entry in group.applied[-5:]] == datas
    assert group.storage.entries_read == 0
    assert not group.node.log.stable_cache, "applied entries leave the cache"
    assert group.node.log.stable_cache_bytes == 0


def test_entries_beyond_the_bound_are_read_from_storage_and_are_the_same() -> None:
    # Room for two entries: of five persisted in one Ready, the oldest three are read back.
    group = SingleNode(RaftConfig(stable_cache_bytes_max=2 * ENTRY_BYTES))
    group.storage.entries_read = 0
    datas = [bytes([index]) * DATA_BYTES for index in range(5)]
    for data in datas:
        group.node.propose(data, offset_count=1)
    group.drain()
    assert [entry.data for entry in group.applied[-5:]] == datas
    assert [entry.offset for entry in group.applied] == sorted(e.offset for e in group.applied)
    assert group.storage.entries_read == 1
    assert group.node.log.stable_cache_bytes <= 2 * ENTRY_BYTES


def test_the_cache_empties_when_the_group_applies_everything() -> None:
    group = SingleNode(RaftConfig(stable_cache_bytes_max=ENTRY_BYTES))
    group.propose_each(3)
    assert group.node.applied == group.node.commit_offset == group.node.last_offset
    assert not group.node.log.stable_cache


def test_a_cache_bound_below_one_byte_is_refused() -> None:
    with pytest.raises(ConfigError, match="stable_cache_bytes_max"):
        RaftConfig(stable_cache_bytes_max=0).validate()


def test_noop_and_data_entries_keep_their_kinds_in_the_cache() -> None:
    group = SingleNode(RaftConfig())
    kinds = [entry.kind for entry in group.applied]
    assert kinds == [EntryKind.NOOP]
    group.propose_each(1)
    assert [entry.kind for entry in group.applied] == [EntryKind.NOOP, EntryKind.DATA]
