"""The reconciler (raftlog.node.reconcile.Reconciler): which raft address a node dials for
each peer, and how fast it creates the partition groups assigned to it.

The voters' addresses it was started with (`--peers`) win over the registrations its replayed
metadata recorded (as KRaft's `controller.quorum.voters`), unless a voter registered again
after this node caught up: that one moved while this node ran. Observers are known only by
their registrations. New groups are created a bounded number per turn of the event loop,
for a bounded time.
A real metadata state, a real reconciler, real storage; the transport is the dict it is
told and the event loop a list of callbacks."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from raftlog.config import LogConfig, NodeConfig
from raftlog.metadata import (
    AlterTopicConfig,
    CreateTopic,
    CreateTopicRequest,
    MetadataState,
    RegisterNode,
    ReportLeader,
    plan_create_topic,
)
from raftlog.metadata.catch_up import caught_up_since_start
from raftlog.metadata.commands import encode_command
from raftlog.node.group_factory import RaftGroupFactory
from raftlog.node.reconcile import Reconciler
from raftlog.raft.types import Role
from raftlog.runtime.clock import FakeMonotonicClock, MonotonicClock
from raftlog.runtime.host import RaftGroupHost
from raftlog.storage.durable_mark import INLINE_MARK_SYNCER
from raftlog.storage.file_system import OsFileSystem
from raftlog.storage.wall_clock import SystemWallClock
from raftlog.types import NodeId, PartitionId

N1, N2, N3, N4 = NodeId(1), NodeId(2), NodeId(3), NodeId(4)
INCARNATION = 50  # this node's start; the replayed registrations are older
CREATES_PER_TURN = 8
CREATE_TURN_MS = 25


class _SteppingClock(FakeMonotonicClock):
    """Each reading finds the clock `step_s` later: every creation takes that long."""

    def __init__(self, step_s: float) -> None:
        super().__init__()
        self._step_s = step_s

    def monotonic(self) -> float:
        self.advance(self._step_s)
        return super().monotonic()


class _Node1:
    def __init__(
        self,
        tmp_path: Path,
        peers: dict[NodeId, tuple[str, int]],
        clock: MonotonicClock | None = None,
    ) -> None:
        self.state = MetadataState("cluster-a")
        self.dialed: dict[NodeId, tuple[str, int]] = {}
        self.soon: list[Callable[[], None]] = []  # the event loop's next turn
        self.reconciler = Reconciler(
            node_id=N1,
            data_dir=tmp_path,
            log_config=LogConfig(),
            bootstrap_peers=peers,
            metadata=lambda: self.state,
            factory=RaftGroupFactory(
                node_id=N1,
                config=NodeConfig(),
                files=OsFileSystem(),
                wall_clock=SystemWallClock(),
                rng=random.Random(1),
                mark_syncer=INLINE_MARK_SYNCER,
            ),
            host=RaftGroupHost(node_id=N1, tick_interval_ms=10, send=lambda *_: None),
            update_peers=self.dialed.update,
            on_leadership_change=lambda group: None,
            caught_up=lambda: caught_up_since_start(self.state, N1, INCARNATION),
            creates_per_turn_max=CREATES_PER_TURN,
            create_turn_ms_max=CREATE_TURN_MS,
            clock=clock or FakeMonotonicClock(),
            call_soon=self.soon.append,
        )

    def register(self, node: NodeId, raft_port: int, incarnation: int) -> None:
        command = RegisterNode(node, f"127.0.0.1:{raft_port - 100}", f"127.0.0.1:{raft_port}",
                               incarnation, 1_000)  # fmt: skip
        assert self.state.apply(self.state.applied_offset + 1, encode_command(command)).ok
        self.reconciler.reconcile()


def test_peers_win_over_replayed_registrations_until_a_voter_registers_again(
    tmp_path: Path,
) -> None:
    peers = {n: ("127.0.0.1", 20100 + n) for n in (N1, N2, N3)}  # the ports of this start
    node = _Node1(tmp_path, peers)
    # The log replays the last start's registrations, on other ports, and an observer's.
    for n in (N1, N2, N3, N4):
        node.register(n, 10100 + n, incarnation=1)
    assert node.dialed == {N2: peers[N2], N3: peers[N3], N4: ("127.0.0.1", 10104)}
    # Node 1's own registration of this start: caught up. Node 2 re-registers as --peers says.
    node.register(N1, 20101, incarnation=INCARNATION)
    node.register(N2, 20102, incarnation=60)
    assert node.dialed == {N2: peers[N2], N3: peers[N3], N4: ("127.0.0.1", 10104)}
    # Node 3 moves while node 1 runs: its new registration wins over node 1's --peers.
    node.register(N3, 30103, incarnation=70)
    assert node.dialed[N3] == ("127.0.0.1", 30103)
    assert node.dialed[N2] == peers[N2]


def test_many_new_partitions_are_created_a_bounded_number_per_turn(tmp_path: Path) -> None:
    node = _Node1(tmp_path, {N1: ("127.0.0.1", 20101)})
    node.register(N1, 20101, incarnation=INCARNATION)
    plan = plan_create_topic(node.state, CreateTopicRequest("many", 20, 1), 1_000)
    assert isinstance(plan, CreateTopic)
    assert node.state.apply(node.state.applied_offset + 1, encode_command(plan)).ok
    hosted = []
    node.reconciler.reconcile()  # the apply's reconcile
    node.reconciler.reconcile()  # another apply in the same turn: no second follow-up
    hosted.append(len(node.reconciler.replicas))
    while node.soon:
        assert len(node.soon) == 1, "one follow-up at a time"
        node.soon.pop()()
        hosted.append(len(node.reconciler.replicas))
    assert hosted == [8, 16, 20]


def test_a_turn_stops_creating_groups_when_its_loop_time_is_spent(tmp_path: Path) -> None:
    """Creations that take 10 ms each fit two in a 25 ms turn; one that takes longer than
    the whole budget still makes progress, one a turn."""
    for step_s, per_turn in ((0.010, 2), (0.100, 1)):
        node = _Node1(tmp_path / str(step_s), {N1: ("127.0.0.1", 20101)}, _SteppingClock(step_s))
        node.register(N1, 20101, incarnation=INCARNATION)
        plan = plan_create_topic(node.state, CreateTopicRequest("slow", 5, 1), 1_000)
        assert isinstance(plan, CreateTopic)
        assert node.state.apply(node.state.applied_offset + 1, encode_command(plan)).ok
        node.reconciler.reconcile()
        hosted = [len(node.reconciler.replicas)]
        while node.soon:
            node.soon.pop()()
            hosted.append(len(node.reconciler.replicas))
        assert hosted == [*range(per_turn, 5, per_turn), 5], (step_s, hosted)
        node.reconciler._factory.close_all()


def test_an_altered_topic_config_reaches_its_replicas_without_a_restart(tmp_path: Path) -> None:
    """A compacted topic's replicas refuse keyless records and are the cleaner's targets as
    soon as the change is applied; retention settings reach the log at its next check."""
    node = _Node1(tmp_path, {N1: ("127.0.0.1", 20101)})
    node.register(N1, 20101, incarnation=INCARNATION)
    plan = plan_create_topic(node.state, CreateTopicRequest("t", 1, 1), 1_000)
    assert isinstance(plan, CreateTopic)
    assert node.state.apply(node.state.applied_offset + 1, encode_command(plan)).ok
    node.reconciler.reconcile()
    replica = node.reconciler.replicas[("t", 0)]
    assert not replica._keys_required() and node.reconciler.clean_targets() == []
    alter = AlterTopicConfig("t", {"cleanup.policy": "compact", "retention.ms": "5000"}, ())
    assert node.state.apply(node.state.applied_offset + 1, encode_command(alter)).ok
    assert replica._keys_required()
    assert [t.raft_group_id for t in node.reconciler.clean_targets()] == [plan.raft_group_ids[0]]
    node.reconciler.apply_retention(now_ms=1_000)
    storage = node.reconciler._factory.storages[plan.raft_group_ids[0]]
    assert storage.log.config.retention_ms == 5000
    node.reconciler._factory.close_all()


@pytest.mark.parametrize("leader_epoch_high", [0, 5])
def test_a_new_group_campaigns_at_once_on_its_preferred_replica_only(
    tmp_path: Path, leader_epoch_high: int
) -> None:
    """The preferred replica of a brand-new group starts the first election when it creates
    the group; the others wait for their election timers. So too for a topic created after
    other topics' leaders were elected, whose groups start at a term above 0."""
    peers = {n: ("127.0.0.1", 20100 + n) for n in (N1, N2, N3)}
    node = _Node1(tmp_path, peers)
    for n in (N1, N2, N3):
        node.register(n, 20100 + n, incarnation=INCARNATION)
    if leader_epoch_high:
        earlier = plan_create_topic(node.state, CreateTopicRequest("earlier", 1, 1), 1_000)
        assert isinstance(earlier, CreateTopic)
        assert node.state.apply(node.state.applied_offset + 1, encode_command(earlier)).ok
        [(replica, *_)] = earlier.assignments
        report = ReportLeader("earlier", PartitionId(0), earlier.raft_group_ids[0], replica,
                              leader_epoch_high)  # fmt: skip
        assert node.state.apply(node.state.applied_offset + 1, encode_command(report)).ok
    plan = plan_create_topic(node.state, CreateTopicRequest("rf3", 6, 3), 1_000)
    assert isinstance(plan, CreateTopic)
    assert node.state.apply(node.state.applied_offset + 1, encode_command(plan)).ok
    node.reconciler.reconcile()
    while node.soon:
        node.soon.pop()()
    roles = {}
    for (topic, partition), replica in node.reconciler.replicas.items():
        info = node.state.partition(topic, partition)
        assert info is not None
        if topic != "rf3":
            continue
        assert info.first_term == leader_epoch_high
        roles[partition] = (info.preferred_leader == N1, replica.group.node.role)
    assert {preferred for preferred, _ in roles.values()} == {True, False}, roles
    for preferred, role in roles.values():
        assert (role is Role.PRE_CANDIDATE) == preferred, roles
    node.reconciler._factory.close_all()
