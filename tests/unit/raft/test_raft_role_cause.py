"""Every role or term change records its cause in words (`RaftNode.role_cause`): which
timer, which peer, how late; the runtime logs it in one line per leadership change."""

from __future__ import annotations

from raft_unit_helpers import Harness

from raftlog.raft.types import HeartbeatRequest, Role, TimeoutNow, VoteRequest, VoteResponse
from raftlog.types import NodeId, Offset, Term

N1, N2, N3 = NodeId(1), NodeId(2), NodeId(3)


def _timed_out(harness: Harness) -> None:
    while harness.node.role is Role.FOLLOWER:
        harness.tick()


def test_an_election_names_its_timer_and_how_long_no_leader_was_heard() -> None:
    harness = Harness(1)
    timeout_ticks = harness.node.randomized_election_timeout_ticks
    _timed_out(harness)
    assert harness.node.role is Role.PRE_CANDIDATE
    assert harness.node.role_cause == (
        f"election timer: no leader heard for {timeout_ticks} ticks (randomized timeout "
        f"{timeout_ticks} ticks; last leader None, unreachable voters [2, 3])"
    )


def test_a_won_election_names_the_votes_and_a_lost_one_who_refused() -> None:
    harness = Harness(1)
    _timed_out(harness)
    harness.step(VoteResponse(Term(1), N2, N1, granted=True, pre_vote=True))
    assert harness.node.role is Role.CANDIDATE
    harness.step(VoteResponse(Term(1), N3, N1, granted=True, pre_vote=False))
    assert harness.node.role is Role.LEADER
    assert harness.node.role_cause == "won the election of term 1, votes [1, 3]"
    other = Harness(2)
    _timed_out(other)
    other.step(VoteResponse(Term(0), N1, N2, granted=False, pre_vote=True))
    other.step(VoteResponse(Term(0), N3, N2, granted=False, pre_vote=True))
    assert other.node.role is Role.FOLLOWER
    assert other.node.role_cause == "lost the pre-vote of term 1, refused by [1, 3]"


def test_a_higher_term_and_a_transfer_name_the_peer() -> None:
    harness = Harness(1)
    harness.step(HeartbeatRequest(Term(4), N3, N1, commit_offset=Offset(-1)))
    assert harness.node.role_cause == "term 4 from node 3 (HeartbeatRequest)"
    harness.step(TimeoutNow(Term(4), N3, N1))
    assert harness.node.role is Role.CANDIDATE
    assert harness.node.role_cause == "TimeoutNow from node 3 (leadership transfer)"


def test_a_new_leader_of_the_same_term_is_named_when_its_append_arrives() -> None:
    harness = Harness(1)
    harness.step(VoteRequest(Term(2), N2, N1, Offset(-1), Term(0)))
    assert harness.node.role_cause == "term 2 from node 2 (VoteRequest)"
    harness.step(HeartbeatRequest(Term(2), N2, N1, commit_offset=Offset(-1)))
    assert harness.node.leader_id == N2
    assert harness.node.role_cause == "node 2 leads term 2 (its append arrived)"
