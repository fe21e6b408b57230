"""ReadIndex (Raft dissertation §6.4)."""

from __future__ import annotations

import pytest
from raft_harness import Cluster
from raft_unit_helpers import Harness

from raftlog.config import RaftConfig
from raftlog.errors import NotLeaderError, ProposalDroppedError
from raftlog.raft.types import HeartbeatRequest, ReadState
from raftlog.types import NodeId, Offset

N1, N2 = NodeId(1), NodeId(2)


def _elected(config: RaftConfig | None = None) -> Cluster:
    cluster = Cluster([1, 2, 3], config=config)
    cluster.run("campaign 1")
    cluster.stabilize()
    return cluster


def test_read_is_answered_after_a_quorum_confirms_leadership() -> None:
    """§6.4 steps 1-3: record the commit offset, confirm with a heartbeat round, answer."""
    cluster = _elected()
    cluster.run("read-index 1 7")
    heartbeats = [m for m in cluster.queue if isinstance(m, HeartbeatRequest)]
    assert {m.read_context for m in heartbeats} == {1}
    assert cluster.read_states[N1] == []
    cluster.run("partition 1 | 3")  # one answer (from 2) is enough for a majority of three
    cluster.stabilize()
    assert cluster.read_states[N1] == [ReadState(7, Offset(0))]


def test_read_without_a_majority_is_never_answered() -> None:
    cluster = _elected()
    cluster.run("partition 1 | 2 3")
    cluster.run("read-index 1 7")
    cluster.run("tick 1 x8")
    cluster.stabilize()
    assert cluster.read_states[N1] == []


def test_new_leader_waits_for_its_first_commit() -> None:
    """§6.4 step 1: until its NOOP commits, the leader may not know the commit offset."""
    cluster = Cluster([1, 2, 3])
    cluster.run("campaign 1")
    for _ in range(4):
        cluster.run("deliver")
    leader = cluster.nodes[N1]
    assert leader.commit_offset < leader.last_offset
    cluster.run("read-index 1 7")
    assert not any(isinstance(m, HeartbeatRequest) for m in cluster.queue)
    cluster.stabilize()
    assert cluster.read_states[N1] == [ReadState(7, Offset(0))]


def test_single_voter_answers_at_once() -> None:
    harness = Harness(1, voters=[1])
    harness.node.campaign()
    harness.drain()
    harness.node.read_index(3)
    harness.drain()
    assert harness.reads == [ReadState(3, Offset(0))]


def test_follower_refuses_reads() -> None:
    cluster = _elected()
    with pytest.raises(NotLeaderError) as caught:
        cluster.nodes[N2].read_index(1)
    assert caught.value.leader_hint == N1


def test_pending_reads_are_bounded() -> None:
    cluster = _elected(RaftConfig(read_index_requests_max=2))
    cluster.run("partition 1 | 2 3")
    cluster.nodes[N1].read_index(1)
    cluster.nodes[N1].read_index(2)
    with pytest.raises(ProposalDroppedError, match="read_index_requests_max"):
        cluster.nodes[N1].read_index(3)
