"""Admission of proposals at the leader: who may propose, and the bounds on what is pending.

Theory of operation. Only a leader appends proposals, and not while a leadership transfer is
under way (dissertation §3.10: the target must catch up with a log that stops growing). Two
bounds keep a leader that cannot commit from growing its log without limit:
`proposals_max` uncommitted proposals and `uncommitted_bytes_max` uncommitted bytes (a single
proposal larger than the byte bound is still admitted when nothing else is pending, as in
etcd, so it is not refused forever). Both are released as the commit offset passes them.
Membership changes additionally follow dissertation §4.1 with the 2015 fix: one node at a
time, none before the leader committed an entry of its term, none while another is pending;
and a node becomes a voter only once its log has caught up with the commit offset (§4.2.1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raftlog.errors import MembershipChangeError, NotLeaderError, ProposalDroppedError
from raftlog.raft.membership import validate_change
from raftlog.raft.types import Entry, EntryKind, Membership, Role
from raftlog.types import Offset

if TYPE_CHECKING:
    from raftlog.raft.node import RaftNode

__all__ = ["append_proposal", "check_membership_change", "check_proposal"]


def check_proposal(node: RaftNode, size_bytes: int) -> None:
    """Raise unless the leader may append a proposal of `size_bytes` now."""
    if node.current_role is not Role.LEADER:
        raise NotLeaderError(leader_hint=node.current_leader)
    if node.lead_transferee is not None:
        raise ProposalDroppedError(
            f"leadership transfer to node {node.lead_transferee} under way (Raft §3.10)"
        )
    if len(node.uncommitted) >= node.config.proposals_max:
        raise ProposalDroppedError(
            f"{len(node.uncommitted)} uncommitted proposals reach proposals_max"
        )
    over = node.uncommitted_bytes + size_bytes > node.config.uncommitted_bytes_max
    if over and node.uncommitted_bytes > 0:
        raise ProposalDroppedError(
            f"{node.uncommitted_bytes} uncommitted bytes + {size_bytes} exceed "
            f"uncommitted_bytes_max={node.config.uncommitted_bytes_max}"
        )


def append_proposal(node: RaftNode, kind: EntryKind, data: bytes, offset_count: int) -> Offset:
    """Append one entry of the leader's term at the end of its log; returns its offset."""
    entry = Entry(node.current_term, Offset(node.last_offset + 1), offset_count, kind, data)
    check_proposal(node, entry.size_bytes)
    node.uncommitted.append((entry.last_offset, entry.size_bytes))
    node.uncommitted_bytes += entry.size_bytes
    node.append_as_leader(entry)
    assert node.last_offset == entry.last_offset, (node.last_offset, entry)
    assert len(node.uncommitted) <= node.config.proposals_max
    return entry.offset


def check_membership_change(node: RaftNode, membership: Membership) -> None:
    """Raise unless `membership` may be proposed now (dissertation §4.1, the 2015 fix)."""
    if node.current_role is not Role.LEADER:
        raise NotLeaderError(leader_hint=node.current_leader)
    validate_change(node.membership_history.current, membership)
    if not node.committed_in_term():
        raise MembershipChangeError(
            f"leader of term {node.current_term} has not committed an entry of its term",
            retriable=True,
        )
    if node.membership_history.last_offset > node.commit:
        raise MembershipChangeError(
            f"the change at offset {node.membership_history.last_offset} is not committed yet "
            f"(commit {node.commit})",
            retriable=True,
        )
    for joining in sorted(membership.voters - node.membership_history.current.voters):
        # Issue 3 and §4.2.1: a new voter must have caught up first (as a learner), or the
        # group could stall waiting for it to count towards commitment.
        progress = node.progress.get(joining)
        match = -1 if progress is None else progress.match
        if match < node.commit:
            raise MembershipChangeError(
                f"node {joining} holds the log up to {match}, behind the commit offset "
                f"{node.commit}: let it catch up as a learner first",
                retriable=True,
            )
    assert membership.voters, membership
