"""Three real Raft groups of one partition, each with its real `PartitionReplica`, over
in-memory storage, driven by hand: a pass processes every Ready (persist, sync, acknowledge
and apply, as the host does), and messages to or from a cut node are held back. Node 1 is
elected at the start."""

from __future__ import annotations

import random

from raftlog.config import LogConfig, RaftConfig
from raftlog.partition.replica import PartitionReplica, TxnVerifier
from raftlog.raft.memory import MemoryHardStateStore, MemoryStorage
from raftlog.raft.node import RaftNode
from raftlog.raft.types import Membership, Message
from raftlog.runtime.group import RaftGroup
from raftlog.runtime.ready import complete_ready, persist_ready
from raftlog.types import NodeId, RaftGroupId

__all__ = ["CONFIG", "LEADER", "NODES", "NoReads", "ReplicaGroups"]

NODES = (NodeId(1), NodeId(2), NodeId(3))
LEADER = NodeId(1)
CONFIG = RaftConfig()


class NoReads:
    """The consumer side of a partition log; produce never reads it. Offsets are not
    translated: this log holds no Raft entries of its own to leave out."""

    def kafka_offset(self, offset: int) -> int:
        return offset

    def raft_offset(self, kafka_offset: int) -> int:
        return kafka_offset

    def set_kafka_start(self, kafka_offset: int) -> None:
        raise AssertionError("no snapshot is restored here")

    def read_kafka(
        self,
        kafka_offset: int,
        *,
        bytes_max: int,
        end_offset: int | None = None,
        skip_emptied: bool = False,
    ) -> bytes:
        raise AssertionError("produce does not read the log")

    def log_start_offset(self) -> int:
        raise AssertionError("produce does not read the log")

    def read(
        self,
        offset: int,
        *,
        bytes_max: int,
        end_offset: int | None = None,
        skip_emptied: bool = False,
    ) -> bytes:
        raise AssertionError("produce does not read the log")

    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        raise AssertionError("produce does not read the log")


class ReplicaGroups:
    def __init__(
        self,
        *,
        topic: str = "t",
        partition: int = 0,
        config: RaftConfig = CONFIG,
        txn_verifier: TxnVerifier | None = None,
    ) -> None:
        membership = Membership(voters=frozenset(NODES))
        self.cut: set[NodeId] = set()
        self.inbox: list[Message] = []
        self.held: list[Message] = []
        self.groups: dict[NodeId, RaftGroup] = {}
        self.replicas: dict[NodeId, PartitionReplica] = {}
        for node_id in NODES:
            storage = MemoryStorage()
            replica = PartitionReplica(
                topic=topic,
                partition=partition,
                log=NoReads(),
                config=LogConfig(),
                txn_verifier=txn_verifier,
            )
            node = RaftNode(
                node_id=node_id,
                config=config,
                storage=storage,
                hard_state=MemoryHardStateStore().load(),
                rng=random.Random(node_id),
                bootstrap_membership=membership,
            )
            group = RaftGroup(
                raft_group_id=RaftGroupId(partition),
                node=node,
                log=storage,
                hard_state_store=MemoryHardStateStore(),
                state_machine=replica,
                config=config,
                bootstrap_membership=membership,
            )
            replica.attach(group)
            self.groups[node_id], self.replicas[node_id] = group, replica
        self.groups[LEADER].node.campaign()
        self.settle()
        assert self.replicas[LEADER].is_leader_ready()

    @property
    def leader(self) -> PartitionReplica:
        return self.replicas[LEADER]

    def heal(self) -> None:
        self.cut = set()
        self.inbox.extend(self.held)
        self.held = []
        self.settle()

    def _send(self, message: Message) -> None:
        cut = message.sender in self.cut or message.receiver in self.cut
        (self.held if cut else self.inbox).append(message)

    def settle(self) -> None:
        """Process Readys (persist, then sync, then acknowledge and apply, as the host does)
        and deliver messages until nothing is left."""
        busy = True
        while busy:
            busy = False
            for group in self.groups.values():
                if group.node.has_ready():
                    self._process(group)
                    busy = True
            inbox, self.inbox = self.inbox, []
            for message in inbox:
                self.groups[message.receiver].node.step(message)
            busy = busy or bool(inbox)

    def _process(self, group: RaftGroup) -> None:
        node = group.node
        ready = node.ready()
        persist_ready(
            node,
            ready,
            log=group.log,
            hard_state_store=group.hard_state_store,
            send=self._send,
            restore=group.restore,
        )
        group.log.sync()
        if ready.entries:
            group.on_durable(ready.entries[-1].last_offset)
        complete_ready(node, ready, send=self._send, apply=group.apply, on_read=group.on_read)
