"""KIP-848's consumer group protocol: ConsumerGroupHeartbeat and ConsumerGroupDescribe.

A second front end onto raftlog's own group coordinator (`raftlog.rpc.consumer_group_servicer`'s
`ConsumerGroupService`, the one the gRPC `Groups` service uses): membership, the server-side sticky
assignment, epochs, fencing and expiry are all the coordinator's. What this module adds is
the Kafka wire's shape:

- Topics are named by id on the wire (assignments and owned partitions) and by name in the
  coordinator; both ids come from the metadata state (`topic_uuid`), the ids Metadata
  answers with. An owned partition of a topic id no longer known is dropped (the topic was
  deleted, and the coordinator frees it).
- A Kafka heartbeat leaves out what did not change since the member's last one (its
  subscription, what it owns, its rebalance timeout): those come from the coordinator's
  record of the member. A member the coordinator does not know, sending neither its
  subscription nor an epoch of 0, is answered UNKNOWN_MEMBER_ID and rejoins with a full
  request (a new controller learns ownership from full requests, which librdkafka sends
  after NOT_COORDINATOR).
- The coordinator's answer is the partitions the member may consume now (kept and granted);
  a partition being revoked is left out of it, which is KIP-848's assignment exactly.
- raftlog has one assignor, sticky and balanced, which Kafka calls `uniform`: a heartbeat
  naming another gets UNSUPPORTED_ASSIGNOR. A subscription by regex (RE2 syntax, the whole
  name must match, as Kafka's RE2/J) is resolved to topic names at every heartbeat
  (`topic_regex`), so the coordinator sees names only; a bad pattern gets
  INVALID_REGULAR_EXPRESSION.
- Static membership (an instance id, KIP-848's form of KIP-345) is the coordinator's: a member
  leaving with epoch -2 keeps its assignment for its session, and a member joining with its
  instance id takes its place. A heartbeat that leaves the instance id out (unchanged) gets
  the one on record.
- A group is either classic (`ClassicGroups`, this listener's JoinGroup/SyncGroup) or run
  by the coordinator: a heartbeat for a group with classic members gets GROUP_ID_NOT_FOUND
  (Kafka's answer when a group is not a consumer group), and JoinGroup for a group with
  coordinator members INCONSISTENT_GROUP_PROTOCOL (`group_handlers`).
- With SASL, the subscription's topics need `read`, as the gRPC heartbeat's do.
"""

from __future__ import annotations

import base64
import datetime
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode
from kio.static.primitive import i32Timedelta

from raftlog.metadata.consumer_groups import (
    GroupDescription,
    GroupErrorCode,
    HeartbeatRequest,
    HeartbeatResponse,
    TopicPartition,
)
from raftlog.rpc.kafka.cluster_handlers import topic_uuid
from raftlog.rpc.kafka.context import KafkaContext
from raftlog.rpc.kafka.schema import NO_THROTTLE, build, response_module, timedelta_ms
from raftlog.rpc.kafka.topic_regex import RegexSubscription
from raftlog.rpc.security import Permission

__all__ = [
    "ASSIGNOR",
    "CONSUMER_GROUP_DESCRIBE",
    "CONSUMER_GROUP_HEARTBEAT",
    "PROTOCOL_TYPE",
    "commit_error",
    "consumer_group_describe",
    "consumer_group_heartbeat",
    "group_state",
]

CONSUMER_GROUP_HEARTBEAT, CONSUMER_GROUP_DESCRIBE = 68, 69
ASSIGNOR = "uniform"
PROTOCOL_TYPE = "consumer"  # as ListGroups names a KIP-848 group
_LEAVE_EPOCHS = (-1, -2)  # -2: a static member leaving for now (its assignment is kept)
_JOIN_EPOCH = 0

_HEARTBEAT_ERRORS = {
    GroupErrorCode.NONE: ErrorCode.none,
    GroupErrorCode.INVALID_REQUEST: ErrorCode.invalid_request,
    GroupErrorCode.UNKNOWN_MEMBER_ID: ErrorCode.unknown_member_id,
    GroupErrorCode.FENCED_MEMBER_EPOCH: ErrorCode.fenced_member_epoch,
    GroupErrorCode.GROUP_MAX_SIZE_REACHED: ErrorCode.group_max_size_reached,
    GroupErrorCode.NON_EMPTY_GROUP: ErrorCode.non_empty_group,
    # Only offset commits are refused this way: the member's view of its assignment is
    # older than the coordinator's, which Kafka calls a stale epoch (it heartbeats, then
    # commits again).
    GroupErrorCode.NOT_OWNER: ErrorCode.stale_member_epoch,
    GroupErrorCode.FENCED_INSTANCE_ID: ErrorCode.fenced_instance_id,
    GroupErrorCode.UNRELEASED_INSTANCE_ID: ErrorCode.unreleased_instance_id,
}


def commit_error(code: GroupErrorCode) -> ErrorCode:
    """The coordinator's refusal of an offset commit (or fetch) as Kafka names it: an epoch
    the coordinator has not given is a stale one for OffsetCommit (KIP-848)."""
    if code is GroupErrorCode.FENCED_MEMBER_EPOCH:
        return ErrorCode.stale_member_epoch
    return _HEARTBEAT_ERRORS[code]


def group_state(description: GroupDescription) -> str:
    """Kafka's name for the group's state: Stable once every member consumes exactly its
    target, Reconciling while partitions move."""
    settled = all(m.assignment == m.target == m.owned for m in description.members)
    return "Stable" if settled else "Reconciling"


def _ms(value: int) -> i32Timedelta:
    return i32Timedelta.parse(datetime.timedelta(milliseconds=value))


async def consumer_group_heartbeat(ctx: KafkaContext, request: Any, version: int) -> Any:
    """ConsumerGroupHeartbeat v0 to v1 (KIP-848), served by `ctx.consumer_groups`' coordinator; the
    node port gives the controller id and the topic ids and names. Answers NOT_COORDINATOR off the
    controller, GROUP_ID_NOT_FOUND for a group with classic members, UNSUPPORTED_ASSIGNOR,
    INVALID_REGULAR_EXPRESSION, INVALID_REQUEST for a join without subscription, UNKNOWN_MEMBER_ID,
    TOPIC_AUTHORIZATION_FAILED for a subscribed topic it may not read, and the coordinator's
    refusals (FENCED_MEMBER_EPOCH, GROUP_MAX_SIZE_REACHED, FENCED_INSTANCE_ID,
    UNRELEASED_INSTANCE_ID...); a refusal carries member epoch -1 and no assignment."""
    module = response_module(CONSUMER_GROUP_HEARTBEAT, version)
    service = ctx.consumer_groups

    def refused(code: ErrorCode, message: str, member_id: str | None = None) -> Any:
        """A heartbeat response refusing with `code` and `message`: epoch -1, no assignment."""
        return build(
            module.ConsumerGroupHeartbeatResponse,
            throttle_time=NO_THROTTLE,
            error_code=code,
            error_message=message,
            member_id=member_id,
            member_epoch=-1,
            heartbeat_interval=_ms(0),
            assignment=None,
        )

    if not service.coordinating():
        controller = ctx.node.controller_id
        return refused(
            ErrorCode.not_coordinator,
            f"not the group coordinator (the controller is node {controller})",
        )
    group_id = str(request.group_id)
    if ctx.groups.follow_term(ctx.controller_term()) and ctx.groups.has_members(group_id):
        return refused(
            ErrorCode.group_id_not_found,
            f"group {group_id!r} has classic-protocol members (JoinGroup): it is not a "
            "consumer group; use one protocol per group",
        )
    assignor = request.server_assignor
    if assignor not in (None, "", ASSIGNOR):
        return refused(
            ErrorCode.unsupported_assignor,
            f"server assignor {assignor!r}: raftlog has only {ASSIGNOR!r} (sticky, balanced)",
        )
    heartbeat = _heartbeat_request(ctx, request, version)
    if isinstance(heartbeat, tuple):
        return refused(*heartbeat)
    denied = sorted(t for t in heartbeat.topics if not ctx.allowed(Permission.READ, t))
    if denied and heartbeat.member_epoch not in _LEAVE_EPOCHS:
        return refused(
            ErrorCode.topic_authorization_failed,
            f"not allowed to read {denied[:10]}",
            heartbeat.member_id,
        )
    now_ms = service.clock_ms()
    service.coordinator.expire(now_ms)
    answer = service.coordinator.heartbeat(
        heartbeat, partition_counts=service.partition_counts(), now_ms=now_ms
    )
    if answer.error is not GroupErrorCode.NONE:
        code = _HEARTBEAT_ERRORS[answer.error]
        return refused(code, f"{answer.error.value}: {answer.message}", answer.member_id or None)
    return _answer(ctx, module, answer)


def _heartbeat_request(
    ctx: KafkaContext, request: Any, version: int
) -> HeartbeatRequest | tuple[ErrorCode, str, str | None]:
    """The coordinator's request: what the Kafka heartbeat left out (unchanged since the
    member's last one) filled in from the coordinator's record; else a refusal."""
    service = ctx.consumer_groups
    group_id, member_id = str(request.group_id), str(request.member_id)
    epoch = int(request.member_epoch)
    known = service.coordinator.member(group_id, member_id)
    instance_id = request.instance_id
    if instance_id is None and known is not None:
        instance_id = known.instance_id  # left out: unchanged
    if epoch in _LEAVE_EPOCHS:
        ctx.topic_regexes.forget(group_id, member_id)
        return HeartbeatRequest(group_id, member_id, epoch, (), frozenset(), 0, instance_id)
    if not member_id and version == 0 and epoch == _JOIN_EPOCH:
        # v0: the coordinator names a joining member (v1 on: the client does, KIP-1082).
        member_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
    continuing = known is not None and epoch != _JOIN_EPOCH
    topics = _subscription(
        ctx, request, group_id, member_id, known.topics if continuing and known else None
    )
    if isinstance(topics, _Refusal):
        return topics.code, topics.message, member_id
    if topics is None:
        if epoch == _JOIN_EPOCH:
            message = "a join (epoch 0) must name its subscription (topic names or a regex)"
            return ErrorCode.invalid_request, message, None
        message = f"member {member_id!r} is not in group {group_id!r}: rejoin with epoch 0"
        return ErrorCode.unknown_member_id, message, member_id
    if request.topic_partitions is not None:
        owned = _owned(ctx, request.topic_partitions)
    elif known is not None and epoch != _JOIN_EPOCH:
        owned = known.owned
    else:
        owned = frozenset()
    timeout_ms = timedelta_ms(request.rebalance_timeout)
    if timeout_ms <= 0:
        # -1: unchanged; a new member gets the most the coordinator allows, as Kafka's
        # coordinator falls back to its own default.
        limit = service.coordinator.limits.rebalance_timeout_ms_max
        timeout_ms = known.rebalance_timeout_ms if known is not None else limit
    return HeartbeatRequest(group_id, member_id, epoch, topics, owned, timeout_ms, instance_id)


@dataclass(frozen=True, slots=True)
class _Refusal:
    code: ErrorCode
    message: str


def _subscription(
    ctx: KafkaContext,
    request: Any,
    group_id: str,
    member_id: str,
    continued_topics: tuple[str, ...] | None,
) -> tuple[str, ...] | _Refusal | None:
    """The member's subscribed topics: the names it sent (or, left out as unchanged, the
    ones on record) and the topics its regex matches now, those it may read; None if it
    sent no subscription and none is on record. `continued_topics` is the coordinator's
    record of a member continuing its membership (None for a join or an unknown member)."""
    regexes = ctx.topic_regexes
    continuing = continued_topics is not None
    on_record = regexes.get(group_id, member_id) if continuing else None
    sent_pattern = getattr(request, "subscribed_topic_regex", None)
    if sent_pattern is not None:
        pattern = str(sent_pattern) or None  # an empty pattern ends the regex subscription
        problem = None if pattern is None else regexes.check(pattern)
        if problem is not None:
            return _Refusal(ErrorCode.invalid_regular_expression, problem)
    else:
        pattern = on_record.pattern if on_record is not None else None
    sent_names = request.subscribed_topic_names
    if sent_names is not None:
        names = tuple(sorted({str(n) for n in sent_names}))
    elif on_record is not None:
        names = on_record.names
    elif continued_topics is not None:
        names = continued_topics  # subscribed by names only, unchanged
    elif pattern is not None:
        names = ()
    else:
        return None
    if pattern is None:
        regexes.forget(group_id, member_id)
        return names
    problem = regexes.put(
        group_id,
        member_id,
        RegexSubscription(pattern, names),
        is_member=lambda g, m: ctx.consumer_groups.coordinator.member(g, m) is not None,
    )
    if problem is not None:
        return _Refusal(ErrorCode.invalid_request, problem)
    topics = [t.name for t in ctx.node.metadata.state.topics()]
    matched = (t for t in regexes.resolve(pattern, topics) if ctx.allowed(Permission.READ, t))
    return tuple(sorted({*names, *matched}))


def _topic_names(ctx: KafkaContext) -> dict[uuid.UUID, str]:
    return {topic_uuid(t.topic_id): t.name for t in ctx.node.metadata.state.topics()}


def _owned(ctx: KafkaContext, entries: Iterable[Any]) -> frozenset[TopicPartition]:
    names = _topic_names(ctx)
    return frozenset(
        (names[e.topic_id], int(p))
        for e in entries
        if e.topic_id in names
        for p in e.partitions
        if p >= 0
    )


def _by_topic(partitions: frozenset[TopicPartition]) -> dict[str, list[int]]:
    grouped: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        grouped.setdefault(topic, []).append(partition)
    return grouped


def _answer(ctx: KafkaContext, module: Any, answer: HeartbeatResponse) -> Any:
    state = ctx.node.metadata.state
    assigned = []
    for name, partitions in _by_topic(answer.assignment).items():
        topic = state.topic(name)
        if topic is not None:  # deleted since: the next heartbeat's target drops it
            assigned.append(
                build(
                    module.TopicPartitions,
                    topic_id=topic_uuid(topic.topic_id),
                    partitions=tuple(partitions),
                )
            )
    leaving = answer.member_epoch in _LEAVE_EPOCHS
    return build(
        module.ConsumerGroupHeartbeatResponse,
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        error_message=None,
        member_id=answer.member_id,
        member_epoch=answer.member_epoch,
        heartbeat_interval=_ms(answer.heartbeat_interval_ms),
        assignment=None if leaving else build(module.Assignment, topic_partitions=tuple(assigned)),
    )


async def consumer_group_describe(ctx: KafkaContext, request: Any, version: int) -> Any:
    """ConsumerGroupDescribe v0 to v1: each group's state, epoch and members with their
    subscriptions and current and target assignments, from `ctx.consumer_groups`' coordinator
    (topic ids from the node port's metadata copy). Answers NOT_COORDINATOR off the controller
    and GROUP_ID_NOT_FOUND for a group the coordinator does not run (clients then try
    DescribeGroups); no permission is checked."""
    module = response_module(CONSUMER_GROUP_DESCRIBE, version)
    coordinating = ctx.consumer_groups.coordinating()
    described = []
    for group_id in request.group_ids:
        description = ctx.consumer_groups.coordinator.describe(group_id) if coordinating else None
        described.append(_described(ctx, module, str(group_id), coordinating, description))
    return build(
        module.ConsumerGroupDescribeResponse, throttle_time=NO_THROTTLE, groups=tuple(described)
    )


def _described(
    ctx: KafkaContext,
    module: Any,
    group_id: str,
    coordinating: bool,
    description: GroupDescription | None,
) -> Any:
    if not coordinating or description is None:
        # Not a consumer group here: clients ask DescribeGroups next (a classic group).
        code = ErrorCode.not_coordinator if not coordinating else ErrorCode.group_id_not_found
        message = "not the group coordinator" if not coordinating else "not a consumer group"
        return build(
            module.DescribedGroup,
            error_code=code,
            error_message=message,
            group_id=group_id,
            group_state="",
            group_epoch=-1,
            assignment_epoch=-1,
            assignor_name="",
            members=(),
        )
    state = ctx.node.metadata.state

    def assignment(partitions: frozenset[TopicPartition]) -> Any:
        """`partitions` as a KIP-848 Assignment grouped by topic, with each topic's name and id (the
        nil UUID for a topic deleted since)."""
        entries = []
        for name, indexes in _by_topic(partitions).items():
            topic = state.topic(name)
            entries.append(
                build(
                    module.TopicPartitions,
                    topic_id=uuid.UUID(int=0) if topic is None else topic_uuid(topic.topic_id),
                    topic_name=name,
                    partitions=tuple(indexes),
                )
            )
        return build(module.Assignment, topic_partitions=tuple(entries))

    return build(
        module.DescribedGroup,
        error_code=ErrorCode.none,
        error_message=None,
        group_id=group_id,
        group_state=group_state(description),
        group_epoch=description.group_epoch,
        assignment_epoch=description.group_epoch,
        assignor_name=ASSIGNOR,
        members=tuple(
            build(
                module.Member,
                member_id=m.member_id,
                instance_id=m.instance_id,
                rack_id=None,
                member_epoch=m.member_epoch,
                client_id="",
                client_host="",
                subscribed_topic_names=m.topics if regex is None else regex.names,
                subscribed_topic_regex=None if regex is None else regex.pattern,
                assignment=assignment(m.assignment),
                target_assignment=assignment(m.target),
                member_type=1,  # a consumer-protocol member
            )
            for m in description.members
            for regex in [ctx.topic_regexes.get(group_id, m.member_id)]
        ),
    )
