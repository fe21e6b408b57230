"""A consumer group's committed offsets on the Kafka wire: OffsetCommit, OffsetFetch,
OffsetDelete, and DeleteGroups, which deletes a group (its offsets) once it has no members.

Committed offsets are raftlog's: `CommitGroupOffsets` through the metadata quorum, answered
only once committed, and read back from the node's metadata state. With each offset the state
keeps what Kafka's OffsetCommit carries besides: the leader epoch of the last record consumed
(KIP-320) and the client's metadata string, bounded by `metadata.group_offset_metadata_chars_max`
(Kafka's offset.metadata.max.bytes; a longer one is that partition's
OFFSET_METADATA_TOO_LARGE, the others are committed).

These APIs serve both group protocols. A commit to a group with members of raftlog's
coordinator (KIP-848, gRPC) is checked by that coordinator, the same check the gRPC commit gets
(the member id, its epoch, and that it owns the partitions); any other by the classic groups
(`ClassicGroups.check_member`: the member and its generation).

A group exists, for DeleteGroups and OffsetDelete, while it has members in either coordinator,
a classic group record, or committed offsets; they answer GROUP_ID_NOT_FOUND for any other, as
Kafka does. Both commit their change through the metadata quorum (DeleteGroup,
DeleteGroupOffsets) before they answer. Kafka runs the check and the write in one step of its
coordinator; here a member may join between the two (its offsets are then gone, as if the
deletion had come just before it joined).
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from raftlog import errors
from raftlog.metadata import ErrorCode as MetadataErrorCode
from raftlog.metadata.commands import (
    OFFSETS_PER_COMMIT_MAX,
    Command,
    DeleteGroup,
    DeleteGroupOffsets,
    commit_group_offsets,
    offset_metadata_chars,
)
from raftlog.metadata.consumer_groups import GroupErrorCode
from raftlog.metadata.model import NO_EPOCH, CommittedOffset
from raftlog.rpc.kafka.classic_group_handlers import consumer_group_has_members, coordinating
from raftlog.rpc.kafka.consumer_group_handlers import commit_error
from raftlog.rpc.kafka.context import KafkaContext
from raftlog.rpc.kafka.errors import metadata_result_error
from raftlog.rpc.kafka.schema import NO_THROTTLE, build, response_module
from raftlog.rpc.security import Permission
from raftlog.types import PartitionId

__all__ = [
    "DELETE_GROUPS",
    "OFFSET_COMMIT",
    "OFFSET_DELETE",
    "OFFSET_FETCH",
    "delete_groups",
    "offset_commit",
    "offset_delete",
    "offset_fetch",
]

OFFSET_COMMIT, OFFSET_FETCH, DELETE_GROUPS, OFFSET_DELETE = 8, 9, 42, 47
_COMMIT_TIMEOUT_S = 10.0
_NOT_COMMITTED = CommittedOffset(-1)  # what OffsetFetch answers for a partition without one


async def offset_commit(ctx: KafkaContext, request: Any, version: int) -> Any:
    """OffsetCommit v2 to v9: checks the member (the classic generation, or for a KIP-848 group the
    coordinator's epoch and ownership), then commits each offset with its leader epoch (v6 on) and
    metadata through the node port (`submit` of CommitGroupOffsets), answering once committed.
    Per partition: TOPIC_AUTHORIZATION_FAILED without read permission, INVALID_COMMIT_OFFSET_SIZE
    for a negative offset, else the request's code (NOT_COORDINATOR, UNKNOWN_MEMBER_ID,
    ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS, STALE_MEMBER_EPOCH, REQUEST_TIMED_OUT), and for a
    member that may commit, OFFSET_METADATA_TOO_LARGE for metadata past the bound."""
    module = response_module(OFFSET_COMMIT, version)
    wanted = [(t.name, p) for t in request.topics for p in t.partitions]
    refusals = [_partition_refusal(ctx, name, p) for name, p in wanted]
    checked = [w for w, refusal in zip(wanted, refusals, strict=True) if refusal is None]
    code = _check_committer(ctx, request, checked) if coordinating(ctx) else None
    code = ErrorCode.not_coordinator if code is None else code
    limit = ctx.node_config.metadata.group_offset_metadata_chars_max
    too_large = [offset_metadata_chars(p.committed_metadata or "") > limit for _, p in wanted]
    if code is ErrorCode.none:
        committed = [
            w
            for w, refusal, big in zip(wanted, refusals, too_large, strict=True)
            if refusal is None and not big
        ]
        code = await _replicate(ctx, request.group_id, committed)
    by_topic: dict[str, list[Any]] = {}
    for (name, partition), refusal, big in zip(wanted, refusals, too_large, strict=True):
        partition_code = refusal or code
        if refusal is None and code is ErrorCode.none and big:
            partition_code = ErrorCode.offset_metadata_too_large
        by_topic.setdefault(name, []).append(
            build(
                module.OffsetCommitResponsePartition,
                partition_index=partition.partition_index,
                error_code=partition_code,
            )
        )
    return build(
        module.OffsetCommitResponse,
        throttle_time=NO_THROTTLE,
        topics=tuple(
            build(module.OffsetCommitResponseTopic, name=name, partitions=tuple(parts))
            for name, parts in by_topic.items()
        ),
    )


def _partition_refusal(ctx: KafkaContext, topic: str, partition: Any) -> ErrorCode | None:
    """What refuses this partition whoever commits it: no read permission, a negative offset."""
    if not ctx.allowed(Permission.READ, topic):
        return ErrorCode.topic_authorization_failed
    if partition.committed_offset < 0:
        return ErrorCode.invalid_commit_offset_size
    return None


def _check_committer(ctx: KafkaContext, request: Any, wanted: list[tuple[str, Any]]) -> ErrorCode:
    """Whether the request's member (or a committer outside any membership) may commit these."""
    generation = int(getattr(request, "generation_id_or_member_epoch", -1))
    if consumer_group_has_members(ctx, request.group_id):
        partitions = [(name, int(p.partition_index)) for name, p in wanted]
        refusal, _ = ctx.consumer_groups.coordinator.check_commit(
            request.group_id, request.member_id or "", generation, partitions
        )
        return ErrorCode.none if refusal is GroupErrorCode.NONE else commit_error(refusal)
    instance_id = getattr(request, "group_instance_id", None) or None  # v7 on
    return ctx.groups.check_member(
        request.group_id, request.member_id or "", generation, instance_id
    )


async def _replicate(ctx: KafkaContext, group_id: str, wanted: list[tuple[str, Any]]) -> ErrorCode:
    """Commit the offsets through the metadata quorum; the first refusal's code, else NONE."""
    entries = [
        (
            name,
            PartitionId(int(p.partition_index)),
            int(p.committed_offset),
            max(int(getattr(p, "committed_leader_epoch", NO_EPOCH)), NO_EPOCH),  # any < 0: none
            p.committed_metadata or "",
        )
        for name, p in wanted
        if p.partition_index >= 0
    ]
    for command in commit_group_offsets(group_id, entries):
        code = await _submit(ctx, command)
        if code is not ErrorCode.none:
            return code
    return ErrorCode.none


async def _submit(ctx: KafkaContext, command: Command) -> ErrorCode:
    """Commit `command` through the metadata quorum: NONE once committed, else why not (a group
    with no offsets left is GROUP_ID_NOT_FOUND)."""
    try:
        result = await ctx.node.submit(command, timeout_s=_COMMIT_TIMEOUT_S)
    except errors.NotLeaderError:
        return ErrorCode.not_coordinator
    except (errors.RaftlogError, TimeoutError):
        return ErrorCode.request_timed_out
    if result.code is MetadataErrorCode.UNKNOWN_GROUP:
        return ErrorCode.group_id_not_found
    return ErrorCode.none if result.ok else metadata_result_error(result.code)


async def offset_fetch(ctx: KafkaContext, request: Any, version: int) -> Any:
    """OffsetFetch v1 to v9 (v8 on: several groups; v9: a KIP-848 member, whose epoch is checked):
    committed offsets of the partitions asked, or every committed one, with the leader epoch (v5
    on) and metadata each was committed with, read from the node port's metadata copy; -1, -1 and
    "" where none is committed. Answers NOT_COORDINATOR off the controller, the commit check's
    code (STALE_MEMBER_EPOCH, UNKNOWN_MEMBER_ID) for a refused member,
    TOPIC_AUTHORIZATION_FAILED per partition without read permission, and with require_stable
    (v7 on) UNSTABLE_OFFSET_COMMIT per partition an open transaction holds an offset of."""
    module = response_module(OFFSET_FETCH, version)
    if not hasattr(request, "groups"):  # v1-v7: one group
        stable = bool(getattr(request, "require_stable", False))  # v7 on (KIP-447)
        code, topics = _fetch_group(ctx, module, request.group_id, request.topics, None, -1, stable)
        return build(
            module.OffsetFetchResponse, throttle_time=NO_THROTTLE, topics=topics, error_code=code
        )
    answers = []
    for group in request.groups:  # v8 on (KIP-709), v9 with the KIP-848 member
        member_id = getattr(group, "member_id", None)
        epoch = int(getattr(group, "member_epoch", -1))
        code, topics = _fetch_group(
            ctx, module, group.group_id, group.topics, member_id, epoch, request.require_stable
        )
        answers.append(
            build(
                module.OffsetFetchResponseGroup,
                group_id=group.group_id,
                topics=topics,
                error_code=code,
            )
        )
    return build(module.OffsetFetchResponse, throttle_time=NO_THROTTLE, groups=tuple(answers))


def _fetch_group(
    ctx: KafkaContext,
    module: Any,
    group_id: str,
    topics: Any,
    member_id: str | None,
    member_epoch: int,
    require_stable: bool,
) -> tuple[ErrorCode, tuple[Any, ...]]:
    if not coordinating(ctx):
        return ErrorCode.not_coordinator, ()
    if member_id and consumer_group_has_members(ctx, group_id):
        refusal, _ = ctx.consumer_groups.coordinator.check_commit(
            group_id, member_id, member_epoch, ()
        )
        if refusal is not GroupErrorCode.NONE:
            return commit_error(refusal), ()
    state = ctx.node.metadata.state
    committed = state.committed(group_id)
    # Partitions with offsets an open transaction holds: with require_stable the client waits
    # (UNSTABLE_OFFSET_COMMIT is retriable) rather than read an offset about to change.
    unstable = (
        {
            tp
            for (group, _), offsets in state.pending_transaction_offsets().items()
            if group == group_id
            for tp in offsets
        }
        if require_stable
        else set()
    )
    if topics is None:
        wanted: dict[str, list[int]] = {}
        for topic, partition in committed:
            wanted.setdefault(topic, []).append(partition)
    else:
        wanted = {t.name: [int(p) for p in t.partition_indexes] for t in topics}
    topic_class = (
        getattr(module, "OffsetFetchResponseTopic", None) or module.OffsetFetchResponseTopics
    )
    partition_class = (
        getattr(module, "OffsetFetchResponsePartition", None)
        or module.OffsetFetchResponsePartitions
    )

    def answer(name: str, partition: int) -> Any:
        """One partition's committed offset, leader epoch and metadata (or none)."""
        found = committed.get((name, partition), _NOT_COMMITTED)
        return build(
            partition_class,
            partition_index=partition,
            committed_offset=found.offset,
            committed_leader_epoch=found.leader_epoch,
            metadata=found.metadata,
            error_code=ErrorCode.topic_authorization_failed
            if not ctx.allowed(Permission.READ, name)
            else ErrorCode.unstable_offset_commit
            if (name, partition) in unstable
            else ErrorCode.none,
        )

    return ErrorCode.none, tuple(
        build(
            topic_class,
            name=name,
            partitions=tuple(answer(name, partition) for partition in partitions),
        )
        for name, partitions in wanted.items()
    )


def _missing_group(ctx: KafkaContext, group_id: str) -> ErrorCode | None:
    """Why DeleteGroups or OffsetDelete cannot find `group_id` here: NOT_COORDINATOR off the
    controller, INVALID_GROUP_ID for an empty id, GROUP_ID_NOT_FOUND for a group with no
    members, classic record or committed offsets; None when it exists."""
    if not coordinating(ctx):
        return ErrorCode.not_coordinator
    if not group_id:
        return ErrorCode.invalid_group_id
    exists = (
        consumer_group_has_members(ctx, group_id)
        or ctx.groups.holds(group_id)
        or ctx.node.metadata.state.has_consumer_group(group_id)
    )
    return None if exists else ErrorCode.group_id_not_found


async def delete_groups(ctx: KafkaContext, request: Any, version: int) -> Any:
    """DeleteGroups v0 to v2: each group in turn, as Kafka's coordinator deletes it: NOT_COORDINATOR
    off the controller, INVALID_GROUP_ID for an empty id, GROUP_ID_NOT_FOUND for a group that does
    not exist, NON_EMPTY_GROUP while it has members (of either protocol); else its committed
    offsets are deleted through the node port (`submit` of DeleteGroup) and its classic record
    (ids handed out) dropped."""
    module = response_module(DELETE_GROUPS, version)
    results = []
    for group_id in request.groups_names:
        code = await _delete_group(ctx, str(group_id))
        results.append(build(module.DeletableGroupResult, group_id=group_id, error_code=code))
    return build(module.DeleteGroupsResponse, throttle_time=NO_THROTTLE, results=tuple(results))


async def _delete_group(ctx: KafkaContext, group_id: str) -> ErrorCode:
    missing = _missing_group(ctx, group_id)
    if missing is not None:
        return missing
    if consumer_group_has_members(ctx, group_id) or ctx.groups.has_members(group_id):
        return ErrorCode.non_empty_group
    ctx.groups.forget(group_id)
    if not ctx.node.metadata.state.has_consumer_group(group_id):
        return ErrorCode.none  # a classic record without offsets: nothing to commit
    return await _submit(ctx, DeleteGroup(group_id))


async def offset_delete(ctx: KafkaContext, request: Any, version: int) -> Any:
    """OffsetDelete v0: deletes a group's committed offsets of the partitions named, as Kafka does.
    Top level: NOT_COORDINATOR off the controller, INVALID_GROUP_ID for an empty id,
    GROUP_ID_NOT_FOUND for a group that does not exist, NON_EMPTY_GROUP for a classic group with
    members of a protocol other than "consumer". Per partition: TOPIC_AUTHORIZATION_FAILED without
    read permission, UNKNOWN_TOPIC_OR_PARTITION for one the cluster does not have,
    GROUP_SUBSCRIBED_TO_TOPIC when a member consumes its topic; the others are deleted through the
    node port (`submit` of DeleteGroupOffsets; those without an offset need nothing) and NONE, or
    the deletion's code when it fails."""
    module = response_module(OFFSET_DELETE, version)
    group_id = str(request.group_id)
    refusal = _missing_group(ctx, group_id) or ctx.groups.offset_delete_refusal(group_id)
    if refusal is not None:
        return build(
            module.OffsetDeleteResponse, error_code=refusal, throttle_time=NO_THROTTLE, topics=()
        )
    wanted = [(t.name, int(p.partition_index)) for t in request.topics for p in t.partitions]
    codes = [_offset_delete_code(ctx, group_id, topic, p) for topic, p in wanted]
    committed = ctx.node.metadata.state.committed(group_id)
    doomed = tuple(
        dict.fromkeys(  # a partition named twice is deleted once
            (topic, PartitionId(p))
            for (topic, p), code in zip(wanted, codes, strict=True)
            if code is ErrorCode.none and (topic, p) in committed
        )
    )
    outcome = ErrorCode.none
    for start in range(0, len(doomed), OFFSETS_PER_COMMIT_MAX):
        chunk = doomed[start : start + OFFSETS_PER_COMMIT_MAX]
        outcome = await _submit(ctx, DeleteGroupOffsets(group_id, chunk))
        if outcome is not ErrorCode.none:
            break
    by_topic: dict[str, list[Any]] = {}
    for (topic, partition), code in zip(wanted, codes, strict=True):
        by_topic.setdefault(topic, []).append(
            build(
                module.OffsetDeleteResponsePartition,
                partition_index=partition,
                error_code=outcome if code is ErrorCode.none else code,
            )
        )
    return build(
        module.OffsetDeleteResponse,
        error_code=ErrorCode.none,
        throttle_time=NO_THROTTLE,
        topics=tuple(
            build(module.OffsetDeleteResponseTopic, name=name, partitions=tuple(parts))
            for name, parts in by_topic.items()
        ),
    )


def _offset_delete_code(ctx: KafkaContext, group_id: str, topic: str, partition: int) -> ErrorCode:
    """One partition's answer before anything is deleted: NONE if its offset may go."""
    if not ctx.allowed(Permission.READ, topic):
        return ErrorCode.topic_authorization_failed
    if ctx.node.metadata.state.partition(topic, partition) is None:
        return ErrorCode.unknown_topic_or_partition
    consumers = ctx.consumer_groups
    subscribed = ctx.groups.is_subscribed(group_id, topic)
    if not subscribed and consumer_group_has_members(ctx, group_id):
        described = consumers.coordinator.describe(group_id)
        subscribed = described is not None and any(topic in m.topics for m in described.members)
    return ErrorCode.group_subscribed_to_topic if subscribed else ErrorCode.none
