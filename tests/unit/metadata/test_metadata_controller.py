"""Controller decisions: topic and partition plans, fencing, leader moves, rebalancing.

The decisions are pure functions of a `MetadataState` and the time, so each test builds a
state by applying commands, decides, and applies the decision to check it is accepted.
"""

from __future__ import annotations

from collections import Counter

import pytest

from raftlog.config import MetadataConfig
from raftlog.errors import ConfigError
from raftlog.metadata.assignment import NodeLoad, assign_replicas
from raftlog.metadata.commands import (
    ApplyResult,
    AssignmentError,
    Command,
    CompleteReassignment,
    CreatePartitions,
    CreateTopic,
    DeleteTopic,
    ErrorCode,
    FenceNode,
    NodeHeartbeat,
    ReassignPartition,
    RegisterNode,
    ReportLeader,
    encode_command,
)
from raftlog.metadata.controller import (
    CreateTopicRequest,
    LeaderMove,
    auto_rebalance_step,
    expired_nodes,
    fences_by_silence,
    live_node_ids,
    node_loads,
    plan_create_partitions,
    plan_create_topic,
    preferred_leader_moves,
    rebalance_plan,
)
from raftlog.metadata.state import MetadataState
from raftlog.types import NodeId, PartitionId, RaftGroupId

LEASE_MS = MetadataConfig().node_lease_ms


class Cluster:
    def __init__(self, node_count: int) -> None:
        self.state = MetadataState("cluster-a")
        self.offset = 0
        self.now_ms = 1_000
        for n in range(1, node_count + 1):
            self.apply(RegisterNode(NodeId(n), f"n{n}:1", f"n{n}:2", 1, self.now_ms))

    def apply(self, *commands: Command) -> None:
        for command in commands:
            result = self.state.apply(self.offset, encode_command(command))
            assert result.ok, (command, result)
            self.offset += 1
        self.state.check_invariants()

    def create(self, name: str, partitions: int, replication_factor: int) -> CreateTopic:
        plan = plan_create_topic(
            self.state, CreateTopicRequest(name, partitions, replication_factor), self.now_ms
        )
        assert isinstance(plan, CreateTopic), plan
        self.apply(plan)
        return plan


def _error(plan: object) -> ApplyResult:
    assert isinstance(plan, ApplyResult), plan
    assert not plan.ok
    return plan


def test_plan_create_topic_balances_leaders_and_replicas() -> None:
    cluster = Cluster(3)
    plan = cluster.create("orders", 6, 3)
    assert plan.raft_group_ids == (1, 2, 3, 4, 5, 6)
    assert len(plan.topic_id) == 22
    assert Counter(r[0] for r in plan.assignments) == {1: 2, 2: 2, 3: 2}
    loads = node_loads(cluster.state)
    assert loads == {n: NodeLoad(leaders=2, replicas=6) for n in (1, 2, 3)}


def test_plans_are_deterministic_and_topic_ids_are_never_reused() -> None:
    cluster = Cluster(3)
    request = CreateTopicRequest("orders", 3, 2, {"retention.ms": "5"})
    first = plan_create_topic(cluster.state, request, cluster.now_ms)
    assert first == plan_create_topic(cluster.state, request, cluster.now_ms)
    assert isinstance(first, CreateTopic)
    cluster.apply(first, DeleteTopic("orders"))
    again = plan_create_topic(cluster.state, request, cluster.now_ms)
    assert isinstance(again, CreateTopic) and again.topic_id != first.topic_id


def test_a_plan_made_stale_by_another_is_rejected_at_apply() -> None:
    cluster = Cluster(3)
    first = plan_create_topic(cluster.state, CreateTopicRequest("a", 1, 1), cluster.now_ms)
    second = plan_create_topic(cluster.state, CreateTopicRequest("b", 1, 1), cluster.now_ms)
    assert isinstance(first, CreateTopic) and isinstance(second, CreateTopic)
    cluster.apply(first)
    result = cluster.state.apply(cluster.offset, encode_command(second))
    assert result.code is ErrorCode.INVALID_GROUP_ID


@pytest.mark.parametrize(
    ("request_", "code", "fragment"),
    [
        (CreateTopicRequest("bad name", 1, 1), ErrorCode.INVALID_TOPIC_NAME, "'bad name'"),
        (CreateTopicRequest("taken", 1, 1), ErrorCode.TOPIC_ALREADY_EXISTS, "'taken'"),
        (CreateTopicRequest("t", 1, 1, {"segment.ms": "0"}), ErrorCode.INVALID_CONFIG, "segment"),
        (CreateTopicRequest("t", 0, 1), ErrorCode.INVALID_PARTITIONS, "partition count 0"),
        (CreateTopicRequest("t", 1001, 1), ErrorCode.INVALID_PARTITIONS, "=1000"),
        (CreateTopicRequest("t", 1, 0), ErrorCode.INVALID_REPLICATION_FACTOR, "factor 0"),
        (CreateTopicRequest("t", 1, 8), ErrorCode.INVALID_REPLICATION_FACTOR, "=7"),
        (CreateTopicRequest("t", 1, 4), ErrorCode.INVALID_REPLICATION_FACTOR, "3 live nodes"),
        (CreateTopicRequest("taken.", 1, 1), ErrorCode.NONE, ""),
        (CreateTopicRequest("t_aken", 1, 1), ErrorCode.NONE, ""),
        (CreateTopicRequest("t.aken", 1, 1), ErrorCode.INVALID_TOPIC_NAME, "collides"),
    ],
)
def test_plan_create_topic_errors(
    request_: CreateTopicRequest, code: ErrorCode, fragment: str
) -> None:
    cluster = Cluster(3)
    cluster.create("taken", 1, 1)
    if request_.name == "t.aken":
        cluster.create("t_aken", 1, 1)
    plan = plan_create_topic(cluster.state, request_, cluster.now_ms)
    if code is ErrorCode.NONE:
        assert isinstance(plan, CreateTopic)
        return
    error = _error(plan)
    assert error.code is code and fragment in error.message, error


def test_only_nodes_alive_now_receive_replicas() -> None:
    cluster = Cluster(4)
    cluster.apply(FenceNode(NodeId(4), cluster.now_ms + LEASE_MS, LEASE_MS))
    cluster.now_ms += LEASE_MS - 1
    cluster.apply(*(NodeHeartbeat(NodeId(n), 1, cluster.now_ms) for n in (1, 2)))
    cluster.now_ms += 1
    # Node 3 missed its heartbeats but is not fenced yet; node 4 is fenced.
    assert live_node_ids(cluster.state, cluster.now_ms, LEASE_MS) == (1, 2)
    error = _error(plan_create_topic(cluster.state, CreateTopicRequest("t", 1, 3), cluster.now_ms))
    assert error.code is ErrorCode.INVALID_REPLICATION_FACTOR and "[1, 2]" in error.message
    plan = cluster.create("t", 4, 2)
    assert {n for r in plan.assignments for n in r} == {1, 2}


def test_topics_max_is_enforced() -> None:
    cluster = Cluster(1)
    cluster.create("a", 1, 1)
    limits = MetadataConfig(topics_max=1)
    plan = plan_create_topic(cluster.state, CreateTopicRequest("b", 1, 1), 0, config=limits)
    assert _error(plan).code is ErrorCode.INVALID_REQUEST


def test_plan_create_partitions() -> None:
    cluster = Cluster(3)
    cluster.create("orders", 3, 2)
    plan = plan_create_partitions(cluster.state, "orders", 6, cluster.now_ms)
    assert isinstance(plan, CreatePartitions)
    assert plan.raft_group_ids == (4, 5, 6)
    cluster.apply(plan)
    assert node_loads(cluster.state) == {n: NodeLoad(leaders=2, replicas=4) for n in (1, 2, 3)}
    for name, total, code in [
        ("nope", 9, ErrorCode.UNKNOWN_TOPIC),
        ("orders", 6, ErrorCode.INVALID_PARTITIONS),
        ("orders", 1001, ErrorCode.INVALID_PARTITIONS),
    ]:
        assert (
            _error(plan_create_partitions(cluster.state, name, total, cluster.now_ms)).code is code
        )
    cluster.apply(FenceNode(NodeId(3), cluster.now_ms + LEASE_MS, LEASE_MS))
    cluster.apply(FenceNode(NodeId(2), cluster.now_ms + LEASE_MS, LEASE_MS))
    error = _error(plan_create_partitions(cluster.state, "orders", 7, cluster.now_ms))
    assert error.code is ErrorCode.INVALID_REPLICATION_FACTOR


def test_expired_nodes_fences_silent_nodes_once() -> None:
    cluster = Cluster(3)
    cluster.apply(NodeHeartbeat(NodeId(2), 1, cluster.now_ms + 500))
    assert expired_nodes(cluster.state, cluster.now_ms + LEASE_MS - 1, LEASE_MS) == ()
    fences = expired_nodes(cluster.state, cluster.now_ms + LEASE_MS, LEASE_MS)
    assert [f.node_id for f in fences] == [1, 3]
    cluster.apply(*fences)
    assert cluster.state.alive_node_ids() == (2,)
    later = expired_nodes(cluster.state, cluster.now_ms + LEASE_MS + 500, LEASE_MS)
    assert [f.node_id for f in later] == [2]


def test_a_new_controller_gives_every_node_one_full_lease() -> None:
    cluster = Cluster(2)
    took_office_ms = cluster.now_ms + 10 * LEASE_MS
    quiet = expired_nodes(
        cluster.state, took_office_ms + LEASE_MS - 1, LEASE_MS, controller_since_ms=took_office_ms
    )
    assert quiet == ()
    fences = expired_nodes(
        cluster.state, took_office_ms + LEASE_MS, LEASE_MS, controller_since_ms=took_office_ms
    )
    assert [f.node_id for f in fences] == [1, 2]


def test_fences_by_silence_measured_on_the_controllers_clock() -> None:
    cluster = Cluster(3)
    # Node 2's last heartbeat was stamped by a controller whose clock ran far ahead: with
    # silences measured on the current controller's own clock that does not matter.
    cluster.apply(NodeHeartbeat(NodeId(2), 1, cluster.now_ms + 10**9))
    silent = {NodeId(1): LEASE_MS - 1, NodeId(2): LEASE_MS, NodeId(3): 0}
    fences = fences_by_silence(cluster.state, silent, LEASE_MS)
    assert fences == (FenceNode(NodeId(2), cluster.now_ms + 10**9 + LEASE_MS, LEASE_MS),)
    # A node the controller has no measure for (not yet registered there) is left alone.
    assert fences_by_silence(cluster.state, {}, LEASE_MS) == ()
    # A heartbeat applied after the fence was planned wins: the stale fence is rejected.
    cluster.apply(NodeHeartbeat(NodeId(2), 1, cluster.now_ms + 10**9 + LEASE_MS))
    assert cluster.state.check(fences[0]).code is ErrorCode.LEASE_NOT_EXPIRED
    cluster.apply(*fences_by_silence(cluster.state, silent, LEASE_MS))
    assert cluster.state.alive_node_ids() == (1, 3)
    assert fences_by_silence(cluster.state, silent, LEASE_MS) == ()  # fenced once


def test_rebalance_leaves_moving_partitions_alone_and_counts_their_target() -> None:
    cluster = Cluster(3)
    cluster.create("orders", 3, 2)
    cluster.apply(RegisterNode(NodeId(4), "n4:1", "n4:2", 1, cluster.now_ms))
    p0 = cluster.state.partitions("orders")[0]
    spare = next(n for n in (1, 2, 3) if n not in p0.replicas)
    target = (spare, p0.replicas[1])
    cluster.apply(ReassignPartition("orders", PartitionId(0), target))
    assert node_loads(cluster.state)[NodeId(spare)].replicas == 3
    plan = rebalance_plan(cluster.state)
    assert plan and all(c.partition != 0 for c in plan)


def test_preferred_leader_moves() -> None:
    cluster = Cluster(3)
    cluster.create("orders", 3, 3)
    p = cluster.state.partitions("orders")
    assert [x.preferred_leader for x in p] == [2, 3, 1]  # rotation starts at group id 1
    assert preferred_leader_moves(cluster.state) == ()  # no leader reported yet
    cluster.apply(
        ReportLeader("orders", PartitionId(0), RaftGroupId(1), NodeId(1), 2),  # not preferred
        ReportLeader("orders", PartitionId(1), RaftGroupId(2), NodeId(3), 1),  # preferred
        ReportLeader("orders", PartitionId(2), RaftGroupId(3), NodeId(2), 4),  # not preferred
    )
    moves = preferred_leader_moves(cluster.state)
    assert moves == (
        LeaderMove("orders", PartitionId(0), RaftGroupId(1), NodeId(1), NodeId(2)),
        LeaderMove("orders", PartitionId(2), RaftGroupId(3), NodeId(2), NodeId(1)),
    )
    # A preferred replica that is fenced does not get leadership back.
    cluster.apply(FenceNode(NodeId(2), cluster.now_ms + LEASE_MS, LEASE_MS))
    assert [m.to_leader for m in preferred_leader_moves(cluster.state)] == [1]


def test_rebalance_moves_replicas_onto_a_node_that_missed_topic_creation() -> None:
    cluster = Cluster(3)
    cluster.apply(FenceNode(NodeId(3), cluster.now_ms + LEASE_MS, LEASE_MS))
    cluster.create("orders", 6, 2)  # placed on nodes 1 and 2 only
    assert rebalance_plan(cluster.state) == ()  # node 3 is away: nothing to balance onto
    cluster.apply(NodeHeartbeat(NodeId(3), 1, cluster.now_ms + LEASE_MS + 1))
    plan = rebalance_plan(cluster.state)
    assert plan
    cluster.apply(*plan)
    loads = node_loads(cluster.state)
    assert sorted(load.replicas for load in loads.values()) == [4, 4, 4]
    assert sorted(load.leaders for load in loads.values()) == [2, 2, 2]
    assert rebalance_plan(cluster.state) == ()


def test_rebalance_spreads_onto_a_new_node_within_its_budget() -> None:
    cluster = Cluster(3)
    cluster.create("orders", 12, 3)
    cluster.apply(RegisterNode(NodeId(4), "n4:1", "n4:2", 1, cluster.now_ms))
    assert len(rebalance_plan(cluster.state, moves_max=2)) == 2
    cluster.apply(*rebalance_plan(cluster.state))
    loads = node_loads(cluster.state)
    assert [loads[NodeId(n)].replicas for n in (1, 2, 3, 4)] == [9, 9, 9, 9]
    assert [loads[NodeId(n)].leaders for n in (1, 2, 3, 4)] == [3, 3, 3, 3]


def test_rebalance_leaves_partitions_with_a_dead_replica_alone() -> None:
    cluster = Cluster(3)
    cluster.create("orders", 3, 3)
    cluster.apply(FenceNode(NodeId(3), cluster.now_ms + LEASE_MS, LEASE_MS))
    cluster.apply(RegisterNode(NodeId(4), "n4:1", "n4:2", 1, cluster.now_ms))
    assert rebalance_plan(cluster.state) == ()


GRACE_MS = 30_000


def _alive_for(ms: int, *nodes: int) -> dict[NodeId, int]:
    return {NodeId(n): ms for n in nodes}


def test_auto_rebalance_moves_one_replica_at_a_time_onto_a_new_node() -> None:
    cluster = Cluster(3)
    cluster.create("orders", 6, 2)  # 4 replicas on each of nodes 1, 2, 3
    cluster.apply(RegisterNode(NodeId(4), "n4:1", "n4:2", 1, cluster.now_ms))
    moves = 0
    while step := auto_rebalance_step(cluster.state, _alive_for(GRACE_MS, 1, 2, 3, 4), GRACE_MS):
        assert NodeId(4) in step.replicas or moves > 0
        cluster.apply(step)
        # While the move runs nothing else starts, even with everything alive.
        assert (
            auto_rebalance_step(cluster.state, _alive_for(GRACE_MS, 1, 2, 3, 4), GRACE_MS) is None
        )
        moving = cluster.state.moving_partitions()
        if moving:
            (info,) = moving
            assert info.target is not None
            cluster.apply(
                CompleteReassignment(info.topic, info.partition, info.raft_group_id, info.target)
            )
        moves += 1
        assert moves <= 12, "the rebalance does not converge"
    loads = node_loads(cluster.state)
    assert sorted(load.replicas for load in loads.values()) == [3, 3, 3, 3]
    assert loads[NodeId(4)].leaders >= 1


def test_auto_rebalance_waits_for_every_involved_node_to_outlive_the_grace() -> None:
    cluster = Cluster(3)
    cluster.create("orders", 6, 2)
    cluster.apply(RegisterNode(NodeId(4), "n4:1", "n4:2", 1, cluster.now_ms))
    just_back = {**_alive_for(GRACE_MS, 1, 2, 3), NodeId(4): GRACE_MS - 1}
    assert auto_rebalance_step(cluster.state, just_back, GRACE_MS) is None
    # Node 4 not heard from recently (missing): nothing moves onto it either.
    assert auto_rebalance_step(cluster.state, _alive_for(GRACE_MS, 1, 2, 3), GRACE_MS) is None
    step = auto_rebalance_step(cluster.state, _alive_for(GRACE_MS, 1, 2, 3, 4), GRACE_MS)
    assert step is not None and NodeId(4) in step.replicas


def test_auto_rebalance_never_runs_beside_an_operators_move() -> None:
    cluster = Cluster(3)
    cluster.create("orders", 6, 2)
    cluster.apply(RegisterNode(NodeId(4), "n4:1", "n4:2", 1, cluster.now_ms))
    p0 = cluster.state.partitions("orders")[0]
    cluster.apply(ReassignPartition("orders", PartitionId(0), (p0.replicas[0], NodeId(4))))
    assert auto_rebalance_step(cluster.state, _alive_for(GRACE_MS, 1, 2, 3, 4), GRACE_MS) is None


def test_auto_rebalance_settings_are_validated() -> None:
    assert MetadataConfig().auto_rebalance
    with pytest.raises(ConfigError, match="rebalance_grace_ms"):
        MetadataConfig(rebalance_grace_ms=0).validate()


def test_assign_replicas_errors() -> None:
    nodes = [NodeId(1), NodeId(2)]
    with pytest.raises(AssignmentError, match="replication factor 3 needs that many live nodes"):
        assign_replicas(nodes, {}, 1, 3, 0)
    with pytest.raises(AssignmentError, match="replication factor 0"):
        assign_replicas(nodes, {}, 1, 0, 0)
    with pytest.raises(AssignmentError, match="partition count must be at least 1, got 0"):
        assign_replicas(nodes, {}, 0, 1, 0)


def test_assign_replicas_fills_the_least_loaded_nodes_first() -> None:
    nodes = [NodeId(1), NodeId(2), NodeId(3)]
    load = {NodeId(1): NodeLoad(1, 1), NodeId(2): NodeLoad(1, 1)}
    assert assign_replicas(nodes, load, 1, 1, 0) == ((3,),)
    # With equal loads the start index rotates the first choice.
    assert assign_replicas(nodes, {}, 1, 2, 1) == ((2, 3),)
    # n=4, r=2: the second run of blocks leads from their second replica.
    four = [NodeId(n) for n in range(4)]
    assert assign_replicas(four, {}, 4, 2, 0) == ((0, 1), (2, 3), (1, 0), (3, 2))


def _nodes(*lists: tuple[int, ...]) -> tuple[tuple[NodeId, ...], ...]:
    return tuple(tuple(NodeId(n) for n in replicas) for replicas in lists)


def test_manual_assignments_are_placed_as_given_under_kafkas_rules() -> None:
    cluster = Cluster(4)
    manual = _nodes((3, 1), (2, 4))
    plan = plan_create_topic(
        cluster.state, CreateTopicRequest("t", 2, 2, assignments=manual), cluster.now_ms
    )
    assert isinstance(plan, CreateTopic) and plan.assignments == manual
    cluster.apply(plan)
    grown = plan_create_partitions(
        cluster.state, "t", 3, cluster.now_ms, assignments=_nodes((4, 3))
    )
    assert isinstance(grown, CreatePartitions) and grown.assignments == _nodes((4, 3))
    cluster.apply(grown)
    assert [p.replicas for p in cluster.state.partitions("t")] == [(3, 1), (2, 4), (4, 3)]

    cluster.apply(FenceNode(NodeId(4), cluster.now_ms + LEASE_MS, LEASE_MS))
    refusals = [
        (_nodes((1, 2)), 2, "1 replica lists for 2 partitions"),
        (_nodes((1, 2), (3,)), 2, "partition 1 has 1 replicas"),
        (
            _nodes(
                (1, 1),
            ),
            1,
            "twice",
        ),
        (
            _nodes(
                (1, 9),
            ),
            1,
            "[9]",
        ),
        # Kafka's rule: a partition needs a replica on a live node (node 4 is fenced).
        (
            _nodes(
                (4,),
            ),
            1,
            "no replica of partition 0",
        ),
    ]
    for assignments, count, fragment in refusals:
        size = len(assignments[0])
        request = CreateTopicRequest("u", count, size, assignments=assignments)
        error = _error(plan_create_topic(cluster.state, request, cluster.now_ms))
        assert error.code is ErrorCode.INVALID_REPLICA_ASSIGNMENT, (assignments, error)
        assert fragment in error.message, (fragment, error.message)
    error = _error(
        plan_create_partitions(cluster.state, "t", 5, cluster.now_ms, assignments=_nodes((1, 2)))
    )
    assert error.code is ErrorCode.INVALID_REPLICA_ASSIGNMENT and "1 replica lists" in error.message
