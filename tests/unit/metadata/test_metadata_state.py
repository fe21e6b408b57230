"""The metadata state machine: every command, every rejection, snapshots and restore.

Each rejection test also checks the rule that a rejected command leaves the state untouched
(only `applied_offset`, a log position, moves).
"""

from __future__ import annotations

import json

import pytest

from raftlog.metadata.checks import check_new_topic_name
from raftlog.metadata.commands import (
    AllocateProducerIds,
    AlterTopicConfig,
    ApplyResult,
    AutoCreateTopic,
    Command,
    CompleteReassignment,
    CreatePartitions,
    CreateTopic,
    DeleteRecords,
    DeleteTopic,
    ErrorCode,
    FenceNode,
    MetadataDecodeError,
    NodeHeartbeat,
    ReassignPartition,
    RegisterNode,
    ReportLeader,
    encode_command,
)
from raftlog.metadata.state import MetadataState
from raftlog.types import NodeId, PartitionId, RaftGroupId


class Log:
    """A metadata log applied in order, checking invariants after every command."""

    def __init__(self) -> None:
        self.state = MetadataState("cluster-a")
        self.offset = 0

    def apply(self, command: Command | bytes) -> ApplyResult:
        data = command if isinstance(command, bytes) else encode_command(command)
        result = self.state.apply(self.offset, data)
        assert self.state.applied_offset == self.offset
        self.offset += 1
        self.state.check_invariants()
        return result

    def ok(self, *commands: Command) -> None:
        for command in commands:
            result = self.apply(command)
            assert result.ok, result

    def rejected(self, command: Command | bytes, code: ErrorCode, *fragments: str) -> None:
        before = content(self.state)
        result = self.apply(command)
        assert result.code is code, result
        for fragment in fragments:
            assert fragment in result.message, (fragment, result.message)
        assert content(self.state) == before


def content(state: MetadataState) -> dict[str, object]:
    body = json.loads(state.snapshot()[1:])
    del body["applied_offset"]
    assert isinstance(body, dict)
    return body


def register(node_id: int, incarnation: int = 1, now_ms: int = 0) -> RegisterNode:
    return RegisterNode(
        NodeId(node_id), f"n{node_id}:9092", f"n{node_id}:9093", incarnation, now_ms
    )


def create(
    name: str = "orders",
    assignments: tuple[tuple[int, ...], ...] = ((1, 2), (2, 3), (3, 1)),
    first_raft_group_id: int = 1,
    **overrides: object,
) -> CreateTopic:
    fields: dict[str, object] = {
        "name": name,
        "topic_id": f"id-{name.replace('.', '_')}",
        "partition_count": len(assignments),
        "replication_factor": len(assignments[0]) if assignments else 2,
        "config": {"retention.ms": "60000"},
        "assignments": tuple(tuple(NodeId(n) for n in r) for r in assignments),
        "raft_group_ids": tuple(
            RaftGroupId(first_raft_group_id + i) for i in range(len(assignments))
        ),
    }
    fields.update(overrides)
    return CreateTopic(**fields)  # type: ignore[arg-type]


@pytest.fixture
def log() -> Log:
    log = Log()
    log.ok(register(1), register(2), register(3))
    return log


@pytest.fixture
def with_topic(log: Log) -> Log:
    log.ok(create())
    return log


def test_a_fresh_state() -> None:
    state = MetadataState("c")
    assert state.cluster_id == "c"
    assert state.applied_offset == -1
    assert state.next_raft_group_id == 1 and state.next_producer_id == 0
    assert state.nodes() == () and state.topics() == () and state.alive_node_ids() == ()
    assert state.partitions("x") == () and state.partition("x", 0) is None


def test_register_node(log: Log) -> None:
    node = log.state.node(NodeId(2))
    assert node is not None
    assert (node.client_address, node.raft_address) == ("n2:9092", "n2:9093")
    assert node.alive and node.incarnation == 1 and node.last_heartbeat_ms == 0
    assert log.state.alive_node_ids() == (1, 2, 3)


def test_reregistering_with_a_higher_incarnation_replaces_the_node(log: Log) -> None:
    log.ok(FenceNode(NodeId(1), 10_000, 5_000))
    log.ok(RegisterNode(NodeId(1), "new:1", "new:2", 2, 20_000))
    node = log.state.node(NodeId(1))
    assert node is not None and node.alive and node.client_address == "new:1"
    assert node.incarnation == 2 and node.last_heartbeat_ms == 20_000


def test_register_rejects_an_older_incarnation(log: Log) -> None:
    log.ok(register(1, incarnation=5))
    log.rejected(register(1, incarnation=4), ErrorCode.STALE_INCARNATION, "incarnation 4", "5")


def test_register_rejects_bad_addresses(log: Log) -> None:
    bad = RegisterNode(NodeId(9), "nohost", "n9:1", 1, 0)
    log.rejected(bad, ErrorCode.INVALID_REQUEST, "client_address 'nohost'")
    bad = RegisterNode(NodeId(9), "n9:1", "n9:0", 1, 0)
    log.rejected(bad, ErrorCode.INVALID_REQUEST, "raft_address 'n9:0'")


def test_heartbeat_renews_and_unfences(log: Log) -> None:
    log.ok(FenceNode(NodeId(2), 7_000, 6_000))
    node = log.state.node(NodeId(2))
    assert node is not None and node.fenced and not node.alive
    assert log.state.alive_node_ids() == (1, 3)
    log.ok(NodeHeartbeat(NodeId(2), 1, 8_000))
    node = log.state.node(NodeId(2))
    assert node is not None and node.alive and node.last_heartbeat_ms == 8_000


def test_heartbeat_rejections(log: Log) -> None:
    log.rejected(NodeHeartbeat(NodeId(7), 1, 5), ErrorCode.UNKNOWN_NODE, "node 7")
    log.rejected(NodeHeartbeat(NodeId(1), 2, 5), ErrorCode.STALE_INCARNATION, "register first")
    log.rejected(NodeHeartbeat(NodeId(1), 0, 5), ErrorCode.STALE_INCARNATION, "incarnation 0")


def test_fence_rechecks_the_lease_at_apply(log: Log) -> None:
    # A heartbeat applied after the controller decided to fence wins.
    log.ok(NodeHeartbeat(NodeId(1), 1, 5_000))
    log.rejected(FenceNode(NodeId(1), 10_999, 6_000), ErrorCode.LEASE_NOT_EXPIRED, "lease_ms=6000")
    log.ok(FenceNode(NodeId(1), 11_000, 6_000))
    log.ok(FenceNode(NodeId(1), 11_000, 6_000))  # fencing a fenced node changes nothing
    log.rejected(FenceNode(NodeId(8), 11_000, 6_000), ErrorCode.UNKNOWN_NODE, "node 8")
    log.rejected(FenceNode(NodeId(2), 11_000, 0), ErrorCode.INVALID_REQUEST, "lease_ms")


def test_create_topic(with_topic: Log) -> None:
    state = with_topic.state
    topic = state.topic("orders")
    assert topic is not None
    assert (topic.topic_id, topic.partition_count, topic.replication_factor) == ("id-orders", 3, 2)
    assert topic.config == {"retention.ms": "60000"}
    p1 = state.partition("orders", 1)
    assert p1 is not None
    assert (p1.raft_group_id, p1.replicas, p1.preferred_leader) == (2, (2, 3), 2)
    assert p1.leader_id is None and p1.leader_epoch == -1
    assert state.next_raft_group_id == 4
    assert state.raft_group_ids_for_node(NodeId(1)) == {1, 3}
    assert state.raft_group_ids_for_node(NodeId(9)) == frozenset()
    by_group = state.partition_by_raft_group(RaftGroupId(3))
    assert by_group is not None and (by_group.topic, by_group.partition) == ("orders", 2)
    assert state.partition_by_raft_group(RaftGroupId(4)) is None
    assert [t.name for t in state.topics()] == ["orders"]


@pytest.mark.parametrize(
    ("command", "code", "fragment"),
    [
        (create(name="a b"), ErrorCode.INVALID_TOPIC_NAME, "'a b'"),
        (create(name="orders"), ErrorCode.TOPIC_ALREADY_EXISTS, "'orders' already exists"),
        (
            create(name="o", topic_id="id-orders", first_raft_group_id=4),
            ErrorCode.INVALID_REQUEST,
            "id",
        ),
        (
            create(name="o", topic_id="bad id", first_raft_group_id=4),
            ErrorCode.INVALID_REQUEST,
            "id",
        ),
        (create(name="o", partition_count=0, assignments=()), ErrorCode.INVALID_PARTITIONS, "0"),
        (create(name="o", partition_count=2), ErrorCode.INVALID_REPLICA_ASSIGNMENT, "3 replica"),
        (create(name="o", replication_factor=16), ErrorCode.INVALID_REPLICATION_FACTOR, "16"),
        (create(name="o", replication_factor=3), ErrorCode.INVALID_REPLICATION_FACTOR, "[1, 2]"),
        (create(name="o", assignments=((1, 1),)), ErrorCode.INVALID_REPLICA_ASSIGNMENT, "twice"),
        (create(name="o", assignments=((1, 9),)), ErrorCode.INVALID_REPLICA_ASSIGNMENT, "[9]"),
        (create(name="o", config={"x": "1"}), ErrorCode.INVALID_CONFIG, "'x'"),
        (
            create(name="o", first_raft_group_id=3),
            ErrorCode.INVALID_GROUP_ID,
            "next_raft_group_id=4",
        ),
        (
            create(name="o", raft_group_ids=(RaftGroupId(5),) * 3),
            ErrorCode.INVALID_GROUP_ID,
            "stale",
        ),
        (
            create(name="o", raft_group_ids=(RaftGroupId(5),)),
            ErrorCode.INVALID_REQUEST,
            "1 Raft group ids",
        ),
        (create(name="o", first_raft_group_id=(1 << 31) - 1), ErrorCode.INVALID_GROUP_ID, "below"),
    ],
)
def test_create_topic_checks(
    with_topic: Log, command: CreateTopic, code: ErrorCode, fragment: str
) -> None:
    with_topic.rejected(command, code, fragment)


def test_topic_names_differing_in_dot_and_underscore_collide(with_topic: Log) -> None:
    with_topic.ok(create("a.b", first_raft_group_id=4))
    with_topic.rejected(create("a_b", first_raft_group_id=7), ErrorCode.INVALID_TOPIC_NAME, "'a.b'")


def test_a_new_topic_name_is_checked_against_the_existing_ones(with_topic: Log) -> None:
    state = with_topic.state
    assert check_new_topic_name(state, "payments") is None
    for name, code in [
        ("orders", ErrorCode.TOPIC_ALREADY_EXISTS),
        ("a|b", ErrorCode.INVALID_TOPIC_NAME),
    ]:
        problem = check_new_topic_name(state, name)
        assert problem is not None and problem.code is code, name
    with_topic.ok(create("pay.ments", first_raft_group_id=4))
    problem = check_new_topic_name(state, "pay_ments")
    assert problem is not None and "collides with existing topic 'pay.ments'" in problem.message


def test_auto_create_topic_is_a_request_never_applied(with_topic: Log) -> None:
    # The controller plans it into a CreateTopic as it receives it; a log holding one refuses it.
    with_topic.rejected(
        AutoCreateTopic("payments", 1, 1), ErrorCode.INVALID_REQUEST, "never applied"
    )


def test_alter_topic_config_sets_and_deletes_keys(with_topic: Log) -> None:
    set_compact = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.1"}
    with_topic.ok(AlterTopicConfig("orders", set_compact, ()))
    topic = with_topic.state.topic("orders")
    assert topic is not None and topic.config == {**set_compact, "retention.ms": "60000"}
    deleted = ("cleanup.policy", "retention.ms")
    with_topic.ok(AlterTopicConfig("orders", {"delete.retention.ms": "5"}, deleted))
    topic = with_topic.state.topic("orders")
    assert topic is not None
    assert topic.config == {"delete.retention.ms": "5", "min.cleanable.dirty.ratio": "0.1"}
    snapshot = with_topic.state.snapshot()
    assert content(MetadataState.restore(snapshot)) == content(with_topic.state)


@pytest.mark.parametrize(
    ("command", "code", "fragment"),
    [
        (AlterTopicConfig("nope", {}, ()), ErrorCode.UNKNOWN_TOPIC, "'nope'"),
        (
            AlterTopicConfig("orders", {"cleanup.policy": "zap"}, ()),
            ErrorCode.INVALID_CONFIG,
            "cleanup.policy='zap'",
        ),
        (AlterTopicConfig("orders", {}, ("x.y",)), ErrorCode.INVALID_CONFIG, "'x.y' cannot be"),
        (
            AlterTopicConfig("orders", {"segment.ms": "5"}, ("segment.ms",)),
            ErrorCode.INVALID_CONFIG,
            "it is also set",
        ),
    ],
)
def test_alter_topic_config_checks(
    with_topic: Log, command: AlterTopicConfig, code: ErrorCode, fragment: str
) -> None:
    with_topic.rejected(command, code, fragment)


def test_delete_topic_keeps_group_ids_unique(with_topic: Log) -> None:
    with_topic.ok(DeleteTopic("orders"))
    assert with_topic.state.topic("orders") is None
    assert with_topic.state.raft_group_ids_for_node(NodeId(1)) == frozenset()
    assert with_topic.state.next_raft_group_id == 4
    with_topic.rejected(DeleteTopic("orders"), ErrorCode.UNKNOWN_TOPIC, "'orders'")
    # Re-created under the same name, the topic gets new groups.
    with_topic.rejected(create(), ErrorCode.INVALID_GROUP_ID)
    with_topic.ok(create(first_raft_group_id=4))
    p0 = with_topic.state.partition("orders", 0)
    assert p0 is not None and p0.raft_group_id == 4


def test_a_recreated_topic_starts_its_groups_above_every_reported_leader_epoch(
    with_topic: Log,
) -> None:
    # A client that cached the deleted topic's leader epoch ignores metadata with a lower one
    # for the same name (librdkafka: "ignoring outdated metadata update"): the new topic's
    # groups start at a term no lower than any epoch reported before, so their leaders'
    # epochs are higher.
    assert [p.first_term for p in with_topic.state.partitions("orders")] == [0, 0, 0]
    with_topic.ok(ReportLeader("orders", PartitionId(1), RaftGroupId(2), NodeId(2), 5))
    with_topic.ok(ReportLeader("orders", PartitionId(0), RaftGroupId(1), NodeId(1), 2))
    with_topic.ok(DeleteTopic("orders"))
    assert with_topic.state.leader_epoch_high == 5
    with_topic.ok(create(first_raft_group_id=4))
    assert [p.first_term for p in with_topic.state.partitions("orders")] == [5, 5, 5]
    restored = MetadataState.restore(with_topic.state.snapshot())
    assert restored.leader_epoch_high == 5
    assert restored.partitions("orders") == with_topic.state.partitions("orders")
    assert restored.snapshot() == with_topic.state.snapshot()


def test_create_partitions(with_topic: Log) -> None:
    with_topic.ok(CreatePartitions("orders", ((NodeId(3), NodeId(2)),), (RaftGroupId(4),)))
    topic = with_topic.state.topic("orders")
    assert topic is not None and topic.partition_count == 4
    p3 = with_topic.state.partition("orders", 3)
    assert p3 is not None and (p3.partition, p3.raft_group_id, p3.replicas) == (3, 4, (3, 2))
    assert with_topic.state.next_raft_group_id == 5


@pytest.mark.parametrize(
    ("command", "code", "fragment"),
    [
        (CreatePartitions("nope", ((1, 2),), (4,)), ErrorCode.UNKNOWN_TOPIC, "'nope'"),
        (CreatePartitions("orders", (), ()), ErrorCode.INVALID_PARTITIONS, "at least one"),
        (CreatePartitions("orders", ((1,),), (4,)), ErrorCode.INVALID_REPLICATION_FACTOR, "1 repl"),
        (CreatePartitions("orders", ((1, 2),), (3,)), ErrorCode.INVALID_GROUP_ID, "[3]"),
        (CreatePartitions("orders", ((1, 2),), ()), ErrorCode.INVALID_REQUEST, "0 Raft group ids"),
        (
            CreatePartitions("orders", ((1, 2),) * 9998, tuple(range(4, 10002))),
            ErrorCode.INVALID_PARTITIONS,
            "at most 10000",
        ),
    ],
)
def test_create_partitions_checks(
    with_topic: Log, command: CreatePartitions, code: ErrorCode, fragment: str
) -> None:
    with_topic.rejected(command, code, fragment)


def test_reassign_partition_starts_a_move_that_completion_ends(with_topic: Log) -> None:
    # orders-0 is group 1 on (1, 2): move it to (3, 1).
    with_topic.ok(ReassignPartition("orders", PartitionId(0), (NodeId(3), NodeId(1))))
    p0 = with_topic.state.partition("orders", 0)
    assert p0 is not None and p0.replicas == (1, 2) and p0.target == (3, 1)
    assert (p0.adding, p0.removing, p0.hosts) == ((3,), (2,), (1, 2, 3))
    # During the move node 2 (leaving) and node 3 (joining) both host the group.
    assert 1 in with_topic.state.raft_group_ids_for_node(NodeId(2))
    assert 1 in with_topic.state.raft_group_ids_for_node(NodeId(3))
    assert with_topic.state.moving_partitions() == (p0,)
    # A snapshot taken mid-move restores the move (and equal states give equal bytes).
    restored = MetadataState.restore(with_topic.state.snapshot())
    assert restored.partition("orders", 0) == p0
    assert restored.snapshot() == with_topic.state.snapshot()
    with_topic.rejected(
        ReassignPartition("orders", PartitionId(0), (NodeId(2), NodeId(3))),
        ErrorCode.REASSIGNMENT_IN_PROGRESS,
        "already moving to [3, 1]",
    )
    with_topic.ok(
        CompleteReassignment("orders", PartitionId(0), RaftGroupId(1), (NodeId(3), NodeId(1)))
    )
    p0 = with_topic.state.partition("orders", 0)
    assert p0 is not None and p0.replicas == (3, 1) and p0.target is None
    assert p0.preferred_leader == 3
    assert with_topic.state.raft_group_ids_for_node(NodeId(2)) == {2}
    assert with_topic.state.moving_partitions() == ()
    # A second, late completion (a new leader reporting again) changes nothing.
    with_topic.rejected(
        CompleteReassignment("orders", PartitionId(0), RaftGroupId(1), (NodeId(3), NodeId(1))),
        ErrorCode.NO_REASSIGNMENT_IN_PROGRESS,
        "target is None",
    )


def test_reassign_to_the_same_nodes_only_reorders(with_topic: Log) -> None:
    with_topic.ok(ReassignPartition("orders", PartitionId(0), (NodeId(2), NodeId(1))))
    p0 = with_topic.state.partition("orders", 0)
    assert p0 is not None and p0.replicas == (2, 1) and p0.target is None


@pytest.mark.parametrize(
    ("command", "code", "fragment"),
    [
        (
            CompleteReassignment("orders", PartitionId(0), RaftGroupId(2), (3, 1)),
            ErrorCode.UNKNOWN_PARTITION,
            "is group 1",
        ),
        (
            CompleteReassignment("orders", PartitionId(0), RaftGroupId(1), (1, 3)),
            ErrorCode.NO_REASSIGNMENT_IN_PROGRESS,
            "target is [3, 1]",
        ),
        (
            CompleteReassignment("nope", PartitionId(0), RaftGroupId(1), (3, 1)),
            ErrorCode.UNKNOWN_TOPIC,
            "'nope'",
        ),
    ],
)
def test_complete_reassignment_checks(
    with_topic: Log, command: CompleteReassignment, code: ErrorCode, fragment: str
) -> None:
    with_topic.ok(ReassignPartition("orders", PartitionId(0), (NodeId(3), NodeId(1))))
    with_topic.rejected(command, code, fragment)


def test_snapshot_with_a_bad_target_is_refused(with_topic: Log) -> None:
    with_topic.ok(ReassignPartition("orders", PartitionId(0), (NodeId(3), NodeId(1))))
    body = json.loads(with_topic.state.snapshot()[1:])
    body["topics"][0]["partitions"][0]["target"] = [1, 2]  # the same nodes: not a move
    data = bytes([1]) + json.dumps(body).encode()
    with pytest.raises(MetadataDecodeError, match=r"moves from \[1, 2\] to \[1, 2\]"):
        MetadataState.restore(data)


@pytest.mark.parametrize(
    ("command", "code", "fragment"),
    [
        (ReassignPartition("nope", PartitionId(0), (1, 2)), ErrorCode.UNKNOWN_TOPIC, "'nope'"),
        (ReassignPartition("orders", PartitionId(3), (1, 2)), ErrorCode.UNKNOWN_PARTITION, "has 3"),
        (
            ReassignPartition("orders", PartitionId(0), (1,)),
            ErrorCode.INVALID_REPLICATION_FACTOR,
            "",
        ),
        (
            ReassignPartition("orders", PartitionId(0), (2, 2)),
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            "",
        ),
        (
            ReassignPartition("orders", PartitionId(0), (2, 4)),
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            "[4]",
        ),
    ],
)
def test_reassign_checks(
    with_topic: Log, command: ReassignPartition, code: ErrorCode, fragment: str
) -> None:
    with_topic.rejected(command, code, fragment)


def test_report_leader_keeps_the_highest_epoch(with_topic: Log) -> None:
    report = ReportLeader("orders", PartitionId(0), RaftGroupId(1), NodeId(2), 3)
    with_topic.ok(report, report)  # a repeated report is harmless
    p0 = with_topic.state.partition("orders", 0)
    assert p0 is not None and (p0.leader_id, p0.leader_epoch) == (2, 3)
    older = ReportLeader("orders", PartitionId(0), RaftGroupId(1), NodeId(1), 2)
    with_topic.rejected(older, ErrorCode.STALE_LEADER_EPOCH, "epoch 2", "epoch 3")
    rival = ReportLeader("orders", PartitionId(0), RaftGroupId(1), NodeId(1), 3)
    with_topic.rejected(rival, ErrorCode.STALE_LEADER_EPOCH)
    with_topic.ok(ReportLeader("orders", PartitionId(0), RaftGroupId(1), NodeId(1), 4))


@pytest.mark.parametrize(
    ("command", "code", "fragment"),
    [
        (
            ReportLeader("nope", PartitionId(0), RaftGroupId(1), NodeId(1), 1),
            ErrorCode.UNKNOWN_TOPIC,
            "",
        ),
        (
            ReportLeader("orders", PartitionId(5), RaftGroupId(1), NodeId(1), 1),
            ErrorCode.UNKNOWN_PARTITION,
            "",
        ),
        (
            ReportLeader("orders", PartitionId(0), RaftGroupId(2), NodeId(1), 1),
            ErrorCode.UNKNOWN_PARTITION,
            "group 2",
        ),
        (
            ReportLeader("orders", PartitionId(0), RaftGroupId(1), NodeId(9), 1),
            ErrorCode.UNKNOWN_NODE,
            "9",
        ),
    ],
)
def test_report_leader_checks(
    with_topic: Log, command: ReportLeader, code: ErrorCode, fragment: str
) -> None:
    with_topic.rejected(command, code, fragment)


def _delete_records(*offsets: tuple[str, int, int], groups: tuple[int, ...] = ()) -> DeleteRecords:
    return DeleteRecords(
        offsets=tuple((t, PartitionId(p), o) for t, p, o in offsets),
        raft_group_ids=tuple(RaftGroupId(g) for g in groups),
    )


def test_delete_records_only_raises_a_log_start_and_survives_a_snapshot(with_topic: Log) -> None:
    with_topic.ok(_delete_records(("orders", 0, 40), ("orders", 2, 7), groups=(1, 3)))
    floors = [p.log_start_floor for p in with_topic.state.partitions("orders")]
    assert floors == [40, 0, 7]
    # A lower offset (a late or repeated request) changes nothing.
    with_topic.ok(_delete_records(("orders", 0, 12), groups=(1,)))
    with_topic.ok(_delete_records(("orders", 0, 41), groups=(1,)))
    assert [p.log_start_floor for p in with_topic.state.partitions("orders")] == [41, 0, 7]
    restored = MetadataState.restore(with_topic.state.snapshot())
    assert restored.partitions("orders") == with_topic.state.partitions("orders")
    assert restored.snapshot() == with_topic.state.snapshot()
    assert '"log_start_floor":41' in with_topic.state.snapshot().decode()
    # A recreated topic starts from nothing deleted.
    with_topic.ok(DeleteTopic("orders"), create(first_raft_group_id=4))
    assert [p.log_start_floor for p in with_topic.state.partitions("orders")] == [0, 0, 0]


def test_a_snapshot_without_log_starts_keeps_its_bytes(with_topic: Log) -> None:
    assert "log_start_floor" not in with_topic.state.snapshot().decode()


@pytest.mark.parametrize(
    ("command", "code", "fragment"),
    [
        (_delete_records(("nope", 0, 1), groups=(1,)), ErrorCode.UNKNOWN_TOPIC, "nope"),
        (_delete_records(("orders", 3, 1), groups=(1,)), ErrorCode.UNKNOWN_PARTITION, ""),
        # A deleted and recreated topic's namesake: its group is another.
        (_delete_records(("orders", 0, 1), groups=(2,)), ErrorCode.UNKNOWN_PARTITION, "group 2"),
        (_delete_records(("orders", 0, 1)), ErrorCode.INVALID_REQUEST, "0 groups"),
        (_delete_records(groups=()), ErrorCode.INVALID_REQUEST, "1-10000"),
        (
            _delete_records(("orders", 0, 1), ("orders", 0, 2), groups=(1, 1)),
            ErrorCode.INVALID_REQUEST,
            "twice",
        ),
    ],
)
def test_delete_records_checks(
    with_topic: Log, command: DeleteRecords, code: ErrorCode, fragment: str
) -> None:
    with_topic.rejected(command, code, fragment)


def test_allocate_producer_ids_hands_out_disjoint_blocks(log: Log) -> None:
    first = log.apply(AllocateProducerIds(1000))
    second = log.apply(AllocateProducerIds(1))
    assert (first.producer_id_first, second.producer_id_first) == (0, 1000)
    assert log.state.next_producer_id == 1001
    log.rejected(AllocateProducerIds(0), ErrorCode.INVALID_REQUEST, "[1, 1048576]")
    log.rejected(AllocateProducerIds(1 << 21), ErrorCode.INVALID_REQUEST, "2097152")


def test_malformed_bytes_are_rejected_not_raised(log: Log) -> None:
    log.rejected(b"\x01{", ErrorCode.INVALID_REQUEST, "not UTF-8 JSON")
    log.rejected(b"", ErrorCode.INVALID_REQUEST, "version")


def test_check_predicts_apply_without_changing_anything(with_topic: Log) -> None:
    before = with_topic.state.snapshot()
    assert with_topic.state.check(create()).code is ErrorCode.TOPIC_ALREADY_EXISTS
    assert with_topic.state.check(DeleteTopic("orders")).ok
    assert with_topic.state.snapshot() == before


def test_apply_demands_increasing_offsets(log: Log) -> None:
    with pytest.raises(AssertionError):
        log.state.apply(log.offset - 1, encode_command(AllocateProducerIds(1)))


def test_snapshot_restore_gives_an_equal_state(with_topic: Log) -> None:
    with_topic.ok(
        ReportLeader("orders", PartitionId(1), RaftGroupId(2), NodeId(3), 9),
        FenceNode(NodeId(1), 50_000, 6_000),
        AllocateProducerIds(7),
    )
    data = with_topic.state.snapshot()
    restored = MetadataState.restore(data)
    assert restored.snapshot() == data
    assert restored.applied_offset == with_topic.state.applied_offset
    assert restored.nodes() == with_topic.state.nodes()
    assert restored.topics() == with_topic.state.topics()
    assert list(restored.all_partitions()) == list(with_topic.state.all_partitions())
    assert restored.next_producer_id == 7 and restored.next_raft_group_id == 4
    restored.check_invariants()


def _snapshot_body(log: Log) -> dict[str, object]:
    body = json.loads(log.state.snapshot()[1:])
    assert isinstance(body, dict)
    return body


def _restore(body: object) -> None:
    MetadataState.restore(b"\x01" + json.dumps(body).encode())


def test_restore_rejects_malformed_snapshots(with_topic: Log) -> None:
    with pytest.raises(MetadataDecodeError, match="format version 9"):
        MetadataState.restore(b"\x09{}")
    with pytest.raises(MetadataDecodeError, match="not UTF-8 JSON"):
        MetadataState.restore(b"\x01{")
    body = _snapshot_body(with_topic)
    with pytest.raises(MetadataDecodeError, match="expected fields"):
        _restore({**body, "extra": 1})
    with pytest.raises(MetadataDecodeError, match="cluster_id is empty"):
        _restore({**body, "cluster_id": ""})
    with pytest.raises(MetadataDecodeError, match="applied_offset"):
        _restore({**body, "applied_offset": -2})
    nodes = body["nodes"]
    assert isinstance(nodes, list)
    with pytest.raises(MetadataDecodeError, match="node 1 twice"):
        _restore({**body, "nodes": [nodes[0], nodes[0], nodes[1], nodes[2]]})
    with pytest.raises(MetadataDecodeError, match="fenced: expected a boolean"):
        _restore({**body, "nodes": [{**nodes[0], "fenced": 0}, *nodes[1:]]})


def test_restore_rejects_snapshots_that_break_invariants(with_topic: Log) -> None:
    body = _snapshot_body(with_topic)
    topics = body["topics"]
    assert isinstance(topics, list)
    with pytest.raises(MetadataDecodeError, match="name unregistered nodes"):
        _restore({**body, "nodes": []})
    with pytest.raises(MetadataDecodeError, match="group id 3 outside"):
        _restore({**body, "next_group_id": 3})
    with pytest.raises(MetadataDecodeError, match="'orders' twice"):
        _restore({**body, "topics": [topics[0], topics[0]]})
    broken = {**topics[0], "config": {"retention.ms": "x"}}
    with pytest.raises(MetadataDecodeError, match=r"retention\.ms='x'"):
        _restore({**body, "topics": [broken]})
    broken = {**topics[0], "replication_factor": 3}
    with pytest.raises(MetadataDecodeError, match="replication factor 3"):
        _restore({**body, "topics": [broken]})
