"""The follower's side of replication (Raft §5.3 AppendEntries, §7 InstallSnapshot).

Theory of operation. An AppendRequest is accepted when this log holds the leader's entry
ending at `prev_offset` (same term there). Entries that this log already holds (same base
offset and term: the same batch, by log matching) are skipped; from the first one it lacks,
the suffix is replaced (never at or below the commit offset: those entries are in every
future leader's log, Raft §5.4). The acknowledgement goes out only after the driver synced
the appended entries (`persisted_messages`), so the leader never counts a replica that a
crash could take back.

The commit offset a follower may reach is the minimum of what the leader says is committed
and the last offset it has matched with this leader (`commit_target`), and it moves only over
entries that are durable here. A rejection tells the leader the term this log holds at
min(prev_offset, last offset) and where that term starts, so it can skip a whole term.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raftlog.raft import quiesce, repair
from raftlog.raft.types import (
    AppendRequest,
    AppendResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    Role,
    SnapshotRequest,
)
from raftlog.types import NodeId, Offset

if TYPE_CHECKING:
    from raftlog.raft.node import RaftNode

__all__ = [
    "maybe_advance_commit",
    "on_append_request",
    "on_heartbeat_request",
    "on_snapshot_request",
]


def from_other_leader(node: RaftNode) -> bool:
    """A leader got a leader's request of its own term: Election Safety (§5.2) was broken
    elsewhere (only a planted bug or a lost vote can do that). This node cannot repair it;
    it ignores the request and leaves the verdict to the simulator's checkers."""
    return node.current_role is Role.LEADER


def _heard_from_leader(node: RaftNode, leader: NodeId) -> None:
    """A current-term leader spoke: follow it and restart the election timer."""
    assert node.current_role is not Role.LEADER, "two leaders in one term (Raft §5.2)"
    if node.current_leader != leader:
        node.role_cause = f"node {leader} leads term {node.current_term} (its append arrived)"
    if node.current_role is not Role.FOLLOWER and node.current_role is not Role.LEARNER:
        node.become_follower(node.current_term, leader)
    node.current_leader = leader
    node.election_elapsed_ticks = 0
    assert node.current_role in (Role.FOLLOWER, Role.LEARNER), node.current_role


def maybe_advance_commit(node: RaftNode) -> None:
    """Commit up to what the leader allowed and this node holds durably."""
    assert node.current_role is not Role.LEADER
    before = node.commit
    target = min(node.commit_target, node.log.durable_last_offset())
    if target > node.commit:
        node.commit = target
        node.membership_history.on_commit(target)
    repair.maybe_finish_repair(node)
    assert node.commit >= before, "the commit offset never goes back"


def _acknowledge(node: RaftNode, request: AppendRequest, last_offset: Offset) -> None:
    reply = AppendResponse(node.current_term, node.node_id, request.sender, True, last_offset)
    # Raft §5.3: the leader counts this replica, so the entries must be durable first.
    node.send(reply, persisted="ack-before-durable" not in node.config.planted_bugs)


def on_append_request(node: RaftNode, request: AppendRequest) -> None:
    _heard_from_leader(node, request.sender)
    if request.prev_offset < node.commit:
        # Everything up to our commit offset matches every leader's log (Raft §5.4).
        _acknowledge(node, request, node.commit)
        return
    if not node.log.matches(request.prev_offset, request.prev_term):
        _reject(node, request)
        return
    entries = request.entries
    last_new = entries[-1].last_offset if entries else request.prev_offset
    conflict = node.log.find_conflict(entries)
    if "truncate-matching" in node.config.planted_bugs and entries:
        conflict = 0 if entries[0].offset > node.commit else conflict
    if conflict is not None:
        suffix = entries[conflict:]
        assert suffix[0].offset > node.commit, (
            f"leader {request.sender} would overwrite committed offset {suffix[0].offset}"
        )
        node.log.append(suffix)
        if node.membership_history.on_append(suffix):
            node.on_membership_changed()
    node.commit_target = max(node.commit_target, min(request.commit_offset, last_new))
    maybe_advance_commit(node)
    _acknowledge(node, request, last_new)


def _reject(node: RaftNode, request: AppendRequest) -> None:
    hint = min(request.prev_offset, node.log.last_offset())
    hint_term = node.log.term_at(hint)
    assert hint_term is not None, f"no term at {hint} (commit {node.commit})"
    reply = AppendResponse(
        node.current_term,
        node.node_id,
        request.sender,
        False,
        node.log.last_offset(),
        reject_offset=request.prev_offset,
        conflict_term=hint_term,
        conflict_offset=node.log.first_offset_of_term_at_least(hint_term),
    )
    node.send(reply)


def on_heartbeat_request(node: RaftNode, request: HeartbeatRequest) -> None:
    _heard_from_leader(node, request.sender)
    # The leader capped the commit at our match with it, so it is safe to adopt.
    node.commit_target = max(node.commit_target, request.commit_offset)
    maybe_advance_commit(node)
    if request.quiesce and quiesce.on_quiesce_notice(node, request):
        return  # the leader went quiet; an answer would wake it
    reply = HeartbeatResponse(
        node.current_term, node.node_id, request.sender, read_context=request.read_context
    )
    node.send(reply)


def on_snapshot_request(node: RaftNode, request: SnapshotRequest) -> None:
    """Raft §7: adopt the leader's snapshot unless this log already holds its last entry."""
    _heard_from_leader(node, request.sender)
    meta = request.snapshot.meta
    reply_offset = meta.offset
    if meta.offset <= node.commit:
        reply_offset = node.commit  # an old snapshot: we are further along
    elif node.log.matches(meta.offset, meta.term):
        node.commit_target = max(node.commit_target, meta.offset)
        maybe_advance_commit(node)
    else:
        node.log.restore(request.snapshot)
        node.membership_history.on_restore(meta.membership, meta.offset)
        node.commit = node.applied = node.commit_target = meta.offset
        node.on_membership_changed()
    reply = AppendResponse(node.current_term, node.node_id, request.sender, True, reply_offset)
    node.send(reply, persisted=True)
