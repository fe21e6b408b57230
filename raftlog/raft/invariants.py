"""Local invariants of one Raft node, asserted after every input (TigerBeetle's habit).

Theory of operation. Each assertion names the rule it protects: terms never go back and a
node votes once per term (Raft §5.1, §5.2); applied <= commit <= last offset; a follower
commits only what it holds durably (its acknowledgements promised that, §5.3), except what
it committed itself while it led; a leader knows itself as leader; the role matches the
membership (learners are exactly the members listed as learners, dissertation §4.2.1).
A failed assertion stops the node: it is never swallowed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raftlog.raft.types import Role

if TYPE_CHECKING:
    from raftlog.raft.node import RaftNode

__all__ = ["check"]


def check(node: RaftNode) -> None:
    """Assert every local invariant (cheap: O(1) per call)."""
    persisted = node.persisted_hard_state
    assert node.current_term >= persisted.term, "term went back (Raft §5.1)"
    if persisted.term == node.current_term and persisted.vote is not None:
        assert node.voted_for == persisted.vote, "two votes in one term (Raft §5.2)"
    assert node.applied <= node.commit <= node.log.last_offset(), (
        f"applied {node.applied} <= commit {node.commit} <= last {node.log.last_offset()}"
    )
    if node.repairing:
        # raftlog.raft.repair: a log under repair vouches for no one, itself included.
        assert node.current_role not in (Role.LEADER, Role.CANDIDATE, Role.PRE_CANDIDATE)
    if node.current_role is Role.LEADER:
        assert node.current_leader == node.node_id and node.node_id in node.progress
    else:
        # Followers commit only what they hold durably (a pending snapshot counts); a
        # former leader may have counted a quorum of others before its own write synced.
        durable = max(node.log.durable_last_offset(), node.commit_as_leader)
        assert node.commit <= durable, (
            f"follower commit {node.commit} beyond durable {node.log.durable_last_offset()}"
        )
    if node.quiesced:
        # Only an idle leader or its follower goes quiet (raftlog.raft.quiesce).
        assert node.current_leader is not None, "a quiesced node knows its leader"
        assert node.current_role is not Role.LEADER or not (
            node.reads or node.lead_transferee is not None or node.uncommitted
        ), "a quiesced leader has nothing pending"
    unstable = node.log.unstable
    assert not unstable or unstable[0].offset == node.log.unstable_offset, (
        f"unstable entries start at {unstable[0].offset}, not {node.log.unstable_offset}"
    )
    assert (node.current_role is Role.LEARNER) == (
        node.node_id in node.membership_history.current.learners
    ) or node.current_role is Role.LEADER, (node.current_role, node.membership_history.current)
