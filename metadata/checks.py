"""The checks of metadata commands: what `MetadataState.apply` would reject, and why.

Each `check_<command>(state, command)` reads the state through its queries only and returns
the rejection (`ApplyResult` naming what was wrong) or None when the command may be carried
out. They never change anything: the controller runs them before proposing, so a user's
error comes back at once, and apply runs them again on every node before the effect.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from raftlog.metadata.commands import (
    CONFIG_VALUE_CHARS_MAX,
    CONSUMER_GROUP_ID_CHARS_MAX,
    CONSUMER_GROUPS_MAX,
    LEADER_EPOCH_LIMIT,
    OFFSET_METADATA_CHARS_MAX,
    OFFSETS_PER_COMMIT_MAX,
    PARTITIONS_PER_TOPIC_MAX,
    PRODUCER_ID_BLOCK_MAX,
    RAFT_GROUP_ID_LIMIT,
    REPLICATION_FACTOR_MAX,
    TOPIC_CONFIG_KEYS,
    AllocateProducerIds,
    AlterTopicConfig,
    ApplyResult,
    AutoCreateTopic,
    CommitGroupOffsets,
    CommitTransactionOffsets,
    CompleteDecommission,
    CompleteReassignment,
    CreatePartitions,
    CreateTopic,
    DecommissionNode,
    DeleteGroup,
    DeleteGroupOffsets,
    DeleteRecords,
    DeleteTopic,
    ErrorCode,
    FenceNode,
    NodeHeartbeat,
    ReassignPartition,
    RegisterNode,
    ReportLeader,
    check_address,
    check_topic_config,
    check_topic_id,
    check_topic_name,
    offset_metadata_chars,
    reject,
    topic_name_collision_key,
)
from raftlog.metadata.model import (
    ALLOCATED_PRODUCER_ID_LIMIT,
    NODE_ACTIVE,
    NODE_DECOMMISSIONED,
    NODE_DECOMMISSIONING,
    NodeInfo,
    PartitionInfo,
    TopicInfo,
)
from raftlog.types import NodeId, RaftGroupId

if TYPE_CHECKING:
    from raftlog.metadata.state import MetadataState

__all__ = [
    "check_allocate_producer_ids",
    "check_alter_topic_config",
    "check_auto_create_topic",
    "check_commit_group_offsets",
    "check_complete_decommission",
    "check_complete_reassignment",
    "check_create_partitions",
    "check_create_topic",
    "check_decommission",
    "check_delete_group",
    "check_delete_group_offsets",
    "check_delete_topic",
    "check_fence",
    "check_heartbeat",
    "check_new_topic_name",
    "check_offsets",
    "check_reassign",
    "check_register_node",
    "check_report_leader",
    "consumer_group_id",
    "id_length",
    "merged_topic_config",
    "partition_known",
]


def _node(state: MetadataState, node_id: NodeId) -> NodeInfo:
    """A node the caller's check already found registered."""
    info = state.node(node_id)
    assert info is not None, node_id
    return info


def _topic(state: MetadataState, name: str) -> TopicInfo:
    """A topic the caller's check already found."""
    info = state.topic(name)
    assert info is not None, name
    return info


def _partition(state: MetadataState, topic: str, partition: int) -> PartitionInfo:
    """A partition the caller's check already found."""
    info = state.partition(topic, partition)
    assert info is not None, (topic, partition)
    return info


def check_register_node(state: MetadataState, command: RegisterNode) -> ApplyResult | None:
    problem = check_address("client_address", command.client_address) or check_address(
        "raft_address", command.raft_address
    )
    if problem is None and command.kafka_address:
        problem = check_address("kafka_address", command.kafka_address)
    if problem is not None:
        return problem
    known = state.node(command.node_id)
    if known is not None and known.status == NODE_DECOMMISSIONED:
        return _decommissioned(command.node_id)
    if known is not None and command.incarnation < known.incarnation:
        return reject(
            ErrorCode.STALE_INCARNATION,
            f"node {command.node_id} registers incarnation {command.incarnation} but "
            f"incarnation {known.incarnation} already registered",
        )
    return None


def check_heartbeat(state: MetadataState, command: NodeHeartbeat) -> ApplyResult | None:
    known = state.node(command.node_id)
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


def check_fence(state: MetadataState, command: FenceNode) -> ApplyResult | None:
    known = state.node(command.node_id)
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


def check_create_topic(state: MetadataState, command: CreateTopic) -> ApplyResult | None:
    problem = check_new_topic_name(state, command.name)
    problem = problem or check_topic_id(command.topic_id)
    if problem is None and any(t.topic_id == command.topic_id for t in state.topics()):
        problem = reject(
            ErrorCode.INVALID_REQUEST, f"topic id {command.topic_id!r} is already in use"
        )
    if problem is not None:
        return problem
    if not 1 <= command.partition_count <= PARTITIONS_PER_TOPIC_MAX:
        return reject(
            ErrorCode.INVALID_PARTITIONS,
            f"partition count {command.partition_count} must be in [1, {PARTITIONS_PER_TOPIC_MAX}]",
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
            f"{len(command.assignments)} replica lists for {command.partition_count} partitions",
        )
    return check_topic_config(command.config) or _new_partitions(
        state, command.name, command.replication_factor, command.assignments, command.raft_group_ids
    )


def check_auto_create_topic(state: MetadataState, command: AutoCreateTopic) -> ApplyResult:
    return reject(
        ErrorCode.INVALID_REQUEST,
        f"AutoCreateTopic {command.name!r} is a request the controller plans into a "
        "CreateTopic; it is never applied",
    )


def check_new_topic_name(state: MetadataState, name: str) -> ApplyResult | None:
    """Why `name` cannot name a new topic (Kafka's name rule; a topic of that name, or of one
    that differs only in '.' versus '_'), or None."""
    return check_topic_name(name) or _name_free(state, name)


def _name_free(state: MetadataState, name: str) -> ApplyResult | None:
    if state.topic(name) is not None:
        return reject(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
    key = topic_name_collision_key(name)
    other = next((t.name for t in state.topics() if topic_name_collision_key(t.name) == key), None)
    if other is not None:
        return reject(
            ErrorCode.INVALID_TOPIC_NAME,
            f"topic {name!r} collides with existing topic {other!r} ('.' and '_' collide)",
        )
    return None


def _new_partitions(
    state: MetadataState,
    topic: str,
    replication_factor: int,
    assignments: tuple[tuple[NodeId, ...], ...],
    raft_group_ids: tuple[RaftGroupId, ...],
) -> ApplyResult | None:
    if len(raft_group_ids) != len(assignments):
        return reject(
            ErrorCode.INVALID_REQUEST,
            f"{len(raft_group_ids)} Raft group ids for {len(assignments)} new partitions of "
            f"{topic!r}",
        )
    for index, replicas in enumerate(assignments):
        problem = _replicas(state, f"{topic!r} new partition {index}", replication_factor, replicas)
        if problem is not None:
            return problem
    fresh = all(a < b for a, b in itertools.pairwise(raft_group_ids))
    assert raft_group_ids, "callers reject an empty list of new partitions first"
    in_range = (
        raft_group_ids[0] >= state.next_raft_group_id and raft_group_ids[-1] < RAFT_GROUP_ID_LIMIT
    )
    if not fresh or not in_range:
        return reject(
            ErrorCode.INVALID_GROUP_ID,
            f"Raft group ids {list(raft_group_ids)} must increase from next_raft_group_id="
            f"{state.next_raft_group_id} and stay below {RAFT_GROUP_ID_LIMIT} "
            "(a stale plan: plan again)",
        )
    return None


def _replicas(
    state: MetadataState,
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
    unknown = [n for n in replicas if state.node(n) is None]
    if unknown:
        return reject(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"{what}: replicas {list(replicas)} name unregistered nodes {unknown}",
        )
    leaving = [n for n in replicas if n not in existing and _node(state, n).status != NODE_ACTIVE]
    if leaving:
        return reject(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"{what}: replicas {list(replicas)} name nodes {leaving} that are "
            "decommissioning or decommissioned (no replica is placed on them)",
        )
    return None


def check_delete_topic(state: MetadataState, command: DeleteTopic) -> ApplyResult | None:
    return _topic_known(state, command.name)


def check_alter_topic_config(state: MetadataState, command: AlterTopicConfig) -> ApplyResult | None:
    """A known topic; known keys to delete, none also set; the merged config valid."""
    unknown = _topic_known(state, command.name)
    if unknown is not None:
        return unknown
    for key in command.delete_keys:
        if key not in TOPIC_CONFIG_KEYS or key in command.set_config:
            return reject(
                ErrorCode.INVALID_CONFIG,
                f"config {key[:CONFIG_VALUE_CHARS_MAX]!r} cannot be deleted: "
                + ("it is also set" if key in command.set_config else "not a topic config key"),
            )
    return check_topic_config(merged_topic_config(state, command))


def merged_topic_config(state: MetadataState, command: AlterTopicConfig) -> dict[str, str]:
    topic = state.topic(command.name)
    assert topic is not None, command.name
    config = {k: v for k, v in topic.config.items() if k not in command.delete_keys}
    config.update(command.set_config)
    return dict(sorted(config.items()))


def _topic_known(state: MetadataState, name: str) -> ApplyResult | None:
    if state.topic(name) is None:
        return reject(ErrorCode.UNKNOWN_TOPIC, f"topic {name!r} does not exist")
    return None


def check_create_partitions(state: MetadataState, command: CreatePartitions) -> ApplyResult | None:
    problem = _topic_known(state, command.name)
    if problem is not None:
        return problem
    topic = _topic(state, command.name)
    total = topic.partition_count + len(command.assignments)
    if not command.assignments or total > PARTITIONS_PER_TOPIC_MAX:
        return reject(
            ErrorCode.INVALID_PARTITIONS,
            f"topic {command.name!r} has {topic.partition_count} partitions; adding "
            f"{len(command.assignments)} must give at most {PARTITIONS_PER_TOPIC_MAX} "
            "and add at least one",
        )
    return _new_partitions(
        state, command.name, topic.replication_factor, command.assignments, command.raft_group_ids
    )


def partition_known(state: MetadataState, topic: str, partition: int) -> ApplyResult | None:
    problem = _topic_known(state, topic)
    if problem is None and state.partition(topic, partition) is None:
        count = _topic(state, topic).partition_count
        problem = reject(
            ErrorCode.UNKNOWN_PARTITION,
            f"topic {topic!r} has no partition {partition} (it has {count})",
        )
    return problem


def check_reassign(state: MetadataState, command: ReassignPartition) -> ApplyResult | None:
    problem = partition_known(state, command.topic, command.partition)
    if problem is not None:
        return problem
    where = f"{command.topic!r} partition {command.partition}"
    target = _partition(state, command.topic, command.partition).target
    if target is not None:
        return reject(
            ErrorCode.REASSIGNMENT_IN_PROGRESS,
            f"{where} is already moving to {list(target)}; wait until it completes",
        )
    current = _partition(state, command.topic, command.partition)
    return _replicas(
        state,
        where,
        _topic(state, command.topic).replication_factor,
        command.replicas,
        existing=current.replicas,
    )


def _group_of(
    state: MetadataState, topic: str, partition: int, raft_group_id: int, what: str
) -> ApplyResult | None:
    """A partition group's own report (`what`: "report", "completion") about a partition
    that exists and is still that group (not a deleted and re-created namesake)."""
    problem = partition_known(state, topic, partition)
    if problem is not None:
        return problem
    current = _partition(state, topic, partition)
    if current.raft_group_id != raft_group_id:
        return reject(
            ErrorCode.UNKNOWN_PARTITION,
            f"{what} from Raft group {raft_group_id} but {topic!r} partition {partition} is group "
            f"{current.raft_group_id}",
        )
    return None


def check_complete_reassignment(
    state: MetadataState, command: CompleteReassignment
) -> ApplyResult | None:
    problem = _group_of(
        state, command.topic, command.partition, command.raft_group_id, "completion"
    )
    if problem is not None:
        return problem
    current = _partition(state, command.topic, command.partition)
    where = f"{command.topic!r} partition {command.partition}"
    if current.target is None or current.target != command.replicas:
        return reject(
            ErrorCode.NO_REASSIGNMENT_IN_PROGRESS,
            f"{where} completes a move to {list(command.replicas)}, but its target is "
            f"{None if current.target is None else list(current.target)}",
        )
    return None


def check_report_leader(state: MetadataState, command: ReportLeader) -> ApplyResult | None:
    problem = _group_of(state, command.topic, command.partition, command.raft_group_id, "report")
    if problem is not None:
        return problem
    current = _partition(state, command.topic, command.partition)
    where = f"{command.topic!r} partition {command.partition}"
    if state.node(command.leader_id) is None:
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


def check_allocate_producer_ids(
    state: MetadataState, command: AllocateProducerIds
) -> ApplyResult | None:
    if not 1 <= command.count <= PRODUCER_ID_BLOCK_MAX:
        return reject(
            ErrorCode.INVALID_REQUEST,
            f"producer id block of {command.count} must be in [1, {PRODUCER_ID_BLOCK_MAX}]",
        )
    if state.next_producer_id + command.count > ALLOCATED_PRODUCER_ID_LIMIT:
        return reject(ErrorCode.INVALID_REQUEST, "producer ids are exhausted")
    return None


def check_commit_group_offsets(
    state: MetadataState, command: CommitGroupOffsets
) -> ApplyResult | None:
    problem = check_offsets(state, command)
    new_group = not state.has_consumer_group(command.group_id)
    if problem is None and new_group and state.consumer_group_count() >= CONSUMER_GROUPS_MAX:
        problem = reject(
            ErrorCode.INVALID_REQUEST,
            f"{CONSUMER_GROUPS_MAX} consumer groups already hold offsets",
        )
    return problem


def check_offsets(
    state: MetadataState, command: CommitGroupOffsets | CommitTransactionOffsets
) -> ApplyResult | None:
    """A commit's group id and offsets (a plain or a transactional one): 1 to
    OFFSETS_PER_COMMIT_MAX of known partitions, each once, with valid details."""
    problem = consumer_group_id(command.group_id)
    if problem is None and not 1 <= len(command.offsets) <= OFFSETS_PER_COMMIT_MAX:
        problem = reject(
            ErrorCode.INVALID_REQUEST,
            f"a commit holds 1-{OFFSETS_PER_COMMIT_MAX} offsets, got {len(command.offsets)}",
        )
    if problem is None and len({(t, p) for t, p, _ in command.offsets}) != len(command.offsets):
        problem = reject(ErrorCode.INVALID_REQUEST, "a commit names a partition twice")
    problem = problem or _offset_details_problem(command)
    for topic, partition, _ in command.offsets:
        problem = problem or partition_known(state, topic, partition)
    return problem


def _offset_details_problem(
    command: CommitGroupOffsets | CommitTransactionOffsets,
) -> ApplyResult | None:
    """Leader epochs and metadata: none, or one per offset; epochs in [-1, 2**31), metadata
    within the protocol's bound."""
    for name, details in (("leader_epochs", command.leader_epochs), ("metadata", command.metadata)):
        if details and len(details) != len(command.offsets):
            return reject(
                ErrorCode.INVALID_REQUEST,
                f"a commit of {len(command.offsets)} offsets has {len(details)} {name}",
            )
    if any(not -1 <= epoch < LEADER_EPOCH_LIMIT for epoch in command.leader_epochs):
        return reject(ErrorCode.INVALID_REQUEST, "a committed leader epoch is outside [-1, 2**31)")
    longest = max((offset_metadata_chars(m) for m in command.metadata), default=0)
    if longest > OFFSET_METADATA_CHARS_MAX:
        return reject(
            ErrorCode.INVALID_REQUEST,
            f"offset metadata of {longest} characters exceeds {OFFSET_METADATA_CHARS_MAX}",
        )
    return None


def check_decommission(state: MetadataState, command: DecommissionNode) -> ApplyResult | None:
    known = state.node(command.node_id)
    if known is None:
        return reject(ErrorCode.UNKNOWN_NODE, f"node {command.node_id} is not registered")
    if known.status == NODE_DECOMMISSIONED:
        return reject(
            ErrorCode.NODE_DECOMMISSIONED, f"node {command.node_id} is already decommissioned"
        )
    # Every topic must still find replication_factor nodes to live on without this one
    # (fenced nodes count: they are expected back; nodes already leaving do not).
    remaining = [
        n for n in state.nodes() if n.status == NODE_ACTIVE and n.node_id != command.node_id
    ]
    for topic in state.topics():
        if topic.replication_factor > len(remaining):
            return reject(
                ErrorCode.DECOMMISSION_REFUSED,
                f"decommissioning node {command.node_id} would leave {len(remaining)} "
                f"nodes {[int(n.node_id) for n in remaining]} for topic {topic.name!r} "
                f"of replication factor {topic.replication_factor}",
            )
    return None


def check_complete_decommission(
    state: MetadataState, command: CompleteDecommission
) -> ApplyResult | None:
    known = state.node(command.node_id)
    if known is None:
        return reject(ErrorCode.UNKNOWN_NODE, f"node {command.node_id} is not registered")
    if known.status != NODE_DECOMMISSIONING:
        return reject(
            ErrorCode.INVALID_REQUEST,
            f"node {command.node_id} is {known.status}, not decommissioning",
        )
    hosted = state.partitions_hosted_by(command.node_id)
    if hosted:
        names = [f"{p.topic}-{p.partition}" for p in hosted[:10]]
        return reject(
            ErrorCode.DECOMMISSION_INCOMPLETE,
            f"node {command.node_id} still hosts {len(hosted)} partitions {names}",
        )
    return None


def check_delete_group(state: MetadataState, command: DeleteGroup) -> ApplyResult | None:
    problem = consumer_group_id(command.group_id)
    if problem is None and not state.has_consumer_group(command.group_id):
        problem = reject(
            ErrorCode.UNKNOWN_GROUP, f"consumer group {command.group_id!r} has no offsets"
        )
    return problem


def check_delete_group_offsets(
    state: MetadataState, command: DeleteGroupOffsets
) -> ApplyResult | None:
    problem = check_delete_group(state, DeleteGroup(command.group_id))
    count = len(command.partitions)
    if problem is None and not 1 <= count <= OFFSETS_PER_COMMIT_MAX:
        problem = reject(
            ErrorCode.INVALID_REQUEST,
            f"a deletion names 1-{OFFSETS_PER_COMMIT_MAX} partitions, got {count}",
        )
    if problem is None and len(set(command.partitions)) != len(command.partitions):
        problem = reject(ErrorCode.INVALID_REQUEST, "a deletion names a partition twice")
    return problem


def check_delete_records(state: MetadataState, command: DeleteRecords) -> ApplyResult | None:
    count = len(command.offsets)
    if not 1 <= count <= OFFSETS_PER_COMMIT_MAX or len(command.raft_group_ids) != count:
        return reject(
            ErrorCode.INVALID_REQUEST,
            f"a deletion names 1-{OFFSETS_PER_COMMIT_MAX} partitions, each with its Raft group, "
            f"got {count} and {len(command.raft_group_ids)} groups",
        )
    if len({(topic, partition) for topic, partition, _ in command.offsets}) != count:
        return reject(ErrorCode.INVALID_REQUEST, "a deletion names a partition twice")
    for (topic, partition, _), raft_group_id in zip(
        command.offsets, command.raft_group_ids, strict=True
    ):
        problem = _group_of(state, topic, partition, raft_group_id, "deletion")
        if problem is not None:
            return problem
    return None


def _decommissioned(node_id: NodeId) -> ApplyResult:
    return reject(
        ErrorCode.NODE_DECOMMISSIONED,
        f"node {node_id} was decommissioned and may not rejoin the cluster (a new node needs "
        "a new node id and an empty data directory)",
    )


def consumer_group_id(group_id: str) -> ApplyResult | None:
    return id_length("consumer group id", group_id, CONSUMER_GROUP_ID_CHARS_MAX)


def id_length(what: str, value: str, chars_max: int) -> ApplyResult | None:
    """INVALID_REQUEST unless `value` (an id named `what`) has 1 to `chars_max` characters."""
    if not 1 <= len(value) <= chars_max:
        return reject(
            ErrorCode.INVALID_REQUEST, f"{what} must be 1-{chars_max} characters, got {len(value)}"
        )
    return None
