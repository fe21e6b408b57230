"""Leadership transfer (Raft dissertation §3.10)."""

from __future__ import annotations

import pytest
from raft_harness import Cluster

from raftlog.errors import NotLeaderError, ProposalDroppedError, RaftError
from raftlog.raft.types import Role, TimeoutNow, VoteRequest
from raftlog.types import NodeId

N1, N2, N3 = NodeId(1), NodeId(2), NodeId(3)


def _elected() -> Cluster:
    cluster = Cluster([1, 2, 3])
    cluster.run("campaign 1")
    cluster.stabilize()
    return cluster


def test_transfer_to_an_up_to_date_follower() -> None:
    cluster = _elected()
    cluster.history.clear()
    cluster.run("transfer 1 3")
    cluster.stabilize()
    assert cluster.nodes[N3].role is Role.LEADER and cluster.nodes[N3].term == 2
    assert any(isinstance(m, TimeoutNow) and m.receiver == N3 for m in cluster.history)
    votes = [m for m in cluster.history if isinstance(m, VoteRequest)]
    assert votes and all(m.transfer and not m.pre_vote for m in votes)  # no pre-vote round


def test_transfer_catches_a_lagging_target_up_first() -> None:
    cluster = _elected()
    cluster.run("partition 1 2 | 3")
    cluster.run("propose 1 x")
    cluster.stabilize()
    cluster.run("heal")
    cluster.run("transfer 1 3")
    assert not any(isinstance(m, TimeoutNow) for m in cluster.queue)
    cluster.stabilize()
    assert cluster.nodes[N3].role is Role.LEADER
    assert cluster.nodes[N3].log.term_at(cluster.nodes[N1].log.last_offset() - 1) == 1


def test_proposals_are_refused_during_a_transfer() -> None:
    cluster = _elected()
    cluster.run("partition 1 | 3")
    cluster.nodes[N1].transfer_leadership(N3)
    with pytest.raises(ProposalDroppedError, match="transfer"):
        cluster.nodes[N1].propose(b"x", offset_count=1)


def test_transfer_aborts_after_an_election_timeout() -> None:
    cluster = _elected()
    cluster.run("partition 1 2 | 3")
    cluster.nodes[N1].transfer_leadership(N3)
    cluster.run("tick 1 x10")
    assert cluster.nodes[N1].role is Role.LEADER
    assert cluster.nodes[N1].propose(b"x", offset_count=1) == 1


def test_transfer_needs_a_leader_and_a_voter() -> None:
    cluster = _elected()
    with pytest.raises(NotLeaderError):
        cluster.nodes[N2].transfer_leadership(N3)
    with pytest.raises(RaftError, match="not a voter"):
        cluster.nodes[N1].transfer_leadership(NodeId(9))
