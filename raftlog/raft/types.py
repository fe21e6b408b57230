"""Values of the pure Raft core: entries, membership, hard state, snapshots, messages, Ready.

Theory of operation. The Raft index space *is* the partition's offset space (as in Kafka's
KRaft). An `Entry` is one record batch and occupies `offset_count` consecutive offsets
`[offset, last_offset]`; its `term` travels in the batch's partition-leader-epoch field.
Log matching works per batch: one leader creates each offset once per term, so two logs that
agree on the term at an offset hold the same batch ending there (Raft §5.3).

The empty log has `last_offset == -1` and term 0 at offset -1. A snapshot covering
`[0, snapshot.offset]` replaces the log prefix: for a partition it carries no data (the
retained segments *are* the state), for the metadata quorum it carries the state machine.

Every value here is a frozen, slotted dataclass: the core hands them out and never mutates
them afterwards, so drivers may keep references.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import TypeAlias

from raftlog.types import NodeId, Offset, Term

__all__ = [
    "NO_OFFSET",
    "AppendRequest",
    "AppendResponse",
    "Entry",
    "EntryKind",
    "HardState",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "Membership",
    "Message",
    "ReadState",
    "Ready",
    "Role",
    "Snapshot",
    "SnapshotMeta",
    "SnapshotRequest",
    "SoftState",
    "TimeoutNow",
    "VoteRequest",
    "VoteResponse",
]

# The offset "before the first": last_offset of an empty log, prev_offset of the first append.
NO_OFFSET = Offset(-1)


class EntryKind(enum.IntEnum):
    """What an entry is. NOOP and CONFIG are control batches that consumers skip."""

    DATA = 0
    NOOP = 1  # appended by every new leader so it can commit its term (Raft §8)
    CONFIG = 2  # a Membership, taking effect when appended (Raft dissertation §4.1)


class Role(enum.Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre-candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"
    LEARNER = "learner"  # a non-voting member catching up; never campaigns


# Bytes charged per entry on top of its data when bounding batches and windows.
ENTRY_OVERHEAD_BYTES = 64


@dataclass(frozen=True, slots=True)
class Entry:
    term: Term
    offset: Offset  # first offset the entry occupies
    offset_count: int  # >= 1; a DATA batch occupies one offset per record
    kind: EntryKind
    data: bytes  # DATA: the record batch bytes (opaque here); CONFIG: Membership.encode()

    def __post_init__(self) -> None:
        assert self.term >= 0 and self.offset >= 0, self
        assert self.offset_count >= 1, self

    @property
    def last_offset(self) -> Offset:
        return Offset(self.offset + self.offset_count - 1)

    @property
    def size_bytes(self) -> int:
        return len(self.data) + ENTRY_OVERHEAD_BYTES


@dataclass(frozen=True, slots=True)
class Membership:
    """The voters and learners of a group. Changes go one voter at a time (dissertation §4.2)."""

    voters: frozenset[NodeId]
    learners: frozenset[NodeId] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        assert not (self.voters & self.learners), "a node is either a voter or a learner"

    @property
    def members(self) -> frozenset[NodeId]:
        return self.voters | self.learners

    def quorum_size(self) -> int:
        return len(self.voters) // 2 + 1

    def encode(self) -> bytes:
        return json.dumps(
            {"voters": sorted(self.voters), "learners": sorted(self.learners)},
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> Membership:
        raw = json.loads(data)
        return cls(
            voters=frozenset(NodeId(n) for n in raw["voters"]),
            learners=frozenset(NodeId(n) for n in raw["learners"]),
        )


@dataclass(frozen=True, slots=True)
class HardState:
    """What must be durable before a node answers: Raft §5.1 (currentTerm, votedFor)."""

    term: Term = Term(0)  # noqa: RUF009 (NewType: an identity call)
    vote: NodeId | None = None


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    offset: Offset  # last offset the snapshot covers
    term: Term  # term of the entry at `offset`
    membership: Membership


@dataclass(frozen=True, slots=True)
class Snapshot:
    meta: SnapshotMeta
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class SoftState:
    """Volatile state a driver routes by; reported in a Ready only when it changed."""

    leader_id: NodeId | None
    role: Role
    term: Term


@dataclass(frozen=True, slots=True)
class ReadState:
    """A ReadIndex answer: reads at or below `commit_offset` are linearizable (Raft §6.4)."""

    request_id: int
    commit_offset: Offset


# --- messages (Raft §5, dissertation §4, §6.4, §9.6 pre-vote, §3.10 leadership transfer) ---


@dataclass(frozen=True, slots=True)
class VoteRequest:
    term: Term  # for a pre-vote: the term the sender would campaign in
    sender: NodeId
    receiver: NodeId
    last_offset: Offset
    last_term: Term
    pre_vote: bool = False
    # Set when a TimeoutNow started the election: voters then ignore their leader lease.
    transfer: bool = False


@dataclass(frozen=True, slots=True)
class VoteResponse:
    term: Term
    sender: NodeId
    receiver: NodeId
    granted: bool
    pre_vote: bool = False


@dataclass(frozen=True, slots=True)
class AppendRequest:
    term: Term
    sender: NodeId
    receiver: NodeId
    prev_offset: Offset
    prev_term: Term
    entries: tuple[Entry, ...]
    commit_offset: Offset


@dataclass(frozen=True, slots=True)
class AppendResponse:
    term: Term
    sender: NodeId
    receiver: NodeId
    success: bool
    # success: the last offset now known to match the leader's log.
    # failure: the follower's last offset (a hint for backtracking).
    last_offset: Offset
    # failure only: the prev_offset that was rejected, and the follower's term at
    # min(prev_offset, last_offset) with the first offset it holds of that term, so the leader
    # can skip a whole conflicting term per round trip (dissertation §5.3 optimisation).
    reject_offset: Offset = NO_OFFSET
    conflict_term: Term = Term(0)  # noqa: RUF009 (NewType: an identity call)
    conflict_offset: Offset = NO_OFFSET


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    term: Term
    sender: NodeId
    receiver: NodeId
    commit_offset: Offset  # min(leader commit, follower match) so a follower never over-commits
    read_context: int = 0  # ReadIndex round being confirmed; 0 when none
    # The leader's last heartbeat before it goes quiet: the group is idle and every follower
    # holds the leader's whole log; `commit_offset` is final (raftlog.raft.quiesce).
    quiesce: bool = False


@dataclass(frozen=True, slots=True)
class HeartbeatResponse:
    term: Term
    sender: NodeId
    receiver: NodeId
    read_context: int = 0


@dataclass(frozen=True, slots=True)
class SnapshotRequest:
    term: Term
    sender: NodeId
    receiver: NodeId
    snapshot: Snapshot


@dataclass(frozen=True, slots=True)
class TimeoutNow:
    term: Term
    sender: NodeId
    receiver: NodeId


Message: TypeAlias = (
    VoteRequest
    | VoteResponse
    | AppendRequest
    | AppendResponse
    | HeartbeatRequest
    | HeartbeatResponse
    | SnapshotRequest
    | TimeoutNow
)


@dataclass(frozen=True, slots=True)
class Ready:
    """One batch of work for the driver, processed in this order (etcd raft's contract):

    1. send `messages` (these never depend on local durability, e.g. a leader's appends: it
       counts itself towards a quorum only once its own append is durable);
    2. install `snapshot` if set, then append `entries` (storage first drops every entry at
       an offset >= entries[0].offset: that is how a follower truncates a conflicting
       suffix), then persist `hard_state` if set; fsync all of it when `must_sync`;
    3. send `persisted_messages` (votes and append acknowledgements: Raft §5.1/§5.3 require
       the state they vouch for to be durable first);
    4. apply `committed_entries` in order, deliver `read_states`;
    5. call `advance(ready)`.
    """

    soft_state: SoftState | None = None
    hard_state: HardState | None = None
    snapshot: Snapshot | None = None
    entries: tuple[Entry, ...] = ()
    must_sync: bool = False
    messages: tuple[Message, ...] = ()
    persisted_messages: tuple[Message, ...] = ()
    committed_entries: tuple[Entry, ...] = ()
    read_states: tuple[ReadState, ...] = ()
    commit_offset: Offset = NO_OFFSET

    def is_empty(self) -> bool:
        return not (
            self.soft_state
            or self.hard_state
            or self.snapshot
            or self.entries
            or self.messages
            or self.persisted_messages
            or self.committed_entries
            or self.read_states
        )
