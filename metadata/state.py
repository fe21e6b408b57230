"""The metadata state machine: what the metadata quorum (Raft group 0) agrees on.

Theory of operation. Every node holds a `MetadataState` and applies the quorum's committed
commands to it in log order: `apply(offset, command_bytes)`. Apply is a pure function of the
state and the bytes (time arrives inside commands as `now_ms`), so every node that applied the
same prefix holds the same state and `snapshot()` returns the same bytes, which
`MetadataState.restore` turns back into an equal state that behaves the same from then on.

Each command is first checked, then carried out: `check(command)` decides, without touching
anything, what `apply` would return, and only an accepted command changes the state. So a
rejected command (bad user input, a stale plan, malformed bytes) leaves the state as it was
except `applied_offset`, which counts log positions and advances for every command. `apply`
never raises on bad input; it asserts only invariants that no input can break.

What the state holds:
- the cluster id (fixed at bootstrap, carried by snapshots);
- nodes: addresses, incarnation, whether fenced and the `now_ms` of the last heartbeat. A
  node is alive while it is registered and not fenced; FenceNode marks a node whose lease
  expired, a heartbeat or re-registration brings it back. A node's `status` is "active",
  "decommissioning" (DecommissionNode: no replica is placed on it again, the controller
  moves its replicas off) or "decommissioned" (CompleteDecommission, once it hosts nothing:
  it is no longer alive and may never register or heartbeat again);
- topics: name, id, replication factor, config, and their partitions in index order;
- partitions: Raft group id (unique for ever: ids are never reused, so a late message from a
  deleted topic's group cannot touch its successor), replicas (the first is the preferred
  leader), the leader with the highest epoch that reported itself and, while a move is under
  way (KIP-455), its target replicas. During a move every node of replicas and target hosts
  the group (`hosts`); the partition leader changes the group's membership one node at a
  time and reports CompleteReassignment, which makes the target the replicas, and only
  then do the removed nodes drop their copy;
- the next group id and the next producer id to hand out;
- consumer groups' committed offsets: group name -> (topic, partition) -> the next offset to
  consume. Offsets of a deleted topic are dropped with it (a topic re-created under the same
  name starts over); a group whose last offset went is forgotten.

Lookups by group id and by node scan the partitions (O(partitions)): the metadata of one
cluster is small, and a derived index would be one more thing to keep consistent.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from raftlog.metadata.commands import (
    CONSUMER_GROUP_ID_CHARS_MAX,
    CONSUMER_GROUPS_MAX,
    GROUP_ID_LIMIT,
    OFFSETS_PER_COMMIT_MAX,
    OK,
    PARTITIONS_PER_TOPIC_MAX,
    PRODUCER_ID_BLOCK_MAX,
    REPLICATION_FACTOR_MAX,
    AllocateProducerIds,
    ApplyResult,
    Command,
    CommitGroupOffsets,
    CompleteDecommission,
    CompleteReassignment,
    CreatePartitions,
    CreateTopic,
    DecommissionNode,
    DeleteGroup,
    DeleteTopic,
    ErrorCode,
    FenceNode,
    MetadataDecodeError,
    NodeHeartbeat,
    ReassignPartition,
    RegisterNode,
    ReportLeader,
    canonical_json,
    check_address,
    check_topic_config,
    check_topic_id,
    check_topic_name,
    decode_command,
    decode_int,
    decode_list,
    decode_offsets,
    decode_str,
    parse_json_object,
    reject,
    topic_name_collision_key,
)
from raftlog.types import DERIVED_PRODUCER_ID_MIN, GroupId, NodeId, PartitionId

__all__ = [
    "FIRST_PARTITION_GROUP_ID",
    "METADATA_GROUP_ID",
    "NODE_ACTIVE",
    "NODE_DECOMMISSIONED",
    "NODE_DECOMMISSIONING",
    "MetadataState",
    "NodeInfo",
    "PartitionInfo",
    "TopicInfo",
]

METADATA_GROUP_ID = GroupId(0)  # the metadata quorum itself
FIRST_PARTITION_GROUP_ID = GroupId(1)
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
    group_id: GroupId
    replicas: tuple[NodeId, ...]  # replicas[0] is the preferred leader
    leader_id: NodeId | None  # last reported leader; None until one reports
    leader_epoch: int  # its epoch (Raft term); NO_EPOCH until one reports
    # The replicas a move under way leads to (None when no move is): other nodes than
    # `replicas`, in preferred-leader order.
    target: tuple[NodeId, ...] | None = None

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


class MetadataState:
    """The replicated metadata. Only `apply` and `restore` change it."""

    def __init__(self, cluster_id: str) -> None:
        assert cluster_id, "a cluster id is fixed at bootstrap"
        self._cluster_id = cluster_id
        self._applied_offset = -1
        self._next_group_id = int(FIRST_PARTITION_GROUP_ID)
        self._next_producer_id = 0
        self._nodes: dict[NodeId, NodeInfo] = {}
        self._topics: dict[str, TopicInfo] = {}
        self._partitions: dict[str, tuple[PartitionInfo, ...]] = {}
        self._group_offsets: dict[str, dict[tuple[str, int], int]] = {}

    # ---- read accessors ----------------------------------------------------------------

    @property
    def cluster_id(self) -> str:
        return self._cluster_id

    @property
    def applied_offset(self) -> int:
        """Offset of the last command applied (-1 before the first)."""
        return self._applied_offset

    @property
    def next_group_id(self) -> GroupId:
        return GroupId(self._next_group_id)

    @property
    def next_producer_id(self) -> int:
        return self._next_producer_id

    def nodes(self) -> tuple[NodeInfo, ...]:
        return tuple(self._nodes[n] for n in sorted(self._nodes))

    def node(self, node_id: NodeId) -> NodeInfo | None:
        return self._nodes.get(node_id)

    def alive_node_ids(self) -> tuple[NodeId, ...]:
        """Registered, unfenced nodes in id order."""
        return tuple(n.node_id for n in self.nodes() if n.alive)

    def placeable_node_ids(self) -> tuple[NodeId, ...]:
        """Alive nodes that are not being decommissioned, in id order (placement targets)."""
        return tuple(n.node_id for n in self.nodes() if n.placeable)

    def decommissioning_node_ids(self) -> tuple[NodeId, ...]:
        return tuple(n.node_id for n in self.nodes() if n.status == NODE_DECOMMISSIONING)

    def partitions_hosted_by(self, node_id: NodeId) -> tuple[PartitionInfo, ...]:
        """Partitions whose group `node_id` holds (replicas or a move's target)."""
        return tuple(p for p in self.all_partitions() if node_id in p.hosts)

    def topics(self) -> tuple[TopicInfo, ...]:
        return tuple(self._topics[name] for name in sorted(self._topics))

    def topic(self, name: str) -> TopicInfo | None:
        return self._topics.get(name)

    def partitions(self, topic: str) -> tuple[PartitionInfo, ...]:
        """The topic's partitions in index order; empty for an unknown topic."""
        return self._partitions.get(topic, ())

    def partition(self, topic: str, partition: int) -> PartitionInfo | None:
        partitions = self._partitions.get(topic, ())
        return partitions[partition] if 0 <= partition < len(partitions) else None

    def all_partitions(self) -> Iterator[PartitionInfo]:
        """Every partition, by topic name then index."""
        for name in sorted(self._partitions):
            yield from self._partitions[name]

    def partition_by_group(self, group_id: GroupId) -> PartitionInfo | None:
        return next((p for p in self.all_partitions() if p.group_id == group_id), None)

    def consumer_group_ids(self) -> tuple[str, ...]:
        """Consumer groups with committed offsets, by name."""
        return tuple(sorted(self._group_offsets))

    def committed_offsets(self, group_id: str) -> dict[tuple[str, int], int]:
        """A consumer group's committed offsets by (topic, partition); empty if none."""
        return dict(sorted(self._group_offsets.get(group_id, {}).items()))

    def committed_offset(self, group_id: str, topic: str, partition: int) -> int | None:
        return self._group_offsets.get(group_id, {}).get((topic, partition))

    def group_ids_for_node(self, node_id: NodeId) -> frozenset[GroupId]:
        """The partition groups `node_id` must host (its replicas and the targets of moves
        under way; fenced or not)."""
        return frozenset(p.group_id for p in self.all_partitions() if node_id in p.hosts)

    def moving_partitions(self) -> tuple[PartitionInfo, ...]:
        """Partitions with a move under way, by topic then index."""
        return tuple(p for p in self.all_partitions() if p.target is not None)

    # ---- apply -------------------------------------------------------------------------

    def apply(self, offset: int, command: bytes) -> ApplyResult:
        """Applies the committed command at `offset`; never raises on bad input."""
        assert offset > self._applied_offset, (offset, self._applied_offset)
        try:
            decoded = decode_command(command)
        except MetadataDecodeError as error:
            result = reject(ErrorCode.INVALID_REQUEST, str(error))
        else:
            result = self.check(decoded)
            if result.ok:
                result = _HANDLERS[type(decoded)][1](self, decoded)
        self._applied_offset = offset
        assert self._applied_offset == offset
        return result

    def check(self, command: Command) -> ApplyResult:
        """What `apply` would return for `command` (its producer ids aside); changes nothing.

        The controller calls it before proposing, so user errors come back at once."""
        rejection = _HANDLERS[type(command)][0](self, command)
        assert rejection is None or not rejection.ok, rejection
        return OK if rejection is None else rejection

    # ---- checks (read only) ------------------------------------------------------------

    def _check_register_node(self, command: RegisterNode) -> ApplyResult | None:
        problem = check_address("client_address", command.client_address) or check_address(
            "raft_address", command.raft_address
        )
        if problem is None and command.kafka_address:
            problem = check_address("kafka_address", command.kafka_address)
        if problem is not None:
            return problem
        known = self._nodes.get(command.node_id)
        if known is not None and known.status == NODE_DECOMMISSIONED:
            return _decommissioned(command.node_id)
        if known is not None and command.incarnation < known.incarnation:
            return reject(
                ErrorCode.STALE_INCARNATION,
                f"node {command.node_id} registers incarnation {command.incarnation} but "
                f"incarnation {known.incarnation} already registered",
            )
        return None

    def _check_heartbeat(self, command: NodeHeartbeat) -> ApplyResult | None:
        known = self._nodes.get(command.node_id)
        if known is None:
            return reject(ErrorCode.UNKNOWN_NODE, f"node {command.node_id} is not registered")
        if known.status == NODE_DECOMMISSIONED:
            return _decommissioned(command.node_id)
        if command.incarnation != known.incarnation:
            return reject(
                ErrorCode.STALE_INCARNATION,
                f"heartbeat from node {command.node_id} incarnation {command.incarnation}, "
                f"registered incarnation is {known.incarnation} (register first)",
            )
        return None

    def _check_fence(self, command: FenceNode) -> ApplyResult | None:
        known = self._nodes.get(command.node_id)
        if known is None:
            return reject(ErrorCode.UNKNOWN_NODE, f"node {command.node_id} is not registered")
        if command.lease_ms < 1:
            return reject(ErrorCode.INVALID_REQUEST, "lease_ms must be positive, got 0")
        silent_ms = command.now_ms - known.last_heartbeat_ms
        if not known.fenced and silent_ms < command.lease_ms:
            return reject(
                ErrorCode.LEASE_NOT_EXPIRED,
                f"node {command.node_id} heartbeat {silent_ms} ms before now_ms="
                f"{command.now_ms}, within lease_ms={command.lease_ms}",
            )
        return None

    def _check_create_topic(self, command: CreateTopic) -> ApplyResult | None:
        problem = check_topic_name(command.name) or self._check_name_free(command.name)
        problem = problem or check_topic_id(command.topic_id)
        if problem is None and any(t.topic_id == command.topic_id for t in self._topics.values()):
            problem = reject(
                ErrorCode.INVALID_REQUEST, f"topic id {command.topic_id!r} is already in use"
            )
        if problem is not None:
            return problem
        if not 1 <= command.partition_count <= PARTITIONS_PER_TOPIC_MAX:
            return reject(
                ErrorCode.INVALID_PARTITIONS,
                f"partition count {command.partition_count} must be in "
                f"[1, {PARTITIONS_PER_TOPIC_MAX}]",
            )
        if not 1 <= command.replication_factor <= REPLICATION_FACTOR_MAX:
            return reject(
                ErrorCode.INVALID_REPLICATION_FACTOR,
                f"replication factor {command.replication_factor} must be in "
                f"[1, {REPLICATION_FACTOR_MAX}]",
            )
        if len(command.assignments) != command.partition_count:
            return reject(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"{len(command.assignments)} replica lists for "
                f"{command.partition_count} partitions",
            )
        return check_topic_config(command.config) or self._check_new_partitions(
            command.name, command.replication_factor, command.assignments, command.group_ids
        )

    def _check_name_free(self, name: str) -> ApplyResult | None:
        if name in self._topics:
            return reject(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
        key = topic_name_collision_key(name)
        other = next((t for t in self._topics if topic_name_collision_key(t) == key), None)
        if other is not None:
            return reject(
                ErrorCode.INVALID_TOPIC_NAME,
                f"topic {name!r} collides with existing topic {other!r} ('.' and '_' collide)",
            )
        return None

    def _check_new_partitions(
        self,
        topic: str,
        replication_factor: int,
        assignments: tuple[tuple[NodeId, ...], ...],
        group_ids: tuple[GroupId, ...],
    ) -> ApplyResult | None:
        if len(group_ids) != len(assignments):
            return reject(
                ErrorCode.INVALID_REQUEST,
                f"{len(group_ids)} group ids for {len(assignments)} new partitions of {topic!r}",
            )
        for index, replicas in enumerate(assignments):
            problem = self._check_replicas(
                f"{topic!r} new partition {index}", replication_factor, replicas
            )
            if problem is not None:
                return problem
        fresh = all(a < b for a, b in itertools.pairwise(group_ids))
        assert group_ids, "callers reject an empty list of new partitions first"
        in_range = group_ids[0] >= self._next_group_id and group_ids[-1] < GROUP_ID_LIMIT
        if not fresh or not in_range:
            return reject(
                ErrorCode.INVALID_GROUP_ID,
                f"group ids {list(group_ids)} must increase from next_group_id="
                f"{self._next_group_id} and stay below {GROUP_ID_LIMIT} (a stale plan: plan again)",
            )
        return None

    def _check_replicas(
        self,
        what: str,
        replication_factor: int,
        replicas: tuple[NodeId, ...],
        existing: tuple[NodeId, ...] = (),
    ) -> ApplyResult | None:
        """`existing` are the partition's current replicas: they may stay where they are
        even on a node being decommissioned; no replica is added to such a node."""
        if len(replicas) != replication_factor:
            return reject(
                ErrorCode.INVALID_REPLICATION_FACTOR,
                f"{what}: {len(replicas)} replicas {list(replicas)}, replication factor is "
                f"{replication_factor}",
            )
        if len(set(replicas)) != len(replicas):
            return reject(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"{what}: replicas {list(replicas)} name a node twice",
            )
        unknown = [n for n in replicas if n not in self._nodes]
        if unknown:
            return reject(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"{what}: replicas {list(replicas)} name unregistered nodes {unknown}",
            )
        leaving = [
            n for n in replicas if n not in existing and self._nodes[n].status != NODE_ACTIVE
        ]
        if leaving:
            return reject(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"{what}: replicas {list(replicas)} name nodes {leaving} that are "
                "decommissioning or decommissioned (no replica is placed on them)",
            )
        return None

    def _check_delete_topic(self, command: DeleteTopic) -> ApplyResult | None:
        return self._check_topic_known(command.name)

    def _check_topic_known(self, name: str) -> ApplyResult | None:
        if name not in self._topics:
            return reject(ErrorCode.UNKNOWN_TOPIC, f"topic {name!r} does not exist")
        return None

    def _check_create_partitions(self, command: CreatePartitions) -> ApplyResult | None:
        problem = self._check_topic_known(command.name)
        if problem is not None:
            return problem
        topic = self._topics[command.name]
        total = topic.partition_count + len(command.assignments)
        if not command.assignments or total > PARTITIONS_PER_TOPIC_MAX:
            return reject(
                ErrorCode.INVALID_PARTITIONS,
                f"topic {command.name!r} has {topic.partition_count} partitions; adding "
                f"{len(command.assignments)} must give at most {PARTITIONS_PER_TOPIC_MAX} "
                "and add at least one",
            )
        return self._check_new_partitions(
            command.name, topic.replication_factor, command.assignments, command.group_ids
        )

    def _check_partition_known(self, topic: str, partition: int) -> ApplyResult | None:
        problem = self._check_topic_known(topic)
        if problem is None and self.partition(topic, partition) is None:
            count = self._topics[topic].partition_count
            problem = reject(
                ErrorCode.UNKNOWN_PARTITION,
                f"topic {topic!r} has no partition {partition} (it has {count})",
            )
        return problem

    def _check_reassign(self, command: ReassignPartition) -> ApplyResult | None:
        problem = self._check_partition_known(command.topic, command.partition)
        if problem is not None:
            return problem
        where = f"{command.topic!r} partition {command.partition}"
        target = self._partitions[command.topic][command.partition].target
        if target is not None:
            return reject(
                ErrorCode.REASSIGNMENT_IN_PROGRESS,
                f"{where} is already moving to {list(target)}; wait until it completes",
            )
        current = self._partitions[command.topic][command.partition]
        return self._check_replicas(
            where,
            self._topics[command.topic].replication_factor,
            command.replicas,
            existing=current.replicas,
        )

    def _check_group_of(
        self, topic: str, partition: int, group_id: int, what: str
    ) -> ApplyResult | None:
        """A partition group's own report (`what`: "report", "completion") about a partition
        that exists and is still that group (not a deleted and re-created namesake)."""
        problem = self._check_partition_known(topic, partition)
        if problem is not None:
            return problem
        current = self._partitions[topic][partition]
        if current.group_id != group_id:
            return reject(
                ErrorCode.UNKNOWN_PARTITION,
                f"{what} from group {group_id} but {topic!r} partition {partition} is group "
                f"{current.group_id}",
            )
        return None

    def _check_complete_reassignment(self, command: CompleteReassignment) -> ApplyResult | None:
        problem = self._check_group_of(
            command.topic, command.partition, command.group_id, "completion"
        )
        if problem is not None:
            return problem
        current = self._partitions[command.topic][command.partition]
        where = f"{command.topic!r} partition {command.partition}"
        if current.target is None or current.target != command.replicas:
            return reject(
                ErrorCode.NO_REASSIGNMENT_IN_PROGRESS,
                f"{where} completes a move to {list(command.replicas)}, but its target is "
                f"{None if current.target is None else list(current.target)}",
            )
        return None

    def _check_report_leader(self, command: ReportLeader) -> ApplyResult | None:
        problem = self._check_group_of(command.topic, command.partition, command.group_id, "report")
        if problem is not None:
            return problem
        current = self._partitions[command.topic][command.partition]
        where = f"{command.topic!r} partition {command.partition}"
        if command.leader_id not in self._nodes:
            return reject(ErrorCode.UNKNOWN_NODE, f"leader {command.leader_id} is not registered")
        if command.epoch < current.leader_epoch or (
            command.epoch == current.leader_epoch and command.leader_id != current.leader_id
        ):
            return reject(
                ErrorCode.STALE_LEADER_EPOCH,
                f"{where}: node {command.leader_id} reports epoch {command.epoch}, node "
                f"{current.leader_id} reported epoch {current.leader_epoch}",
            )
        return None

    def _check_allocate_producer_ids(self, command: AllocateProducerIds) -> ApplyResult | None:
        if not 1 <= command.count <= PRODUCER_ID_BLOCK_MAX:
            return reject(
                ErrorCode.INVALID_REQUEST,
                f"producer id block of {command.count} must be in [1, {PRODUCER_ID_BLOCK_MAX}]",
            )
        if self._next_producer_id + command.count > ALLOCATED_PRODUCER_ID_LIMIT:
            return reject(ErrorCode.INVALID_REQUEST, "producer ids are exhausted")
        return None

    def _check_commit_group_offsets(self, command: CommitGroupOffsets) -> ApplyResult | None:
        problem = _check_consumer_group_id(command.group_id)
        if problem is None and not 1 <= len(command.offsets) <= OFFSETS_PER_COMMIT_MAX:
            problem = reject(
                ErrorCode.INVALID_REQUEST,
                f"a commit holds 1-{OFFSETS_PER_COMMIT_MAX} offsets, got {len(command.offsets)}",
            )
        if problem is None and len({(t, p) for t, p, _ in command.offsets}) != len(command.offsets):
            problem = reject(ErrorCode.INVALID_REQUEST, "a commit names a partition twice")
        for topic, partition, _ in command.offsets:
            problem = problem or self._check_partition_known(topic, partition)
        new_group = command.group_id not in self._group_offsets
        if problem is None and new_group and len(self._group_offsets) >= CONSUMER_GROUPS_MAX:
            problem = reject(
                ErrorCode.INVALID_REQUEST,
                f"{CONSUMER_GROUPS_MAX} consumer groups already hold offsets",
            )
        return problem

    def _check_decommission(self, command: DecommissionNode) -> ApplyResult | None:
        known = self._nodes.get(command.node_id)
        if known is None:
            return reject(ErrorCode.UNKNOWN_NODE, f"node {command.node_id} is not registered")
        if known.status == NODE_DECOMMISSIONED:
            return reject(
                ErrorCode.NODE_DECOMMISSIONED, f"node {command.node_id} is already decommissioned"
            )
        # Every topic must still find replication_factor nodes to live on without this one
        # (fenced nodes count: they are expected back; nodes already leaving do not).
        remaining = [
            n
            for n in self._nodes.values()
            if n.status == NODE_ACTIVE and n.node_id != command.node_id
        ]
        for topic in self.topics():
            if topic.replication_factor > len(remaining):
                return reject(
                    ErrorCode.DECOMMISSION_REFUSED,
                    f"decommissioning node {command.node_id} would leave {len(remaining)} "
                    f"nodes {[int(n.node_id) for n in remaining]} for topic {topic.name!r} "
                    f"of replication factor {topic.replication_factor}",
                )
        return None

    def _check_complete_decommission(self, command: CompleteDecommission) -> ApplyResult | None:
        known = self._nodes.get(command.node_id)
        if known is None:
            return reject(ErrorCode.UNKNOWN_NODE, f"node {command.node_id} is not registered")
        if known.status != NODE_DECOMMISSIONING:
            return reject(
                ErrorCode.INVALID_REQUEST,
                f"node {command.node_id} is {known.status}, not decommissioning",
            )
        hosted = self.partitions_hosted_by(command.node_id)
        if hosted:
            names = [f"{p.topic}-{p.partition}" for p in hosted[:10]]
            return reject(
                ErrorCode.DECOMMISSION_INCOMPLETE,
                f"node {command.node_id} still hosts {len(hosted)} partitions {names}",
            )
        return None

    def _check_delete_group(self, command: DeleteGroup) -> ApplyResult | None:
        problem = _check_consumer_group_id(command.group_id)
        if problem is None and command.group_id not in self._group_offsets:
            problem = reject(
                ErrorCode.UNKNOWN_GROUP, f"consumer group {command.group_id!r} has no offsets"
            )
        return problem

    # ---- effects (run only after their check passed) ------------------------------------

    def _register_node(self, command: RegisterNode) -> ApplyResult:
        known = self._nodes.get(command.node_id)
        self._nodes[command.node_id] = NodeInfo(
            node_id=command.node_id,
            client_address=command.client_address,
            raft_address=command.raft_address,
            incarnation=command.incarnation,
            fenced=False,
            last_heartbeat_ms=command.now_ms,
            # A decommissioning node that restarts is still leaving.
            status=NODE_ACTIVE if known is None else known.status,
            kafka_address=command.kafka_address,
        )
        return OK

    def _decommission(self, command: DecommissionNode) -> ApplyResult:
        # Repeating it while the node is leaving changes nothing.
        known = self._nodes[command.node_id]
        self._nodes[command.node_id] = replace(known, status=NODE_DECOMMISSIONING)
        return OK

    def _complete_decommission(self, command: CompleteDecommission) -> ApplyResult:
        known = self._nodes[command.node_id]
        assert not self.partitions_hosted_by(command.node_id), command
        self._nodes[command.node_id] = replace(known, status=NODE_DECOMMISSIONED)
        return OK

    def _heartbeat(self, command: NodeHeartbeat) -> ApplyResult:
        known = self._nodes[command.node_id]
        # The proposer's clock: a new controller's may be behind the old one's, so the time
        # is replaced, not maxed (expired_nodes measures silence on the current clock).
        self._nodes[command.node_id] = replace(
            known, fenced=False, last_heartbeat_ms=command.now_ms
        )
        return OK

    def _fence(self, command: FenceNode) -> ApplyResult:
        self._nodes[command.node_id] = replace(self._nodes[command.node_id], fenced=True)
        return OK

    def _create_topic(self, command: CreateTopic) -> ApplyResult:
        self._topics[command.name] = TopicInfo(
            name=command.name,
            topic_id=command.topic_id,
            partition_count=command.partition_count,
            replication_factor=command.replication_factor,
            config=dict(sorted(command.config.items())),
        )
        self._partitions[command.name] = ()
        self._add_partitions(command.name, command.assignments, command.group_ids)
        assert len(self._partitions[command.name]) == command.partition_count
        return OK

    def _add_partitions(
        self,
        topic: str,
        assignments: tuple[tuple[NodeId, ...], ...],
        group_ids: tuple[GroupId, ...],
    ) -> None:
        existing = self._partitions[topic]
        added = tuple(
            PartitionInfo(
                topic=topic,
                partition=PartitionId(len(existing) + i),
                group_id=group_id,
                replicas=tuple(replicas),
                leader_id=None,
                leader_epoch=NO_EPOCH,
            )
            for i, (replicas, group_id) in enumerate(zip(assignments, group_ids, strict=True))
        )
        assert added and added[0].group_id >= self._next_group_id
        self._partitions[topic] = existing + added
        self._next_group_id = added[-1].group_id + 1

    def _delete_topic(self, command: DeleteTopic) -> ApplyResult:
        # Group ids are not handed back: next_group_id only grows.
        del self._topics[command.name]
        del self._partitions[command.name]
        for group_id, offsets in list(self._group_offsets.items()):
            kept = {tp: o for tp, o in offsets.items() if tp[0] != command.name}
            if kept:
                self._group_offsets[group_id] = kept
            else:
                del self._group_offsets[group_id]
        return OK

    def _commit_group_offsets(self, command: CommitGroupOffsets) -> ApplyResult:
        offsets = self._group_offsets.setdefault(command.group_id, {})
        for topic, partition, offset in command.offsets:
            offsets[(topic, int(partition))] = offset
        assert offsets, command
        return OK

    def _delete_group(self, command: DeleteGroup) -> ApplyResult:
        del self._group_offsets[command.group_id]
        assert command.group_id not in self._group_offsets
        return OK

    def _create_partitions(self, command: CreatePartitions) -> ApplyResult:
        topic = self._topics[command.name]
        self._add_partitions(command.name, command.assignments, command.group_ids)
        count = len(self._partitions[command.name])
        assert count == topic.partition_count + len(command.assignments)
        self._topics[command.name] = replace(topic, partition_count=count)
        return OK

    def _replace_partition(self, updated: PartitionInfo) -> None:
        partitions = list(self._partitions[updated.topic])
        assert partitions[updated.partition].group_id == updated.group_id
        partitions[updated.partition] = updated
        self._partitions[updated.topic] = tuple(partitions)

    def _reassign(self, command: ReassignPartition) -> ApplyResult:
        current = self._partitions[command.topic][command.partition]
        if set(command.replicas) == set(current.replicas):
            # Same nodes: only the preferred leader changes, no membership change needed.
            self._replace_partition(replace(current, replicas=tuple(command.replicas)))
        else:
            self._replace_partition(replace(current, target=tuple(command.replicas)))
        return OK

    def _complete_reassignment(self, command: CompleteReassignment) -> ApplyResult:
        current = self._partitions[command.topic][command.partition]
        assert current.target == command.replicas, (current, command)
        self._replace_partition(replace(current, replicas=current.target, target=None))
        return OK

    def _report_leader(self, command: ReportLeader) -> ApplyResult:
        current = self._partitions[command.topic][command.partition]
        updated = replace(current, leader_id=command.leader_id, leader_epoch=command.epoch)
        self._replace_partition(updated)
        return OK

    def _allocate_producer_ids(self, command: AllocateProducerIds) -> ApplyResult:
        first = self._next_producer_id
        self._next_producer_id += command.count
        assert first < self._next_producer_id <= ALLOCATED_PRODUCER_ID_LIMIT
        return ApplyResult(ErrorCode.NONE, producer_id_first=first)

    # ---- snapshots ---------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """The whole state as canonical bytes (equal states give equal bytes)."""
        return _encode_snapshot(self)

    @classmethod
    def restore(cls, data: bytes) -> MetadataState:
        """The state `snapshot()` saved; raises MetadataDecodeError on malformed bytes."""
        state = _decode_snapshot(data)
        violations = state.invariant_violations()
        if violations:
            raise MetadataDecodeError(f"snapshot breaks invariants: {violations}")
        return state

    # ---- invariants --------------------------------------------------------------------

    def invariant_violations(self) -> list[str]:
        """Every broken invariant, in words (empty when the state is sound)."""
        violations: list[str] = []
        group_ids: set[int] = set()
        for name, topic in self._topics.items():
            partitions = self._partitions.get(name, ())
            if len(partitions) != topic.partition_count:
                violations.append(
                    f"topic {name!r} has {len(partitions)} partitions, says {topic.partition_count}"
                )
            for index, p in enumerate(partitions):
                violations += _partition_violations(self, topic, index, p)
                if p.group_id in group_ids:
                    violations.append(f"group id {p.group_id} used twice")
                group_ids.add(p.group_id)
        if set(self._partitions) != set(self._topics):
            violations.append("partitions held for topics that do not exist")
        if len({t.topic_id for t in self._topics.values()}) != len(self._topics):
            violations.append("two topics share a topic id")
        if any(n.node_id != key for key, n in self._nodes.items()):
            violations.append("a node is filed under another id")
        for node in self._nodes.values():
            if node.status not in NODE_STATUSES:
                violations.append(f"node {node.node_id} has status {node.status!r}")
            elif node.status == NODE_DECOMMISSIONED and self.partitions_hosted_by(node.node_id):
                violations.append(f"decommissioned node {node.node_id} hosts partitions")
        for group_id, offsets in self._group_offsets.items():
            unknown = [tp for tp in offsets if self.partition(*tp) is None]
            if not offsets or unknown:
                violations.append(f"consumer group {group_id!r} offsets of {unknown or 'nothing'}")
        return violations

    def check_invariants(self) -> None:
        violations = self.invariant_violations()
        assert not violations, violations


def _partition_violations(
    state: MetadataState, topic: TopicInfo, index: int, p: PartitionInfo
) -> list[str]:
    where = f"{topic.name!r} partition {index}"
    violations = []
    if p.topic != topic.name or p.partition != index:
        violations.append(f"{where} is filed as {p.topic!r} partition {p.partition}")
    if not FIRST_PARTITION_GROUP_ID <= p.group_id < state.next_group_id:
        violations.append(f"{where} group id {p.group_id} outside [1, {state.next_group_id})")
    if len(p.replicas) != topic.replication_factor or len(set(p.replicas)) != len(p.replicas):
        violations.append(
            f"{where} replicas {list(p.replicas)} for replication factor {topic.replication_factor}"
        )
    if any(state.node(n) is None for n in p.replicas):
        violations.append(f"{where} replicas {list(p.replicas)} name unregistered nodes")
    if (p.leader_id is None) != (p.leader_epoch == NO_EPOCH):
        violations.append(f"{where} leader {p.leader_id} with epoch {p.leader_epoch}")
    if p.target is not None and (
        len(p.target) != topic.replication_factor
        or len(set(p.target)) != len(p.target)
        or set(p.target) == set(p.replicas)
        or any(state.node(n) is None for n in p.target)
    ):
        violations.append(f"{where} moves from {list(p.replicas)} to {list(p.target)}")
    return violations


# Command type -> (check, effect): the dispatch table of apply.
_HANDLERS: dict[
    type[Any], tuple[Callable[[Any, Any], ApplyResult | None], Callable[[Any, Any], ApplyResult]]
] = {
    RegisterNode: (MetadataState._check_register_node, MetadataState._register_node),
    NodeHeartbeat: (MetadataState._check_heartbeat, MetadataState._heartbeat),
    FenceNode: (MetadataState._check_fence, MetadataState._fence),
    CreateTopic: (MetadataState._check_create_topic, MetadataState._create_topic),
    DeleteTopic: (MetadataState._check_delete_topic, MetadataState._delete_topic),
    CreatePartitions: (MetadataState._check_create_partitions, MetadataState._create_partitions),
    ReassignPartition: (MetadataState._check_reassign, MetadataState._reassign),
    CompleteReassignment: (
        MetadataState._check_complete_reassignment,
        MetadataState._complete_reassignment,
    ),
    ReportLeader: (MetadataState._check_report_leader, MetadataState._report_leader),
    AllocateProducerIds: (
        MetadataState._check_allocate_producer_ids,
        MetadataState._allocate_producer_ids,
    ),
    CommitGroupOffsets: (
        MetadataState._check_commit_group_offsets,
        MetadataState._commit_group_offsets,
    ),
    DeleteGroup: (MetadataState._check_delete_group, MetadataState._delete_group),
    DecommissionNode: (MetadataState._check_decommission, MetadataState._decommission),
    CompleteDecommission: (
        MetadataState._check_complete_decommission,
        MetadataState._complete_decommission,
    ),
}


def _decommissioned(node_id: NodeId) -> ApplyResult:
    return reject(
        ErrorCode.NODE_DECOMMISSIONED,
        f"node {node_id} was decommissioned and may not rejoin the cluster (a new node needs "
        "a new node id and an empty data directory)",
    )


def _check_consumer_group_id(group_id: str) -> ApplyResult | None:
    if not 1 <= len(group_id) <= CONSUMER_GROUP_ID_CHARS_MAX:
        return reject(
            ErrorCode.INVALID_REQUEST,
            f"consumer group id must be 1-{CONSUMER_GROUP_ID_CHARS_MAX} characters, "
            f"got {len(group_id)}",
        )
    return None


# ---- snapshot codec ------------------------------------------------------------------------
#
# Format version 1: one version byte, then canonical JSON (sorted keys, no whitespace) of
#   {"applied_offset", "cluster_id", "next_group_id", "next_producer_id",
#    "nodes": [{node fields}] by id,
#    "topics": [{"name", "topic_id", "replication_factor", "config",
#                "partitions": [{"group_id", "replicas", "leader_id", "leader_epoch"}]}] by name}
# where leader_id and leader_epoch are -1 while no leader has reported, and applied_offset is
# -1 before the first command. Decoding is as strict as for commands. When consumer groups
# have committed offsets the root also holds
#   "group_offsets": [{"group_id", "offsets": [[topic, partition, offset], ...]}] by group,
# and only then, so snapshots taken before consumer groups existed still decode. Likewise a
# partition with a move under way also holds "target": [node ids], and only then, and a node
# that is not active holds "status" ("decommissioning" or "decommissioned"), and only then.

SNAPSHOT_FORMAT_VERSION = 1


def _encode_snapshot(state: MetadataState) -> bytes:
    body = {
        "applied_offset": state.applied_offset,
        "cluster_id": state.cluster_id,
        "next_group_id": int(state.next_group_id),
        "next_producer_id": state.next_producer_id,
        "nodes": [
            {
                "node_id": n.node_id,
                "client_address": n.client_address,
                "raft_address": n.raft_address,
                "incarnation": n.incarnation,
                "fenced": n.fenced,
                "last_heartbeat_ms": n.last_heartbeat_ms,
            }
            | ({} if n.status == NODE_ACTIVE else {"status": n.status})
            | ({"kafka_address": n.kafka_address} if n.kafka_address else {})
            for n in state.nodes()
        ],
        "topics": [_encode_topic(t, state.partitions(t.name)) for t in state.topics()],
    }
    if state.consumer_group_ids():
        body["group_offsets"] = [
            {
                "group_id": group_id,
                "offsets": [[t, p, o] for (t, p), o in state.committed_offsets(group_id).items()],
            }
            for group_id in state.consumer_group_ids()
        ]
    return bytes([SNAPSHOT_FORMAT_VERSION]) + canonical_json(body)


def _encode_topic(topic: TopicInfo, partitions: tuple[PartitionInfo, ...]) -> dict[str, Any]:
    return {
        "name": topic.name,
        "topic_id": topic.topic_id,
        "replication_factor": topic.replication_factor,
        "config": dict(topic.config),
        "partitions": [_encode_partition(p) for p in partitions],
    }


def _encode_partition(p: PartitionInfo) -> dict[str, Any]:
    encoded: dict[str, Any] = {
        "group_id": p.group_id,
        "replicas": list(p.replicas),
        "leader_id": NO_EPOCH if p.leader_id is None else p.leader_id,
        "leader_epoch": p.leader_epoch,
    }
    if p.target is not None:
        encoded["target"] = list(p.target)
    return encoded


def _object(where: str, value: object, keys: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict) or set(value) != set(keys):
        found = sorted(value) if isinstance(value, dict) else type(value).__name__
        raise MetadataDecodeError(f"snapshot {where}: expected fields {sorted(keys)}, got {found}")
    return value


def _int_or_none(where: str, value: object) -> int:
    """An int field that may also hold -1 (none yet)."""
    if type(value) is int and value == NO_EPOCH:
        return NO_EPOCH
    return decode_int(where, value)


def _decode_snapshot(data: bytes) -> MetadataState:
    if not data or data[0] != SNAPSHOT_FORMAT_VERSION:
        version = data[0] if data else None
        raise MetadataDecodeError(f"unknown metadata snapshot format version {version}")
    keys = ("applied_offset", "cluster_id", "next_group_id", "next_producer_id", "nodes", "topics")
    body = parse_json_object(data[1:], what="snapshot")
    group_offsets = body.pop("group_offsets", None)  # present only when there are some
    body = _object("root", body, keys)
    cluster_id = decode_str("cluster_id", body["cluster_id"])
    if not cluster_id:
        raise MetadataDecodeError("snapshot cluster_id is empty")
    state = MetadataState(cluster_id)
    state._applied_offset = _int_or_none("applied_offset", body["applied_offset"])
    state._next_group_id = decode_int("next_group_id", body["next_group_id"])
    state._next_producer_id = decode_int("next_producer_id", body["next_producer_id"])
    for i, raw in enumerate(decode_list("nodes", body["nodes"])):
        node = _decode_node(f"nodes[{i}]", raw)
        if node.node_id in state._nodes:
            raise MetadataDecodeError(f"snapshot nodes[{i}]: node {node.node_id} twice")
        state._nodes[node.node_id] = node
    for i, raw in enumerate(decode_list("topics", body["topics"])):
        topic, partitions = _decode_topic(f"topics[{i}]", raw)
        if topic.name in state._topics:
            raise MetadataDecodeError(f"snapshot topics[{i}]: topic {topic.name!r} twice")
        state._topics[topic.name] = topic
        state._partitions[topic.name] = partitions
    if group_offsets is not None:
        state._group_offsets = _decode_group_offsets(group_offsets)
    return state


def _decode_group_offsets(raw: object) -> dict[str, dict[tuple[str, int], int]]:
    groups: dict[str, dict[tuple[str, int], int]] = {}
    for i, item in enumerate(decode_list("group_offsets", raw)):
        fields_ = _object(f"group_offsets[{i}]", item, ("group_id", "offsets"))
        group_id = decode_str(f"group_offsets[{i}].group_id", fields_["group_id"])
        triples = decode_offsets(f"group_offsets[{i}].offsets", fields_["offsets"])
        offsets = {(t, int(p)): o for t, p, o in triples}
        if group_id in groups or not offsets or len(offsets) != len(triples):
            raise MetadataDecodeError(f"snapshot group_offsets[{i}]: {group_id!r} twice or empty")
        groups[group_id] = offsets
    return groups


def _decode_node(where: str, raw: object) -> NodeInfo:
    keys: tuple[str, ...] = (
        "node_id",
        "client_address",
        "raft_address",
        "incarnation",
        "fenced",
        "last_heartbeat_ms",
    )
    if isinstance(raw, dict) and "status" in raw:
        keys += ("status",)
    if isinstance(raw, dict) and "kafka_address" in raw:
        keys += ("kafka_address",)
    fields_ = _object(where, raw, keys)
    status = decode_str(f"{where}.status", fields_.get("status", NODE_ACTIVE))
    if status not in NODE_STATUSES or ("status" in fields_ and status == NODE_ACTIVE):
        raise MetadataDecodeError(f"snapshot {where}.status: unknown status {status!r}")
    fenced = fields_["fenced"]
    if not isinstance(fenced, bool):
        raise MetadataDecodeError(f"snapshot {where}.fenced: expected a boolean, got {fenced!r}")
    return NodeInfo(
        node_id=NodeId(decode_int(f"{where}.node_id", fields_["node_id"])),
        client_address=decode_str(f"{where}.client_address", fields_["client_address"]),
        raft_address=decode_str(f"{where}.raft_address", fields_["raft_address"]),
        incarnation=decode_int(f"{where}.incarnation", fields_["incarnation"]),
        fenced=fenced,
        last_heartbeat_ms=decode_int(f"{where}.last_heartbeat_ms", fields_["last_heartbeat_ms"]),
        status=status,
        kafka_address=decode_str(f"{where}.kafka_address", fields_.get("kafka_address", "")),
    )


def _decode_topic(where: str, raw: object) -> tuple[TopicInfo, tuple[PartitionInfo, ...]]:
    keys = ("name", "topic_id", "replication_factor", "config", "partitions")
    fields_ = _object(where, raw, keys)
    name = decode_str(f"{where}.name", fields_["name"])
    config_raw = fields_["config"]
    if not isinstance(config_raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in config_raw.items()
    ):
        raise MetadataDecodeError(f"snapshot {where}.config: expected an object of strings")
    partitions = tuple(
        _decode_partition(f"{where}.partitions[{i}]", name, i, p)
        for i, p in enumerate(decode_list(f"{where}.partitions", fields_["partitions"]))
    )
    topic = TopicInfo(
        name=name,
        topic_id=decode_str(f"{where}.topic_id", fields_["topic_id"]),
        partition_count=len(partitions),
        replication_factor=decode_int(f"{where}.replication_factor", fields_["replication_factor"]),
        config=dict(sorted(config_raw.items())),
    )
    problem = check_topic_name(name) or check_topic_id(topic.topic_id)
    problem = problem or check_topic_config(topic.config)
    if problem is not None:
        raise MetadataDecodeError(f"snapshot {where}: {problem.message}")
    return topic, partitions


def _decode_partition(where: str, topic: str, index: int, raw: object) -> PartitionInfo:
    keys: tuple[str, ...] = ("group_id", "replicas", "leader_id", "leader_epoch")
    if isinstance(raw, dict) and "target" in raw:
        keys += ("target",)
    fields_ = _object(where, raw, keys)
    leader_id = _int_or_none(f"{where}.leader_id", fields_["leader_id"])
    replicas = decode_list(f"{where}.replicas", fields_["replicas"])
    target = None
    if "target" in fields_:
        raw_target = decode_list(f"{where}.target", fields_["target"])
        target = tuple(NodeId(decode_int(f"{where}.target", n)) for n in raw_target)
    return PartitionInfo(
        topic=topic,
        partition=PartitionId(index),
        group_id=GroupId(decode_int(f"{where}.group_id", fields_["group_id"])),
        replicas=tuple(NodeId(decode_int(f"{where}.replicas", n)) for n in replicas),
        leader_id=None if leader_id == NO_EPOCH else NodeId(leader_id),
        leader_epoch=_int_or_none(f"{where}.leader_epoch", fields_["leader_epoch"]),
        target=target,
    )
