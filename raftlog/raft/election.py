"""Elections, pre-vote, check-quorum, leases and leadership transfer.

Theory of operation.

- Randomized timeouts (Raft §5.2): a follower that hears nothing from a leader for its
  randomized timeout, drawn from [election_timeout_ticks, 2 * election_timeout_ticks) with
  the injected rng at every reset, starts an election.
- Pre-vote (Raft dissertation §9.6): first it asks, without changing its term, whether the
  voters would vote for it at term + 1; only with a majority of yeses does it bump its term
  and campaign for real. A partitioned node therefore cannot inflate terms and depose a
  healthy leader when it rejoins.
- Check-quorum and leases (§6.2, §9.6): a leader that has not heard from a majority within an
  election timeout steps down; a node that heard from a leader within the election timeout
  rejects (pre-)votes unless the request comes from a leadership transfer.
- Votes (§5.2, §5.4.1): one per term, only for a candidate whose log is at least as
  up-to-date (last term, then last offset); the grant leaves only after the vote is durable.
- Leadership transfer (dissertation §3.10): the leader stops taking proposals, brings the
  target up to date, and sends TimeoutNow; the target campaigns at once, skipping pre-vote
  and with `transfer` set to override leases. The transfer aborts after an election timeout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raftlog.raft import quiesce, quorum, repair, replication
from raftlog.raft.progress import ProgressState
from raftlog.raft.quorum import VoteResult
from raftlog.raft.types import (
    AppendRequest,
    AppendResponse,
    HeartbeatRequest,
    Message,
    Role,
    SnapshotRequest,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from raftlog.types import NodeId, Term

if TYPE_CHECKING:
    from raftlog.raft.node import RaftNode

__all__ = [
    "campaigns_on_next_tick",
    "check_term",
    "on_timeout_now",
    "on_vote_request",
    "on_vote_response",
    "start_election",
    "start_transfer",
    "tick_election",
    "tick_leader",
]


def tick_election(node: RaftNode) -> None:
    """Follower, learner and candidate tick: campaign after the randomized timeout."""
    assert node.current_role is not Role.LEADER
    # Bounded: a learner or removed node never campaigns, but its lease must still expire.
    elapsed_max = 2 * node.config.election_timeout_ticks
    node.election_elapsed_ticks = min(node.election_elapsed_ticks + 1, elapsed_max)
    timed_out = node.election_elapsed_ticks >= node.randomized_election_timeout_ticks
    if timed_out and node.is_voter():
        if repair.may_vote_or_campaign(node):
            voters = node.membership_history.current.voters - {node.node_id}
            node.role_cause = (
                f"election timer: no leader heard for {node.election_elapsed_ticks} ticks "
                f"(randomized timeout {node.randomized_election_timeout_ticks} ticks; "
                f"last leader {node.current_leader}, unreachable voters "
                f"{sorted(voters - node.reachable_peers)})"
            )
            start_election(node, transfer=False)
        else:
            repair.ask_around(node)
    assert node.randomized_election_timeout_ticks < elapsed_max


def campaigns_on_next_tick(node: RaftNode) -> bool:
    """Whether the next tick makes `tick_election` start a campaign (a query, no change):
    the runtime asks it to bound the campaigns a node starts a second."""
    return (
        not node.quiesced
        and node.current_role is not Role.LEADER
        and node.is_voter()
        and node.election_elapsed_ticks + 1 >= node.randomized_election_timeout_ticks
        and repair.may_vote_or_campaign(node)
    )


def tick_leader(node: RaftNode) -> None:
    """Leader tick: heartbeats (§5.2), check-quorum (§6.2), transfer timeout (§3.10),
    deferred commit notices (raftlog.raft.replication)."""
    assert node.current_role is Role.LEADER
    node.heartbeat_elapsed_ticks += 1
    node.election_elapsed_ticks += 1
    if node.election_elapsed_ticks >= node.config.election_timeout_ticks:
        node.election_elapsed_ticks = 0
        if node.config.check_quorum and not _quorum_active(node):
            node.role_cause = (
                f"check-quorum timer: a majority of voters not heard from within "
                f"{node.config.election_timeout_ticks} ticks"
            )
            node.become_follower(node.current_term, None)
            return
        node.lead_transferee = None  # §3.10: a transfer that took an election timeout failed
    replication.tick_snapshots(node)
    if node.heartbeat_elapsed_ticks >= node.config.heartbeat_interval_ticks:
        node.heartbeat_elapsed_ticks = 0
        if quiesce.maybe_quiesce(node):
            return  # the group is idle: the last heartbeat told the followers to go quiet
        replication.bcast_heartbeat(node, node.reads.latest_context())
    replication.send_commit_notices(node)
    assert node.heartbeat_elapsed_ticks < node.config.heartbeat_interval_ticks


def _quorum_active(node: RaftNode) -> bool:
    """Whether a majority of voters was heard from since the last check; resets the marks."""
    active = {node.node_id}
    for member, progress in node.progress.items():
        if progress.recent_active:
            active.add(member)
        progress.recent_active = False
    assert not any(progress.recent_active for progress in node.progress.values())
    return quorum.has_quorum(node.membership_history.current.voters, active)


def start_election(node: RaftNode, *, transfer: bool) -> None:
    """Campaign: pre-vote first unless disabled or transferring (§9.6, §3.10)."""
    assert node.is_voter(), "only voters campaign"
    assert repair.may_vote_or_campaign(node), "a log under repair does not campaign"
    if node.config.pre_vote and not transfer:
        node.become_pre_candidate()
        _request_votes(node, Term(node.current_term + 1), pre_vote=True, transfer=False)
    else:
        _campaign_for_real(node, transfer=transfer)
    assert node.current_role is not Role.FOLLOWER or node.current_leader is None


def _campaign_for_real(node: RaftNode, *, transfer: bool) -> None:
    node.become_candidate()
    _request_votes(node, node.current_term, pre_vote=False, transfer=transfer)


def _request_votes(node: RaftNode, term: Term, *, pre_vote: bool, transfer: bool) -> None:
    assert node.current_role is (Role.PRE_CANDIDATE if pre_vote else Role.CANDIDATE)
    assert term == node.current_term + (1 if pre_vote else 0), (term, node.current_term)
    node.votes[node.node_id] = True
    if _tally(node, pre_vote=pre_vote):
        return  # a single voter wins at once
    last_offset, last_term = node.log.last_offset(), node.log.last_term()
    for voter in sorted(node.membership_history.current.voters - {node.node_id}):
        request = VoteRequest(
            term, node.node_id, voter, last_offset, last_term, pre_vote=pre_vote, transfer=transfer
        )
        # A real request vouches for our own vote, so it waits for it to be durable.
        node.send(request, persisted=not pre_vote)


def _tally(node: RaftNode, *, pre_vote: bool) -> bool:
    """Act on the votes so far; True once the election ended."""
    result = quorum.vote_result(node.membership_history.current.voters, node.votes)
    if result is VoteResult.WON:
        if pre_vote:
            _campaign_for_real(node, transfer=False)
        else:
            granted = sorted(voter for voter, vote in node.votes.items() if vote)
            node.role_cause = f"won the election of term {node.current_term}, votes {granted}"
            node.become_leader()
    elif result is VoteResult.LOST:
        refused = sorted(voter for voter, vote in node.votes.items() if not vote)
        kind, term = (
            ("pre-vote", node.current_term + 1) if pre_vote else ("election", node.current_term)
        )
        node.role_cause = f"lost the {kind} of term {term}, refused by {refused}"
        node.become_follower(node.current_term, None)
    return result is not VoteResult.PENDING


def in_lease(node: RaftNode) -> bool:
    """Heard from a leader within the election timeout (with check-quorum): §4.2.3/§9.6."""
    return (
        node.config.check_quorum
        and node.current_leader is not None
        and node.election_elapsed_ticks < node.config.election_timeout_ticks
    )


def check_term(node: RaftNode, message: Message) -> bool:
    """Apply Raft §5.1's term rules to an incoming message; False when it is dropped."""
    if message.term > node.current_term:
        cause = f"term {message.term} from node {message.sender} ({type(message).__name__})"
        match message:
            case VoteRequest() if in_lease(node) and not message.transfer:
                _reject_vote(node, message)
                return False
            case VoteRequest(pre_vote=True):
                pass  # a pre-vote never changes our term
            case VoteResponse(pre_vote=True, granted=True):
                pass  # granted pre-votes carry the term we would campaign in
            case AppendRequest() | HeartbeatRequest() | SnapshotRequest():
                node.role_cause = cause
                node.become_follower(message.term, message.sender)
            case VoteRequest():
                # Figure 2: only a leader's append or a granted vote restarts the election
                # timer. Restarting it on every higher-term request would let a candidate
                # with a stale log that times out faster keep a up-to-date one from ever
                # campaigning (a livelock without pre-vote).
                elapsed_ticks = node.election_elapsed_ticks
                node.role_cause = cause
                node.become_follower(message.term, None)
                node.election_elapsed_ticks = elapsed_ticks
            case _:
                node.role_cause = cause
                node.become_follower(message.term, None)
        return True
    if message.term < node.current_term:
        match message:
            case AppendRequest() | HeartbeatRequest():
                # An old leader cut off by a partition: tell it our term so it steps down
                # (otherwise, with pre-vote, it could keep its followers' leases forever).
                reply = AppendResponse(
                    node.current_term, node.node_id, message.sender, False, node.last_offset
                )
                node.send(reply)
            case VoteRequest(pre_vote=True):
                _reject_vote(node, message)
        return False
    return True


def _reject_vote(node: RaftNode, message: VoteRequest) -> None:
    reply = VoteResponse(
        node.current_term, node.node_id, message.sender, False, pre_vote=message.pre_vote
    )
    node.send(reply)


def _log_up_to_date(node: RaftNode, message: VoteRequest) -> bool:
    """Raft §5.4.1: compare last terms, then last offsets."""
    mine = (node.log.last_term(), node.log.last_offset())
    return (message.last_term, message.last_offset) >= mine


def on_vote_request(node: RaftNode, message: VoteRequest) -> None:
    assert message.term >= node.current_term, "check_term drops requests of older terms"
    can_vote = (
        node.voted_for == message.sender
        or (node.voted_for is None and node.current_leader is None)
        or (message.pre_vote and message.term > node.current_term)
    )
    # A node that believes it is a learner still answers: the candidate may hold a newer
    # configuration that already promoted it, and only the candidate's configuration decides
    # whose votes count. Refusing would livelock a cluster whose promoted member has not yet
    # received its promotion (simulator seed 17623; etcd raft answers for the same reason).
    grant = can_vote and _log_up_to_date(node, message) and repair.may_vote_or_campaign(node)
    if not grant:
        _reject_vote(node, message)
        return
    if message.pre_vote:
        reply = VoteResponse(message.term, node.node_id, message.sender, True, pre_vote=True)
        node.send(reply)
        return
    assert message.term == node.current_term, (message.term, node.current_term)
    assert node.voted_for in (None, message.sender), "one vote per term (Raft §5.2)"
    node.voted_for = message.sender
    node.election_elapsed_ticks = 0
    reply = VoteResponse(node.current_term, node.node_id, message.sender, True)
    # Raft §5.1: the vote must be durable before the candidate may count it.
    node.send(reply, persisted="vote-not-persisted" not in node.config.planted_bugs)


def on_vote_response(node: RaftNode, message: VoteResponse) -> None:
    if message.pre_vote:
        expected_role, expected_term = Role.PRE_CANDIDATE, node.current_term + 1
    else:
        expected_role, expected_term = Role.CANDIDATE, node.current_term
    assert message.term >= node.current_term, "check_term drops answers of older terms"
    if node.current_role is not expected_role:
        return
    if message.granted and message.term != expected_term:
        return  # a stale answer from an earlier campaign
    node.votes.setdefault(message.sender, message.granted)
    _tally(node, pre_vote=message.pre_vote)


def on_timeout_now(node: RaftNode, message: TimeoutNow) -> None:
    """§3.10: the leader asks us to campaign at once, overriding leases."""
    if not node.is_voter() or node.current_role is Role.LEADER:
        return
    if not repair.may_vote_or_campaign(node):
        return  # the leader will time the transfer out and pick another
    assert message.term == node.current_term
    node.role_cause = f"TimeoutNow from node {message.sender} (leadership transfer)"
    start_election(node, transfer=True)


def in_sync(node: RaftNode, peer: NodeId) -> bool:
    """Whether the leader's follower `peer` is in sync, as Kafka's ISR means it: its node is
    reachable (the host's node-level liveness), the leader is replicating to it (not probing
    for where its log ends, nor sending a snapshot) and it holds every committed entry.

    A transfer to such a follower finishes in about one round trip. A transfer to any other
    refuses proposals until the target catches up or, for a dead one, until it aborts an
    election timeout later: a caller that only wants leadership back where it belongs asks
    this first.
    """
    assert node.current_role is Role.LEADER
    progress = node.progress.get(peer)
    return (
        progress is not None
        and peer in node.reachable_peers
        and progress.state is ProgressState.REPLICATE
        and progress.match >= node.commit_offset
    )


def start_transfer(node: RaftNode, to: NodeId) -> None:
    """§3.10: stop proposals, catch `to` up, then send it TimeoutNow."""
    assert node.current_role is Role.LEADER
    if to == node.node_id or node.lead_transferee == to:
        return
    assert to in node.membership_history.current.voters, to
    node.lead_transferee = to
    node.election_elapsed_ticks = 0  # the transfer aborts after one election timeout
    maybe_send_timeout_now(node, to)


def maybe_send_timeout_now(node: RaftNode, to: NodeId) -> None:
    assert node.current_role is Role.LEADER and node.lead_transferee == to
    progress = node.progress.get(to)
    if progress is None:
        return
    if progress.match == node.log.last_offset():
        node.send(TimeoutNow(node.current_term, node.node_id, to))
    else:
        replication.send_append(node, to)
