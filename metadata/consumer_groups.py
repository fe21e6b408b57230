"""Consumer groups: membership, incremental rebalancing and partition ownership (KIP-848).

Theory of operation. The controller coordinates every consumer group. A group is soft state
in its memory, like Kafka's group coordinator: members, their subscriptions and who owns
which partition. Only committed offsets are durable (metadata commands CommitGroupOffsets /
DeleteGroup). This module is pure: time (`now_ms`) and the topics' partition counts are
inputs, so the same calls give the same answers, and tests need no clock or sockets.

Members heartbeat (`heartbeat`). A heartbeat carries the member's id (chosen by the client,
a UUID, as in KIP-1082), its member epoch (0 to join), its subscribed topics and the
partitions it holds right now. The answer is the member's whole assignment and its new epoch.

Ownership, and the two-step move. `owners` maps each partition to at most one member: a
partition is owned from the moment it is handed to a member until that member's heartbeat
no longer lists it. The coordinator computes a target assignment (`sticky_assign`) when the
group changes (join, leave, expiry, subscription or partition count change) and reconciles
each member towards it at its heartbeat:

    keep   = owned(m) ∩ target(m)            answered again: m keeps consuming them
    grant  = {p ∈ target(m) : p unowned}     handed to m now, owned by m from now on
    revoke = owned(m) − target(m)            left out of the answer: m commits, drops them and
                                             its next heartbeat (not listing them) frees them

Example: m1 owns p0..p5, m2 joins. The target gives p3..p5 to m2. m2's heartbeat gets
nothing (all owned by m1). m1's heartbeat is answered {p0, p1, p2}; m1 commits p3..p5 and
drops them; its next heartbeat lists {p0, p1, p2}, which frees p3..p5; m2's next heartbeat
is granted them. m1 never stopped consuming p0..p2 (no stop-the-world), and no partition
was ever held by two members. A member that does not confirm a revocation within its
rebalance timeout, or that is silent for the session timeout, is removed and all it owned
is freed; but a member removed while it may still be consuming (late with a revocation, its
last heartbeat less than a session timeout ago) keeps its partitions out of every grant until
that session ends (`held_until`): by the client's own rule it has dropped them by then, and
until then no other member is handed them.

A heartbeat that lists a partition the coordinator does not think the member owns adopts it
if it is free: that is how a new controller (which starts empty) rebuilds ownership from the
members' next heartbeats. A partition the member lists but someone else owns is left out of
its answer, so the member drops it. A new coordinator (`reset`) grants nothing for one
session timeout: by then every member that still holds a partition has either reported it
or, by the client's own rule (no heartbeat answered for a session timeout, counted from the
request's send), dropped it; granting earlier could hand out a partition still consumed.

Epochs. A member's epoch grows each time its assignment changes. A heartbeat from a known
member with an epoch above the current one, or more than one below it (a zombie or a stale
request), is answered FENCED_MEMBER_EPOCH: the member drops everything and rejoins with 0.
A heartbeat with epoch 0 from a known member is a rejoin: what it owned is freed first.

Static members (KIP-345 in KIP-848's form, as Kafka's GroupMetadataManager runs it). A member
may name a group instance id, which at most one member of the group holds. Leaving with epoch
-2 (LEAVE_STATIC_EPOCH: the process stops and means to come back) keeps the member, its target
and the partitions it owned (none is reassigned) until its session timeout ends; only those it
was giving up are freed. A member that joins (epoch 0) under a new member id with that instance
id then takes the old member's place: its target, its owned partitions (handed back to it at
once, so it gets the same assignment) and its epoch. While the instance id's holder has not
left that way, such a join is UNRELEASED_INSTANCE_ID; a heartbeat or leave naming an instance
id that another member holds is FENCED_INSTANCE_ID, one no member holds UNKNOWN_MEMBER_ID.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "GROUP_ID_CHARS_MAX",
    "ConsumerGroupCoordinator",
    "GroupDescription",
    "GroupErrorCode",
    "GroupLimits",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "MemberDescription",
    "TopicPartition",
    "sticky_assign",
]

TopicPartition = tuple[str, int]
GROUP_ID_CHARS_MAX = 255
MEMBER_ID_CHARS_MAX = 64
SUBSCRIBED_TOPICS_MAX = 1000
OWNED_PARTITIONS_MAX = 100_000
INSTANCE_ID_CHARS_MAX = 249  # Kafka's limit on a group.instance.id
JOIN_EPOCH = 0
LEAVE_EPOCH = -1
LEAVE_STATIC_EPOCH = -2  # a static member leaving for now: its assignment is kept


class GroupErrorCode(enum.Enum):
    """Why a group request was refused (names from Kafka's protocol)."""

    NONE = "NONE"
    INVALID_REQUEST = "INVALID_REQUEST"
    UNKNOWN_MEMBER_ID = "UNKNOWN_MEMBER_ID"  # rejoin with epoch 0
    FENCED_MEMBER_EPOCH = "FENCED_MEMBER_EPOCH"  # drop every partition, rejoin with epoch 0
    GROUP_MAX_SIZE_REACHED = "GROUP_MAX_SIZE_REACHED"
    NOT_OWNER = "NOT_OWNER"  # an offset commit for a partition the member does not own
    NON_EMPTY_GROUP = "NON_EMPTY_GROUP"  # a group with members cannot be deleted
    FENCED_INSTANCE_ID = "FENCED_INSTANCE_ID"  # another member holds the instance id
    UNRELEASED_INSTANCE_ID = "UNRELEASED_INSTANCE_ID"  # its holder has not left with epoch -2


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupLimits:
    """The coordinator's bounds (from raftlog.config.MetadataConfig's group_* fields)."""

    session_timeout_ms: int
    heartbeat_interval_ms: int
    rebalance_timeout_ms_max: int
    groups_max: int
    members_max: int

    def __post_init__(self) -> None:
        assert 0 < self.heartbeat_interval_ms < self.session_timeout_ms, self
        assert self.rebalance_timeout_ms_max > 0 and self.groups_max > 0, self
        assert self.members_max > 0, self


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    group_id: str
    member_id: str
    member_epoch: int  # 0 joins (or rejoins), -1 leaves, -2 leaves for now (static), else the
    # epoch last received
    topics: tuple[str, ...]  # the subscription
    owned: frozenset[TopicPartition]  # what the member holds right now
    rebalance_timeout_ms: int
    instance_id: str | None = None  # a static member's group instance id


@dataclass(frozen=True, slots=True)
class HeartbeatResponse:
    error: GroupErrorCode
    message: str = ""
    member_id: str = ""
    member_epoch: int = 0
    assignment: frozenset[TopicPartition] = frozenset()
    heartbeat_interval_ms: int = 0


@dataclass(frozen=True, slots=True)
class MemberDescription:
    member_id: str
    member_epoch: int
    topics: tuple[str, ...]
    assignment: frozenset[TopicPartition]  # last answered
    owned: frozenset[TopicPartition]  # assignment plus partitions being revoked
    target: frozenset[TopicPartition]
    rebalance_timeout_ms: int
    instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    group_epoch: int
    members: tuple[MemberDescription, ...]


@dataclass(slots=True)
class _Member:
    member_id: str
    epoch: int
    topics: tuple[str, ...]
    rebalance_timeout_ms: int
    last_heartbeat_ms: int
    assignment: frozenset[TopicPartition] = frozenset()
    revoke_deadline_ms: int | None = None  # set while it owns partitions outside its target
    instance_id: str | None = None


@dataclass(slots=True)
class _Group:
    group_id: str
    epoch: int = 0
    members: dict[str, _Member] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    owners: dict[TopicPartition, str] = field(default_factory=dict)
    target: dict[str, frozenset[TopicPartition]] = field(default_factory=dict)
    partition_counts: dict[str, int] = field(default_factory=dict)  # of subscribed topics
    dirty: bool = True  # the target must be recomputed
    # Partitions of a removed member that may still consume them: granted to no one before
    # this instant (at most the group's partitions, so bounded with them).
    held_until: dict[TopicPartition, int] = field(default_factory=dict)

    def is_held(self, tp: TopicPartition, now_ms: int) -> bool:
        until = self.held_until.get(tp)
        return until is not None and now_ms < until

    def owned_by(self, member_id: str) -> frozenset[TopicPartition]:
        return frozenset(tp for tp, owner in self.owners.items() if owner == member_id)


class ConsumerGroupCoordinator:
    """Every consumer group this controller coordinates (module docstring)."""

    def __init__(self, limits: GroupLimits) -> None:
        self.limits = limits
        self._groups: dict[str, _Group] = {}
        # Before this instant only reported partitions are owned (`reset`, module docstring).
        self._grants_from_ms = -(2**63)

    # ---- requests ----------------------------------------------------------------------

    def heartbeat(
        self, request: HeartbeatRequest, *, partition_counts: Mapping[str, int], now_ms: int
    ) -> HeartbeatResponse:
        """Join, renew, reconcile or leave (epoch -1, or -2 for a static member leaving for
        now); see the module docstring."""
        problem = _request_problem(request)
        if problem is not None:
            return HeartbeatResponse(GroupErrorCode.INVALID_REQUEST, problem)
        if request.member_epoch in (LEAVE_EPOCH, LEAVE_STATIC_EPOCH):
            return self._leave_heartbeat(request, now_ms)
        group = self._groups.get(request.group_id)
        if group is None:
            if len(self._groups) >= self.limits.groups_max:
                return HeartbeatResponse(
                    GroupErrorCode.GROUP_MAX_SIZE_REACHED,
                    f"the coordinator holds groups_max={self.limits.groups_max} groups",
                )
            group = self._groups[request.group_id] = _Group(request.group_id)
        refusal = self._instance_refusal(group, request)
        if refusal is not None:
            self._forget_if_empty(group)
            return refusal
        replaced, inherited = self._maybe_replace_static(group, request, now_ms)
        member = replaced or group.members.get(request.member_id)
        refusal = self._admission_refusal(group, member, request)
        if refusal is not None:
            self._forget_if_empty(group)
            return refusal
        member = self._renew(group, member, request, now_ms, rejoin=replaced is None)
        self._refresh_partition_counts(group, partition_counts)
        return self._reconcile(group, member, request.owned | inherited, now_ms)

    def _leave_heartbeat(self, request: HeartbeatRequest, now_ms: int) -> HeartbeatResponse:
        """Epoch -1: the member leaves. Epoch -2 (static members only): it leaves for now, and
        keeps its place until its session timeout (module docstring)."""
        group_id, member_id, epoch = request.group_id, request.member_id, request.member_epoch
        group = self._groups.get(group_id)
        if request.instance_id is not None:
            holder_id = None if group is None else group.static_members.get(request.instance_id)
            holder = None if group is None or holder_id is None else group.members[holder_id]
            refusal = _holder_refusal(holder, request)
            if refusal is not None:
                return refusal
        if epoch == LEAVE_EPOCH or request.instance_id is None:
            self.leave(group_id, member_id)
            return HeartbeatResponse(GroupErrorCode.NONE, member_id=member_id, member_epoch=epoch)
        assert group is not None
        member = group.members[member_id]
        for tp in group.owned_by(member_id) - group.target.get(member_id, frozenset()):
            del group.owners[tp]  # what it was giving up goes now
        member.epoch, member.assignment = LEAVE_STATIC_EPOCH, group.owned_by(member_id)
        member.revoke_deadline_ms, member.last_heartbeat_ms = None, now_ms
        return HeartbeatResponse(
            GroupErrorCode.NONE, member_id=member_id, member_epoch=LEAVE_STATIC_EPOCH
        )

    def leave(self, group_id: str, member_id: str) -> bool:
        """Remove a member at once, freeing what it owned; False if it was unknown."""
        group = self._groups.get(group_id)
        if group is None or member_id not in group.members:
            return False
        self._remove(group, member_id)
        self._forget_if_empty(group)
        return True

    def expire(self, now_ms: int) -> list[tuple[str, str]]:
        """Remove members silent for the session timeout or late with a revocation;
        returns (group id, member id) of each one removed."""
        removed: list[tuple[str, str]] = []
        session_ms = self.limits.session_timeout_ms
        for group in list(self._groups.values()):
            for member in list(group.members.values()):
                silent_ms = now_ms - member.last_heartbeat_ms
                late = member.revoke_deadline_ms is not None and now_ms > member.revoke_deadline_ms
                if silent_ms > session_ms or late:
                    # Its client keeps what it holds until a session passes without an
                    # answered heartbeat: nobody else gets it before then.
                    hold_until = member.last_heartbeat_ms + session_ms
                    for tp in group.owned_by(member.member_id):
                        if hold_until > now_ms:
                            group.held_until[tp] = hold_until
                    self._remove(group, member.member_id)
                    removed.append((group.group_id, member.member_id))
            for tp in [tp for tp, until in group.held_until.items() if until <= now_ms]:
                del group.held_until[tp]
            self._forget_if_empty(group)
        return removed

    def check_commit(
        self, group_id: str, member_id: str, member_epoch: int, partitions: Iterable[TopicPartition]
    ) -> tuple[GroupErrorCode, str]:
        """May this member commit offsets of these partitions? A member may commit what it
        owns (a partition being revoked included: it commits before it confirms). A client
        outside any membership (epoch -1, with or without a member id: the AdminClient, an
        assign()ed consumer, one that never subscribed) may commit to a group with no
        members, as Kafka's ConsumerGroup.validateOffsetCommit allows; with members, it must
        be one of them (UNKNOWN_MEMBER_ID) at its epoch (FENCED_MEMBER_EPOCH, which Kafka's
        OffsetCommit calls STALE_MEMBER_EPOCH)."""
        group = self._groups.get(group_id)
        if member_epoch < 0 and (group is None or not group.members):
            return GroupErrorCode.NONE, ""
        member = None if group is None else group.members.get(member_id)
        if group is None or member is None:
            if not member_id:
                return GroupErrorCode.UNKNOWN_MEMBER_ID, (
                    f"group {group_id!r} has members: commit as one of them"
                )
            return GroupErrorCode.UNKNOWN_MEMBER_ID, (
                f"member {member_id!r} is not in group {group_id!r}"
            )
        if member_epoch < 0:
            return GroupErrorCode.FENCED_MEMBER_EPOCH, (
                f"member {member_id!r} of group {group_id!r} committed with epoch {member_epoch}"
            )
        if member_epoch > member.epoch:
            return GroupErrorCode.FENCED_MEMBER_EPOCH, (
                f"member {member_id!r} epoch {member_epoch} is ahead of {member.epoch}"
            )
        stray = sorted(tp for tp in partitions if group.owners.get(tp) != member_id)
        if stray:
            return GroupErrorCode.NOT_OWNER, (
                f"member {member_id!r} of group {group_id!r} does not own {stray[:10]}"
            )
        return GroupErrorCode.NONE, ""

    def has_members(self, group_id: str) -> bool:
        group = self._groups.get(group_id)
        return group is not None and bool(group.members)

    def describe(self, group_id: str) -> GroupDescription | None:
        group = self._groups.get(group_id)
        if group is None:
            return None
        members = tuple(
            _describe_member(group, m)
            for m in sorted(group.members.values(), key=lambda m: m.member_id)
        )
        return GroupDescription(group.group_id, group.epoch, members)

    def member(self, group_id: str, member_id: str) -> MemberDescription | None:
        """One member as `describe` shows it; None if the coordinator does not know it."""
        group = self._groups.get(group_id)
        member = None if group is None else group.members.get(member_id)
        if group is None or member is None:
            return None
        return _describe_member(group, member)

    def group_ids(self) -> tuple[str, ...]:
        return tuple(sorted(self._groups))

    def reset(self, now_ms: int) -> None:
        """Forget every group and start over as a new coordinator at `now_ms` (this node
        became, or stopped being, the controller): no grants for one session timeout."""
        self._groups.clear()
        self._grants_from_ms = now_ms + self.limits.session_timeout_ms
        assert not self._groups

    # ---- steps -------------------------------------------------------------------------

    def _instance_refusal(
        self, group: _Group, request: HeartbeatRequest
    ) -> HeartbeatResponse | None:
        """Whether the instance id a heartbeat names is its member's to use (module docstring):
        a join may take it from a holder that left with epoch -2, or rejoin with it under the
        same member id; any other heartbeat must come from its holder. An instance id no
        member holds is the joiner's (or, to a new coordinator, the heartbeating member's)."""
        if request.instance_id is None:
            return None
        holder_id = group.static_members.get(request.instance_id)
        holder = None if holder_id is None else group.members[holder_id]
        if holder is None or holder.member_id == request.member_id:
            return None
        if request.member_epoch != JOIN_EPOCH:
            return _holder_refusal(holder, request)
        if holder.epoch != LEAVE_STATIC_EPOCH:
            return HeartbeatResponse(
                GroupErrorCode.UNRELEASED_INSTANCE_ID,
                f"instance id {request.instance_id!r} is held by member {holder.member_id!r}, "
                "which has not left",
                member_id=request.member_id,
            )
        return None

    def _maybe_replace_static(
        self, group: _Group, request: HeartbeatRequest, now_ms: int
    ) -> tuple[_Member | None, frozenset[TopicPartition]]:
        """A join whose instance id's holder left with epoch -2 (checked by `_instance_refusal`):
        a new member record under the joiner's id, with the holder's subscription and target,
        owning what the holder owned (returned: the joiner gets them back at once, as its own);
        the holder goes. (None, nothing) for any other heartbeat."""
        holder_id = group.static_members.get(request.instance_id or "")
        if holder_id is None or holder_id == request.member_id:
            return None, frozenset()
        holder = group.members.pop(holder_id)
        assert holder.epoch == LEAVE_STATIC_EPOCH and request.member_epoch == JOIN_EPOCH
        assert holder.instance_id is not None
        if request.member_id in group.members:
            self._remove(group, request.member_id)  # a rejoin: it dropped what it held
        replaced = group.members[request.member_id] = _Member(
            member_id=request.member_id,
            epoch=JOIN_EPOCH,
            topics=holder.topics,
            rebalance_timeout_ms=holder.rebalance_timeout_ms,
            last_heartbeat_ms=now_ms,
            instance_id=holder.instance_id,
        )
        group.static_members[holder.instance_id] = replaced.member_id
        inherited = group.owned_by(holder_id)
        for tp in inherited:
            group.owners[tp] = replaced.member_id
        group.target[replaced.member_id] = group.target.pop(holder_id, frozenset())
        return replaced, inherited

    def _admission_refusal(
        self, group: _Group, member: _Member | None, request: HeartbeatRequest
    ) -> HeartbeatResponse | None:
        if member is None:
            if len(group.members) >= self.limits.members_max:
                return HeartbeatResponse(
                    GroupErrorCode.GROUP_MAX_SIZE_REACHED,
                    f"group {group.group_id!r} has members_max={self.limits.members_max} members",
                )
            return None
        epoch = request.member_epoch
        if epoch != JOIN_EPOCH and not member.epoch - 1 <= epoch <= member.epoch:
            return HeartbeatResponse(
                GroupErrorCode.FENCED_MEMBER_EPOCH,
                f"member {member.member_id!r} sent epoch {epoch}, current is {member.epoch}",
                member_id=member.member_id,
            )
        return None

    def _renew(
        self,
        group: _Group,
        member: _Member | None,
        request: HeartbeatRequest,
        now_ms: int,
        *,
        rejoin: bool,
    ) -> _Member:
        """The member record after this heartbeat: created on join (or on its first
        heartbeat to a new controller), reset on rejoin (`rejoin`: a join of a known member
        is one, unless it just took a static member's place), renewed otherwise."""
        if member is not None and request.member_epoch == JOIN_EPOCH and rejoin:
            self._remove(group, member.member_id)  # a rejoin: it dropped what it held
            member = None
        timeout_ms = min(request.rebalance_timeout_ms, self.limits.rebalance_timeout_ms_max)
        if member is None:
            # A known epoch from an unknown member: this coordinator is new, keep the count.
            member = _Member(
                member_id=request.member_id,
                epoch=request.member_epoch,
                topics=request.topics,
                rebalance_timeout_ms=timeout_ms,
                last_heartbeat_ms=now_ms,
                instance_id=request.instance_id,
            )
            group.members[member.member_id] = member
            if request.instance_id is not None:
                group.static_members[request.instance_id] = member.member_id
            group.dirty = True
        if member.topics != request.topics:
            member.topics = request.topics
            group.dirty = True
        member.rebalance_timeout_ms = timeout_ms
        member.last_heartbeat_ms = now_ms
        assert group.members[member.member_id] is member
        return member

    def _refresh_partition_counts(self, group: _Group, partition_counts: Mapping[str, int]) -> None:
        topics = sorted({t for m in group.members.values() for t in m.topics})
        counts = {t: partition_counts.get(t, 0) for t in topics}
        if counts != group.partition_counts:
            group.partition_counts = counts
            group.dirty = True
        # Partitions that no longer exist (topic deleted) are owned by nobody.
        for tp in [tp for tp in group.owners if tp[1] >= partition_counts.get(tp[0], 0)]:
            del group.owners[tp]

    def _reconcile(
        self, group: _Group, member: _Member, reported: frozenset[TopicPartition], now_ms: int
    ) -> HeartbeatResponse:
        """Free what the member no longer holds, adopt what it holds that is free, then
        keep, grant and revoke towards its target (module docstring)."""
        member_id = member.member_id
        confirmed = group.owned_by(member_id) - reported
        for tp in confirmed:
            del group.owners[tp]  # a confirmed revocation (or a grant it never received)
        if confirmed:
            # It did what it was asked: what it is asked to give up next gets a full rebalance
            # timeout of its own (as Kafka reschedules it), not what is left of the last one.
            member.revoke_deadline_ms = None
        for tp in sorted(reported):
            if tp not in group.owners and tp[1] < group.partition_counts.get(tp[0], 0):
                group.owners[tp] = member_id  # a new controller learning what members hold
        self._maybe_compute_target(group)
        target = group.target.get(member_id, frozenset())
        if now_ms >= self._grants_from_ms:
            for tp in sorted(target):
                if not group.is_held(tp, now_ms):
                    group.owners.setdefault(tp, member_id)
        owned = group.owned_by(member_id)
        assignment = owned & target
        if assignment != member.assignment or member.epoch == JOIN_EPOCH:
            member.epoch += 1
            member.assignment = assignment
        if owned - assignment:
            if member.revoke_deadline_ms is None:
                member.revoke_deadline_ms = now_ms + member.rebalance_timeout_ms
        else:
            member.revoke_deadline_ms = None
        assert assignment <= target and member.epoch > JOIN_EPOCH, (assignment, target)
        return HeartbeatResponse(
            GroupErrorCode.NONE,
            member_id=member_id,
            member_epoch=member.epoch,
            assignment=assignment,
            heartbeat_interval_ms=self.limits.heartbeat_interval_ms,
        )

    def _maybe_compute_target(self, group: _Group) -> None:
        if not group.dirty:
            return
        subscriptions = {m.member_id: m.topics for m in group.members.values()}
        # Stick to what members hold first, then to the old target (disjoint either way).
        owned_any = frozenset(group.owners)
        previous = {
            m: group.owned_by(m) | (group.target.get(m, frozenset()) - owned_any)
            for m in subscriptions
        }
        group.target = sticky_assign(subscriptions, group.partition_counts, previous)
        group.epoch += 1
        group.dirty = False
        assert set(group.target) == set(group.members)

    def _remove(self, group: _Group, member_id: str) -> None:
        member = group.members.pop(member_id)
        if (
            member.instance_id is not None
            and group.static_members.get(member.instance_id) == member_id
        ):
            del group.static_members[member.instance_id]
        for tp in group.owned_by(member_id):
            del group.owners[tp]
        group.target.pop(member_id, None)
        group.dirty = True
        assert member_id not in group.owners.values()

    def _forget_if_empty(self, group: _Group) -> None:
        if not group.members and not group.held_until:
            assert not group.owners, group.owners
            self._groups.pop(group.group_id, None)


def _describe_member(group: _Group, member: _Member) -> MemberDescription:
    return MemberDescription(
        member_id=member.member_id,
        member_epoch=member.epoch,
        topics=member.topics,
        assignment=member.assignment,
        owned=group.owned_by(member.member_id),
        target=group.target.get(member.member_id, frozenset()),
        rebalance_timeout_ms=member.rebalance_timeout_ms,
        instance_id=member.instance_id,
    )


def _request_problem(request: HeartbeatRequest) -> str | None:
    if not 1 <= len(request.group_id) <= GROUP_ID_CHARS_MAX:
        return f"group id must be 1-{GROUP_ID_CHARS_MAX} characters, got {len(request.group_id)}"
    if not 1 <= len(request.member_id) <= MEMBER_ID_CHARS_MAX:
        return f"member id must be 1-{MEMBER_ID_CHARS_MAX} characters (a UUID the client picks)"
    if request.member_epoch < LEAVE_STATIC_EPOCH:
        return f"member epoch {request.member_epoch} is below -2"
    if (
        request.instance_id is not None
        and not 1 <= len(request.instance_id) <= INSTANCE_ID_CHARS_MAX
    ):
        return f"instance id must be 1-{INSTANCE_ID_CHARS_MAX} characters"
    if len(request.topics) > SUBSCRIBED_TOPICS_MAX or len(request.owned) > OWNED_PARTITIONS_MAX:
        return (
            f"{len(request.topics)} topics / {len(request.owned)} owned partitions exceed "
            f"{SUBSCRIBED_TOPICS_MAX} / {OWNED_PARTITIONS_MAX}"
        )
    leaving = request.member_epoch in (LEAVE_EPOCH, LEAVE_STATIC_EPOCH)
    if request.rebalance_timeout_ms <= 0 and not leaving:
        return f"rebalance_timeout_ms must be positive, got {request.rebalance_timeout_ms}"
    if any(partition < 0 for _, partition in request.owned):
        return "owned partitions must have non-negative ids"
    return None


# ---- the sticky assignor -------------------------------------------------------------------


def sticky_assign(
    subscriptions: Mapping[str, tuple[str, ...]],
    partition_counts: Mapping[str, int],
    previous: Mapping[str, frozenset[TopicPartition]],
) -> dict[str, frozenset[TopicPartition]]:
    """Every partition of a subscribed topic to exactly one subscriber of it, keeping the
    previous target where still valid, then evening out loads by moving as few partitions
    as possible. When every member subscribes to the same topics the loads differ by at
    most one. Deterministic: ties break by member id, partitions go in (topic, id) order."""
    members = sorted(subscriptions)
    if not members:
        return {}
    eligible = _eligible_members(subscriptions, partition_counts)
    owner: dict[TopicPartition, str] = {}
    loads: dict[str, list[TopicPartition]] = {m: [] for m in members}
    for member in members:
        for tp in sorted(previous.get(member, frozenset())):
            if member in eligible.get(tp, ()) and tp not in owner:
                owner[tp] = member
                loads[member].append(tp)
    for tp in sorted(eligible):
        if tp not in owner:
            target = min(eligible[tp], key=lambda m: (len(loads[m]), m))
            owner[tp] = target
            loads[target].append(tp)
    _even_out(loads, eligible, owner)
    assert sorted(owner) == sorted(eligible)
    return {member: frozenset(loads[member]) for member in members}


def _eligible_members(
    subscriptions: Mapping[str, tuple[str, ...]], partition_counts: Mapping[str, int]
) -> dict[TopicPartition, list[str]]:
    subscribers: dict[str, list[str]] = {}
    for member in sorted(subscriptions):
        for topic in sorted(set(subscriptions[member])):
            subscribers.setdefault(topic, []).append(member)
    return {
        (topic, partition): members
        for topic, members in sorted(subscribers.items())
        for partition in range(partition_counts.get(topic, 0))
    }


def _even_out(
    loads: dict[str, list[TopicPartition]],
    eligible: Mapping[TopicPartition, list[str]],
    owner: dict[TopicPartition, str],
) -> None:
    """Move one partition at a time from a member to an eligible one with at least two
    fewer, preferring the most and least loaded. Each move lowers the sum of squared loads,
    so the loop ends; the bound makes sure."""
    moves_max = len(owner) * max(1, len(loads)) + 1
    for _ in range(moves_max):
        move = _best_move(loads, eligible)
        if move is None:
            return
        tp, source, target = move
        loads[source].remove(tp)
        loads[target].append(tp)
        owner[tp] = target
    raise AssertionError(f"sticky_assign did not settle in {moves_max} moves")


def _best_move(
    loads: Mapping[str, list[TopicPartition]], eligible: Mapping[TopicPartition, list[str]]
) -> tuple[TopicPartition, str, str] | None:
    by_load_desc = sorted(loads, key=lambda m: (-len(loads[m]), m))
    for source in by_load_desc:
        best: tuple[int, str, TopicPartition] | None = None
        for tp in sorted(loads[source], reverse=True):
            for target in eligible[tp]:
                gap = len(loads[source]) - len(loads[target])
                if gap >= 2 and (best is None or (-gap, target) < (-best[0], best[1])):
                    best = (gap, target, tp)
        if best is not None:
            return best[2], source, best[1]
    return None


def _holder_refusal(holder: _Member | None, request: HeartbeatRequest) -> HeartbeatResponse | None:
    """A heartbeat (not a join) naming an instance id: UNKNOWN_MEMBER_ID if no member holds it,
    FENCED_INSTANCE_ID if another member does (Kafka's throwIfStaticMemberIsUnknown and
    throwIfInstanceIdIsFenced)."""
    if holder is None:
        return HeartbeatResponse(
            GroupErrorCode.UNKNOWN_MEMBER_ID,
            f"no member holds instance id {request.instance_id!r}",
            member_id=request.member_id,
        )
    if holder.member_id != request.member_id:
        return HeartbeatResponse(
            GroupErrorCode.FENCED_INSTANCE_ID,
            f"instance id {request.instance_id!r} is held by member {holder.member_id!r}",
            member_id=request.member_id,
        )
    return None
