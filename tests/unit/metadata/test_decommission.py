"""Decommissioning a node: DecommissionNode / CompleteDecommission applied to the state, the
controller's refusals and its one-move-at-a-time steps, snapshots, and that no placement or
rebalance ever puts a replica on a node that is leaving.

Each test drives the state as the controller would: decide, apply, and, for a move, apply
the CompleteReassignment the partition leader would report."""

from __future__ import annotations

import pytest

from raftlog.metadata.commands import (
    ApplyResult,
    Command,
    CompleteDecommission,
    CompleteReassignment,
    CreateTopic,
    DecommissionNode,
    ErrorCode,
    NodeHeartbeat,
    ReassignPartition,
    RegisterNode,
    decode_command,
    encode_command,
)
from raftlog.metadata.controller import (
    CreateTopicRequest,
    auto_rebalance_step,
    decommission_step,
    live_node_ids,
    node_loads,
    plan_create_topic,
    plan_decommission,
    rebalance_plan,
)
from raftlog.metadata.state import (
    NODE_ACTIVE,
    NODE_DECOMMISSIONED,
    NODE_DECOMMISSIONING,
    MetadataState,
)
from raftlog.types import NodeId, PartitionId

VOTERS = (NodeId(1), NodeId(2), NodeId(3))


class Log:
    def __init__(self, node_count: int) -> None:
        self.state = MetadataState("cluster-d")
        self.offset = 0
        self.now_ms = 1_000
        for n in range(1, node_count + 1):
            self.ok(RegisterNode(NodeId(n), f"n{n}:1", f"n{n}:2", 1, self.now_ms))

    def apply(self, command: Command) -> ApplyResult:
        result = self.state.apply(self.offset, encode_command(command))
        self.offset += 1
        self.state.check_invariants()
        return result

    def ok(self, command: Command) -> None:
        result = self.apply(command)
        assert result.ok, (command, result)

    def refused(self, command: Command, code: ErrorCode) -> str:
        before = self.state.snapshot()
        result = self.apply(command)
        assert result.code is code, result
        assert result.message
        # A refused command changes nothing but the applied offset.
        after = MetadataState.restore(self.state.snapshot())
        assert after.nodes() == MetadataState.restore(before).nodes()
        return result.message

    def create(self, name: str, partitions: int, replication_factor: int) -> None:
        plan = plan_create_topic(
            self.state, CreateTopicRequest(name, partitions, replication_factor), self.now_ms
        )
        assert isinstance(plan, CreateTopic), plan
        self.ok(plan)

    def drain(self, live: tuple[int, ...], steps_max: int = 100) -> list[ReassignPartition]:
        """Run decommission steps, completing each move as its leader would, until done."""
        moves = []
        for _ in range(steps_max):
            step = decommission_step(self.state, [NodeId(n) for n in live])
            if step is None:
                return moves
            if isinstance(step, CompleteDecommission):
                self.ok(step)
                continue
            moves.append(step)
            self.ok(step)
            assert decommission_step(self.state, [NodeId(n) for n in live]) is None, (
                "a second move while one is under way"
            )
            info = self.state.partition(step.topic, step.partition)
            assert info is not None
            self.ok(
                CompleteReassignment(step.topic, step.partition, info.raft_group_id, step.replicas)
            )
        raise AssertionError("decommission did not finish")


def test_commands_round_trip() -> None:
    for command in (DecommissionNode(NodeId(4)), CompleteDecommission(NodeId(4))):
        assert decode_command(encode_command(command)) == command


def test_a_decommissioned_observer_hands_every_replica_to_the_others() -> None:
    log = Log(4)
    log.create("orders", 8, 3)
    on_4 = [p for p in log.state.all_partitions() if 4 in p.replicas]
    assert on_4
    plan = plan_decommission(log.state, NodeId(4), VOTERS)
    assert plan == DecommissionNode(NodeId(4))
    log.ok(plan)
    node = log.state.node(NodeId(4))
    assert node is not None and node.status == NODE_DECOMMISSIONING and node.alive
    assert not node.placeable

    moves = log.drain(live=(1, 2, 3, 4))

    assert len(moves) == len(on_4)  # one move per replica it held, nothing else
    for move in moves:
        before = next(p for p in on_4 if p.partition == move.partition)
        # The replacement takes node 4's place in the list (a preferred leadership moves too).
        assert [n for n in move.replicas if n != 4] == list(move.replicas)
        position = before.replicas.index(NodeId(4))
        assert move.replicas[:position] == before.replicas[:position]
    assert not log.state.partitions_hosted_by(NodeId(4))
    node = log.state.node(NodeId(4))
    assert node is not None and node.status == NODE_DECOMMISSIONED and not node.alive
    assert all(len(set(p.replicas)) == 3 for p in log.state.all_partitions())


def test_the_replacement_is_the_live_node_holding_fewest_replicas() -> None:
    log = Log(5)
    log.create("a", 5, 2)
    log.ok(DecommissionNode(NodeId(5)))
    step = decommission_step(log.state, [NodeId(1), NodeId(2), NodeId(3)])  # 4 not heard
    assert isinstance(step, ReassignPartition)
    before = log.state.partitions(step.topic)[step.partition].replicas
    (added,) = set(step.replicas) - set(before)
    assert set(before) - set(step.replicas) == {5}
    assert added in (1, 2, 3)  # heard from recently, and not already a replica
    loads = node_loads(log.state)
    candidates = [n for n in (1, 2, 3) if n not in before]
    assert loads[added].replicas == min(loads[NodeId(n)].replicas for n in candidates)
    assert decommission_step(log.state, []) is None  # nobody to move to: wait


def test_a_metadata_voter_is_refused_and_says_why() -> None:
    log = Log(4)
    refusal = plan_decommission(log.state, NodeId(2), VOTERS)
    assert isinstance(refusal, ApplyResult)
    assert refusal.code is ErrorCode.DECOMMISSION_REFUSED
    assert "voter" in refusal.message and "bootstrap" in refusal.message


def test_too_few_nodes_left_for_a_topic_is_refused_naming_it() -> None:
    log = Log(4)
    log.create("wide", 1, 3)
    log.create("narrow", 1, 1)
    log.ok(DecommissionNode(NodeId(4)))
    message = log.refused(DecommissionNode(NodeId(3)), ErrorCode.DECOMMISSION_REFUSED)
    assert "'wide'" in message and "replication factor 3" in message
    refusal = plan_decommission(log.state, NodeId(3), ())
    assert isinstance(refusal, ApplyResult) and refusal.code is ErrorCode.DECOMMISSION_REFUSED


def test_unknown_and_repeated_requests() -> None:
    log = Log(4)
    log.refused(DecommissionNode(NodeId(9)), ErrorCode.UNKNOWN_NODE)
    log.ok(DecommissionNode(NodeId(4)))
    log.ok(DecommissionNode(NodeId(4)))  # repeating it while the node leaves changes nothing
    log.drain(live=(1, 2, 3))
    log.refused(DecommissionNode(NodeId(4)), ErrorCode.NODE_DECOMMISSIONED)


def test_completion_is_refused_while_the_node_hosts_a_replica() -> None:
    log = Log(4)
    log.create("orders", 4, 3)
    log.refused(CompleteDecommission(NodeId(4)), ErrorCode.INVALID_REQUEST)  # not leaving
    log.ok(DecommissionNode(NodeId(4)))
    message = log.refused(CompleteDecommission(NodeId(4)), ErrorCode.DECOMMISSION_INCOMPLETE)
    assert "orders-" in message


def test_a_decommissioned_node_may_not_register_or_heartbeat_again() -> None:
    log = Log(4)
    log.ok(DecommissionNode(NodeId(4)))
    # A restart while leaving keeps it leaving.
    log.ok(RegisterNode(NodeId(4), "n4:1", "n4:2", 2, log.now_ms))
    node = log.state.node(NodeId(4))
    assert node is not None and node.status == NODE_DECOMMISSIONING
    log.drain(live=(1, 2, 3))
    message = log.refused(
        RegisterNode(NodeId(4), "n4:1", "n4:2", 3, log.now_ms), ErrorCode.NODE_DECOMMISSIONED
    )
    assert "may not rejoin" in message
    log.refused(NodeHeartbeat(NodeId(4), 2, log.now_ms), ErrorCode.NODE_DECOMMISSIONED)


def test_no_replica_is_placed_on_a_leaving_node() -> None:
    log = Log(4)
    log.create("before", 4, 3)
    log.ok(DecommissionNode(NodeId(4)))
    assert live_node_ids(log.state, log.now_ms, 10_000) == (1, 2, 3)
    log.create("after", 6, 3)
    assert all(4 not in p.replicas for p in log.state.partitions("after"))
    # Rebalancing neither fills nor drains it (that is decommission_step's job).
    for command in rebalance_plan(log.state, moves_max=100):
        assert 4 not in set(command.replicas) - set(
            log.state.partitions(command.topic)[command.partition].replicas
        )
    alive_for = {NodeId(n): 10**9 for n in (1, 2, 3, 4)}
    step = auto_rebalance_step(log.state, alive_for, 1)
    assert step is None or 4 not in step.replicas
    # An operator's move onto it is refused too; a move that keeps it (a reorder) is not.
    on_4 = next(p for p in log.state.all_partitions() if 4 in p.replicas)
    others = next(p for p in log.state.all_partitions() if 4 not in p.replicas)
    log.refused(
        ReassignPartition(others.topic, others.partition, (NodeId(4), *others.replicas[1:])),
        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
    )
    log.ok(ReassignPartition(on_4.topic, on_4.partition, tuple(reversed(on_4.replicas))))


@pytest.mark.parametrize("stage", ["decommissioning", "decommissioned"])
def test_snapshots_carry_the_status(stage: str) -> None:
    log = Log(4)
    log.create("orders", 2, 2)
    log.ok(DecommissionNode(NodeId(4)))
    if stage == "decommissioned":
        log.drain(live=(1, 2, 3))
    restored = MetadataState.restore(log.state.snapshot())
    assert restored.nodes() == log.state.nodes()
    assert restored.snapshot() == log.state.snapshot()
    node = restored.node(NodeId(4))
    assert node is not None and node.status == stage
    # The active nodes' entries are unchanged by the new field (older snapshots decode).
    assert b'"status":"active"' not in log.state.snapshot()


def test_a_snapshot_with_an_unknown_status_is_refused() -> None:
    log = Log(2)
    log.ok(DecommissionNode(NodeId(2)))
    data = log.state.snapshot().replace(b'"decommissioning"', b'"retired"')
    with pytest.raises(ValueError, match="status"):
        MetadataState.restore(data)
    data = log.state.snapshot().replace(b'"decommissioning"', f'"{NODE_ACTIVE}"'.encode())
    with pytest.raises(ValueError, match="status"):
        MetadataState.restore(data)


def test_moves_wait_for_a_move_under_way() -> None:
    log = Log(4)
    log.create("orders", 4, 3)
    p = next(p for p in log.state.all_partitions() if 4 not in p.replicas)
    log.ok(ReassignPartition(p.topic, PartitionId(p.partition), (NodeId(4), *p.replicas[1:])))
    log.ok(DecommissionNode(NodeId(3)))
    assert decommission_step(log.state, (*VOTERS, NodeId(4))) is None
