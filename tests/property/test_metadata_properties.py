"""Properties of the metadata state machine and the controller's placement.

- apply is deterministic: two states fed the same random command bytes return the same
  results and end with byte-identical snapshots;
- snapshot -> restore gives the same state and the same future behaviour;
- a rejected command changes nothing but applied_offset, and `check` predicts `apply`;
- invariants hold after every command, whatever the bytes;
- assign_replicas always gives valid assignments balanced within 1 (leaders and replicas);
- rebalance_plan is accepted, balances replicas among alive nodes within 1, and is then done
  (each move it starts completed as the partition leader would);
- the partition leader's move steps change one node at a time, never leave fewer voters than
  the smaller of the old and new replica sets, and reach the target.

Commands are drawn against the current state (sometimes a controller's plan, sometimes
random fields near valid values, sometimes corrupted bytes), so that most kinds of command
both succeed and fail along a sequence.
"""

from __future__ import annotations

import json
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from raftlog.metadata.assignment import NodeLoad, assign_replicas
from raftlog.metadata.commands import (
    AllocateProducerIds,
    ApplyResult,
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
    decode_command,
    encode_command,
)
from raftlog.metadata.controller import (
    CreateTopicRequest,
    node_loads,
    plan_create_partitions,
    plan_create_topic,
    rebalance_plan,
)
from raftlog.metadata.reassignment import (
    Complete,
    ProposeMembership,
    TransferLeadership,
    Wait,
    next_step,
)
from raftlog.metadata.state import MetadataState
from raftlog.raft.membership import validate_change
from raftlog.raft.types import Membership
from raftlog.types import NodeId, PartitionId, RaftGroupId

NAMES = ["a", "b", "a.b", "a_b", "orders"]
NODE_IDS = st.integers(0, 4).map(NodeId)
NOW_MS = st.integers(0, 30_000)
LEASE_MS = st.sampled_from([1, 5_000, 10_000])


def _replicas(draw: st.DrawFn, size_max: int = 3) -> tuple[NodeId, ...]:
    return tuple(draw(st.lists(NODE_IDS, min_size=1, max_size=size_max)))


def _name(draw: st.DrawFn, state: MetadataState) -> str:
    """Mostly an existing topic (so commands on topics can succeed), else any name."""
    existing = [t.name for t in state.topics()]
    if existing and draw(st.integers(0, 3)) > 0:
        return draw(st.sampled_from(existing))
    return draw(st.sampled_from(NAMES))


def _fitting_replicas(draw: st.DrawFn, state: MetadataState, name: str) -> tuple[NodeId, ...]:
    """Distinct registered nodes, as many as the topic's replication factor, when possible."""
    topic, registered = state.topic(name), [n.node_id for n in state.nodes()]
    if topic is None or len(registered) < topic.replication_factor or draw(st.integers(0, 4)) == 0:
        return _replicas(draw)
    chosen = draw(st.permutations(registered))
    return tuple(chosen[: topic.replication_factor])


def _group_ids(draw: st.DrawFn, state: MetadataState, count: int) -> tuple[RaftGroupId, ...]:
    start = state.next_raft_group_id + draw(st.integers(-1, 1))
    return tuple(RaftGroupId(max(0, start) + i) for i in range(count))


def _node_command(draw: st.DrawFn, state: MetadataState) -> bytes:
    node_id = draw(NODE_IDS)
    known = state.node(node_id)
    incarnation = draw(st.integers(0, 3)) if known is None else known.incarnation
    incarnation += draw(st.sampled_from([0, 0, 0, 1, -1])) if incarnation > 0 else 0
    kind = draw(st.sampled_from(["register", "heartbeat", "fence"]))
    if kind == "register":
        port = draw(st.sampled_from([1, 9092, 0]))
        command = RegisterNode(
            node_id, f"n{node_id}:{port}", f"n{node_id}:9093", incarnation, draw(NOW_MS)
        )
        return encode_command(command)
    if kind == "heartbeat":
        return encode_command(NodeHeartbeat(node_id, incarnation, draw(NOW_MS)))
    return encode_command(FenceNode(node_id, draw(NOW_MS), draw(LEASE_MS)))


def _topic_command(draw: st.DrawFn, state: MetadataState) -> bytes:
    kind = draw(st.sampled_from(["plan", "plan", "raw", "delete", "grow", "grow_raw"]))
    name = draw(st.sampled_from(NAMES)) if kind in ("plan", "raw") else _name(draw, state)
    # Plans run "now" = the latest heartbeat, so that registered nodes count as live.
    now_ms = max((n.last_heartbeat_ms for n in state.nodes()), default=0)
    if kind == "plan":
        config = draw(st.sampled_from([{}, {}, {"retention.ms": "100"}, {"retention.ms": "x"}]))
        partitions = draw(st.sampled_from([1, 2, 3, 5, 0]))
        request = CreateTopicRequest(name, partitions, draw(st.integers(1, 3)), config)
        plan = plan_create_topic(state, request, now_ms)
        if isinstance(plan, CreateTopic):
            return encode_command(plan)
    if kind in ("plan", "raw"):
        assignments = tuple(_replicas(draw) for _ in range(draw(st.integers(0, 3))))
        command = CreateTopic(
            name=name,
            topic_id=draw(st.sampled_from(["id1", "id2", name.replace(".", "-")])),
            partition_count=draw(st.integers(0, 3)),
            replication_factor=draw(st.integers(1, 3)),
            config=draw(st.sampled_from([{}, {"segment.bytes": "4096"}, {"bogus": "1"}])),
            assignments=assignments,
            raft_group_ids=_group_ids(draw, state, len(assignments)),
        )
        return encode_command(command)
    if kind == "delete":
        return encode_command(DeleteTopic(name))
    if kind == "grow":
        grow = plan_create_partitions(state, name, draw(st.integers(0, 8)), now_ms)
        if isinstance(grow, CreatePartitions):
            return encode_command(grow)
    assignments = tuple(_replicas(draw) for _ in range(draw(st.integers(0, 2))))
    return encode_command(
        CreatePartitions(name, assignments, _group_ids(draw, state, len(assignments)))
    )


def _partition_command(draw: st.DrawFn, state: MetadataState) -> bytes:
    name = _name(draw, state)
    index = PartitionId(draw(st.integers(0, 4)))
    partition = state.partition(name, index)
    if draw(st.booleans()):
        return encode_command(ReassignPartition(name, index, _fitting_replicas(draw, state, name)))
    if partition is not None and draw(st.booleans()):
        # Completion as a leader reports it (the target), or a stale/bogus one.
        replicas = partition.target if partition.target is not None else partition.replicas
        if draw(st.integers(0, 3)) == 0:
            replicas = _fitting_replicas(draw, state, name)
        return encode_command(CompleteReassignment(name, index, partition.raft_group_id, replicas))
    group_id = (
        partition.raft_group_id if partition is not None else RaftGroupId(draw(st.integers(0, 9)))
    )
    leader_id = draw(NODE_IDS)
    if partition is not None and draw(st.booleans()):
        leader_id = draw(st.sampled_from(partition.replicas))
    if draw(st.integers(0, 4)) == 0:
        group_id = RaftGroupId(group_id + 1)
    report = ReportLeader(name, index, group_id, leader_id, draw(st.integers(0, 5)))
    return encode_command(report)


def _other_command(draw: st.DrawFn, state: MetadataState) -> bytes:
    kind = draw(st.sampled_from(["producer_ids", "rebalance", "rebalance", "garbage", "corrupt"]))
    if kind == "producer_ids":
        return encode_command(AllocateProducerIds(draw(st.integers(0, 2_000))))
    if kind == "garbage":
        return draw(st.binary(max_size=40))
    if kind == "rebalance":
        plan = rebalance_plan(state)
        return encode_command(plan[0]) if plan else encode_command(AllocateProducerIds(1))
    data = bytearray(
        encode_command(ReportLeader("a", PartitionId(0), RaftGroupId(1), NodeId(1), 1))
    )
    position = draw(st.integers(0, len(data) - 1))
    data[position] = draw(st.integers(0, 255))
    return bytes(data)


@st.composite
def command_bytes(draw: st.DrawFn, state: MetadataState) -> bytes:
    """One command's bytes, drawn against `state` so that many of them apply."""
    # Weights: nodes first register, then topics and partitions see most traffic.
    makers = [_node_command] * 2 + [_topic_command] * 3 + [_partition_command] * 3
    maker = draw(st.sampled_from([*makers, _other_command]))
    return maker(draw, state)


def _content(state: MetadataState) -> object:
    body = json.loads(state.snapshot()[1:])
    del body["applied_offset"]
    return body


def _epochs(state: MetadataState) -> dict[RaftGroupId, int]:
    return {p.raft_group_id: p.leader_epoch for p in state.all_partitions()}


def _run(
    data: st.DataObject, state: MetadataState, steps: int
) -> tuple[list[bytes], list[ApplyResult]]:
    """Applies `steps` drawn commands to `state`, checking per-command properties; returns
    the commands and their results."""
    log: list[bytes] = []
    results: list[ApplyResult] = []
    for _ in range(steps):
        command = data.draw(command_bytes(state))
        before = _content(state)
        epochs_before = _epochs(state)
        try:
            predicted = state.check(decode_command(command)).code
        except ValueError:
            predicted = None
        result = state.apply(state.applied_offset + 1, command)
        state.check_invariants()
        assert predicted is None or predicted is result.code, (predicted, result)
        if not result.ok:
            assert _content(state) == before, result
        epochs = _epochs(state)
        # A partition group's reported leader epoch never goes backward.
        assert all(epochs[g] >= e for g, e in epochs_before.items() if g in epochs)
        log.append(command)
        results.append(result)
    return log, results


def _replay(state: MetadataState, commands: list[bytes]) -> list[ApplyResult]:
    return [state.apply(state.applied_offset + 1, command) for command in commands]


@settings(max_examples=60, deadline=None)
@given(data=st.data(), steps=st.integers(1, 40))
def test_apply_is_deterministic(data: st.DataObject, steps: int) -> None:
    first = MetadataState("c")
    commands, results = _run(data, first, steps)
    replayed, second = MetadataState("c"), MetadataState("c")
    assert _replay(replayed, commands) == _replay(second, commands) == results
    assert replayed.snapshot() == second.snapshot() == first.snapshot()


@settings(max_examples=60, deadline=None)
@given(data=st.data(), before=st.integers(0, 25), after=st.integers(1, 25))
def test_snapshot_restore_gives_the_same_state_and_future(
    data: st.DataObject, before: int, after: int
) -> None:
    original = MetadataState("c")
    _run(data, original, before)
    snapshot = original.snapshot()
    restored = MetadataState.restore(snapshot)
    assert restored.snapshot() == snapshot
    assert restored.nodes() == original.nodes() and restored.topics() == original.topics()
    assert list(restored.all_partitions()) == list(original.all_partitions())
    future, results = _run(data, original, after)
    assert _replay(restored, future) == results
    assert restored.snapshot() == original.snapshot()


def _spread(counts: Counter[NodeId], nodes: list[NodeId]) -> int:
    values = [counts.get(n, 0) for n in nodes]
    return max(values) - min(values)


@settings(max_examples=300, deadline=None)
@given(
    node_count=st.integers(1, 12),
    data=st.data(),
    partition_count=st.integers(1, 60),
    start_index=st.integers(0, 1_000),
)
def test_assignments_are_valid_and_balanced(
    node_count: int, data: st.DataObject, partition_count: int, start_index: int
) -> None:
    nodes = [NodeId(n * 3 + 1) for n in range(node_count)]  # ids need not be dense
    replication_factor = data.draw(st.integers(1, node_count))
    assignments = assign_replicas(nodes, {}, partition_count, replication_factor, start_index)
    assert len(assignments) == partition_count
    for replicas in assignments:
        assert len(replicas) == replication_factor == len(set(replicas))
        assert set(replicas) <= set(nodes)
    assert _spread(Counter(r[0] for r in assignments), nodes) <= 1
    assert _spread(Counter(n for r in assignments for n in r), nodes) <= 1


@settings(max_examples=200, deadline=None)
@given(
    node_count=st.integers(1, 8),
    data=st.data(),
    start_index=st.integers(0, 100),
)
def test_successive_topics_keep_replicas_balanced(
    node_count: int, data: st.DataObject, start_index: int
) -> None:
    nodes = [NodeId(n) for n in range(node_count)]
    replicas: Counter[NodeId] = Counter()
    leaders: Counter[NodeId] = Counter()
    for topic in range(data.draw(st.integers(1, 4))):
        load = {n: NodeLoad(leaders=leaders[n], replicas=replicas[n]) for n in nodes}
        count = data.draw(st.integers(1, 10))
        factor = data.draw(st.integers(1, node_count))
        assignments = assign_replicas(nodes, load, count, factor, start_index + topic)
        leaders.update(r[0] for r in assignments)
        replicas.update(n for r in assignments for n in r)
        assert _spread(replicas, nodes) <= 1


@settings(max_examples=100, deadline=None)
@given(data=st.data(), steps=st.integers(5, 40))
def test_rebalance_plans_apply_and_balance_replicas(data: st.DataObject, steps: int) -> None:
    state = MetadataState("c")
    _run(data, state, steps)
    for _ in range(100):  # each plan moves each partition at most once: repeat until done
        plan = rebalance_plan(state, moves_max=10_000)
        if not plan:
            break
        for command in plan:
            current = state.partition(command.topic, command.partition)
            assert current is not None
            assert len(set(command.replicas) - set(current.replicas)) <= 1
            assert state.apply(state.applied_offset + 1, encode_command(command)).ok
        state.check_invariants()
        for moving in state.moving_partitions():  # the leaders complete the moves
            assert moving.target is not None
            done = CompleteReassignment(
                moving.topic, moving.partition, moving.raft_group_id, moving.target
            )
            assert state.apply(state.applied_offset + 1, encode_command(done)).ok
    else:
        raise AssertionError("rebalance plans did not converge")
    alive = set(state.alive_node_ids())
    if all(alive.issuperset(p.replicas) for p in state.all_partitions()) and alive:
        loads = node_loads(state)
        counts = [loads[n].replicas for n in alive]
        assert max(counts) - min(counts) <= 1


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_move_steps_change_one_node_at_a_time_and_reach_the_target(data: st.DataObject) -> None:
    nodes = st.lists(st.integers(0, 6).map(NodeId), min_size=1, max_size=5, unique=True)
    voters = data.draw(nodes)
    target = data.draw(nodes)
    learners = data.draw(st.sets(st.integers(0, 6).map(NodeId).filter(lambda n: n not in voters)))
    membership = Membership(voters=frozenset(voters), learners=frozenset(learners))
    leader = data.draw(st.sampled_from(voters))
    floor = min(len(voters), len(target))
    for _ in range(4 * (len(voters) + len(target) + len(learners)) + 40):
        # Sometimes the last change is uncommitted or a learner lags; never for long.
        lagging = data.draw(st.booleans())
        step = next_step(
            leader=leader,
            membership=membership,
            membership_committed=not lagging or data.draw(st.booleans()),
            target=target,
            caught_up=frozenset() if lagging else membership.members,
        )
        if isinstance(step, Complete):
            break
        if isinstance(step, ProposeMembership):
            validate_change(membership, step.membership)  # one node at a time (§4.2)
            membership = step.membership
            assert leader in membership.voters, "the leader is removed only after it left"
            assert len(membership.voters) >= floor
        elif isinstance(step, TransferLeadership):
            assert leader not in target and step.to in target and step.to in membership.voters
            leader = step.to
        else:
            assert isinstance(step, Wait) and lagging
    else:
        raise AssertionError(f"no completion: at {membership}, target {target}")
    assert membership == Membership(voters=frozenset(target))
    assert leader in target


class MetadataAgainstModel(RuleBasedStateMachine):
    """The state machine against a plain model: topics and their partition counts, producer
    id blocks, highest reported epochs; snapshots and restores happen mid-run."""

    def __init__(self) -> None:
        super().__init__()
        self.state = MetadataState("model")
        self.topics: dict[str, int] = {}
        self.epochs: dict[tuple[str, int], int] = {}
        self.producer_ids_handed_out = 0

    @initialize()
    def register_three(self) -> None:
        for node in (1, 2, 3):
            self.register(node)

    def _apply(self, command: Command) -> ApplyResult:
        return self.state.apply(self.state.applied_offset + 1, encode_command(command))

    @rule(node=st.integers(0, 3))
    def register(self, node: int) -> None:
        assert self._apply(RegisterNode(NodeId(node), f"n{node}:1", f"n{node}:2", 0, 0)).ok

    @rule(name=st.sampled_from(NAMES), partitions=st.integers(1, 4), factor=st.integers(1, 3))
    def create_topic(self, name: str, partitions: int, factor: int) -> None:
        plan = plan_create_topic(self.state, CreateTopicRequest(name, partitions, factor), 0)
        exists = name in self.topics or any(
            n.replace(".", "_") == name.replace(".", "_") for n in self.topics
        )
        enough = factor <= len(self.state.alive_node_ids())
        assert isinstance(plan, CreateTopic) == (not exists and enough), plan
        if isinstance(plan, CreateTopic):
            assert self._apply(plan).ok
            self.topics[name] = partitions

    @rule(name=st.sampled_from(NAMES))
    def delete_topic(self, name: str) -> None:
        assert self._apply(DeleteTopic(name)).ok == (name in self.topics)
        if self.topics.pop(name, None) is not None:
            self.epochs = {k: v for k, v in self.epochs.items() if k[0] != name}

    @rule(name=st.sampled_from(NAMES), more=st.integers(1, 3))
    def grow(self, name: str, more: int) -> None:
        total = self.topics.get(name, 0) + more
        plan = plan_create_partitions(self.state, name, total, 0)
        if isinstance(plan, CreatePartitions):
            assert self._apply(plan).ok
            self.topics[name] = total
        else:
            assert name not in self.topics or plan.code is ErrorCode.INVALID_REPLICATION_FACTOR

    @rule(count=st.integers(1, 100))
    def allocate(self, count: int) -> None:
        result = self._apply(AllocateProducerIds(count))
        assert result.producer_id_first == self.producer_ids_handed_out
        self.producer_ids_handed_out += count

    @precondition(lambda self: bool(self.topics))
    @rule(data=st.data(), epoch=st.integers(0, 4))
    def report_leader(self, data: st.DataObject, epoch: int) -> None:
        partition = data.draw(st.sampled_from(list(self.state.all_partitions())))
        name, index = partition.topic, partition.partition
        leader = partition.replicas[0]
        report = ReportLeader(name, index, partition.raft_group_id, leader, epoch)
        result = self._apply(report)
        highest = self.epochs.get((name, index), -1)
        assert result.ok == (epoch >= highest), result
        self.epochs[(name, index)] = max(highest, epoch)

    @rule()
    def snapshot_and_restore(self) -> None:
        self.state = MetadataState.restore(self.state.snapshot())

    @invariant()
    def agrees_with_the_model(self) -> None:
        self.state.check_invariants()
        assert {t.name: t.partition_count for t in self.state.topics()} == self.topics
        assert self.state.next_producer_id == self.producer_ids_handed_out
        reported = {
            (p.topic, p.partition): p.leader_epoch
            for p in self.state.all_partitions()
            if p.leader_id is not None
        }
        assert reported == self.epochs


MetadataAgainstModel.TestCase.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None
)
test_metadata_against_model = MetadataAgainstModel.TestCase
