"""Leases and the controller's liveness duties on a fake monotonic clock: no sleeps, every
duration exact (raftlog.node.leases, raftlog.node.controller_duties)."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from pathlib import Path

from raftlog.config import MetadataConfig, NodeConfig, RaftConfig
from raftlog.metadata import (
    ApplyResult,
    Command,
    CreateTopic,
    CreateTopicRequest,
    ErrorCode,
    FenceNode,
    MetadataState,
    NodeHeartbeat,
    ReassignPartition,
    RegisterNode,
    plan_create_topic,
)
from raftlog.metadata.commands import encode_command
from raftlog.node.controller_duties import ControllerDuties
from raftlog.node.leases import ControllerWatch, LoopLagMeter, NodeLease
from raftlog.node.node import Node
from raftlog.raft.memory import MemoryHardStateStore, MemoryStorage
from raftlog.raft.node import RaftNode
from raftlog.raft.types import Entry, Membership, Role, Snapshot
from raftlog.runtime.clock import FakeMonotonicClock
from raftlog.runtime.group import RaftGroup
from raftlog.settings import NodeSettings
from raftlog.types import NodeId, RaftGroupId

LEASE_MS = 1000
N1, N2, N3 = NodeId(1), NodeId(2), NodeId(3)


def test_a_node_starts_with_one_full_lease_and_loses_it_exactly_at_its_end() -> None:
    clock = FakeMonotonicClock()
    lease = NodeLease(clock, lease_ms=LEASE_MS)
    clock.advance(0.999)
    assert not lease.lapsed()
    clock.advance(0.001)
    assert lease.lapsed()


def test_a_renewal_counts_from_when_the_heartbeat_was_sent_not_committed() -> None:
    clock = FakeMonotonicClock()
    lease = NodeLease(clock, lease_ms=LEASE_MS)
    clock.advance(0.5)
    sent_at = clock.monotonic()
    clock.advance(0.4)  # the heartbeat took this long to commit
    lease.renew(sent_at)
    clock.advance(0.599)
    assert not lease.lapsed()
    clock.advance(0.001)
    assert lease.lapsed()


def test_a_node_does_not_hold_its_own_loops_lateness_against_its_lease() -> None:
    # The node's loop ran a 100 ms timer 1.9 s late (a thousand groups being created, or no
    # CPU): the answers to its heartbeats sat unread meanwhile, so its lease stood still.
    clock = FakeMonotonicClock()
    meter = LoopLagMeter(clock)
    lease = NodeLease(clock, lease_ms=LEASE_MS, loop_lag=meter)
    meter.expect(0.1)
    clock.advance(2.0)
    assert not lease.lapsed(), "the overdue timer counts as lag before it fires"
    meter.woke()
    clock.advance(0.899)
    assert not lease.lapsed()
    clock.advance(0.001)  # a full lease of loop time without a renewal
    assert lease.lapsed()
    assert "own loop lag so far, not counted: 1900 ms" in (lease.lapse_cause() or "")


def test_a_new_controller_measures_silence_from_its_taking_office() -> None:
    clock = FakeMonotonicClock()
    watch = ControllerWatch(clock)
    watch.heard(N2)  # heard before this term: forgotten when the term starts
    clock.advance(5.0)
    assert watch.silence_ms(7, [N1, N2], clock.monotonic()) == {N1: 0, N2: 0}
    clock.advance(0.25)
    watch.heard(N2)
    clock.advance(0.5)
    assert watch.silence_ms(7, [N1, N2], clock.monotonic()) == {N1: 750, N2: 500}
    # A later term is a new taking office: every node has a full lease again.
    assert watch.silence_ms(8, [N1, N2], clock.monotonic()) == {N1: 0, N2: 0}


def test_alive_for_restarts_with_a_new_incarnation_but_not_with_a_late_heartbeat() -> None:
    clock = FakeMonotonicClock()
    watch = ControllerWatch(clock)
    state = _registered(N1, N2)
    recent_ms = 200
    first = watch.alive_for_ms(state.nodes(), {N1: 0, N2: 0}, recent_ms, clock.monotonic())
    assert first == {N1: 0, N2: 0}
    clock.advance(3.0)
    # Node 2 was not heard recently: left out, its grace period kept.
    late = watch.alive_for_ms(state.nodes(), {N1: 0, N2: recent_ms}, recent_ms, clock.monotonic())
    assert late == {N1: 3000}
    clock.advance(1.0)
    heard = watch.alive_for_ms(state.nodes(), {N1: 0, N2: 0}, recent_ms, clock.monotonic())
    assert heard == {N1: 4000, N2: 4000}
    # Node 2 restarts (a new incarnation): its grace period starts again.
    _apply(state, RegisterNode(N2, "n2:1", "n2:2", 2, 0))
    clock.advance(1.0)
    restarted = watch.alive_for_ms(state.nodes(), {N1: 0, N2: 0}, recent_ms, clock.monotonic())
    assert restarted == {N1: 5000, N2: 0}


# -- the controller's fencing pass, with a real single-voter metadata group ---------------------


class _Applied:
    def apply(self, entry: Entry) -> None:
        pass

    def restore(self, snapshot: Snapshot) -> None:
        raise AssertionError("no snapshots here")


def _apply(state: MetadataState, command: Command) -> ApplyResult:
    return state.apply(state.applied_offset + 1, encode_command(command))


def _registered(*nodes: NodeId) -> MetadataState:
    state = MetadataState("cluster-a")
    for n in nodes:
        assert _apply(state, RegisterNode(n, f"n{n}:1", f"n{n}:2", 1, 1_000)).ok
    return state


def _leader_group() -> RaftGroup:
    config = RaftConfig()
    storage = MemoryStorage()
    membership = Membership(voters=frozenset({N1}))
    node = RaftNode(
        node_id=N1,
        config=config,
        storage=storage,
        hard_state=MemoryHardStateStore().load(),
        rng=random.Random(1),
        bootstrap_membership=membership,
    )
    node.campaign()
    assert node.role is Role.LEADER
    return RaftGroup(
        raft_group_id=RaftGroupId(0),
        node=node,
        log=storage,
        hard_state_store=MemoryHardStateStore(),
        state_machine=_Applied(),
        config=config,
        bootstrap_membership=membership,
    )


class _Controller:
    """ControllerDuties over a real metadata state; `submit` applies what it is given, as a
    commit through the quorum would."""

    def __init__(self, *nodes: NodeId, metadata: MetadataConfig | None = None) -> None:
        self.clock = FakeMonotonicClock()
        self.state = _registered(*nodes)
        self.submitted: list[Command] = []
        self.loop_lag = LoopLagMeter(self.clock)
        self.watch = ControllerWatch(self.clock, loop_lag=self.loop_lag)
        group = _leader_group()
        metadata = metadata or MetadataConfig(
            node_lease_ms=LEASE_MS, node_heartbeat_interval_ms=100, auto_rebalance=False
        )
        self.duties = ControllerDuties(
            node_id=N1,
            config=dataclasses.replace(NodeConfig(), metadata=metadata),
            clock=self.clock,
            watch=self.watch,
            metadata_group=lambda: group,
            metadata=lambda: self.state,
            submit=self._submit,
        )

    async def _submit(self, command: Command, *, timeout_s: float) -> ApplyResult:
        self.submitted.append(command)
        return _apply(self.state, command)

    def run(self) -> list[NodeId]:
        """One pass; the nodes it fenced."""
        self.submitted.clear()
        asyncio.run(self.duties.run())
        return [c.node_id for c in self.submitted if isinstance(c, FenceNode)]


def test_the_controller_fences_a_node_silent_for_a_lease_and_no_sooner() -> None:
    controller = _Controller(N1, N2, N3)
    assert controller.run() == []  # takes office: every node has a full lease
    controller.clock.advance(0.6)
    controller.watch.heard(N1)
    controller.watch.heard(N3)
    controller.clock.advance(0.399)
    assert controller.run() == []
    controller.clock.advance(0.001)
    assert controller.run() == [N2]
    assert controller.state.alive_node_ids() == (N1, N3)
    assert controller.run() == []  # fenced once
    controller.clock.advance(0.6)
    assert controller.run() == [N1, N3]


def _on_time_passes(controller: _Controller, seconds: float, *heartbeating: NodeId) -> list[NodeId]:
    """Every 100 ms: the loop-lag timer fires on time, `heartbeating` nodes' heartbeats
    arrive, the controller runs its pass; the nodes fenced meanwhile."""
    fenced = []
    for _ in range(round(seconds / 0.1)):
        controller.loop_lag.expect(0.1)
        controller.clock.advance(0.1)
        assert controller.loop_lag.woke() == 0.0
        for node in heartbeating:
            controller.watch.heard(node)
        fenced += controller.run()
    return fenced


def test_a_controller_whose_own_loop_was_late_fences_nobody() -> None:
    controller = _Controller(N1, N2, N3)
    assert _on_time_passes(controller, 2.0, N1, N2, N3) == []
    # The controller's loop stalls for 1.5 leases: every heartbeat sent meanwhile sits
    # unread in its sockets. When it runs again, its pass may come before its lag timer.
    controller.loop_lag.expect(0.1)
    controller.clock.advance(1.5)
    assert controller.run() == []
    assert abs(controller.loop_lag.woke() - 1.4) < 1e-9
    assert controller.run() == []
    # The queued heartbeats are read now: nobody was ever silent for a lease of loop time.
    for node in (N1, N2, N3):
        controller.watch.heard(node)
    assert _on_time_passes(controller, 3.0, N1, N2, N3) == []
    assert controller.state.alive_node_ids() == (N1, N2, N3)


def test_a_node_whose_heartbeats_arrive_late_but_arrive_is_not_fenced() -> None:
    controller = _Controller(N1, N2, N3)
    fenced = []
    for _ in range(20):  # node 2's heartbeats come 900 ms apart, a lease is 1000 ms
        fenced += _on_time_passes(controller, 0.9, N1, N3)
        controller.watch.heard(N2)
        fenced += controller.run()
    assert fenced == []
    assert controller.state.alive_node_ids() == (N1, N2, N3)


def test_a_really_silent_node_is_fenced_within_its_lease() -> None:
    controller = _Controller(N1, N2, N3)
    assert _on_time_passes(controller, 0.5, N1, N2, N3) == []
    # Node 2 falls silent; the controller's loop is on time: fenced at exactly one lease.
    assert _on_time_passes(controller, 0.9, N1, N3) == []
    assert _on_time_passes(controller, 0.1, N1, N3) == [N2]
    # Node 3 falls silent while the controller's timers each run 50 ms late: it is fenced
    # after its lease of loop time (10 passes), its silence excused by that lateness alone.
    fenced_at: list[int] = []
    for step in range(1, 13):
        controller.loop_lag.expect(0.1)
        controller.clock.advance(0.15)
        assert abs(controller.loop_lag.woke() - 0.05) < 1e-9
        controller.watch.heard(N1)
        fenced_at += [step] if controller.run() == [N3] else []
    assert fenced_at == [10]  # 1500 ms of wall time, 1000 ms of loop time


def _unstarted_node(data_dir: Path, clock: FakeMonotonicClock) -> Node:
    address = ("127.0.0.1", 1)
    metadata = MetadataConfig(node_lease_ms=LEASE_MS, node_heartbeat_interval_ms=100)
    return Node(
        NodeSettings(
            node_id=N1,
            data_dir=data_dir,
            listen=address,
            raft_listen=address,
            peers={N1: address},
            config=dataclasses.replace(NodeConfig(), metadata=metadata),
        ),
        clock=clock,
    )


def test_a_node_cannot_renew_another_nodes_lease_by_a_call(tmp_path: Path) -> None:
    node = _unstarted_node(tmp_path, FakeMonotonicClock())
    for command in (
        NodeHeartbeat(node_id=N3, incarnation=1, now_ms=0),
        RegisterNode(N3, "127.0.0.1:1", "127.0.0.1:2", incarnation=1, now_ms=0),
    ):
        result = asyncio.run(node.metadata_calls.serve_call(N2, command, 1.0))
        assert result.code is ErrorCode.INVALID_REQUEST
        assert result.message == "node 2 sent the liveness of node 3"


def test_a_broker_reads_its_lease_on_the_clock_it_was_given(tmp_path: Path) -> None:
    clock = FakeMonotonicClock()
    node = _unstarted_node(tmp_path, clock)
    clock.advance(0.999)
    assert not node.is_fenced()
    clock.advance(0.001)
    assert node.is_fenced()


def test_the_controller_rebalances_onto_a_new_node_once_it_outlived_the_grace() -> None:
    grace_ms = 2000
    metadata = MetadataConfig(
        node_lease_ms=LEASE_MS, node_heartbeat_interval_ms=100, rebalance_grace_ms=grace_ms
    )
    controller = _Controller(N1, N2, N3, metadata=metadata)
    plan = plan_create_topic(controller.state, CreateTopicRequest("orders", 6, 2), 1_000)
    assert isinstance(plan, CreateTopic) and _apply(controller.state, plan).ok
    n4 = NodeId(4)
    assert _apply(controller.state, RegisterNode(n4, "n4:1", "n4:2", 1, 1_000)).ok
    moves_at_ms: list[int] = []
    for step in range(30):  # every node heartbeats every 100 ms
        for node in (N1, N2, N3, n4):
            controller.watch.heard(node)
        controller.run()
        if any(isinstance(c, ReassignPartition) for c in controller.submitted):
            moves_at_ms.append(step * 100)
        controller.clock.advance(0.1)
    # The controller saw node 4 alive from its first pass: the first move onto it comes when
    # that reaches the grace period, and no second one starts while the first is under way.
    assert moves_at_ms == [grace_ms]
