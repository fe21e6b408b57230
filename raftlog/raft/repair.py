"""Repair after storage damage: a replica whose log lost synced data abstains until refilled.

Theory of operation. Raft assumes that what a node fsynced stays on its disk. A disk that
flips a byte or loses a write breaks that: a node that acknowledged entries (or voted on the
strength of its log) and then lost them would, if it carried on as if its log were whole,
vote for a candidate that lacks committed entries, and the cluster would lose acknowledged
writes although a majority never failed. Protocol-aware recovery (Alagappan et al., FAST
2018) answers with the replicas' redundancy: the storage layer detects the loss (it records
how far it had synced, `raftlog.storage.durable_mark`), and the node *abstains* in that
group until a leader has refilled it:

- it grants no vote and no pre-vote, never campaigns, ignores TimeoutNow;
- it still follows a leader: appends, acknowledges what it holds durably (those answers are
  true), commits and applies.

Why abstaining is safe. An entry committed by counting replicas is on a set M that is a
majority; a leader elected while the damaged replicas D abstain was voted in by a majority V
of the other replicas. |V| > n/2 and |M \\ D| >= |M| - |D|; V and M \\ D lie among the
n - |D| undamaged nodes and |V| + |M| - |D| > n - |D|, so they share an undamaged node, whose
intact log made it vote only for a candidate holding the entry (§5.4.1). This holds for any
number of damaged replicas; liveness needs a majority of undamaged ones.

When the repair ends. The node must hold every committed entry before it votes again, and
its old acknowledgements must no longer count: an answer it sent before the damage may still
be on its way to a leader and commit an entry, up to `repair_offset`, the end its log had
durably reached. A follower commits only what the leader allowed and it holds durably; once
its commit offset reaches `repair_offset` *and* an entry of the leader's own term, every
entry committed before (in any term, §5.4.2) and every entry its old answers could commit
lies at or below its commit offset, so it holds them all. From then on its acknowledgements
and votes are honest again. (A group whose lost entries were never committed and that takes
no new writes stays repairing until its log grows past them: safe, one voter short.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raftlog.raft.types import Role, VoteRequest
from raftlog.types import Term

if TYPE_CHECKING:
    from raftlog.raft.node import RaftNode

__all__ = ["ask_around", "may_vote_or_campaign", "maybe_finish_repair"]


def may_vote_or_campaign(node: RaftNode) -> bool:
    """Whether the node's log may vouch for it: not while it is being repaired."""
    return not node.repairing


def ask_around(node: RaftNode) -> None:
    """Election timeout while repairing: no campaign, but pre-vote requests whose answers
    it ignores (it stays a follower). A pre-vote changes no one's term or vote (§9.6); it
    wakes quiesced peers, whose own timers then run: a group whose leader was this node,
    reopened for a repair while its node stays up, elects a new one instead of waiting for
    a node failure that never comes."""
    assert node.repairing and node.current_role in (Role.FOLLOWER, Role.LEARNER)
    node.election_elapsed_ticks = 0
    last_offset, last_term = node.log.last_offset(), node.log.last_term()
    term = Term(node.current_term + 1)
    for voter in sorted(node.membership.voters - {node.node_id}):
        node.send(VoteRequest(term, node.node_id, voter, last_offset, last_term, pre_vote=True))


def maybe_finish_repair(node: RaftNode) -> bool:
    """End the repair once the commit offset reached an entry of the leader's term; True
    when it just ended (the driver then records that durably, `RaftNode.repairing`)."""
    if not node.repairing or node.current_leader is None:
        return False
    if node.current_role not in (Role.FOLLOWER, Role.LEARNER):
        return False
    assert node.repair_offset is not None
    if node.commit < node.repair_offset or node.log.term_at(node.commit) != node.current_term:
        return False
    assert node.commit <= node.log.durable_last_offset(), "a follower commits durable entries"
    node.repair_offset = None
    return True
