"""The leader's side of log replication, commitment and snapshots (Raft §5.3, §5.4.2, §7).

Theory of operation. The leader keeps a `Progress` per member. `send_append` sends the
entries from `progress.next` (at most `append_bytes_max` of them, but at least one) after the
entry ending at `next - 1`; in REPLICATE state several appends are in flight at once (bounded
by `inflight_messages_max` / `inflight_bytes_max`), in PROBE state one at a time. If `next`
falls below the first offset storage still holds, the follower gets the snapshot instead.

A rejection carries the follower's term at min(prev_offset, its last offset) (the
conflict term). The leader then retreats in one step to an offset where its own log ends an
entry and could still match: the same offset if it has the same term there (log matching:
same term at an offset means the same batch, so the batch ends there too), otherwise to
just before the first entry of the smaller of the two terms (Raft §5.3's
optimisation, in Kafka's "end offset of epoch" form). Every retreat strictly lowers `next`.

Commitment (Raft §5.4.2): the leader commits the highest offset a majority of voters hold,
but only if the entry there has the current term; earlier-term entries commit indirectly.
Its own log counts only up to what the driver has made durable (`on_durable`).

Every append carries the leader's commit offset. A follower that is sent nothing else
learns a new one from an empty append: at once (`commit_notice == "immediate"`, etcd's
way) or at the leader's next tick (`"next_tick"`, `send_commit_notices`), by which time, under
load, the next append has usually carried it. Followers only need the commit offset to
apply; no producer waits for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raftlog.raft import election, follower, quorum
from raftlog.raft.progress import Progress, ProgressState
from raftlog.raft.types import (
    AppendRequest,
    AppendResponse,
    Entry,
    HeartbeatRequest,
    HeartbeatResponse,
    Role,
    SnapshotRequest,
)
from raftlog.types import NodeId, Offset, Term

if TYPE_CHECKING:
    from raftlog.raft.node import RaftNode

__all__ = [
    "bcast_append",
    "bcast_heartbeat",
    "committed_entries",
    "maybe_commit",
    "on_append_response",
    "on_durable",
    "on_heartbeat_response",
    "send_append",
    "send_commit_notices",
    "tick_snapshots",
]

# Heartbeat answers without any append progress before a REPLICATE follower is re-probed:
# appends were lost, and only a probe will find out from where to resend.
STALLED_HEARTBEATS_MAX = 2


def _peers(node: RaftNode) -> list[NodeId]:
    return sorted(member for member in node.progress if member != node.node_id)


def send_append(node: RaftNode, peer: NodeId, *, send_empty: bool = True) -> bool:
    """Send `peer` the entries it lacks (or the snapshot); False if nothing was sent."""
    assert node.current_role is Role.LEADER
    progress = node.progress[peer]
    if progress.is_paused(node.config):
        return False
    if progress.next < node.log.first_offset():
        return _send_snapshot(node, peer, progress)
    prev_offset = Offset(progress.next - 1)
    prev_term = node.log.term_at(prev_offset)
    assert prev_term is not None, f"no term at prev_offset {prev_offset} for node {peer}"
    entries: tuple[Entry, ...] = ()
    if progress.next <= node.log.last_offset():
        entries = tuple(node.log.entries(progress.next, bytes_max=node.config.append_bytes_max))
    elif not send_empty:
        return False
    request = AppendRequest(
        node.current_term, node.node_id, peer, prev_offset, prev_term, entries, node.commit
    )
    node.send(request)
    progress.sent_commit = max(progress.sent_commit, node.commit)
    last = entries[-1].last_offset if entries else prev_offset
    progress.sent(last, sum(entry.size_bytes for entry in entries))
    return True


def _send_snapshot(node: RaftNode, peer: NodeId, progress: Progress) -> bool:
    """Raft §7: the follower needs entries we compacted; send the snapshot instead."""
    snapshot = node.log.snapshot()
    assert snapshot is not None, f"offset {progress.next} is compacted but there is no snapshot"
    progress.become_snapshot(snapshot.meta.offset)
    node.send(SnapshotRequest(node.current_term, node.node_id, peer, snapshot))
    assert progress.is_paused(node.config)
    return True


def bcast_append(node: RaftNode) -> None:
    """Send every follower what it lacks (empty appends carry a new commit offset)."""
    assert node.current_role is Role.LEADER
    for peer in _peers(node):
        send_append(node, peer)


def _on_commit_advanced(node: RaftNode) -> None:
    """Tell the followers of a new commit offset: with what they are sent anyway, and, if
    notices are immediate, with an empty append to the others (see the module docstring)."""
    assert node.current_role is Role.LEADER
    immediate = node.config.commit_notice == "immediate"
    for peer in _peers(node):
        send_append(node, peer, send_empty=immediate)


def _commit_unsent(node: RaftNode, progress: Progress) -> bool:
    """Whether `progress`'s follower holds committed entries it was not told are committed."""
    return progress.sent_commit < min(node.commit, progress.match)


def send_commit_notices(node: RaftNode) -> None:
    """Leader tick with deferred notices: an empty append to each follower that holds
    committed entries it was not told of (no append has carried the commit since)."""
    assert node.current_role is Role.LEADER
    if node.config.commit_notice != "next_tick":
        return
    for peer in _peers(node):
        if _commit_unsent(node, node.progress[peer]):
            send_append(node, peer)


def _fill_pipeline(node: RaftNode, peer: NodeId) -> None:
    """Send appends until the follower is up to date or its window is full (bounded)."""
    assert node.current_role is Role.LEADER and peer != node.node_id
    for _ in range(node.config.inflight_messages_max):
        if not send_append(node, peer, send_empty=False):
            return


def bcast_heartbeat(node: RaftNode, read_context: int) -> None:
    """Raft §5.2 heartbeats; each commit is capped at the follower's match so a follower
    never commits an offset it has not matched with this leader."""
    assert node.current_role is Role.LEADER and read_context >= 0
    for peer in _peers(node):
        progress = node.progress[peer]
        commit = min(node.commit, progress.match)
        progress.sent_commit = max(progress.sent_commit, commit)
        heartbeat = HeartbeatRequest(
            node.current_term, node.node_id, peer, commit, read_context=read_context
        )
        node.send(heartbeat)


def tick_snapshots(node: RaftNode) -> None:
    """A snapshot unanswered for an election timeout was probably lost: probe again."""
    assert node.current_role is Role.LEADER
    for progress in node.progress.values():
        if progress.state is ProgressState.SNAPSHOT:
            progress.snapshot_elapsed_ticks += 1
            if progress.snapshot_elapsed_ticks >= node.config.election_timeout_ticks:
                progress.become_probe()


def on_append_response(node: RaftNode, message: AppendResponse) -> None:
    assert message.term == node.current_term, "check_term dropped other terms"
    if node.current_role is not Role.LEADER:
        return
    progress = node.progress.get(message.sender)
    if progress is None:
        return
    progress.recent_active = True
    if not message.success:
        _on_reject(node, message, progress)
        return
    # A probe answered at exactly `match` also confirms where the logs agree (etcd).
    confirmed = progress.state is ProgressState.PROBE and message.last_offset == progress.match
    if not progress.maybe_update(message.last_offset) and not confirmed:
        return
    snapshot_done = progress.match >= progress.pending_snapshot
    if progress.state is ProgressState.PROBE or (
        progress.state is ProgressState.SNAPSHOT and snapshot_done
    ):
        progress.become_replicate()
    if maybe_commit(node) and node.current_role is Role.LEADER:
        _on_commit_advanced(node)  # (a leader removed by what just committed has stepped down)
    if node.current_role is Role.LEADER and message.sender in node.progress:
        _fill_pipeline(node, message.sender)
        if _commit_unsent(node, progress) and node.config.commit_notice == "immediate":
            send_append(node, message.sender)  # tell it what of its log is committed
        if node.lead_transferee == message.sender:
            election.maybe_send_timeout_now(node, message.sender)


def _on_reject(node: RaftNode, message: AppendResponse, progress: Progress) -> None:
    if message.last_offset < progress.match:
        # The follower's log ends below what it acknowledged: a reordered old answer, or a
        # log that lost entries to its disk and is being repaired (raftlog.raft.repair).
        # Probing it again is safe either way (forget_peer_log) and refills the second.
        node.forget_peer_log(message.sender)
        return
    if message.reject_offset <= progress.match:
        return  # stale: sent before the follower acknowledged `match` (reordered)
    if progress.state is ProgressState.SNAPSHOT:
        return  # an answer to an append sent before the snapshot; wait for the snapshot's
    if progress.state is ProgressState.PROBE and message.reject_offset != progress.next - 1:
        return  # stale: not the probe we are waiting for
    prev = _retreat(node, message, progress)
    assert progress.match <= prev < message.reject_offset, (progress, prev, message)
    progress.become_probe(next_offset=Offset(prev + 1))
    send_append(node, message.sender)


def _retreat(node: RaftNode, message: AppendResponse, progress: Progress) -> Offset:
    """Where to try next after a rejection: an offset ending one of our entries."""
    hint = min(message.reject_offset, message.last_offset, node.log.last_offset())
    if hint < node.log.first_offset() - 1:
        # Below our snapshot (perhaps compacted since the probe left): any offset there
        # makes the next send a snapshot.
        return max(progress.match, Offset(min(hint, message.reject_offset - 1)))
    hint_term = node.log.term_at(Offset(hint))
    assert hint_term is not None, hint
    if hint_term == message.conflict_term:
        return Offset(hint)
    term = Term(min(hint_term, message.conflict_term + 1))
    start = node.log.first_offset_of_term_at_least(term)
    assert start <= hint, (start, hint)  # hint's own term is >= `term`
    return max(progress.match, Offset(start - 1))


def on_heartbeat_response(node: RaftNode, message: HeartbeatResponse) -> None:
    assert message.term == node.current_term, "check_term dropped other terms"
    if node.current_role is not Role.LEADER:
        return
    progress = node.progress.get(message.sender)
    if progress is None:
        return
    progress.recent_active = True
    if message.read_context:
        node.reads.ack(node, message.sender, message.read_context)
    if progress.match >= node.log.last_offset():
        return
    if progress.state is ProgressState.PROBE:
        progress.probe_sent = False  # the follower is alive: probe again (etcd)
    elif progress.state is ProgressState.REPLICATE and progress.inflights:
        progress.stalled_heartbeats += 1
        if progress.stalled_heartbeats >= STALLED_HEARTBEATS_MAX:
            progress.become_probe()
    # Only a probe is worth sending empty: it asks where the logs match.
    send_append(node, message.sender, send_empty=progress.state is ProgressState.PROBE)


def maybe_commit(node: RaftNode) -> bool:
    """Raft §5.4.2: advance the commit offset by counting replicas of current-term entries."""
    assert node.current_role is Role.LEADER
    match = {member: progress.match for member, progress in node.progress.items()}
    candidate = quorum.committed_offset(node.membership_history.current.voters, match)
    if candidate <= node.commit:
        return False
    old_term_allowed = "commit-old-term" in node.config.planted_bugs
    if node.log.term_at(candidate) != node.current_term and not old_term_allowed:
        return False
    _commit_to(node, candidate)
    assert node.commit == candidate
    return True


def _commit_to(node: RaftNode, offset: Offset) -> None:
    assert offset > node.commit and offset <= node.log.last_offset(), (offset, node.commit)
    node.commit = offset
    node.membership_history.on_commit(offset)
    while node.uncommitted and node.uncommitted[0][0] <= offset:
        node.uncommitted_bytes -= node.uncommitted.popleft()[1]
    node.reads.on_commit(node)
    if not node.is_voter():
        # Dissertation §4.2.2: a leader removed by a change steps down once it commits,
        # after telling the others the change is committed.
        bcast_append(node)
        node.role_cause = "removed from the voters by a committed membership change"
        node.become_follower(node.current_term, None)


def on_durable(node: RaftNode) -> None:
    """After advance(): the leader's own durable log counts towards the quorum now."""
    if node.current_role is Role.LEADER:
        own = node.progress[node.node_id]
        committed = own.maybe_update(node.log.durable_last_offset()) and maybe_commit(node)
        if committed and node.current_role is Role.LEADER:
            _on_commit_advanced(node)
    else:
        follower.maybe_advance_commit(node)


def committed_entries(node: RaftNode) -> tuple[Entry, ...]:
    """Committed, not yet applied entries, at most `apply_bytes_max` (at least one)."""
    start = max(node.applied, node.log.first_offset() - 1) + 1
    if start > node.commit:
        return ()
    result: list[Entry] = []
    size_bytes = 0
    for entry in node.log.entries(Offset(start), bytes_max=node.config.apply_bytes_max):
        if entry.offset > node.commit:
            break
        if result and size_bytes + entry.size_bytes > node.config.apply_bytes_max:
            break
        result.append(entry)
        size_bytes += entry.size_bytes
    assert all(entry.last_offset <= node.commit for entry in result), node.commit
    return tuple(result)
