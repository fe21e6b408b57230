"""RaftNode: a pure, deterministic Raft state machine for one group (etcd raft's design).

Theory of operation. The node owns no socket, clock, file or thread. Inputs are `tick()`,
`step(message)`, `propose(...)`, `propose_membership(...)`, `campaign()`,
`transfer_leadership(to)` and `read_index(...)`; every effect they cause is queued and handed
out by `ready()`: entries and hard state to persist, messages to send (those that vouch for
local durability, votes and append acknowledgements, wait in `persisted_messages` until the
driver has synced), committed entries to apply, read states to deliver. The driver processes
the Ready in the documented order and calls `advance(ready)`, which is how the node learns
what is durable (a leader counts its own log towards a quorum only then: Raft §5.3 via
etcd's rule).

This module holds the state, the dispatch of messages (`match` over the message types) and
the role transitions (Raft §5.2, Figure 4 plus pre-candidate, §9.6). The flows live in
`election.py` (§5.2, §9.6, §3.10), `replication.py` (§5.3, §5.4, §7), `read_index.py` (§6.4)
and `membership.py` (dissertation §4). The offset space is the Raft index space: an entry
covers `[offset, last_offset]`.
"""

from __future__ import annotations

import random
from collections import deque

from raftlog.config import RaftConfig
from raftlog.errors import NotLeaderError, RaftError
from raftlog.raft import (
    election,
    follower,
    invariants,
    proposal,
    quiesce,
    read_index,
    replication,
)
from raftlog.raft.membership import ConfigHistory
from raftlog.raft.ports import LogStorage
from raftlog.raft.progress import Progress
from raftlog.raft.raft_log import RaftLog
from raftlog.raft.types import (
    NO_OFFSET,
    AppendRequest,
    AppendResponse,
    Entry,
    EntryKind,
    HardState,
    HeartbeatRequest,
    HeartbeatResponse,
    Membership,
    Message,
    ReadState,
    Ready,
    Role,
    SnapshotRequest,
    SoftState,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from raftlog.types import NodeId, Offset, Term

__all__ = ["RaftNode"]

assert __debug__, "raftlog refuses to run under python -O: its assertions guard safety"


class RaftNode:
    def __init__(
        self,
        *,
        node_id: NodeId,
        config: RaftConfig,
        storage: LogStorage,
        hard_state: HardState,
        rng: random.Random,
        bootstrap_membership: Membership | None = None,
        applied_offset: Offset = NO_OFFSET,
        repair_offset: Offset | None = None,
    ) -> None:
        self._node_id = node_id
        self.config = config.validate()
        self.rng = rng
        self.log = RaftLog(storage, stable_cache_bytes_max=self.config.stable_cache_bytes_max)
        self.current_term: Term = hard_state.term
        self.voted_for: NodeId | None = hard_state.vote
        self.current_role = Role.FOLLOWER
        self.current_leader: NodeId | None = None
        self.commit: Offset = NO_OFFSET
        self.applied: Offset = NO_OFFSET
        self.commit_target: Offset = NO_OFFSET  # follower: what the leader let it commit
        self.commit_as_leader: Offset = NO_OFFSET  # commit offset when last stepping down
        self.membership_history = self._recover(storage, bootstrap_membership, applied_offset)
        self.election_elapsed_ticks = 0
        self.heartbeat_elapsed_ticks = 0
        self.randomized_election_timeout_ticks = 0
        self.votes: dict[NodeId, bool] = {}
        self.progress: dict[NodeId, Progress] = {}
        self.lead_transferee: NodeId | None = None
        # Why the role or term last changed, in words (which timer, which peer, how late),
        # for the runtime's one log line per leadership change.
        self.role_cause = "start"
        self.term_start_offset: Offset = NO_OFFSET  # offset of this leader's NOOP
        self.uncommitted: deque[tuple[Offset, int]] = deque()  # (last offset, bytes)
        self.uncommitted_bytes = 0
        self.reads = read_index.ReadIndexQueue()
        self.outbox: list[Message] = []
        self.persisted_outbox: list[Message] = []
        self.outbox_dropped_count = 0
        self.read_states: list[ReadState] = []
        self.persisted_hard_state = hard_state
        self.reported_soft_state: SoftState | None = None
        self.ready_pending = False
        # Quiescence (raftlog.raft.quiesce): an idle group stops its heartbeats and timers;
        # the host's node-level liveness of peers stands in for them.
        self.quiesced = False
        self.reachable_peers: set[NodeId] = set()
        # The storage lost synced data up to this offset (raftlog.raft.repair): no votes, no
        # campaigns, until a leader refilled the log. The planted bug trusts what it kept.
        trusting = "trust-damaged-log" in self.config.planted_bugs
        self.repair_offset: Offset | None = None if trusting else repair_offset
        self.become_follower(self.current_term, None)

    def _recover(
        self, storage: LogStorage, bootstrap: Membership | None, applied_offset: Offset
    ) -> ConfigHistory:
        """Restart point: commit and apply resume at the durably checkpointed applied offset
        (or the snapshot); membership is the last CONFIG entry held, else the snapshot's,
        else the bootstrap one (a fresh group)."""
        snapshot = storage.snapshot()
        snapshot_offset = NO_OFFSET if snapshot is None else snapshot.meta.offset
        assert applied_offset <= storage.last_offset(), (applied_offset, storage.last_offset())
        self.commit = self.applied = self.commit_target = max(snapshot_offset, applied_offset)
        base = bootstrap or Membership(voters=frozenset())
        if snapshot is not None:
            base = snapshot.meta.membership
        configs = ConfigHistory(base, snapshot_offset)
        configs.on_append(storage.config_entries())
        configs.on_commit(self.commit)
        assert self.commit >= snapshot_offset
        return configs

    # --- read-only views ---

    @property
    def node_id(self) -> NodeId:
        return self._node_id

    @property
    def role(self) -> Role:
        return self.current_role

    @property
    def term(self) -> Term:
        return self.current_term

    @property
    def leader_id(self) -> NodeId | None:
        return self.current_leader

    @property
    def commit_offset(self) -> Offset:
        return self.commit

    @property
    def last_offset(self) -> Offset:
        return self.log.last_offset()

    @property
    def membership(self) -> Membership:
        return self.membership_history.current

    @property
    def repairing(self) -> bool:
        """Whether the log lost synced entries and a leader has not yet refilled it."""
        return self.repair_offset is not None

    def is_voter(self) -> bool:
        return self.node_id in self.membership_history.current.voters

    def soft_state(self) -> SoftState:
        return SoftState(leader_id=self.current_leader, role=self.current_role, term=self.term)

    def hard_state(self) -> HardState:
        return HardState(term=self.current_term, vote=self.voted_for)

    def committed_in_term(self) -> bool:
        """Whether this leader has committed an entry of its own term (Raft §5.4.2, §8)."""
        return self.term_start_offset != NO_OFFSET and self.commit >= self.term_start_offset

    # --- outbox ---

    def send(self, message: Message, *, persisted: bool = False) -> None:
        """Queue `message`; `persisted` ones go out only after the Ready's sync."""
        assert message.sender == self.node_id and message.receiver != self.node_id, message
        if len(self.outbox) + len(self.persisted_outbox) >= self.config.outbox_messages_max:
            self.outbox_dropped_count += 1  # Raft tolerates message loss; memory must not grow
            return
        (self.persisted_outbox if persisted else self.outbox).append(message)

    # --- role transitions (Raft §5.2 Figure 4; pre-candidate from §9.6) ---

    def reset(self, term: Term) -> None:
        assert term >= self.current_term, f"term went back from {self.current_term} to {term}"
        if self.current_role is Role.LEADER:
            self.commit_as_leader = self.commit
        if term != self.current_term:
            self.current_term = term
            self.voted_for = None
        self.current_leader = None
        self.quiesced = False
        self.election_elapsed_ticks = 0
        self.heartbeat_elapsed_ticks = 0
        timeout = self.config.election_timeout_ticks
        self.randomized_election_timeout_ticks = timeout + self.rng.randrange(timeout)
        self.votes = {}
        self.progress = {}
        self.lead_transferee = None
        self.term_start_offset = NO_OFFSET
        self.uncommitted.clear()
        self.uncommitted_bytes = 0
        self.reads = read_index.ReadIndexQueue()

    def become_follower(self, term: Term, leader: NodeId | None) -> None:
        self.reset(term)
        self.current_leader = leader
        self.current_role = self._follower_role()
        assert self.current_term == term

    def _follower_role(self) -> Role:
        """Learners say so; a voter, or a node removed from the group, is a follower."""
        return (
            Role.LEARNER
            if self.node_id in self.membership_history.current.learners
            else Role.FOLLOWER
        )

    def become_pre_candidate(self) -> None:
        assert self.current_role is not Role.LEADER and self.is_voter()
        # A pre-candidate keeps its term and vote: pre-votes change nothing durable (§9.6).
        term = self.current_term
        self.reset(term)
        self.current_role = Role.PRE_CANDIDATE
        assert self.current_term == term

    def become_candidate(self) -> None:
        assert self.current_role is not Role.LEADER and self.is_voter()
        self.reset(Term(self.current_term + 1))
        self.voted_for = self.node_id
        self.current_role = Role.CANDIDATE

    def become_leader(self) -> None:
        assert self.current_role is Role.CANDIDATE, self.current_role
        term = self.current_term
        # The voters that just granted us this term were heard from within this election
        # timeout: they count for the first check-quorum (§6.2), so a leader on a slow
        # cluster is not deposed for answers still on their way to its first appends.
        granted = {voter for voter, vote in self.votes.items() if vote}
        self.reset(term)
        self.current_role = Role.LEADER
        self.current_leader = self.node_id
        for member in self.membership_history.current.members:
            self.add_progress(member)
            self.progress[member].recent_active = member in granted
        # Raft §8: a NOOP of the new term lets the leader learn what is committed.
        noop = Entry(term, Offset(self.last_offset + 1), 1, EntryKind.NOOP, b"")
        self.term_start_offset = noop.offset
        self.append_as_leader(noop)
        assert self.current_term == term and self.lead_transferee is None

    def add_progress(self, member: NodeId) -> None:
        progress = Progress(next_offset=Offset(self.last_offset + 1))
        if member == self.node_id:
            progress.match = self.log.durable_last_offset()
            progress.become_replicate()
        self.progress[member] = progress

    def on_membership_changed(self) -> None:
        """A CONFIG entry was appended or truncated: it takes effect now (§4.1)."""
        members = self.membership_history.current.members
        if self.current_role is Role.LEADER:
            for member in members - self.progress.keys():
                self.add_progress(member)
            for gone in self.progress.keys() - members - {self.node_id}:
                del self.progress[gone]
            if self.lead_transferee not in self.membership_history.current.voters:
                self.lead_transferee = None
        elif self.current_role in (Role.FOLLOWER, Role.LEARNER):
            self.current_role = self._follower_role()
        elif not self.is_voter():
            self.role_cause = "removed from the voters while campaigning"
            self.become_follower(self.current_term, None)  # a removed candidate gives up

    def append_as_leader(self, entry: Entry) -> None:
        assert self.current_role is Role.LEADER and entry.term == self.current_term
        assert entry.offset == self.last_offset + 1, (entry.offset, self.last_offset)
        self.log.append([entry])
        if entry.kind is EntryKind.CONFIG and self.membership_history.on_append([entry]):
            self.on_membership_changed()
        replication.bcast_append(self)

    # --- inputs ---

    def check_invariants(self) -> None:
        invariants.check(self)

    def campaigns_on_next_tick(self) -> bool:
        """Whether the next `tick` starts a campaign by the election timer (Raft §5.2)."""
        return election.campaigns_on_next_tick(self)

    def tick(self) -> None:
        if self.quiesced:
            return  # no heartbeats, no election timer: node liveness stands in for them
        if self.current_role is Role.LEADER:
            election.tick_leader(self)
        else:
            election.tick_election(self)
        self.check_invariants()

    def step(self, message: Message) -> None:
        assert message.receiver == self.node_id, (message, self.node_id)
        self._dispatch(message)
        self.check_invariants()

    def _dispatch(self, message: Message) -> None:
        if self.quiesced and not quiesce.is_quiesce_notice(self, message):
            quiesce.wake(self, tell_leader=message.sender != self.current_leader)
        if not election.check_term(self, message):
            return
        from_leader = isinstance(message, AppendRequest | HeartbeatRequest | SnapshotRequest)
        if from_leader and follower.from_other_leader(self):
            return
        match message:
            case VoteRequest():
                election.on_vote_request(self, message)
            case VoteResponse():
                election.on_vote_response(self, message)
            case AppendRequest():
                follower.on_append_request(self, message)
            case AppendResponse():
                replication.on_append_response(self, message)
            case HeartbeatRequest():
                follower.on_heartbeat_request(self, message)
            case HeartbeatResponse():
                replication.on_heartbeat_response(self, message)
            case SnapshotRequest():
                follower.on_snapshot_request(self, message)
            case TimeoutNow():
                election.on_timeout_now(self, message)

    def propose(self, data: bytes, *, offset_count: int) -> Offset:
        """Append a DATA batch of `offset_count` records; returns its base offset."""
        if offset_count < 1:
            raise ValueError(f"offset_count must be >= 1, got {offset_count}")
        self._wake_if_quiesced()
        return proposal.append_proposal(self, EntryKind.DATA, data, offset_count)

    def check_propose(self, size_bytes: int) -> None:
        """Raise what `propose` of `size_bytes` would raise now (NotLeaderError,
        ProposalDroppedError), appending nothing: a caller can refuse a whole request first."""
        assert size_bytes >= 0, size_bytes
        proposal.check_proposal(self, size_bytes)

    def propose_membership(self, membership: Membership) -> Offset:
        """Propose a one-node membership change (dissertation §4.1, with the 2015 fix)."""
        proposal.check_membership_change(self, membership)
        self._wake_if_quiesced()
        return proposal.append_proposal(self, EntryKind.CONFIG, membership.encode(), 1)

    def forget_peer_log(self, peer: NodeId) -> None:
        """A peer restarted and may have lost its log (a replaced disk, a wiped directory).

        Raft assumes storage survives restarts, so a leader treats a rejection below what a
        follower already acknowledged as a stale, reordered answer and ignores it: a
        follower that really lost its log would then never be repaired. The runtime calls
        this when a peer comes back as a new incarnation; the leader forgets the peer's
        `match` and probes it from the end of its log. Safe: `match` only ever counts
        towards advancing the commit offset, which never goes backward.
        """
        if self.current_role is not Role.LEADER or peer == self.node_id:
            return
        progress = self.progress.get(peer)
        if progress is None:
            return
        self._wake_if_quiesced()
        progress.match = NO_OFFSET
        progress.become_probe(next_offset=Offset(self.last_offset + 1))
        assert progress.next > progress.match

    def campaign(self) -> None:
        """Start an election now; a no-op for a leader, a node that is not a voter, or one
        whose log is being repaired (raftlog.raft.repair)."""
        if self.current_role is Role.LEADER or not self.is_voter() or self.repairing:
            return
        self._wake_if_quiesced()
        self.role_cause = "campaign asked by the runtime"
        election.start_election(self, transfer=False)

    def transfer_leadership(self, to: NodeId) -> None:
        if self.current_role is not Role.LEADER:
            raise NotLeaderError(leader_hint=self.current_leader)
        if to not in self.membership_history.current.voters:
            raise RaftError(f"cannot transfer leadership to node {to}: not a voter")
        self._wake_if_quiesced()
        election.start_transfer(self, to)

    def is_in_sync(self, peer: NodeId) -> bool:
        """On a leader: whether follower `peer` is in sync (reachable, replicating, holding
        every committed entry), so a transfer to it would finish at once
        (`raftlog.raft.election.in_sync`)."""
        if self.current_role is not Role.LEADER:
            raise NotLeaderError(leader_hint=self.current_leader)
        return election.in_sync(self, peer)

    def read_index(self, request_id: int) -> None:
        """Ask for a linearizable read point; the answer comes in Ready.read_states."""
        if self.current_role is not Role.LEADER:
            raise NotLeaderError(leader_hint=self.current_leader)
        self._wake_if_quiesced()
        read_index.request(self, request_id)

    def set_peer_reachable(self, peer: NodeId, *, reachable: bool) -> None:
        """The host's node-level liveness of `peer` (one heartbeat per node pair covers
        every group): a quiesced follower whose leader's node is unreachable wakes and
        elects; a quiesced leader with an unreachable peer wakes (raftlog.raft.quiesce)."""
        quiesce.set_peer_reachable(self, peer, reachable=reachable)
        self.check_invariants()

    def _wake_if_quiesced(self) -> None:
        if self.quiesced:
            quiesce.wake(self, tell_leader=True)

    # --- output ---

    def has_ready(self) -> bool:
        # Hot in drivers that poll every node after every event: compare fields, build nothing.
        if self.outbox or self.persisted_outbox or self.log.unstable or self.read_states:
            return True
        if self.commit > self.applied or self.log.pending_snapshot is not None:
            return True
        hard = self.persisted_hard_state
        if hard.term != self.current_term or hard.vote != self.voted_for:
            return True
        soft = self.reported_soft_state
        return (
            soft is None
            or soft.role is not self.current_role
            or soft.term != self.current_term
            or soft.leader_id != self.current_leader
        )

    def ready_needs_sync(self) -> bool:
        """Whether the next Ready has anything to make durable (entries, a snapshot, a
        changed term or vote): its `must_sync`. A driver may complete a Ready that needs no
        sync at once, in the turn that produced it (a commit learned from an
        acknowledgement, applied and answered without waiting for a pass)."""
        if self.log.unstable or self.log.pending_snapshot is not None:
            return True
        hard = self.persisted_hard_state
        return hard.term != self.current_term or hard.vote != self.voted_for

    def ready(self) -> Ready:
        assert not self.ready_pending, "ready() called twice without advance()"
        soft = self.soft_state()
        hard = self.hard_state()
        hard_changed = hard != self.persisted_hard_state
        snapshot = self.log.pending_snapshot
        entries = tuple(self.log.unstable)
        result = Ready(
            soft_state=soft if soft != self.reported_soft_state else None,
            hard_state=hard if hard_changed else None,
            snapshot=snapshot,
            entries=entries,
            must_sync=bool(entries) or hard_changed or snapshot is not None,
            messages=tuple(self.outbox),
            persisted_messages=tuple(self.persisted_outbox),
            committed_entries=replication.committed_entries(self),
            read_states=tuple(self.read_states),
            commit_offset=self.commit,
        )
        self.reported_soft_state = soft
        self.outbox, self.persisted_outbox, self.read_states = [], [], []
        self.ready_pending = True
        return result

    def advance(self, ready: Ready) -> None:
        assert self.ready_pending, "advance() without ready()"
        self.ready_pending = False
        if ready.hard_state is not None:
            self.persisted_hard_state = ready.hard_state
        self.log.stable_to(snapshot=ready.snapshot, entries=ready.entries)
        if ready.committed_entries:
            applied = ready.committed_entries[-1].last_offset
            assert applied <= self.commit, (applied, self.commit)
            self.applied = max(self.applied, applied)
        self.log.applied_to(self.applied)
        replication.on_durable(self)
        self.check_invariants()
