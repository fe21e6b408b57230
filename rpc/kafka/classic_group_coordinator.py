"""Kafka's classic consumer-group protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) with
client-side assignment, as the group coordinator runs it.

Theory of operation. The controller coordinates every group (as for raftlog's own groups,
`raftlog.rpc.consumer_group_servicer`); membership is soft state kept here, in memory, and dropped
when this node stops coordinating (a new controller's members rejoin, as after a Kafka
coordinator failover). Committed offsets are not kept here: they replicate through the
metadata quorum (`CommitGroupOffsets`), like raftlog's group offsets.

A group moves Empty -> PreparingRebalance -> CompletingRebalance -> Stable:

- JoinGroup puts the group in PreparingRebalance; each JoinGroup waits until every known
  member has (re)joined or the largest rebalance timeout has passed, whichever is first;
  members that did not rejoin are removed. The new generation then starts: the leader
  (kept if it rejoined, else the first member) gets every member's subscription metadata.
- SyncGroup from the leader carries the assignment of every member; it answers the members
  waiting in SyncGroup and makes the group Stable. Followers that sync later get theirs
  at once.
- Heartbeats answer REBALANCE_IN_PROGRESS while a rebalance waits for rejoins, so members
  rejoin. A member not heard from within its session timeout is removed and the group
  rebalances, or, if a rebalance waits for it, completes without it. Sessions end on the
  coordinator's one timer (`ExpiryQueue`: a heap of deadlines, one entry per member), not when
  some request next touches the group: during a rebalance the survivors wait in JoinGroup and
  send nothing, so only the timer can end a dead member's session (as Kafka's coordinator
  does with its heartbeat timer). A member waiting in JoinGroup or SyncGroup is not expired.
- A new member first gets MEMBER_ID_REQUIRED with its id (KIP-394) and joins with it; ids
  handed out but unused expire after `_PENDING_MEMBER_MS`.
- The first rebalance of an empty group waits `initial_rebalance_delay_ms` (Kafka's
  group.initial.rebalance.delay.ms and its InitialDelayedJoin) even once every member has
  joined, and waits that long again (at most, within the largest rebalance timeout) while new
  members keep joining: consumers started together get one generation, not one rebalance
  each (librdkafka's 0089, 0102, 0113 and 0118 start two consumers and count rebalances).

Static membership (KIP-345), as Kafka's GroupMetadataManager runs it. A member that joins with
a group instance id gets a member id at once (no MEMBER_ID_REQUIRED). A later JoinGroup with
that instance id and no member id (the process restarted: static members send no LeaveGroup
when they close) takes the old member's place under a new member id: the old id is fenced
(its waiting JoinGroup or SyncGroup, and every later request, get FENCED_INSTANCE_ID), the new
one inherits the old one's assignment and leadership, and in a Stable group whose chosen
protocol stays the same there is no rebalance: the member gets the current generation and
syncs to its old assignment (a leader on JoinGroup v9 gets the members and skip_assignment;
before v9 it is told the old member id leads, so it does not assign). Otherwise the group
rebalances. Every request that names an instance id must name the member id that holds it
(else FENCED_INSTANCE_ID; UNKNOWN_MEMBER_ID for an instance id the group does not know). A
static member that does not rejoin a rebalance stays in the group until its session ends;
LeaveGroup (v3 on) may name a member by its instance id alone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import Callable, Iterator

from kio.schema.errors import ErrorCode

from raftlog.rpc.kafka.classic_group_records import (
    ClassicGroup,
    ClassicMember,
    GroupState,
    JoinAnswer,
    JoinRequest,
    MemberView,
    SyncAnswer,
    answer_sync,
    choose_protocol,
    identity_refusal,
    metadata_for,
    views,
)
from raftlog.rpc.kafka.consumer_protocol import subscribed_topics
from raftlog.rpc.kafka.expiry_queue import ExpiryQueue

log = logging.getLogger(__name__)

__all__ = [
    "ClassicGroups",
    "GroupState",
    "JoinAnswer",
    "JoinRequest",
    "MemberView",
    "SyncAnswer",
]


class ClassicGroups:
    """Every classic group this node coordinates (bounded by `groups_max`, `members_max`)."""

    def __init__(
        self,
        *,
        clock_ms: Callable[[], int],
        groups_max: int,
        members_max: int,
        initial_rebalance_delay_ms: int = 0,
    ) -> None:
        self._clock_ms = clock_ms
        self._initial_delay_ms = initial_rebalance_delay_ms
        self._groups_max = groups_max
        self._members_max = members_max
        self._groups: dict[str, ClassicGroup] = {}
        self._term: int | None = None
        self._expiries = ExpiryQueue(clock_ms=clock_ms, on_due=self._on_due, live=self._queued)

    def follow_term(self, term: int | None) -> bool:
        """True while this node coordinates (`term`: the controller term, else None); a new
        term, or none, forgets every group first (members rejoin the new coordinator)."""
        if term != self._term:
            self.reset()
            self._term = term
        return term is not None

    # -- queries ---------------------------------------------------------------------------

    def group_ids(self) -> tuple[str, ...]:
        """The ids of every group this node holds, sorted (members or handed-out ids pending)."""
        return tuple(sorted(self._groups))

    def describe(self, group_id: str) -> tuple[GroupState, str, str | None, list[MemberView]]:
        """(state, protocol type, chosen protocol, members) of `group_id` once silent members are
        expired; each member's metadata is for the chosen protocol. An unknown group reads as Empty
        with no members."""
        group = self._groups.get(group_id)
        if group is None:
            return GroupState.EMPTY, "", None, []
        self._expire(group)
        return group.state, group.protocol_type, group.protocol_name, list(views(group))

    def has_members(self, group_id: str) -> bool:
        """Whether `group_id` has members once those past their session timeout are expired."""
        group = self._groups.get(group_id)
        if group is not None:
            self._expire(group)
        return group is not None and bool(group.members)

    def holds(self, group_id: str) -> bool:
        """Whether this coordinator holds `group_id` (members, or handed-out ids pending)."""
        return group_id in self._groups

    def offset_delete_refusal(self, group_id: str) -> ErrorCode | None:
        """Why Kafka's OffsetDelete may not touch `group_id` at all: NON_EMPTY_GROUP while it has
        members of a protocol other than the consumer one (ClassicGroup.validateOffsetDelete)."""
        group = self._groups.get(group_id)
        if group is not None:
            self._expire(group)
        if group is not None and group.members and group.protocol_type != _CONSUMER_PROTOCOL:
            return ErrorCode.non_empty_group
        return None

    def is_subscribed(self, group_id: str, topic: str) -> bool:
        """Whether a member of `group_id` consumes `topic` (ClassicGroup.isSubscribedToTopic):
        from the members' subscriptions for the chosen protocol; while one of them cannot be
        read, or no protocol is chosen yet, every topic counts as subscribed."""
        group = self._groups.get(group_id)
        if group is None or not group.members or group.protocol_type != _CONSUMER_PROTOCOL:
            return False
        if group.protocol_name is None:
            return True
        for member in group.members.values():
            topics = subscribed_topics(metadata_for(member, group.protocol_name))
            if topics is None or topic in topics:
                return True
        return False

    def forget(self, group_id: str) -> bool:
        """Drop `group_id` if it has no members (its handed-out ids go with it); whether it
        was held. Its committed offsets are the metadata state's (DeleteGroups)."""
        group = self._groups.get(group_id)
        if group is None or group.members:
            return False
        del self._groups[group_id]
        return True

    def check_member(
        self, group_id: str, member_id: str, generation_id: int, instance_id: str | None = None
    ) -> ErrorCode:
        """Whether `member_id` of `generation_id` may commit offsets now, by Kafka's rules
        (ClassicGroup.validateOffsetCommit): generation -1 comes from outside the group
        protocol (the AdminClient, an assign()ed or a KIP-848 consumer that never subscribed,
        with or without a member id) and may commit while the group has no members; otherwise
        the member must be in the group (UNKNOWN_MEMBER_ID), hold its instance id if it names
        one (FENCED_INSTANCE_ID), at its generation (ILLEGAL_GENERATION), and not between
        JoinGroup and SyncGroup (REBALANCE_IN_PROGRESS).
        A group this coordinator does not hold reads as Empty: Kafka would hold it (it loads
        its groups), and answers UNKNOWN_MEMBER_ID to a member of an Empty group."""
        group = self._groups.get(group_id)
        if group is not None:
            self._expire(group)
        if group is None or not group.members:
            return ErrorCode.none if generation_id < 0 else ErrorCode.unknown_member_id
        refusal = identity_refusal(group, member_id, instance_id)
        if refusal is not None:
            return refusal
        if generation_id != group.generation_id:
            return ErrorCode.illegal_generation
        if group.state is GroupState.COMPLETING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        group.members[member_id].heard_ms = self._clock_ms()
        return ErrorCode.none

    # -- the protocol ------------------------------------------------------------------------

    async def join(self, request: JoinRequest) -> JoinAnswer:
        """JoinGroup for `request`. A member without an id gets MEMBER_ID_REQUIRED and a fresh id
        (KIP-394), a static one its id at once (and maybe its old place: the module docstring);
        a follower rejoining a settled generation unchanged gets it back at once; otherwise it
        waits for the rebalance to end and gets the new generation (the leader also every
        member's metadata). Refuses with COORDINATOR_NOT_AVAILABLE past `groups_max`,
        INCONSISTENT_GROUP_PROTOCOL, UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID,
        GROUP_MAX_SIZE_REACHED; a superseded join gets REBALANCE_IN_PROGRESS, a fenced one
        FENCED_INSTANCE_ID and a reset NOT_COORDINATOR."""
        group = self._groups.get(request.group_id)
        if group is not None:
            self._expire(group)
            group = self._groups.get(request.group_id)  # gone if it expired empty
        if group is None:
            if len(self._groups) >= self._groups_max:
                return JoinAnswer(ErrorCode.coordinator_not_available, request.member_id)
            group = self._groups[request.group_id] = ClassicGroup(request.group_id)
        refusal = self._join_refusal(group, request)
        if refusal is not None:
            return JoinAnswer(refusal, request.member_id)
        if not request.member_id and request.group_instance_id is not None:
            return await self._join_static(group, request)
        if not request.member_id:
            member_id = f"{request.client_id or 'member'}-{uuid.uuid4()}"
            group.pending[member_id] = now_ms = self._clock_ms()
            self._expiries.push(now_ms + _PENDING_MEMBER_MS + 1, group.group_id, member_id)
            return JoinAnswer(ErrorCode.member_id_required, member_id)
        rejoin = self._unchanged_rejoin(group, request)
        if rejoin is not None:
            return rejoin
        member = self._admit(group, request)
        return await self._await_generation(group, member, f"member {member.member_id} joined")

    async def _await_generation(
        self, group: ClassicGroup, member: ClassicMember, reason: str
    ) -> JoinAnswer:
        """`member` waits in JoinGroup for the next generation (a rebalance starts if none is
        under way); a join of its own still waiting gets REBALANCE_IN_PROGRESS."""
        if member.joined is not None and not member.joined.done():
            member.joined.set_result(JoinAnswer(ErrorCode.rebalance_in_progress, member.member_id))
        member.joined = asyncio.get_running_loop().create_future()
        self._prepare_rebalance(group, reason)
        self._maybe_complete_join(group)
        return await member.joined

    async def _join_static(self, group: ClassicGroup, request: JoinRequest) -> JoinAnswer:
        """A static member joining without a member id: a new member, or the one its instance
        id names replaced under a new id (GroupMetadataManager's
        updateStaticMemberThenRebalanceOrCompleteJoin)."""
        instance_id = request.group_instance_id
        assert instance_id is not None
        new_id = f"{instance_id}-{uuid.uuid4()}"
        old_id = group.static_members.get(instance_id)
        if old_id is None:
            member = self._admit(group, dataclasses.replace(request, member_id=new_id))
            member.instance_id = instance_id
            group.static_members[instance_id] = new_id
            return await self._await_generation(group, member, f"static member {new_id} joined")
        leader_before = group.leader_id
        member = self._replace_static(group, old_id, new_id)
        member.client_id, member.protocols = request.client_id, request.protocols
        member.session_timeout_ms = request.session_timeout_ms
        member.rebalance_timeout_ms = request.rebalance_timeout_ms
        if group.state is GroupState.STABLE and choose_protocol(group) == group.protocol_name:
            log.info(
                "consumer group %r: static member %s replaced %s", group.group_id, new_id, old_id
            )
            skip = request.skip_assignment_supported and group.leader_id == new_id
            return JoinAnswer(
                ErrorCode.none,
                new_id,
                group.generation_id,
                group.protocol_type,
                group.protocol_name,
                group.leader_id if request.skip_assignment_supported else leader_before,
                views(group) if skip else (),
                skip_assignment=skip,
            )
        # Otherwise a rebalance: in CompletingRebalance too, since the leader may be assigning
        # to the old member id (Kafka's rule).
        reason = f"static member {new_id} replaced {old_id}"
        return await self._await_generation(group, member, reason)

    def _replace_static(self, group: ClassicGroup, old_id: str, new_id: str) -> ClassicMember:
        """`new_id` takes `old_id`'s place (its instance id, assignment and leadership); the old
        member's waiting requests learn it is fenced."""
        old = group.members.pop(old_id)
        if old.joined is not None and not old.joined.done():
            old.joined.set_result(JoinAnswer(ErrorCode.fenced_instance_id, old_id))
        answer_sync(old, SyncAnswer(ErrorCode.fenced_instance_id))
        new = group.members[new_id] = ClassicMember(
            new_id,
            old.client_id,
            old.session_timeout_ms,
            old.rebalance_timeout_ms,
            old.protocols,
            self._clock_ms(),
            assignment=old.assignment,
            instance_id=old.instance_id,
        )
        assert new.instance_id is not None
        group.static_members[new.instance_id] = new_id
        if group.leader_id == old_id:
            group.leader_id = new_id
        self._queue_session(group, new)
        return new

    def _unchanged_rejoin(self, group: ClassicGroup, request: JoinRequest) -> JoinAnswer | None:
        """A follower rejoining a settled generation with the same subscription gets that
        generation back without a rebalance (as Kafka's coordinator answers it)."""
        member = group.members.get(request.member_id)
        settled = group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE)
        if member is None or not settled or request.member_id == group.leader_id:
            return None
        if member.protocols != request.protocols:
            return None
        member.heard_ms = self._clock_ms()
        return JoinAnswer(
            ErrorCode.none,
            member.member_id,
            group.generation_id,
            group.protocol_type,
            group.protocol_name,
            group.leader_id,
        )

    def _join_refusal(self, group: ClassicGroup, request: JoinRequest) -> ErrorCode | None:
        if not request.protocol_type or not request.protocols:
            return ErrorCode.inconsistent_group_protocol
        if group.members and request.protocol_type != group.protocol_type:
            return ErrorCode.inconsistent_group_protocol
        member_id, instance_id = request.member_id, request.group_instance_id
        if member_id in group.pending and instance_id is not None:
            return ErrorCode.unknown_member_id  # a handed-out id is never a static member's
        if member_id and member_id not in group.pending:
            refusal = identity_refusal(group, member_id, instance_id)
            if refusal is not None:
                return refusal
        # Who this join is in the group now: itself, or the static member it replaces.
        current = member_id or group.static_members.get(instance_id or "", "")
        known = current in group.members or current in group.pending
        if not known and len(group.members) + len(group.pending) >= self._members_max:
            return ErrorCode.group_max_size_reached
        # Kafka's supportsProtocols: one of the joiner's protocols every other member supports
        # (so the group always has a protocol in common to choose).
        common = {name for name, _ in request.protocols}
        for member in group.members.values():
            if member.member_id != current:
                common &= {name for name, _ in member.protocols}
        return None if common else ErrorCode.inconsistent_group_protocol

    def _admit(self, group: ClassicGroup, request: JoinRequest) -> ClassicMember:
        group.pending.pop(request.member_id, None)
        group.protocol_type = request.protocol_type
        member = group.members.get(request.member_id)
        now_ms = self._clock_ms()
        if member is None:
            member = group.members[request.member_id] = ClassicMember(
                request.member_id,
                request.client_id,
                request.session_timeout_ms,
                request.rebalance_timeout_ms,
                request.protocols,
                now_ms,
            )
            self._queue_session(group, member)
            group.new_member_added = group.initial_delay
        member.protocols = request.protocols
        member.session_timeout_ms = request.session_timeout_ms
        member.rebalance_timeout_ms = request.rebalance_timeout_ms
        member.heard_ms = now_ms
        return member

    def _prepare_rebalance(self, group: ClassicGroup, reason: str) -> None:
        """Start a rebalance (PreparingRebalance until every member rejoins or the largest
        rebalance timeout passes), unless one is under way."""
        if group.state is GroupState.PREPARING_REBALANCE:
            return
        log.info("consumer group %r: rebalancing (%s)", group.group_id, reason)
        # Members waiting for a sync of the generation being replaced learn it now.
        for member in group.members.values():
            answer_sync(member, SyncAnswer(ErrorCode.rebalance_in_progress))
        was_empty = group.state is GroupState.EMPTY
        group.state = GroupState.PREPARING_REBALANCE
        timeout_ms = max(m.rebalance_timeout_ms for m in group.members.values())
        loop = asyncio.get_running_loop()
        if was_empty and self._initial_delay_ms > 0:
            group.initial_delay, group.new_member_added = True, False
            remaining_ms = max(timeout_ms - self._initial_delay_ms, 0)
            group.join_deadline = loop.call_later(
                self._initial_delay_ms / 1000, self._initial_delay_due, group, remaining_ms
            )
            return
        group.join_deadline = loop.call_later(timeout_ms / 1000, self._complete_join, group)

    def _initial_delay_due(self, group: ClassicGroup, remaining_ms: int) -> None:
        """The initial delay passed: wait once more if a member joined meanwhile and the
        rebalance timeout leaves time (Kafka's InitialDelayedJoin.onComplete), else start the
        generation."""
        if group.state is not GroupState.PREPARING_REBALANCE or not group.initial_delay:
            return
        if group.new_member_added and remaining_ms > 0:
            group.new_member_added = False
            delay_ms = min(self._initial_delay_ms, remaining_ms)
            group.join_deadline = asyncio.get_running_loop().call_later(
                delay_ms / 1000, self._initial_delay_due, group, remaining_ms - delay_ms
            )
            return
        group.initial_delay = False
        self._complete_join(group)

    def _maybe_complete_join(self, group: ClassicGroup) -> None:
        waiting = [m for m in group.members.values() if m.joined is None or m.joined.done()]
        if (
            group.state is GroupState.PREPARING_REBALANCE
            and not waiting
            and not group.initial_delay
        ):
            self._complete_join(group)

    def _complete_join(self, group: ClassicGroup) -> None:
        """A new generation from the members that rejoined and the static members that did not
        (they stay until their session ends); dynamic members that did not rejoin are removed.
        If only static members are left and none rejoined, the rebalance waits on."""
        if group.state is not GroupState.PREPARING_REBALANCE:
            return
        group.initial_delay = False
        if group.join_deadline is not None:
            group.join_deadline.cancel()
            group.join_deadline = None
        rejoined = [
            m for m in group.members.values() if m.joined is not None and not m.joined.done()
        ]
        for member in list(group.members.values()):
            if member not in rejoined and member.instance_id is None:
                del group.members[member.member_id]
        if group.members and not rejoined:
            timeout_ms = max(m.rebalance_timeout_ms for m in group.members.values())
            group.join_deadline = asyncio.get_running_loop().call_later(
                timeout_ms / 1000, self._complete_join, group
            )
            return
        group.generation_id += 1
        if not group.members:
            group.state, group.leader_id, group.protocol_name = GroupState.EMPTY, "", None
            return
        if group.leader_id not in {m.member_id for m in rejoined}:
            group.leader_id = rejoined[0].member_id
        group.protocol_name = choose_protocol(group)
        group.state = GroupState.COMPLETING_REBALANCE
        now_ms = self._clock_ms()
        for member in group.members.values():
            member.heard_ms = now_ms  # its session runs from the new generation's start
            member.assignment = b""
        seen = views(group)
        for member in rejoined:
            assert member.joined is not None
            member.joined.set_result(
                JoinAnswer(
                    ErrorCode.none,
                    member.member_id,
                    group.generation_id,
                    group.protocol_type,
                    group.protocol_name,
                    group.leader_id,
                    seen if member.member_id == group.leader_id else (),
                )
            )

    async def sync(
        self,
        group_id: str,
        member_id: str,
        generation_id: int,
        assignments: dict[str, bytes],
        instance_id: str | None = None,
    ) -> SyncAnswer:
        """SyncGroup: the leader's `assignments` (member id to bytes) make the group Stable and
        answer every waiting member; a follower waits for them, or gets its own at once if
        Stable. Answers UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID, ILLEGAL_GENERATION,
        REBALANCE_IN_PROGRESS (also to waiters when a new rebalance starts) and NOT_COORDINATOR
        on a reset."""
        group = self._groups.get(group_id)
        if group is not None:
            self._expire(group)
        if group is None:
            return SyncAnswer(ErrorCode.unknown_member_id)
        refusal = identity_refusal(group, member_id, instance_id)
        if refusal is not None:
            return SyncAnswer(refusal)
        if generation_id != group.generation_id:
            return SyncAnswer(ErrorCode.illegal_generation)
        if group.state is GroupState.PREPARING_REBALANCE:
            return SyncAnswer(ErrorCode.rebalance_in_progress)
        member = group.members[member_id]
        member.heard_ms = self._clock_ms()
        if group.state is GroupState.STABLE:
            return self._synced(group, member)
        if member_id == group.leader_id:
            for other in group.members.values():
                other.assignment = assignments.get(other.member_id, b"")
            group.state = GroupState.STABLE
            for other in group.members.values():
                answer_sync(other, self._synced(group, other))
            return self._synced(group, member)
        member.synced = asyncio.get_running_loop().create_future()
        return await member.synced

    def _synced(self, group: ClassicGroup, member: ClassicMember) -> SyncAnswer:
        return SyncAnswer(
            ErrorCode.none, member.assignment, group.protocol_type, group.protocol_name
        )

    def heartbeat(
        self, group_id: str, member_id: str, generation_id: int, instance_id: str | None = None
    ) -> ErrorCode:
        """Record the member as alive; UNKNOWN_MEMBER_ID if it is not in the group,
        FENCED_INSTANCE_ID if another member holds its instance id, REBALANCE_IN_PROGRESS while
        the group waits for rejoins (so it rejoins), ILLEGAL_GENERATION for another generation,
        else NONE."""
        group = self._groups.get(group_id)
        if group is not None:
            self._expire(group)
        if group is None:
            return ErrorCode.unknown_member_id
        refusal = identity_refusal(group, member_id, instance_id)
        if refusal is not None:
            return refusal
        group.members[member_id].heard_ms = self._clock_ms()
        if group.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        if generation_id != group.generation_id:
            return ErrorCode.illegal_generation
        return ErrorCode.none

    def leave(self, group_id: str, member_id: str, instance_id: str | None = None) -> ErrorCode:
        """Remove a member (the group rebalances if others remain): `member_id`, or with no
        member id the static member holding `instance_id` (an administrator's removal), or an id
        handed out and not used yet. UNKNOWN_MEMBER_ID if there is none, FENCED_INSTANCE_ID if
        `instance_id` is held by another member, else NONE."""
        group = self._groups.get(group_id)
        if group is None:
            return ErrorCode.unknown_member_id
        if not member_id:
            member_id = group.static_members.get(instance_id or "", "")
            instance_id = None  # named by it: nothing else to match
        if member_id in group.pending and instance_id is None:
            del group.pending[member_id]
            if not group.members and not group.pending:
                del self._groups[group_id]
            return ErrorCode.none
        refusal = identity_refusal(group, member_id, instance_id)
        if refusal is not None:
            return refusal
        self._remove(group, member_id, "left")
        return ErrorCode.none

    def reset(self) -> None:
        """Forget every group (this node stopped coordinating): waiters learn it."""
        self._expiries.clear()
        for group in self._groups.values():
            if group.join_deadline is not None:
                group.join_deadline.cancel()
            for member in group.members.values():
                if member.joined is not None and not member.joined.done():
                    member.joined.set_result(
                        JoinAnswer(ErrorCode.not_coordinator, member.member_id)
                    )
                answer_sync(member, SyncAnswer(ErrorCode.not_coordinator))
        self._groups.clear()

    # -- membership changes ------------------------------------------------------------------

    def _expire(self, group: ClassicGroup) -> None:
        """Remove the members whose session ended and the handed-out ids past theirs; a group
        left with neither is forgotten."""
        now_ms = self._clock_ms()
        for member_id, since_ms in list(group.pending.items()):
            if now_ms - since_ms > _PENDING_MEMBER_MS:
                del group.pending[member_id]
        for member in list(group.members.values()):
            if not member.waiting and now_ms - member.heard_ms > member.session_timeout_ms:
                self._remove(group, member.member_id, "timed out")
        if not group.members and not group.pending and self._groups.get(group.group_id) is group:
            del self._groups[group.group_id]

    # -- sessions on the coordinator's timer -------------------------------------------------

    def _queue_session(self, group: ClassicGroup, member: ClassicMember) -> None:
        """Queue `member`'s session end (one entry per member: `expiry_queued_ms`)."""
        start_ms = self._clock_ms() if member.waiting else member.heard_ms
        member.expiry_queued_ms = start_ms + member.session_timeout_ms + 1
        self._expiries.push(member.expiry_queued_ms, group.group_id, member.member_id)

    def _on_due(self, group_id: str, member_id: str, deadline_ms: int) -> None:
        """An entry's deadline passed: expire its group's ended sessions and queue the member
        again if it lives on; an entry of a member since gone (or queued anew) does nothing."""
        group = self._groups.get(group_id)
        member = None if group is None else group.members.get(member_id)
        if group is None or (member is None and member_id not in group.pending):
            return
        if member is not None:
            if member.expiry_queued_ms != deadline_ms:
                return
            member.expiry_queued_ms = None
        self._expire(group)
        if member is not None and group.members.get(member_id) is member:
            self._queue_session(group, member)

    def _queued(self) -> Iterator[tuple[int, str, str]]:
        """Every entry the expiry queue should hold (it rebuilds from these)."""
        for group in self._groups.values():
            for member in group.members.values():
                if member.expiry_queued_ms is not None:
                    yield member.expiry_queued_ms, group.group_id, member.member_id
            for member_id, since_ms in group.pending.items():
                yield since_ms + _PENDING_MEMBER_MS + 1, group.group_id, member_id

    def _remove(self, group: ClassicGroup, member_id: str, reason: str) -> None:
        member = group.members.pop(member_id)
        if (
            member.instance_id is not None
            and group.static_members.get(member.instance_id) == member_id
        ):
            del group.static_members[member.instance_id]
        if member.joined is not None and not member.joined.done():
            member.joined.set_result(JoinAnswer(ErrorCode.unknown_member_id, member_id))
        answer_sync(member, SyncAnswer(ErrorCode.unknown_member_id))
        if group.members:
            self._prepare_rebalance(group, f"member {member_id} {reason}")
            self._maybe_complete_join(group)
        elif group.state is not GroupState.PREPARING_REBALANCE:
            group.state, group.leader_id = GroupState.EMPTY, ""
            group.generation_id += 1
        else:
            self._complete_join(group)
        if not group.members and not group.pending and self._groups.get(group.group_id) is group:
            del self._groups[group.group_id]


# A handed-out member id not used to join within this long is forgotten.
_PENDING_MEMBER_MS = 60_000
_CONSUMER_PROTOCOL = "consumer"  # the protocol type whose metadata names the subscription
