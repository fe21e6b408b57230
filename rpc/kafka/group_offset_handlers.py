"""A consumer group's committed offsets on the Kafka wire: OffsetCommit and OffsetFetch.

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
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from raftlog import errors
from raftlog.metadata.commands import commit_group_offsets, offset_metadata_chars
from raftlog.metadata.consumer_groups import GroupErrorCode
from raftlog.metadata.model import NO_EPOCH, CommittedOffset
from raftlog.rpc.kafka.classic_group_handlers import consumer_group_has_members, coordinating
from raftlog.rpc.kafka.consumer_group_handlers import commit_error
from raftlog.rpc.kafka.context import KafkaContext
from raftlog.rpc.kafka.errors import metadata_result_error
from raftlog.rpc.kafka.schema import NO_THROTTLE, build, response_module
from raftlog.rpc.security import Permission
from raftlog.types import PartitionId

__all__ = ["OFFSET_COMMIT", "OFFSET_FETCH", "offset_commit", "offset_fetch"]

OFFSET_COMMIT, OFFSET_FETCH = 8, 9
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
    return ctx.groups.check_member(request.group_id, request.member_id or "", generation)


async def _replicate(ctx: KafkaContext, group_id: str, wanted: list[tuple[str, Any]]) -> ErrorCode:
    """Commit the offsets through the metadata quorum; the first refusal's code, else NONE."""
    entries = [
        (
            name,
            PartitionId(int(p.partition_index)),
            int(p.committed_offset),
            int(getattr(p, "committed_leader_epoch", NO_EPOCH)),
            p.committed_metadata or "",
        )
        for name, p in wanted
        if p.partition_index >= 0
    ]
    for command in commit_group_offsets(group_id, entries):
        try:
            result = await ctx.node.submit(command, timeout_s=_COMMIT_TIMEOUT_S)
        except errors.NotLeaderError:
            return ErrorCode.not_coordinator
        except (errors.RaftlogError, TimeoutError):
            return ErrorCode.request_timed_out
        if not result.ok:
            return metadata_result_error(result.code)
    return ErrorCode.none


async def offset_fetch(ctx: KafkaContext, request: Any, version: int) -> Any:
    """OffsetFetch v1 to v9 (v8 on: several groups; v9: a KIP-848 member, whose epoch is checked):
    committed offsets of the partitions asked, or every committed one, with the leader epoch (v5
    on) and metadata each was committed with, read from the node port's metadata copy; -1, -1 and
    "" where none is committed. Answers NOT_COORDINATOR off the controller, the commit check's
    code (STALE_MEMBER_EPOCH, UNKNOWN_MEMBER_ID) for a refused member,
    TOPIC_AUTHORIZATION_FAILED per partition without read permission."""
    module = response_module(OFFSET_FETCH, version)
    if not hasattr(request, "groups"):  # v1-v7: one group
        code, topics = _fetch_group(ctx, module, request.group_id, request.topics, None, -1)
        return build(
            module.OffsetFetchResponse, throttle_time=NO_THROTTLE, topics=topics, error_code=code
        )
    answers = []
    for group in request.groups:  # v8 on (KIP-709), v9 with the KIP-848 member
        member_id = getattr(group, "member_id", None)
        epoch = int(getattr(group, "member_epoch", -1))
        code, topics = _fetch_group(ctx, module, group.group_id, group.topics, member_id, epoch)
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
) -> tuple[ErrorCode, tuple[Any, ...]]:
    if not coordinating(ctx):
        return ErrorCode.not_coordinator, ()
    if member_id and consumer_group_has_members(ctx, group_id):
        refusal, _ = ctx.consumer_groups.coordinator.check_commit(
            group_id, member_id, member_epoch, ()
        )
        if refusal is not GroupErrorCode.NONE:
            return commit_error(refusal), ()
    committed = ctx.node.metadata.state.committed(group_id)
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
            error_code=ErrorCode.none
            if ctx.allowed(Permission.READ, name)
            else ErrorCode.topic_authorization_failed,
        )

    return ErrorCode.none, tuple(
        build(
            topic_class,
            name=name,
            partitions=tuple(answer(name, partition) for partition in partitions),
        )
        for name, partitions in wanted.items()
    )
