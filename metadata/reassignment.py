"""Moving a partition: the partition leader's next step toward the target replicas.

Theory of operation (Kafka KIP-455, Redpanda's move). The controller records a move as the
partition's target (`ReassignPartition`); every node of the replicas and the target hosts the
group, a joining node starting EMPTY, with no membership of its own, so it can neither vote
nor campaign until it learns the group's membership from the leader's log or snapshot. The
partition leader then changes the group's membership one node at a time (Raft dissertation
§4.2, which the core enforces): add a missing target node as a learner, promote it once it
caught up, and only when every target node is a voter remove the voters the target drops,
the leader itself last, after handing leadership to a target voter (§3.10). Adding before
removing keeps the group at its replication factor or above for the whole move. When the
committed membership is exactly the target's voters, the leader reports
`CompleteReassignment`; the controller commits the target as the assignment and only then do
removed nodes delete their copy.

`next_step` is a pure function of what the leader sees, so any leader (a new one after a
failover, or the same one after a restart) resumes the move where the group's log left it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from raftlog.raft.types import Membership
from raftlog.types import NodeId

__all__ = ["Complete", "ProposeMembership", "Step", "TransferLeadership", "Wait", "next_step"]


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing to do now (a change is uncommitted, or a learner is catching up)."""

    reason: str


@dataclass(frozen=True, slots=True)
class ProposeMembership:
    membership: Membership


@dataclass(frozen=True, slots=True)
class TransferLeadership:
    """The leader must leave the group: hand leadership to `to` first."""

    to: NodeId


@dataclass(frozen=True, slots=True)
class Complete:
    """The committed membership is the target: report it to the controller."""


Step = Wait | ProposeMembership | TransferLeadership | Complete


def next_step(
    *,
    leader: NodeId,
    membership: Membership,
    membership_committed: bool,
    target: Sequence[NodeId],
    caught_up: frozenset[NodeId],
) -> Step:
    """The leader's next action toward `target` (in preferred-leader order).

    `membership` is the one in force at the end of the leader's log; `membership_committed`
    says its CONFIG entry (if any) is committed; `caught_up` holds the members whose log
    reaches the commit offset (a learner is promoted only then, §4.2.1).
    """
    wanted = frozenset(target)
    assert wanted and len(wanted) == len(target), target
    assert leader in membership.voters, (leader, membership)
    if not membership_committed:
        return Wait("a membership change is not committed yet")
    stale = sorted(membership.learners - wanted)
    if stale:  # a learner of an abandoned move: drop it before anything else
        return ProposeMembership(_replace(membership, learners=membership.learners - {stale[0]}))
    learners = sorted(membership.learners)
    if learners:
        joining = learners[0]
        if joining not in caught_up:
            return Wait(f"learner {joining} is catching up")
        return ProposeMembership(
            Membership(
                voters=membership.voters | {joining}, learners=membership.learners - {joining}
            )
        )
    missing = [n for n in target if n not in membership.voters]
    if missing:
        return ProposeMembership(_replace(membership, learners=frozenset({missing[0]})))
    leaving = sorted(membership.voters - wanted - {leader})
    if leaving:
        return ProposeMembership(_replace(membership, voters=membership.voters - {leaving[0]}))
    if leader not in wanted:
        successor = next(n for n in target if n in caught_up) if caught_up & wanted else target[0]
        return TransferLeadership(successor)
    assert membership.voters == wanted and not membership.learners, (membership, target)
    return Complete()


def _replace(
    membership: Membership,
    *,
    voters: frozenset[NodeId] | None = None,
    learners: frozenset[NodeId] | None = None,
) -> Membership:
    return Membership(
        voters=membership.voters if voters is None else voters,
        learners=membership.learners if learners is None else learners,
    )
