"""The classic consumer-group APIs: FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
LeaveGroup, ListGroups, DescribeGroups (a group's offsets: `group_offset_handlers`).

The coordinator of every group is the controller (the metadata quorum's leader), as for
raftlog's own groups; elsewhere every group API answers NOT_COORDINATOR and clients ask
FindCoordinator again, except ListGroups, which every node answers with the groups it
coordinates (none off the controller), as every Kafka broker does. Membership is
`ClassicGroups` (soft state on the coordinator).
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from raftlog.rpc.kafka.classic_group_coordinator import JoinAnswer, JoinRequest
from raftlog.rpc.kafka.consumer_group_handlers import PROTOCOL_TYPE, group_state
from raftlog.rpc.kafka.context import KafkaContext, split_address
from raftlog.rpc.kafka.schema import NO_THROTTLE, build, response_module, timedelta_ms

__all__ = [
    "DESCRIBE_GROUPS",
    "FIND_COORDINATOR",
    "HEARTBEAT",
    "JOIN_GROUP",
    "LEAVE_GROUP",
    "LIST_GROUPS",
    "SYNC_GROUP",
    "consumer_group_has_members",
    "coordinating",
    "describe_groups",
    "find_coordinator",
    "heartbeat",
    "join_group",
    "leave_group",
    "list_groups",
    "sync_group",
]

FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT = 10, 11, 12
LEAVE_GROUP, SYNC_GROUP, DESCRIBE_GROUPS, LIST_GROUPS = 13, 14, 15, 16
_GROUP_KEY, _TRANSACTION_KEY = 0, 1  # FindCoordinator's key types
_SKIP_ASSIGNMENT_VERSION = 9  # JoinGroup's skip_assignment (KIP-814)


def coordinating(ctx: KafkaContext) -> bool:
    """Whether this node coordinates groups now (the controller, its term's first entry
    applied); a new term, or none, resets the classic groups first."""
    return ctx.groups.follow_term(ctx.controller_term())


def consumer_group_has_members(ctx: KafkaContext, group_id: str) -> bool:
    """Whether raftlog's coordinator (KIP-848, gRPC) has members of `group_id`."""
    service = ctx.consumer_groups
    return service.coordinating() and service.coordinator.has_members(group_id)


async def find_coordinator(ctx: KafkaContext, request: Any, version: int) -> Any:
    """FindCoordinator v0 to v4 (v4: several keys): every group's and every transactional id's
    coordinator is the controller, read from the node port (`controller_id`) with its registered
    Kafka address. Answers COORDINATOR_NOT_AVAILABLE while no controller, or none with a Kafka
    address, is known, INVALID_REQUEST for a key type other than GROUP and TRANSACTION."""
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
    if key_type not in (_GROUP_KEY, _TRANSACTION_KEY):
        return {
            **none,
            "error_code": ErrorCode.invalid_request,
            "error_message": f"unknown coordinator key type {key_type}",
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
    with KIP-848 members, else what `ClassicGroups.join` answers (v5 on: static members by their
    group instance id, KIP-345; v9: skip_assignment, KIP-814); the rebalance timeout is clamped
    to the same bound."""
    module = response_module(JOIN_GROUP, version)
    if not coordinating(ctx):
        return _join_response(module, JoinAnswer(ErrorCode.not_coordinator, request.member_id))
    limits = ctx.node_config.metadata
    session_ms = timedelta_ms(request.session_timeout)
    rebalance_ms = timedelta_ms(getattr(request, "rebalance_timeout", request.session_timeout))
    if not 0 < session_ms <= limits.group_rebalance_timeout_ms_max:
        refusal = JoinAnswer(ErrorCode.invalid_session_timeout, request.member_id)
        return _join_response(module, refusal)
    if consumer_group_has_members(ctx, request.group_id):
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
            group_instance_id=_instance_id(request),
            skip_assignment_supported=version >= _SKIP_ASSIGNMENT_VERSION,
        )
    )
    return _join_response(module, answer)


def _instance_id(request: Any) -> str | None:
    """A request's group instance id (None before the version that has one, or for a dynamic
    member; an empty one is none either)."""
    return getattr(request, "group_instance_id", None) or None


def _join_response(module: Any, answer: JoinAnswer) -> Any:
    return build(
        module.JoinGroupResponse,
        throttle_time=NO_THROTTLE,
        error_code=answer.error,
        generation_id=answer.generation_id,
        protocol_type=answer.protocol_type or "",
        protocol_name=answer.protocol_name or "",
        leader=answer.leader_id,
        skip_assignment=answer.skip_assignment,
        member_id=answer.member_id,
        members=tuple(
            build(
                module.JoinGroupResponseMember,
                member_id=m.member_id,
                group_instance_id=m.instance_id,
                metadata=m.metadata,
            )
            for m in answer.members
        ),
    )


async def sync_group(ctx: KafkaContext, request: Any, version: int) -> Any:
    """SyncGroup v0 to v5: the leader hands out assignments, followers get theirs
    (`ClassicGroups.sync`, in memory; the node port is not called). Answers NOT_COORDINATOR off the
    controller, else UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID (v3 on: a static member replaced by
    another with its instance id), ILLEGAL_GENERATION or REBALANCE_IN_PROGRESS for a member
    that must rejoin."""
    module = response_module(SYNC_GROUP, version)
    if not coordinating(ctx):
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
        request.group_id,
        request.member_id,
        int(request.generation_id),
        assignments,
        _instance_id(request),
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
    controller, else UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID (v3 on), REBALANCE_IN_PROGRESS
    (rejoin) or ILLEGAL_GENERATION."""
    module = response_module(HEARTBEAT, version)
    code = (
        ctx.groups.heartbeat(
            request.group_id,
            request.member_id,
            int(request.generation_id),
            _instance_id(request),
        )
        if coordinating(ctx)
        else ErrorCode.not_coordinator
    )
    return build(module.HeartbeatResponse, throttle_time=NO_THROTTLE, error_code=code)


async def leave_group(ctx: KafkaContext, request: Any, version: int) -> Any:
    """LeaveGroup v0 to v5 (`ClassicGroups.leave`, in memory); v3 on name several members, by
    member id, instance id or both (KIP-345: an administrator removes a static member by its
    instance id), each answered on its own with a top-level NONE. Answers NOT_COORDINATOR off
    the controller, UNKNOWN_MEMBER_ID for a member not in the group, FENCED_INSTANCE_ID for an
    instance id another member holds."""
    module = response_module(LEAVE_GROUP, version)
    members: list[tuple[str, str | None]] = (
        [(m.member_id, _instance_id(m)) for m in request.members]
        if hasattr(request, "members")
        else [(request.member_id, None)]
    )
    if not coordinating(ctx):
        codes = [ErrorCode.not_coordinator for _ in members]
        top = ErrorCode.not_coordinator
    else:
        codes = [ctx.groups.leave(request.group_id, *member) for member in members]
        top = codes[0] if not hasattr(request, "members") else ErrorCode.none
    member_class = getattr(module, "MemberResponse", None)  # v3 and later
    return build(
        module.LeaveGroupResponse,
        throttle_time=NO_THROTTLE,
        error_code=top,
        members=()
        if member_class is None
        else tuple(
            build(member_class, member_id=m, group_instance_id=i, error_code=c)
            for (m, i), c in zip(members, codes, strict=True)
        ),
    )


async def list_groups(ctx: KafkaContext, request: Any, version: int) -> Any:
    """ListGroups v0 to v4: every classic group, KIP-848 group and group with committed offsets
    (from the node port's metadata copy), with state and protocol type, filtered by
    `states_filter` (v4). Off the controller the list is empty, with no error: as every Kafka
    broker lists the groups it coordinates, and clients (the AdminClient) ask every broker."""
    module = response_module(LIST_GROUPS, version)
    if not coordinating(ctx):
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
    here = coordinating(ctx)
    described = []
    for name in request.groups:
        code = ErrorCode.none if here else ErrorCode.not_coordinator
        state, protocol_type, protocol_name, members = (
            ctx.groups.describe(name) if here else (None, "", None, [])
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
                        group_instance_id=m.instance_id,
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
