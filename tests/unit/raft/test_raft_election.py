"""Leader election (Raft §5.2, §5.4.1), pre-vote and check-quorum (dissertation §9.6, §6.2)."""

from __future__ import annotations

import random

import pytest
from raft_harness import Cluster
from raft_unit_helpers import Harness, data_entry

from raftlog.config import RaftConfig
from raftlog.raft.node import RaftNode
from raftlog.raft.types import (
    AppendRequest,
    AppendResponse,
    HardState,
    HeartbeatRequest,
    Role,
    VoteRequest,
    VoteResponse,
)
from raftlog.types import NodeId, Offset, Term

N1, N2, N3 = NodeId(1), NodeId(2), NodeId(3)


@pytest.mark.parametrize("seed", range(20))
def test_election_timeout_is_randomized_in_one_to_two_timeouts(seed: int) -> None:
    """§5.2: a follower campaigns after a random timeout in [E, 2E) drawn from the rng."""
    config = RaftConfig(election_timeout_ticks=10, pre_vote=False)
    harness = Harness(1, config=config)
    harness.node.rng = random.Random(seed)
    harness.node.become_follower(Term(0), None)  # redraw from the seeded rng
    ticks = 0
    while harness.node.role is Role.FOLLOWER:
        harness.node.tick()
        ticks += 1
        assert ticks < 20
    assert 10 <= ticks < 20
    assert harness.node.role is Role.CANDIDATE and harness.node.term == 1


def test_timeouts_differ_across_nodes() -> None:
    """§5.2: randomization is what makes split votes rare; the draws are not all equal."""
    timeouts = {Harness(n, voters=[n]).node.randomized_election_timeout_ticks for n in range(1, 30)}
    assert len(timeouts) > 3


def test_three_nodes_elect_one_leader_which_commits_its_noop() -> None:
    """§5.2 and §8: one leader; its NOOP of the new term commits everywhere."""
    cluster = Cluster([1, 2, 3])
    cluster.run("campaign 1")
    cluster.stabilize()
    roles = {n: node.role for n, node in cluster.nodes.items()}
    assert roles == {N1: Role.LEADER, N2: Role.FOLLOWER, N3: Role.FOLLOWER}
    assert all(node.commit_offset == 0 and node.term == 1 for node in cluster.nodes.values())


def test_single_voter_becomes_leader_at_once() -> None:
    harness = Harness(1, voters=[1])
    harness.node.campaign()
    assert harness.node.role is Role.LEADER
    harness.drain()
    assert harness.node.commit_offset == 0


def _vote_request(term: int, sender: int, last_offset: int, last_term: int) -> VoteRequest:
    return VoteRequest(Term(term), NodeId(sender), N1, Offset(last_offset), Term(last_term))


def test_one_vote_per_term() -> None:
    """§5.2: each server votes for at most one candidate in a term, and remembers it."""
    harness = Harness(1, config=RaftConfig(pre_vote=False))
    first = harness.step(_vote_request(1, 2, -1, 0))
    second = harness.step(_vote_request(1, 3, -1, 0))
    assert first == [VoteResponse(Term(1), N1, N2, True)]
    assert second == [VoteResponse(Term(1), N1, N3, False)]
    assert harness.store.load() == HardState(Term(1), N2)
    again = harness.step(_vote_request(1, 2, -1, 0))
    assert again == [VoteResponse(Term(1), N1, N2, True)]  # a duplicate request


def test_vote_survives_restart() -> None:
    """§5.1: votedFor is durable, so a restarted node does not vote twice in a term."""
    harness = Harness(1)
    harness.step(_vote_request(1, 2, -1, 0))
    restarted = RaftNode(
        node_id=N1,
        config=RaftConfig(),
        storage=harness.storage,
        hard_state=harness.store.load(),
        rng=random.Random(1),
        bootstrap_membership=harness.membership,
    )
    restarted.step(_vote_request(1, 3, -1, 0))
    ready = restarted.ready()
    assert ready.messages + ready.persisted_messages == (VoteResponse(Term(1), N1, N3, False),)


def test_vote_refused_to_a_candidate_with_a_less_up_to_date_log() -> None:
    """§5.4.1: compare last terms first, then last offsets."""
    entries = [data_entry(1, 0), data_entry(2, 1, count=3)]
    harness = Harness(1, entries=entries, hard_state=HardState(Term(2)))
    assert harness.step(_vote_request(3, 2, 9, 1))[0].granted is False  # older last term
    assert harness.step(_vote_request(4, 2, 2, 2))[0].granted is False  # shorter, same term
    assert harness.step(_vote_request(5, 2, 3, 2))[0].granted is True  # as up to date


def test_granted_vote_waits_for_the_hard_state_to_be_durable() -> None:
    """§5.1: the vote leaves in persisted_messages, after the hard state save and sync."""
    harness = Harness(1, config=RaftConfig(pre_vote=False))
    harness.node.step(_vote_request(1, 2, -1, 0))
    ready = harness.node.ready()
    assert ready.messages == ()
    assert ready.persisted_messages == (VoteResponse(Term(1), N1, N2, True),)
    assert ready.hard_state == HardState(Term(1), N2) and ready.must_sync


def test_planted_bug_vote_not_persisted_sends_the_vote_early() -> None:
    config = RaftConfig(planted_bugs=frozenset({"vote-not-persisted"}))
    harness = Harness(1, config=config)
    harness.node.step(_vote_request(1, 2, -1, 0))
    assert harness.node.ready().messages == (VoteResponse(Term(1), N1, N2, True),)


def test_pre_vote_does_not_change_term_or_vote() -> None:
    """§9.6: a partitioned node keeps its term however often it times out."""
    harness = Harness(1)
    sent = harness.tick(100)
    assert harness.node.term == 0 and harness.node.role is Role.PRE_CANDIDATE
    assert all(isinstance(m, VoteRequest) and m.pre_vote and m.term == 1 for m in sent)
    assert harness.store.load() == HardState()


def test_pre_vote_grant_does_not_change_the_voters_term() -> None:
    harness = Harness(1)
    sent = harness.step(VoteRequest(Term(1), N2, N1, Offset(-1), Term(0), pre_vote=True))
    assert sent == [VoteResponse(Term(1), N1, N2, True, pre_vote=True)]
    assert harness.node.term == 0 and harness.node.hard_state() == HardState()


def _follow_leader(harness: Harness, term: int = 1) -> None:
    heartbeat = HeartbeatRequest(Term(term), N2, N1, Offset(-1))
    harness.step(heartbeat)
    assert harness.node.leader_id == N2


def test_lease_rejects_a_disruptive_candidate() -> None:
    """§9.6/§4.2.3: within an election timeout of hearing from a leader, a follower rejects
    (pre-)votes of a higher term without adopting that term."""
    harness = Harness(1)
    _follow_leader(harness)
    for pre_vote in (True, False):
        request = VoteRequest(Term(5), N3, N1, Offset(9), Term(1), pre_vote=pre_vote)
        assert harness.step(request) == [VoteResponse(Term(1), N1, N3, False, pre_vote=pre_vote)]
    assert harness.node.term == 1 and harness.node.leader_id == N2


def test_transfer_flag_overrides_the_lease() -> None:
    """§3.10: a vote started by TimeoutNow must win even though followers hold a lease."""
    harness = Harness(1)
    _follow_leader(harness)
    request = VoteRequest(Term(2), N3, N1, Offset(9), Term(1), transfer=True)
    assert harness.step(request) == [VoteResponse(Term(2), N1, N3, True)]


def test_lease_expires_after_an_election_timeout() -> None:
    config = RaftConfig(election_timeout_ticks=10, pre_vote=True)
    harness = Harness(1, config=config)
    _follow_leader(harness)
    harness.node.election_elapsed_ticks = 10  # heard nothing for a whole timeout
    request = VoteRequest(Term(2), N3, N1, Offset(9), Term(1), pre_vote=True)
    assert harness.step(request)[0].granted is True


def test_check_quorum_leader_steps_down_without_a_majority() -> None:
    """§6.2: a leader that heard from no majority within an election timeout steps down."""
    cluster = Cluster([1, 2, 3], config=RaftConfig(election_timeout_ticks=10))
    cluster.run("campaign 1")
    cluster.stabilize()
    cluster.run("partition 1 | 2 3")
    cluster.run("tick 1 x19")
    assert cluster.nodes[N1].role is Role.LEADER  # one check passes on old activity
    cluster.run("tick 1 x1")
    assert cluster.nodes[N1].role is Role.FOLLOWER and cluster.nodes[N1].term == 1


def test_without_check_quorum_a_cut_off_leader_stays() -> None:
    config = RaftConfig(check_quorum=False)
    cluster = Cluster([1, 2, 3], config=config)
    cluster.run("campaign 1")
    cluster.stabilize()
    cluster.run("partition 1 | 2 3")
    cluster.run("tick 1 x100")
    assert cluster.nodes[N1].role is Role.LEADER


def test_stale_leader_learns_the_new_term_from_a_rejection() -> None:
    """§5.1: a reply carrying a higher term makes a stale leader step down."""
    harness = Harness(1, hard_state=HardState(Term(5)))
    stale = AppendRequest(Term(3), N2, N1, Offset(-1), Term(0), (), Offset(-1))
    sent = harness.step(stale)
    assert sent == [AppendResponse(Term(5), N1, N2, False, Offset(-1))]


def test_candidate_returns_to_follower_on_an_append_of_its_term() -> None:
    """§5.2: a candidate that hears from a leader of its term recognizes it."""
    harness = Harness(1, config=RaftConfig(pre_vote=False))
    harness.tick(30)
    assert harness.node.role is Role.CANDIDATE
    term = harness.node.term
    append = AppendRequest(term, N2, N1, Offset(-1), Term(0), (), Offset(-1))
    harness.step(append)
    assert harness.node.role is Role.FOLLOWER and harness.node.leader_id == N2


def test_learner_never_campaigns() -> None:
    """Dissertation §4.2.1: learners do not start elections. They do answer a candidate
    (whose newer configuration may already count them as voters): only the candidate's
    configuration decides whose vote counts (simulator seed 17623 livelocked otherwise)."""
    harness = Harness(3, voters=[1, 2], learners=[3])
    assert harness.tick(100) == [] and harness.node.role is Role.LEARNER
    harness.node.campaign()
    assert harness.drain() == [] and harness.node.term == 0
    request = VoteRequest(Term(1), N1, NodeId(3), Offset(-1), Term(0))
    assert harness.step(request)[0].granted is True


def test_rejected_higher_term_vote_does_not_restart_the_election_timer() -> None:
    """Figure 2: only a leader's append or a granted vote restarts the timer; otherwise a
    stale candidate that times out faster could keep an up-to-date node from campaigning."""
    config = RaftConfig(pre_vote=False, election_timeout_ticks=10)
    harness = Harness(1, entries=[data_entry(1, 0), data_entry(2, 1)], config=config)
    harness.tick(5)
    assert harness.step(_vote_request(7, 2, 0, 1))[0].granted is False  # stale log
    assert harness.node.term == 7 and harness.node.election_elapsed_ticks == 5
    harness.step(_vote_request(8, 3, 5, 2))  # an up-to-date candidate gets the vote ...
    assert harness.node.election_elapsed_ticks == 0  # ... which restarts the timer
