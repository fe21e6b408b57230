"""Opening a Raft group's storage and building its `RaftGroup` (metadata or partition).

A group's directory holds its segmented log, its hard state and, for a partition, the
voters it was created with (`raftlog.storage.bootstrap_voters`, written durably once): after
a replica move the metadata's replicas differ from the voters the group started with, and a
restart must rebuild the same membership history. A log that reports storage damage starts
its Raft node repairing (`raftlog.raft.repair`), with an ERROR naming what was lost.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from pathlib import Path

from raftlog.config import LogConfig, NodeConfig
from raftlog.partition.replica import PartitionReplica
from raftlog.raft.node import RaftNode
from raftlog.raft.types import HardState, Membership
from raftlog.runtime.group import RaftGroup, StateMachine
from raftlog.storage.durable_mark import MarkSyncer
from raftlog.storage.file_system import FileSystem
from raftlog.storage.hard_state import FileHardStateStore
from raftlog.storage.raft_log_storage import RaftLogStorage
from raftlog.storage.wall_clock import WallClock
from raftlog.types import NodeId, Offset, RaftGroupId, Term

__all__ = ["RaftGroupFactory"]

log = logging.getLogger(__name__)


class RaftGroupFactory:
    def __init__(
        self,
        *,
        node_id: NodeId,
        config: NodeConfig,
        files: FileSystem,
        wall_clock: WallClock,
        rng: random.Random,
        mark_syncer: MarkSyncer,
    ) -> None:
        self._node_id = node_id
        self._mark_syncer = mark_syncer
        self._config = config
        self._files = files
        self._wall_clock = wall_clock
        self._rng = rng
        # The open log of every group this node hosts; closed when the group goes.
        self.storages: dict[RaftGroupId, RaftLogStorage] = {}

    def open_storage(
        self, directory: Path, log_config: LogConfig | None = None
    ) -> tuple[RaftLogStorage, FileHardStateStore]:
        directory.mkdir(parents=True, exist_ok=True)
        storage = RaftLogStorage.open(
            directory / "log",
            config=log_config or self._config.log,
            files=self._files,
            clock=self._wall_clock,
            mark_syncer=self._mark_syncer,
        )
        return storage, FileHardStateStore(directory, files=self._files)

    def make_group(
        self,
        raft_group_id: RaftGroupId,
        storage: RaftLogStorage,
        hard_state_store: FileHardStateStore,
        voters: frozenset[NodeId],
        machine: StateMachine,
        *,
        first_term: int = 0,
    ) -> RaftGroup:
        """`first_term`: the term a new group starts at (`PartitionInfo.first_term`); a node
        may always move to a higher term with no vote, so it is safe on a restart too."""
        # A partition restart resumes applying after the replica's checkpoint, not offset 0.
        applied_offset = (
            machine.recover(storage) if isinstance(machine, PartitionReplica) else Offset(-1)
        )
        config = self._config.raft
        if not isinstance(machine, PartitionReplica):
            # Metadata followers learn each commit at once: every node acts on what it applies
            # (creates the groups it hosts, learns leaders), and metadata writes are few.
            config = dataclasses.replace(config, commit_notice="immediate")
        if storage.damage is not None:
            log.error(
                "group %s: storage damage: %s; this replica neither votes nor campaigns until "
                "a leader elected by the other replicas has refilled its log",
                raft_group_id,
                storage.damage.describe(),
            )
        hard_state = hard_state_store.load()
        if hard_state.term < first_term:
            hard_state = HardState(term=Term(first_term))
        node = RaftNode(
            node_id=self._node_id,
            config=config,
            storage=storage,
            hard_state=hard_state,
            rng=random.Random(self._rng.getrandbits(64)),
            bootstrap_membership=Membership(voters=voters),
            applied_offset=applied_offset,
            repair_offset=storage.repair_offset,
        )
        if node.membership.voters == frozenset({self._node_id}):
            # A sole voter wins at once: a restarted single-replica group serves without
            # waiting out an election timeout first (etcd campaigns the same way).
            node.campaign()
        bootstrap = Membership(voters=voters)
        self.storages[raft_group_id] = storage
        snapshot = storage.snapshot()
        if snapshot is not None and snapshot.meta.offset > applied_offset:
            # The core resumes applying after the snapshot; the machine starts from it.
            machine.restore(snapshot)
        return RaftGroup(
            raft_group_id=raft_group_id,
            node=node,
            log=storage,
            hard_state_store=hard_state_store,
            state_machine=machine,
            config=config,
            bootstrap_membership=bootstrap,
        )

    def close(self, raft_group_id: RaftGroupId) -> None:
        storage = self.storages.pop(raft_group_id, None)
        if storage is not None:
            storage.close()

    def close_all(self) -> None:
        for storage in self.storages.values():
            storage.close()
        self.storages.clear()
