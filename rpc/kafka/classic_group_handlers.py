"""The classic consumer-group APIs: FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
LeaveGroup, OffsetCommit, OffsetFetch, ListGroups, DescribeGroups.

The coordinator of every group is the controller (the metadata quorum's leader), as for
raftlog's own groups; elsewhere every group API answers NOT_COORDINATOR and clients ask
FindCoordinator again, except ListGroups, which every node answers with the groups it
coordinates (none off the controller), as every Kafka broker does. Membership is `ClassicGroups` (soft state on the coordinator);
committed offsets are raftlog's: `CommitGroupOffsets` through the metadata quorum, answered
only once committed, and read back from the metadata state.

OffsetCommit and OffsetFetch serve KIP-848 groups too (`consumer_group_handlers`): a commit
to a group with members of raftlog's coordinator is checked by that coordinator, the same
check the gRPC commit gets (the member id, its epoch, and that it owns the partitions).
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from raftlog import errors
from raftlog.metadata.commands import OFFSETS_PER_COMMIT_MAX, CommitGroupOffsets
from raftlog.metadata.consumer_groups import GroupErrorCode
from raftlog.rpc.kafka.classic_group_coordinator import JoinAnswer, JoinRequest
from raftlog.rpc.kafka.consumer_group_handlers import PROTOCOL_TYPE, commit_error, group_state
from raftlog.rpc.kafka.context import KafkaContext, split_address
from raftlog.rpc.kafka.errors import metadata_result_error
from raftlog.rpc.kafka.schema import NO_THROTTLE, build, response_module, timedelta_ms
from raftlog.rpc.security import Permission
from raftlog.types import PartitionId

__all__ = [
    "DESCRIBE_GROUPS",
    "FIND_COORDINATOR",
    "HEARTBEAT",
    "JOIN_GROUP",
    "LEAVE_GROUP",
    "LIST_GROUPS",
    "OFFSET_COMMIT",
    "OFFSET_FETCH",
    "SYNC_GROUP",
    "describe_groups",
    "find_coordinator",
    "heartbeat",
    "join_group",
    "leave_group",
    "list_groups",
    "offset_commit",
    "offset_fetch",
    "sync_group",
]

OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT = 8, 9, 10, 11, 12
LEAVE_GROUP, SYNC_GROUP, DESCRIBE_GROUPS, LIST_GROUPS = 13, 14, 15, 16
_GROUP_KEY, _COMMIT_TIMEOUT_S = 0, 10.0


def _coordinating(ctx: KafkaContext) -> bool:
    return ctx.groups.follow_term(ctx.controller_term())


def _consumer_group(ctx: KafkaContext, group_id: str) -> bool:
    """Whether raftlog's coordinator (KIP-848, gRPC) has members of `group_id`."""
    service = ctx.consumer_groups
    return service.coordinating() and service.coordinator.has_members(group_id)


async def find_coordinator(ctx: KafkaContext, request: Any, version: int) -> Any:
    """FindCoordinator v0 to v4 (v4: several keys): every group's coordinator is the controller,
    read from the node port (`controller_id`) with its registered Kafka address. Answers
    COORDINATOR_NOT_AVAILABLE while no controller, or none with a Kafka address, is known, and
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED for a transaction key (transactions are not supported)."""
    module = response_module(FIND_COORDINATOR, version)
    keys = list(request.coordinator_keys) if hasattr(request, "coordinator_keys") else [request.key]
    answers = [_coordinator(ctx, int(getattr(request, "key_type", _GROUP_KEY))) for _ in keys]
    if hasattr(module, "Coordinator"):
        return build(
            module.FindCoordinatorResponse,
            throttle_time=NO_THROTTLE,
            coordinators=tuple(
                build(module.Coordinator, key=key, **answer)
                for key, answer in zip(keys, answers, strict=True)
            ),
        )
    return build(module.FindCoordinatorResponse, throttle_time=NO_THROTTLE, **answers[0])


def _coordinator(ctx: KafkaContext, key_type: int) -> dict[str, Any]:
    none = {"node_id": -1, "host": "", "port": -1}
    if key_type != _GROUP_KEY:
        message = "raftlog has no transaction coordinator: transactions are not supported"
        return {
            **none,
            "error_code": ErrorCode.transactional_id_authorization_failed,
            "error_message": message,
        }
    controller = ctx.node.controller_id
    address = "" if controller is None else ctx.kafka_address_of(controller)
    if controller is None or not address:
        return {
            **none,
            "error_code": ErrorCode.coordinator_not_available,
            "error_message": "no controller (group coordinator) known yet",
        }
    host, port = split_address(address)
    return {
        "node_id": int(controller),
        "host": host,
        "port": port,
        "error_code": ErrorCode.none,
        "error_message": None,
    }


async def join_group(ctx: KafkaContext, request: Any, version: int) -> Any:
    """JoinGroup v2 to v9, run by `ClassicGroups` in this node's memory (the node port is not
    called). Answers NOT_COORDINATOR off the controller, INVALID_SESSION_TIMEOUT for a session
    timeout not in (0, group_rebalance_timeout_ms_max], INCONSISTENT_GROUP_PROTOCOL for a group
    with KIP-848 members, else what `ClassicGroups.join` answers; the rebalance timeout is
    clamped to the same bound."""
    module = response_module(JOIN_GROUP, version)
    if not _coordinating(ctx):
        return _join_response(module, JoinAnswer(ErrorCode.not_coordinator, request.member_id))
    limits = ctx.node_config.metadata
    session_ms = timedelta_ms(request.session_timeout)
    rebalance_ms = timedelta_ms(getattr(request, "rebalance_timeout", request.session_timeout))
    if not 0 < session_ms <= limits.group_rebalance_timeout_ms_max:
        refusal = JoinAnswer(ErrorCode.invalid_session_timeout, request.member_id)
        return _join_response(module, refusal)
    if _consumer_group(ctx, request.group_id):
        # One protocol per group: its members are KIP-848 (or raftlog client) members.
        refusal = JoinAnswer(ErrorCode.inconsistent_group_protocol, request.member_id)
        return _join_response(module, refusal)
    answer = await ctx.groups.join(
        JoinRequest(
            group_id=request.group_id,
            member_id=request.member_id,
            client_id=ctx.client_id,
            session_timeout_ms=session_ms,
            rebalance_timeout_ms=min(max(rebalance_ms, 1), limits.group_rebalance_timeout_ms_max),
            protocol_type=request.protocol_type,
            protocols=tuple((p.name, bytes(p.metadata)) for p in request.protocols),
        )
    )
    return _join_response(module, answer)


def _join_response(module: Any, answer: JoinAnswer) -> Any:
    return build(
        module.JoinGroupResponse,
        throttle_time=NO_THROTTLE,
        error_code=answer.error,
        generation_id=answer.generation_id,
        protocol_type=answer.protocol_type or "",
        protocol_name=answer.protocol_name or "",
        leader=answer.leader_id,
        skip_assignment=False,
        member_id=answer.member_id,
        members=tuple(
            build(
                module.JoinGroupResponseMember,
                member_id=m.member_id,
                group_instance_id=None,
                metadata=m.metadata,
            )
            for m in answer.members
        ),
    )


async def sync_group(ctx: KafkaContext, request: Any, version: int) -> Any:
    """SyncGroup v0 to v5: the leader hands out assignments, followers get theirs
    (`ClassicGroups.sync`, in memory; the node port is not called). Answers NOT_COORDINATOR off the
    controller, else UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION or REBALANCE_IN_PROGRESS for a member
    that must rejoin."""
    module = response_module(SYNC_GROUP, version)
    if not _coordinating(ctx):
        return build(
            module.SyncGroupResponse,
            throttle_time=NO_THROTTLE,
            error_code=ErrorCode.not_coordinator,
            protocol_type="",
            protocol_name="",
            assignment=b"",
        )
    assignments = {a.member_id: bytes(a.assignment) for a in request.assignments}
    answer = await ctx.groups.sync(
        request.group_id, request.member_id, int(request.generation_id), assignments
    )
    return build(
        module.SyncGroupResponse,
        throttle_time=NO_THROTTLE,
        error_code=answer.error,
        protocol_type=answer.protocol_type or "",
        protocol_name=answer.protocol_name or "",
        assignment=answer.assignment,
    )


async def heartbeat(ctx: KafkaContext, request: Any, version: int) -> Any:
    """Heartbeat v0 to v4 (`ClassicGroups.heartbeat`, in memory): NOT_COORDINATOR off the
    controller, else UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS (rejoin) or ILLEGAL_GENERATION."""
    module = response_module(HEARTBEAT, version)
    code = (
        ctx.groups.heartbeat(request.group_id, request.member_id, int(request.generation_id))
        if _coordinating(ctx)
        else ErrorCode.not_coordinator
    )
    return build(module.HeartbeatResponse, throttle_time=NO_THROTTLE, error_code=code)


async def leave_group(ctx: KafkaContext, request: Any, version: int) -> Any:
    """LeaveGroup v0 to v5 (`ClassicGroups.leave`, in memory); v3 on name several members, each
    answered on its own with a top-level NONE. Answers NOT_COORDINATOR off the controller,
    UNKNOWN_MEMBER_ID for a member not in the group."""
    module = response_module(LEAVE_GROUP, version)
    members = (
        [m.member_id for m in request.members]
        if hasattr(request, "members")
        else [request.member_id]
    )
    if not _coordinating(ctx):
        codes = [ErrorCode.not_coordinator for _ in members]
        top = ErrorCode.not_coordinator
    else:
        codes = [ctx.groups.leave(request.group_id, member) for member in members]
        top = codes[0] if not hasattr(request, "members") else ErrorCode.none
    member_class = getattr(module, "MemberResponse", None)  # v3 and later
    return build(
        module.LeaveGroupResponse,
        throttle_time=NO_THROTTLE,
        error_code=top,
        members=()
        if member_class is None
        else tuple(
            build(member_class, member_id=m, group_instance_id=None, error_code=c)
            for m, c in zip(members, codes, strict=True)
        ),
    )


async def offset_commit(ctx: KafkaContext, request: Any, version: int) -> Any:
    """OffsetCommit v2 to v9: checks the member (the classic generation, or for a KIP-848 group the
    coordinator's epoch and ownership), then commits the offsets through the node port (`submit` of
    CommitGroupOffsets), answering once committed. Per partition: TOPIC_AUTHORIZATION_FAILED without
    read permission, INVALID_COMMIT_OFFSET_SIZE for a negative offset, else one code for the
    request: NOT_COORDINATOR, UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS,
    STALE_MEMBER_EPOCH, REQUEST_TIMED_OUT."""
    module = response_module(OFFSET_COMMIT, version)
    wanted = [(t.name, p) for t in request.topics for p in t.partitions]
    permitted = [(name, p) for name, p in wanted if ctx.allowed(Permission.READ, name)]
    code = await _commit(ctx, request, permitted)
    by_topic: dict[str, list[Any]] = {}
    for name, partition in wanted:
        partition_code = (
            code if partition.committed_offset >= 0 else ErrorCode.invalid_commit_offset_size
        )
        if not ctx.allowed(Permission.READ, name):
            partition_code = ErrorCode.topic_authorization_failed
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


async def _commit(ctx: KafkaContext, request: Any, wanted: list[tuple[str, Any]]) -> ErrorCode:
    """Check the member, then replicate the offsets through the metadata quorum."""
    if not _coordinating(ctx):
        return ErrorCode.not_coordinator
    generation = int(getattr(request, "generation_id_or_member_epoch", -1))
    if _consumer_group(ctx, request.group_id):
        partitions = [(name, int(p.partition_index)) for name, p in wanted]
        refusal, _ = ctx.consumer_groups.coordinator.check_commit(
            request.group_id, request.member_id or "", generation, partitions
        )
        if refusal is not GroupErrorCode.NONE:
            return commit_error(refusal)
    else:
        code = ctx.groups.check_member(request.group_id, request.member_id or "", generation)
        if code is not ErrorCode.none:
            return code
    offsets = tuple(
        (name, PartitionId(int(p.partition_index)), int(p.committed_offset))
        for name, p in wanted
        if p.committed_offset >= 0 and p.partition_index >= 0
    )
    for start in range(0, len(offsets), OFFSETS_PER_COMMIT_MAX):
        command = CommitGroupOffsets(
            request.group_id, offsets[start : start + OFFSETS_PER_COMMIT_MAX]
        )
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
    committed offsets of the partitions asked, or every committed one, read from the node port's
    metadata copy; -1 where none is committed. Answers NOT_COORDINATOR off the controller, the
    commit check's code (STALE_MEMBER_EPOCH, UNKNOWN_MEMBER_ID) for a refused member,
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
    if not _coordinating(ctx):
        return ErrorCode.not_coordinator, ()
    if member_id and _consumer_group(ctx, group_id):
        refusal, _ = ctx.consumer_groups.coordinator.check_commit(
            group_id, member_id, member_epoch, ()
        )
        if refusal is not GroupErrorCode.NONE:
            return commit_error(refusal), ()
    committed = ctx.node.metadata.state.committed_offsets(group_id)
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
    return ErrorCode.none, tuple(
        build(
            topic_class,
            name=name,
            partitions=tuple(
                build(
                    partition_class,
                    partition_index=partition,
                    committed_offset=committed.get((name, partition), -1),
                    committed_leader_epoch=-1,
                    metadata="",
                    error_code=ErrorCode.none
                    if ctx.allowed(Permission.READ, name)
                    else ErrorCode.topic_authorization_failed,
                )
                for partition in partitions
            ),
        )
        for name, partitions in wanted.items()
    )


async def list_groups(ctx: KafkaContext, request: Any, version: int) -> Any:
    """ListGroups v0 to v4: every classic group, KIP-848 group and group with committed offsets
    (from the node port's metadata copy), with state and protocol type, filtered by
    `states_filter` (v4). Off the controller the list is empty, with no error: as every Kafka
    broker lists the groups it coordinates, and clients (the AdminClient) ask every broker."""
    module = response_module(LIST_GROUPS, version)
    if not _coordinating(ctx):
        return build(
            module.ListGroupsResponse,
            throttle_time=NO_THROTTLE,
            error_code=ErrorCode.none,
            groups=(),
        )
    states = set(getattr(request, "states_filter", ()) or ())
    consumer = ctx.consumer_groups.coordinator if ctx.consumer_groups.coordinating() else None
    names = set(ctx.groups.group_ids()) | set(ctx.node.metadata.state.consumer_group_ids())
    names |= set(() if consumer is None else consumer.group_ids())
    listed = []
    for name in sorted(names):
        described = None if consumer is None else consumer.describe(name)
        if described is not None and described.members:
            state_name, protocol_type = group_state(described), PROTOCOL_TYPE
        else:
            classic_state, protocol_type, _, _ = ctx.groups.describe(name)
            state_name = classic_state.value
        if states and state_name not in states:
            continue
        listed.append(
            build(
                module.ListedGroup,
                group_id=name,
                protocol_type=protocol_type,
                group_state=state_name,
            )
        )
    return build(
        module.ListGroupsResponse,
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        groups=tuple(listed),
    )


async def describe_groups(ctx: KafkaContext, request: Any, version: int) -> Any:
    """DescribeGroups v0 to v5: each classic group's state, protocol and members from
    `ClassicGroups` (in memory); an unknown group, or a KIP-848 one, reads as Empty with no
    members. Answers NOT_COORDINATOR off the controller."""
    module = response_module(DESCRIBE_GROUPS, version)
    coordinating = _coordinating(ctx)
    described = []
    for name in request.groups:
        code = ErrorCode.none if coordinating else ErrorCode.not_coordinator
        state, protocol_type, protocol_name, members = (
            ctx.groups.describe(name) if coordinating else (None, "", None, [])
        )
        described.append(
            build(
                module.DescribedGroup,
                error_code=code,
                group_id=name,
                group_state="" if state is None else state.value,
                protocol_type=protocol_type,
                protocol_data=protocol_name or "",
                members=tuple(
                    build(
                        module.DescribedGroupMember,
                        member_id=m.member_id,
                        group_instance_id=None,
                        client_id=m.client_id,
                        client_host="",
                        member_metadata=m.metadata,
                        member_assignment=m.assignment,
                    )
                    for m in members
                ),
                authorized_operations=-(2**31),
            )
        )
    return build(module.DescribeGroupsResponse, throttle_time=NO_THROTTLE, groups=tuple(described))
