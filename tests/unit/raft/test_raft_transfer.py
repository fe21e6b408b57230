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


# --- in sync: whom a leader may hand leadership back to without refusing proposals ---------


def _elected_and_reachable() -> Cluster:
    """`_elected`, with every node told its peers' nodes are reachable (the host's liveness)."""
    cluster = _elected()
    for node in cluster.nodes.values():
        for peer in (N1, N2, N3):
            node.set_peer_reachable(peer, reachable=True)
    return cluster


def test_a_caught_up_reachable_follower_is_in_sync() -> None:
    cluster = _elected_and_reachable()
    cluster.run("propose 1 x")
    cluster.stabilize()
    leader = cluster.nodes[N1]
    assert leader.is_in_sync(N2) and leader.is_in_sync(N3)


def test_a_follower_whose_node_is_unreachable_is_not_in_sync() -> None:
    """A killed node: its log may be complete, but a transfer to it would never finish."""
    cluster = _elected_and_reachable()
    leader = cluster.nodes[N1]
    leader.set_peer_reachable(N3, reachable=False)
    assert not leader.is_in_sync(N3) and leader.is_in_sync(N2)
    leader.set_peer_reachable(N3, reachable=True)
    assert leader.is_in_sync(N3)


def test_a_follower_missing_committed_entries_is_not_in_sync_until_it_catches_up() -> None:
    cluster = _elected_and_reachable()
    cluster.run("partition 1 2 | 3")
    cluster.run("propose 1 x")
    cluster.stabilize()
    leader = cluster.nodes[N1]
    assert leader.commit_offset > leader.progress[N3].match
    assert not leader.is_in_sync(N3) and leader.is_in_sync(N2)
    cluster.run("heal")
    # The append it missed was lost: one heartbeat's answer shows the gap, the next round
    # carries the entry.
    for _ in range(2):
        cluster.run("tick 1 x2")
        cluster.stabilize()
    assert leader.progress[N3].match == leader.commit_offset
    assert leader.is_in_sync(N3)


def test_a_probed_follower_is_not_in_sync() -> None:
    """A follower the leader is still probing (here: one that came back from a restart, so
    its log's end is unknown) has not shown it holds the log."""
    cluster = _elected_and_reachable()
    leader = cluster.nodes[N1]
    leader.progress[N3].become_probe()
    assert not leader.is_in_sync(N3)


def test_only_a_leader_answers_who_is_in_sync() -> None:
    cluster = _elected_and_reachable()
    with pytest.raises(NotLeaderError):
        cluster.nodes[N2].is_in_sync(N3)
