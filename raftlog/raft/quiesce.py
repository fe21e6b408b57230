"""Quiescence: an idle group stops heartbeating and its followers stop their election timers.

Theory of operation (CockroachDB's quiesced ranges, with etcd's pre-vote and check-quorum).
A node hosting thousands of groups cannot afford a heartbeat and a timer per idle group, so:

- A leader quiesces at a heartbeat tick when nothing is in motion: it committed an entry of
  its term and everything it holds (commit == last offset == its durable last offset), no
  proposal, read, transfer or membership change is pending, and every member holds its
  whole log (`match` == last offset, REPLICATE, nothing in flight), has been sent that commit
  offset, and is reachable as a NODE (the host reports node liveness: `set_peer_reachable`).
  Instead of a heartbeat it sends a final one with `quiesce` set, carrying the commit offset,
  and stops ticking.
- A follower that gets that heartbeat from its leader, whose node it knows reachable, adopts
  the commit offset and quiesces: no answer, no election timer. One it cannot trust (the
  leader's node is not known reachable) answers as usual, which wakes the leader.
- Anything else wakes a quiesced node: any message (a vote or pre-vote request, a higher
  term, a stale answer), a proposal, a read, a transfer, a campaign, a membership change. A
  follower that wakes restarts its timer from zero and tells its leader (a heartbeat answer),
  so the leader heartbeats again long before that timer runs out. A woken leader restarts its
  check-quorum window, so it never steps down for silence that quiescence itself caused.
- Liveness replaces timers: when the host reports the leader's node unreachable, a quiesced
  follower wakes and elects as usual; when it reports any peer unreachable, a quiesced leader
  wakes, heartbeats and runs check-quorum again (so a partitioned leader steps down).

Safety never depends on any of this: quiescence only withholds heartbeats and ticks, which
Raft's safety never relied on (§5.2: timing affects liveness only). A quiesced leader cut off
from the rest cannot commit: commitment still needs a majority of acknowledgements in its
term. Its followers' leases (they heard from a leader recently) last while they are quiesced,
which is what check-quorum's lease means: the leader's node was alive all along.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raftlog.raft.progress import ProgressState
from raftlog.raft.types import HeartbeatRequest, HeartbeatResponse, Message, Role
from raftlog.types import NodeId

if TYPE_CHECKING:
    from raftlog.raft.node import RaftNode

__all__ = ["can_quiesce", "is_quiesce_notice", "maybe_quiesce", "set_peer_reachable", "wake"]


def can_quiesce(node: RaftNode) -> bool:
    """Whether this leader may stop heartbeating now (see the module docstring)."""
    if not node.config.quiesce or node.current_role is not Role.LEADER:
        return False
    last = node.log.last_offset()
    idle = (
        node.committed_in_term()
        and node.commit == last
        and node.log.durable_last_offset() == last
        and not node.log.unstable
        and node.lead_transferee is None
        and len(node.reads) == 0
        and not node.uncommitted
        and node.membership_history.last_offset <= node.commit
    )
    if not idle or node.progress.keys() != node.membership_history.current.members | {node.node_id}:
        return False
    for member, progress in node.progress.items():
        if progress.match != last:
            return False
        if member == node.node_id:
            continue
        if member not in node.reachable_peers or progress.state is not ProgressState.REPLICATE:
            return False
        if progress.inflights or progress.sent_commit < node.commit:
            return False
    return True


def maybe_quiesce(node: RaftNode) -> bool:
    """At a heartbeat tick: send the final heartbeats and go quiet if the group is idle."""
    if not can_quiesce(node):
        return False
    for peer in sorted(node.progress.keys() - {node.node_id}):
        notice = HeartbeatRequest(node.current_term, node.node_id, peer, node.commit, quiesce=True)
        node.send(notice)
    node.quiesced = True
    assert node.current_role is Role.LEADER and not node.reads and node.lead_transferee is None
    return True


def is_quiesce_notice(node: RaftNode, message: Message) -> bool:
    """The current leader's final heartbeat (a duplicate must not wake the follower)."""
    return (
        isinstance(message, HeartbeatRequest)
        and message.quiesce
        and message.term == node.current_term
        and message.sender == node.current_leader
    )


def on_quiesce_notice(node: RaftNode, request: HeartbeatRequest) -> bool:
    """Follower: quiesce on the leader's final heartbeat; False when it must answer instead."""
    assert request.quiesce and node.current_leader == request.sender
    trusted = request.sender in node.reachable_peers
    if not node.config.quiesce or not trusted or node.current_role is Role.LEADER:
        return False
    node.quiesced = True
    node.election_elapsed_ticks = 0
    assert node.current_role in (Role.FOLLOWER, Role.LEARNER), node.current_role
    return True


def wake(node: RaftNode, *, tell_leader: bool) -> None:
    """Leave quiescence: timers restart from zero; a follower may wake its leader too."""
    assert node.quiesced
    node.quiesced = False
    node.election_elapsed_ticks = 0
    node.heartbeat_elapsed_ticks = 0
    leader = node.current_leader
    if node.current_role is Role.LEADER or leader is None or not tell_leader:
        return
    if leader in node.reachable_peers:
        # Any message wakes a quiesced leader; this one asks for nothing else.
        node.send(HeartbeatResponse(node.current_term, node.node_id, leader))
    assert not node.quiesced


def set_peer_reachable(node: RaftNode, peer: NodeId, *, reachable: bool) -> None:
    """The host's node-level liveness of `peer` changed (or is being restated)."""
    if peer == node.node_id:
        return
    if reachable:
        node.reachable_peers.add(peer)
        return
    node.reachable_peers.discard(peer)
    if not node.quiesced:
        return
    if node.current_role is Role.LEADER:
        wake(node, tell_leader=False)  # heartbeat again: check-quorum and probing resume
    elif peer == node.current_leader:
        wake(node, tell_leader=False)  # the leader's node is gone: elect as usual
