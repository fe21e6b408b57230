"""The records a classic group coordinator keeps and answers with (the group, its members,
JoinGroup's and SyncGroup's answers) and the pure rules it applies to them: who a member is
(static members' instance ids), which protocol the group uses, what the leader and
DescribeGroups see. `classic_group_coordinator` runs the protocol over them."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

__all__ = [
    "ClassicGroup",
    "ClassicMember",
    "GroupState",
    "JoinAnswer",
    "JoinRequest",
    "MemberView",
    "SyncAnswer",
    "answer_sync",
    "choose_protocol",
    "identity_refusal",
    "metadata_for",
    "views",
]


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"


@dataclass(frozen=True, slots=True)
class JoinRequest:
    group_id: str
    member_id: str
    client_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]  # (name, metadata), in the member's preference
    group_instance_id: str | None = None  # a static member's (KIP-345)
    skip_assignment_supported: bool = False  # JoinGroup v9 on (KIP-814)


@dataclass(frozen=True, slots=True)
class MemberView:
    member_id: str
    client_id: str
    metadata: bytes  # for the chosen protocol
    assignment: bytes
    instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class JoinAnswer:
    error: ErrorCode
    member_id: str
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    members: tuple[MemberView, ...] = ()  # the leader's only
    skip_assignment: bool = False  # a static leader rejoining a Stable group: no new assignment


@dataclass(frozen=True, slots=True)
class SyncAnswer:
    error: ErrorCode
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(slots=True)
class ClassicMember:
    """One member of a classic group: its JoinGroup's terms, liveness and assignment."""

    member_id: str
    client_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]
    heard_ms: int
    joined: asyncio.Future[JoinAnswer] | None = None
    synced: asyncio.Future[SyncAnswer] | None = None
    assignment: bytes = b""
    expiry_queued_ms: int | None = None  # the deadline of its entry in the expiry queue
    instance_id: str | None = None  # a static member's group instance id

    @property
    def waiting(self) -> bool:
        """In JoinGroup or SyncGroup now: its session does not run out meanwhile."""
        return any(f is not None and not f.done() for f in (self.joined, self.synced))


@dataclass(slots=True)
class ClassicGroup:
    """One group's membership as the coordinator holds it (soft state)."""

    group_id: str
    protocol_type: str = ""
    state: GroupState = GroupState.EMPTY
    generation_id: int = 0
    protocol_name: str | None = None
    leader_id: str = ""
    members: dict[str, ClassicMember] = field(default_factory=dict)
    pending: dict[str, int] = field(default_factory=dict)  # handed-out id -> when, ms
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    join_deadline: asyncio.TimerHandle | None = None
    # The first rebalance of an empty group waits out the initial delay (Kafka's
    # InitialDelayedJoin) even when every member has joined; a member joining meanwhile
    # extends it (`new_member_added`).
    initial_delay: bool = False
    new_member_added: bool = False


def identity_refusal(
    group: ClassicGroup, member_id: str, instance_id: str | None
) -> ErrorCode | None:
    """Whether `member_id` (naming `instance_id`, if static) is who it says it is, as Kafka's
    ClassicGroup.validateMember checks: an instance id held by another member is
    FENCED_INSTANCE_ID, one the group does not know or a member id not in it UNKNOWN_MEMBER_ID."""
    if instance_id is not None:
        holder = group.static_members.get(instance_id)
        if holder is None:
            return ErrorCode.unknown_member_id
        if holder != member_id:
            return ErrorCode.fenced_instance_id
    return None if member_id in group.members else ErrorCode.unknown_member_id


def views(group: ClassicGroup) -> tuple[MemberView, ...]:
    """Every member as the leader and DescribeGroups see it (metadata of the chosen protocol)."""
    return tuple(
        MemberView(
            m.member_id,
            m.client_id,
            metadata_for(m, group.protocol_name),
            m.assignment,
            m.instance_id,
        )
        for m in group.members.values()
    )


def answer_sync(member: ClassicMember, answer: SyncAnswer) -> None:
    """Answer `member`'s SyncGroup with `answer` if one is waiting."""
    if member.synced is not None and not member.synced.done():
        member.synced.set_result(answer)


def choose_protocol(group: ClassicGroup) -> str:
    """The leader's most preferred protocol that every member supports."""
    leader = group.members[group.leader_id]
    for name, _ in leader.protocols:
        if all(name in {n for n, _ in m.protocols} for m in group.members.values()):
            return name
    raise AssertionError(f"group {group.group_id}: no common protocol (checked at join)")


def metadata_for(member: ClassicMember, protocol_name: str | None) -> bytes:
    """`member`'s JoinGroup metadata for `protocol_name` (b"" for none)."""
    return next((data for name, data in member.protocols if name == protocol_name), b"")
