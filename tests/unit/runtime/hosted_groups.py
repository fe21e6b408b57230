"""One Raft group hosted by a RaftGroupHost for the host's unit tests: a real core on the log
the test gives, hard state in memory, and a state machine that keeps what it applied."""

from __future__ import annotations

import random

from raftlog.config import RaftConfig
from raftlog.raft.memory import MemoryHardStateStore, MemoryStorage
from raftlog.raft.node import RaftNode
from raftlog.raft.ports import HardStateStore
from raftlog.raft.types import Entry, Membership, Snapshot
from raftlog.runtime.group import RaftGroup, StateMachine
from raftlog.runtime.host import RaftGroupHost
from raftlog.storage.raft_log_storage import RaftLogStorage
from raftlog.types import NodeId, RaftGroupId


class Applied:
    """A state machine that keeps the entries applied to it, in order."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []

    def apply(self, entry: Entry) -> None:
        self.entries.append(entry)

    def restore(self, snapshot: Snapshot) -> None:
        raise AssertionError("no snapshots here")


def add_group(
    host: RaftGroupHost,
    raft_group_id: RaftGroupId,
    storage: MemoryStorage | RaftLogStorage,
    *,
    config: RaftConfig,
    voters: tuple[NodeId, ...],
    seed: int,
    hard_state_store: HardStateStore | None = None,
    state_machine: StateMachine | None = None,
) -> RaftGroup:
    """Add a group on `storage` to `host` (whose node it is) and return it; its hard state
    goes to `hard_state_store` (in memory by default), its entries to `state_machine` (an
    `Applied` by default)."""
    membership = Membership(voters=frozenset(voters))
    node = RaftNode(
        node_id=host.node_id,
        config=config,
        storage=storage,
        hard_state=MemoryHardStateStore().load(),
        rng=random.Random(seed),
        bootstrap_membership=membership,
    )
    group = RaftGroup(
        raft_group_id=raft_group_id,
        node=node,
        log=storage,
        hard_state_store=MemoryHardStateStore() if hard_state_store is None else hard_state_store,
        state_machine=Applied() if state_machine is None else state_machine,
        config=config,
        bootstrap_membership=membership,
    )
    host.add(group)
    return group
