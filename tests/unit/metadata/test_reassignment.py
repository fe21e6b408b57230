"""The partition leader's next step of a move (raftlog.metadata.reassignment)."""

from __future__ import annotations

import pytest

from raftlog.metadata.reassignment import (
    Complete,
    ProposeMembership,
    Step,
    TransferLeadership,
    Wait,
    next_step,
)
from raftlog.raft.types import Membership
from raftlog.types import NodeId


def _members(voters: set[int], learners: set[int] | None = None) -> Membership:
    return Membership(
        voters=frozenset(NodeId(n) for n in voters),
        learners=frozenset(NodeId(n) for n in learners or set()),
    )


def _step(
    leader: int,
    membership: Membership,
    target: tuple[int, ...],
    *,
    committed: bool = True,
    caught_up: set[int] | None = None,
) -> Step:
    return next_step(
        leader=NodeId(leader),
        membership=membership,
        membership_committed=committed,
        target=tuple(NodeId(n) for n in target),
        caught_up=frozenset(
            NodeId(n) for n in (membership.members if caught_up is None else caught_up)
        ),
    )


def test_a_follower_is_replaced_add_first() -> None:
    """(1, 2, 3) -> (1, 2, 4) led by 1: learner 4, promote 4, remove 3, complete."""
    membership = _members({1, 2, 3})
    expected = [
        _members({1, 2, 3}, {4}),
        _members({1, 2, 3, 4}),
        _members({1, 2, 4}),
    ]
    for after in expected:
        step = _step(1, membership, (1, 2, 4))
        assert step == ProposeMembership(after)
        membership = after
    assert _step(1, membership, (1, 2, 4)) == Complete()


def test_the_leader_hands_over_before_it_is_removed() -> None:
    membership = _members({1, 2, 4})  # 4 already promoted; 3 gone; 1 must leave
    step = _step(1, membership, (4, 2, 3), caught_up={1, 2, 4})
    assert step == ProposeMembership(_members({1, 2, 4}, {3}))
    membership = _members({1, 2, 3, 4})
    assert _step(1, membership, (4, 2, 3)) == TransferLeadership(NodeId(4))
    # The new leader removes the old one, then completes.
    assert _step(4, membership, (4, 2, 3)) == ProposeMembership(_members({2, 3, 4}))
    assert _step(4, _members({2, 3, 4}), (4, 2, 3)) == Complete()


def test_waits_for_a_commit_and_for_a_lagging_learner() -> None:
    assert isinstance(_step(1, _members({1, 2}), (1, 3), committed=False), Wait)
    lagging = _step(1, _members({1, 2}, {3}), (1, 3), caught_up={1, 2})
    assert lagging == Wait("learner 3 is catching up")


def test_a_learner_outside_the_target_is_dropped_first() -> None:
    step = _step(1, _members({1, 2}, {5}), (1, 3))
    assert step == ProposeMembership(_members({1, 2}))


def test_the_leader_must_be_a_voter() -> None:
    with pytest.raises(AssertionError):
        _step(3, _members({1, 2}, {3}), (1, 3))
