"""What the metadata state holds: nodes, topics, partitions and consumer groups' committed
offsets as immutable records, and the constants that name the metadata group and a node's
life cycle (raftlog.metadata.state)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from raftlog.types import DERIVED_PRODUCER_ID_MIN, NodeId, PartitionId, RaftGroupId

__all__ = [
    "ALLOCATED_PRODUCER_ID_LIMIT",
    "FIRST_PARTITION_RAFT_GROUP_ID",
    "METADATA_RAFT_GROUP_ID",
    "NODE_ACTIVE",
    "NODE_DECOMMISSIONED",
    "NODE_DECOMMISSIONING",
    "NODE_STATUSES",
    "NO_EPOCH",
    "CommittedOffset",
    "NodeInfo",
    "PartitionInfo",
    "TopicInfo",
]

METADATA_RAFT_GROUP_ID = RaftGroupId(0)  # the metadata quorum itself
FIRST_PARTITION_RAFT_GROUP_ID = RaftGroupId(1)
NO_EPOCH = -1  # leader_epoch of a partition no leader has reported yet
# Producer ids from 2**62 up are derived by clients (the Spark sink's per-task ids,
# raftlog.types.DERIVED_PRODUCER_ID_MIN): the allocator never reaches them.
ALLOCATED_PRODUCER_ID_LIMIT = DERIVED_PRODUCER_ID_MIN
# A node's life cycle: active -> decommissioning -> decommissioned, never back.
NODE_ACTIVE = "active"
NODE_DECOMMISSIONING = "decommissioning"
NODE_DECOMMISSIONED = "decommissioned"
NODE_STATUSES = (NODE_ACTIVE, NODE_DECOMMISSIONING, NODE_DECOMMISSIONED)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    node_id: NodeId
    client_address: str
    raft_address: str
    incarnation: int
    fenced: bool
    last_heartbeat_ms: int  # now_ms of the last RegisterNode or NodeHeartbeat applied
    status: str = NODE_ACTIVE  # one of NODE_STATUSES
    kafka_address: str = ""  # host:port of its Kafka listener; "" when it has none

    @property
    def alive(self) -> bool:
        return not self.fenced and self.status != NODE_DECOMMISSIONED

    @property
    def placeable(self) -> bool:
        """New replicas may go here: alive and not being decommissioned."""
        return self.alive and self.status == NODE_ACTIVE


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    topic_id: str
    partition_count: int
    replication_factor: int
    config: Mapping[str, str] = field(hash=False)


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    topic: str
    partition: PartitionId
    raft_group_id: RaftGroupId
    replicas: tuple[NodeId, ...]  # replicas[0] is the preferred leader
    leader_id: NodeId | None  # last reported leader; None until one reports
    leader_epoch: int  # its epoch (Raft term); NO_EPOCH until one reports
    # The replicas a move under way leads to (None when no move is): other nodes than
    # `replicas`, in preferred-leader order.
    target: tuple[NodeId, ...] | None = None
    # The Raft term the partition's group starts at: the highest leader epoch any partition
    # had reported when this one was created. A client that cached a deleted topic's leader
    # epoch ignores metadata with a lower one for the same name (librdkafka does, its topic
    # id changed or not), so a recreated topic's leaders must have higher epochs.
    first_term: int = 0
    # Kafka's log start offset as DeleteRecords advanced it (a Kafka offset; 0: never): records
    # below it are deleted, whichever replica leads. Retention may have cut a replica's log
    # above it; readers see the higher of the two.
    log_start_floor: int = 0

    @property
    def preferred_leader(self) -> NodeId:
        return self.replicas[0]

    @property
    def hosts(self) -> tuple[NodeId, ...]:
        """Nodes that hold the group: the replicas and, during a move, the target's too."""
        extra = (
            () if self.target is None else tuple(n for n in self.target if n not in self.replicas)
        )
        return self.replicas + extra

    @property
    def adding(self) -> tuple[NodeId, ...]:
        """Target nodes not yet replicas (they join the group as learners)."""
        return (
            () if self.target is None else tuple(n for n in self.target if n not in self.replicas)
        )

    @property
    def removing(self) -> tuple[NodeId, ...]:
        """Replicas the move takes away (they keep their copy until it completes)."""
        return (
            () if self.target is None else tuple(n for n in self.replicas if n not in self.target)
        )


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    """A consumer group's committed position in one partition, as Kafka's OffsetCommit gives it:
    the next offset to consume, the leader epoch of the last record consumed (KIP-320;
    NO_EPOCH when the client gave none) and the client's metadata string."""

    offset: int
    leader_epoch: int = NO_EPOCH
    metadata: str = ""
