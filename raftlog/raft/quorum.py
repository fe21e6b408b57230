"""Majority math for one group (Raft §5.2 elections, §5.3/§5.4.2 commitment).

Theory of operation. Only voters count: learners receive entries but neither vote nor help
commit (dissertation §4.2.1). The committed offset of a set of voters is the highest offset
that a majority of them hold: sort their match offsets from high to low and take the
`quorum_size`-th. A voter without a known match counts as NO_OFFSET.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping

from raftlog.raft.types import NO_OFFSET
from raftlog.types import NodeId, Offset

__all__ = ["VoteResult", "committed_offset", "has_quorum", "vote_result"]


class VoteResult(enum.Enum):
    PENDING = "pending"
    WON = "won"
    LOST = "lost"


def quorum_size(voters: Collection[NodeId]) -> int:
    assert voters, "a group needs at least one voter"
    return len(voters) // 2 + 1


def committed_offset(voters: Collection[NodeId], match: Mapping[NodeId, Offset]) -> Offset:
    """The highest offset held by a majority of `voters` (Raft §5.3)."""
    offsets = sorted((match.get(voter, NO_OFFSET) for voter in voters), reverse=True)
    result = offsets[quorum_size(voters) - 1]
    assert result <= offsets[0], (result, offsets)
    return result


def has_quorum(voters: Collection[NodeId], present: Collection[NodeId]) -> bool:
    """Whether `present` contains a majority of `voters` (non-voters in it are ignored)."""
    count = sum(1 for voter in voters if voter in present)
    return count >= quorum_size(voters)


def vote_result(voters: Collection[NodeId], votes: Mapping[NodeId, bool]) -> VoteResult:
    """Tally an election (Raft §5.2): won with a majority of grants, lost once a majority
    can no longer be reached, pending otherwise."""
    granted = sum(1 for voter in voters if votes.get(voter) is True)
    rejected = sum(1 for voter in voters if votes.get(voter) is False)
    needed = quorum_size(voters)
    assert granted + rejected <= len(voters)
    if granted >= needed:
        return VoteResult.WON
    if len(voters) - rejected < needed:
        return VoteResult.LOST
    return VoteResult.PENDING
