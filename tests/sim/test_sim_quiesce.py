"""Quiescence on the simulator: the real core with node liveness from simulated node-pair
heartbeats (raftlog.raft.quiesce, raftlog.sim.cluster._update_liveness)."""

from __future__ import annotations

import random
from collections.abc import Callable

from raftlog.raft.types import Role
from raftlog.sim.cluster import Cluster, SimNode
from raftlog.sim.network import Link
from raftlog.sim.options import derive_options, scripted_options
from raftlog.sim.runner import run_seeds
from raftlog.sim.trace import Trace
from raftlog.types import NodeId, Term

STEPS_MAX = 2000


def _cluster(**overrides: object) -> Cluster:
    options = scripted_options(pre_vote=True, check_quorum=True, **overrides)
    return Cluster(options, random.Random(7), Trace(events_max=1000))


def _run_until(cluster: Cluster, done: Callable[[], bool]) -> int:
    for step in range(STEPS_MAX):
        if done():
            return step
        cluster.step(chaos=False)
    raise AssertionError("stuck: " + "; ".join(n.describe() for n in cluster.nodes.values()))


def _rafts(cluster: Cluster) -> list[SimNode]:
    return [node for node in cluster.nodes.values() if node.raft is not None]


def _all_quiesced(cluster: Cluster) -> bool:
    nodes = _rafts(cluster)
    return bool(nodes) and all(n.raft is not None and n.raft.quiesced for n in nodes)


def _quiesced_cluster() -> tuple[Cluster, SimNode]:
    cluster = _cluster()
    _run_until(cluster, lambda: cluster.leader() is not None)
    _run_until(cluster, lambda: _all_quiesced(cluster))
    leader = cluster.leader()
    assert leader is not None and leader.raft is not None
    return cluster, leader


def _isolate(cluster: Cluster, node_id: NodeId) -> frozenset[Link]:
    others = [n for n in cluster.nodes if n != node_id]
    return frozenset(link for o in others for link in ((node_id, o), (o, node_id)))


def test_an_idle_group_quiesces_and_then_sends_nothing() -> None:
    cluster, leader = _quiesced_cluster()
    delivered = cluster.delivered
    term = leader.raft.term if leader.raft else Term(0)
    for _ in range(20 * cluster.options.election_timeout_ticks):
        cluster.step(chaos=False)
    assert cluster.delivered == delivered, "a quiesced group exchanges no Raft messages"
    assert cluster.leader() is leader and leader.raft is not None and leader.raft.term == term
    assert _all_quiesced(cluster)


def test_no_spurious_election_while_quiesced_with_a_live_leader_node() -> None:
    cluster, leader = _quiesced_cluster()
    terms = {n.node_id: n.raft.term for n in _rafts(cluster) if n.raft is not None}
    for _ in range(STEPS_MAX):
        cluster.step(chaos=False)
    assert {n.node_id: n.raft.term for n in _rafts(cluster) if n.raft is not None} == terms
    assert cluster.leader() is leader


def test_a_proposal_wakes_the_group_commits_everywhere_and_it_quiesces_again() -> None:
    cluster, leader = _quiesced_cluster()
    assert leader.raft is not None
    offset = leader.raft.propose(b"wake up", offset_count=3)
    cluster.step(chaos=False)
    assert not leader.raft.quiesced
    last = offset + 2
    _run_until(
        cluster,
        lambda: all(n.raft is not None and n.raft.commit_offset >= last for n in _rafts(cluster)),
    )
    _run_until(cluster, lambda: _all_quiesced(cluster))
    assert cluster.leader() is leader


def test_a_crashed_quiesced_leader_is_replaced_after_the_liveness_timeout() -> None:
    cluster, leader = _quiesced_cluster()
    assert leader.raft is not None
    old_term = leader.raft.term
    cluster._crash(leader, "test")
    leader.restart_at = 10**9  # stays down
    steps = _run_until(cluster, lambda: cluster.leader() is not None)
    new = cluster.leader()
    assert new is not None and new is not leader and new.raft is not None
    assert new.raft.term > old_term
    # Liveness timeout, then one randomized election timeout: a bounded wait, in steps.
    assert steps <= cluster.options.liveness_timeout_ticks() + 4 * (
        cluster.options.election_timeout_ticks
    )
    # With a member's node down the new leader keeps heartbeating (it must keep probing it);
    # once the old leader is back and caught up, the group goes quiet again.
    for _ in range(3 * cluster.options.election_timeout_ticks):
        cluster.step(chaos=False)
    assert not new.raft.quiesced
    leader.restart_at = cluster.now + 1
    _run_until(cluster, lambda: leader.raft is not None and _all_quiesced(cluster))
    assert cluster.leader() is new


def test_a_partitioned_quiesced_leader_is_replaced_and_never_commits_again() -> None:
    cluster, old = _quiesced_cluster()
    assert old.raft is not None
    old_term, old_commit = old.raft.term, old.raft.commit_offset
    cluster.network.blocked = _isolate(cluster, old.node_id)
    old.raft.propose(b"lost", offset_count=1)  # can never reach a majority
    _run_until(
        cluster,
        lambda: any(
            n is not old and n.raft is not None and n.raft.role == Role.LEADER
            for n in _rafts(cluster)
        ),
    )
    _run_until(cluster, lambda: old.raft is not None and old.raft.role != Role.LEADER)
    new = next(n for n in _rafts(cluster) if n.raft is not None and n.raft.role == Role.LEADER)
    assert new.raft is not None and new.raft.term > old_term
    for _ in range(5 * cluster.options.election_timeout_ticks):
        cluster.step(chaos=False)
        assert old.raft is not None and old.raft.commit_offset == old_commit
    cluster.network.heal()
    _run_until(
        cluster,
        lambda: (
            old.raft is not None
            and old.raft.leader_id == new.node_id
            and old.raft.commit_offset == new.raft.commit_offset  # type: ignore[union-attr]
            and _all_quiesced(cluster)
        ),
    )
    cluster._check_all()


def test_random_runs_with_quiescence_exercise_it() -> None:
    """The fixed seed range (test_sim_runs) runs with quiescence on; check it really
    quiesces there, so those safety and liveness checks cover it."""
    quiesced = 0
    for result in run_seeds(range(1, 11), steps=300, jobs=1):
        assert result.ok, result.report()
        quiesced += dict(result.stats.exercised).get("quiesced", 0) if result.stats else 0
    assert quiesced > 0
    options, _ = derive_options(3, nodes=None, steps=10)
    assert options.quiesce and options.raft_config().quiesce
