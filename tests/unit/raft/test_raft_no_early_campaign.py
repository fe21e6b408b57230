"""A group that just changed leader, or just lost an election, waits a full randomized
election timeout before it campaigns again (Raft §5.2): under pressure, a storm must not
feed itself with elections started early. Every seed draws other timeouts."""

from __future__ import annotations

import pytest
from raft_unit_helpers import Harness

from raftlog.raft.types import HeartbeatRequest, Role, VoteResponse
from raftlog.types import NodeId, Offset, Term


def _ticks_until_campaign(harness: Harness, limit: int) -> int:
    for ticks in range(1, limit + 1):
        harness.tick()
        if harness.node.role is not Role.FOLLOWER:
            return ticks
    raise AssertionError(f"no campaign within {limit} ticks")


@pytest.mark.parametrize("node_id", [1, 2, 3, 4, 5, 6, 7, 8])
def test_a_new_leader_resets_the_timer_to_a_full_randomized_timeout(node_id: int) -> None:
    harness = Harness(node_id, voters=(node_id, 20, 30))
    timeout = harness.node.config.election_timeout_ticks
    harness.tick(timeout - 1)  # nearly timed out when the new leader speaks
    leader = NodeId(20)
    harness.step(HeartbeatRequest(Term(3), leader, NodeId(node_id), commit_offset=Offset(-1)))
    assert harness.node.leader_id == leader
    # The leader falls silent at once: the next campaign needs a full randomized timeout.
    waited = _ticks_until_campaign(harness, 2 * timeout)
    assert waited >= timeout, (waited, timeout)


@pytest.mark.parametrize("node_id", [1, 2, 3, 4, 5, 6, 7, 8])
def test_a_lost_pre_vote_waits_a_full_randomized_timeout_before_the_next(node_id: int) -> None:
    harness = Harness(node_id, voters=(node_id, 20, 30))
    timeout = harness.node.config.election_timeout_ticks
    _ticks_until_campaign(harness, 2 * timeout)
    assert harness.node.role is Role.PRE_CANDIDATE
    for voter in (NodeId(20), NodeId(30)):
        harness.step(VoteResponse(Term(0), voter, NodeId(node_id), granted=False, pre_vote=True))
    assert harness.node.role is Role.FOLLOWER
    assert _ticks_until_campaign(harness, 2 * timeout) >= timeout


@pytest.mark.parametrize("node_id", [1, 2, 3, 4])
def test_the_next_tick_campaign_query_matches_what_the_tick_does(node_id: int) -> None:
    # The runtime's campaign bound (raftlog.runtime.host) asks this before each tick.
    harness = Harness(node_id, voters=(node_id, 20, 30))
    for _ in range(2 * harness.node.config.election_timeout_ticks):
        expected = harness.node.campaigns_on_next_tick()
        harness.tick()
        assert (harness.node.role is Role.PRE_CANDIDATE) == expected
        if expected:
            break
    assert harness.node.role is Role.PRE_CANDIDATE
    assert not harness.node.campaigns_on_next_tick(), "a fresh campaign has a full timeout"
