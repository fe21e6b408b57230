"""Majority math (Raft §5.2 elections, §5.3 commitment), checked against brute force."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.raft.quorum import VoteResult, committed_offset, has_quorum, vote_result
from raftlog.types import NodeId, Offset

voters_strategy = st.sets(st.integers(1, 9), min_size=1, max_size=7).map(
    lambda s: frozenset(NodeId(n) for n in s)
)


@settings(max_examples=200)
@given(voters=voters_strategy, data=st.data())
def test_committed_offset_is_the_highest_offset_a_majority_holds(
    voters: frozenset[NodeId], data: st.DataObject
) -> None:
    match = {v: Offset(data.draw(st.integers(-1, 20))) for v in voters}
    result = committed_offset(voters, match)
    majority = len(voters) // 2 + 1
    holders = sum(1 for v in voters if match[v] >= result)
    assert holders >= majority
    assert sum(1 for v in voters if match[v] >= result + 1) < majority


def test_learners_and_strangers_do_not_count() -> None:
    voters = frozenset({NodeId(1), NodeId(2), NodeId(3)})
    match = {NodeId(1): Offset(9), NodeId(4): Offset(9), NodeId(5): Offset(9)}
    assert committed_offset(voters, match) == -1
    assert not has_quorum(voters, {NodeId(1), NodeId(4), NodeId(5)})
    assert has_quorum(voters, {NodeId(1), NodeId(3)})


@settings(max_examples=200)
@given(voters=voters_strategy, data=st.data())
def test_vote_result_matches_counting(voters: frozenset[NodeId], data: st.DataObject) -> None:
    votes = {v: data.draw(st.booleans()) for v in voters if data.draw(st.booleans())}
    result = vote_result(voters, votes)
    majority = len(voters) // 2 + 1
    granted = sum(votes.values())
    undecided = len(voters) - len(votes)
    if granted >= majority:
        assert result is VoteResult.WON
    elif granted + undecided < majority:
        assert result is VoteResult.LOST
    else:
        assert result is VoteResult.PENDING
