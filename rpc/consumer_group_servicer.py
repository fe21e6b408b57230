"""The gRPC Groups service: consumer group heartbeats, offset commits and fetches (raftlog.v1).

`ConsumerGroupServicer` maps protobuf to the node's `ConsumerGroupService`
(`raftlog.metadata.consumer_group_service`, the coordinator both front ends use) and back. A
node that is not the controller answers NOT_COORDINATOR with the controller's id and
address; clients follow the hint (retriable).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from raftlog import errors
from raftlog.metadata import Command
from raftlog.metadata.commands import (
    OFFSETS_PER_COMMIT_MAX,
    CommitGroupOffsets,
    DeleteGroup,
    ErrorCode,
)
from raftlog.metadata.consumer_group_service import ConsumerGroupService
from raftlog.metadata.consumer_groups import (
    GroupErrorCode,
    HeartbeatRequest,
    TopicPartition,
)
from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.rpc.v1 import raftlog_pb2_grpc as pb_grpc
from raftlog.types import PartitionId

__all__ = ["ConsumerGroupServicer"]

_GROUP_CODES = {
    GroupErrorCode.INVALID_REQUEST: pb.INVALID_REQUEST,
    GroupErrorCode.UNKNOWN_MEMBER_ID: pb.UNKNOWN_MEMBER,
    GroupErrorCode.FENCED_MEMBER_EPOCH: pb.FENCED_MEMBER_EPOCH,
    GroupErrorCode.GROUP_MAX_SIZE_REACHED: pb.GROUP_MAX_SIZE_REACHED,
    GroupErrorCode.NOT_OWNER: pb.NOT_PARTITION_OWNER,
    GroupErrorCode.NON_EMPTY_GROUP: pb.NON_EMPTY_GROUP,
    # Only Kafka's heartbeats name instance ids; a gRPC request never meets these.
    GroupErrorCode.FENCED_INSTANCE_ID: pb.FENCED,
    GroupErrorCode.UNRELEASED_INSTANCE_ID: pb.FENCED,
}
_RESULT_CODES = {
    ErrorCode.UNKNOWN_TOPIC: pb.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.UNKNOWN_PARTITION: pb.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.UNKNOWN_GROUP: pb.UNKNOWN_GROUP,
}


def _error(code: int, message: str, *, retriable: bool = False) -> pb.Error:
    return pb.Error(code=code, message=message, retriable=retriable, leader_id=-1)  # type: ignore[arg-type]


def _group_error(code: GroupErrorCode, message: str) -> pb.Error | None:
    if code is GroupErrorCode.NONE:
        return None
    return _error(_GROUP_CODES[code], f"{code.value}: {message}")


def _partitions(entries: Any) -> frozenset[TopicPartition]:
    return frozenset((e.topic, int(p)) for e in entries for p in e.partitions)


def _topic_partitions(partitions: frozenset[TopicPartition]) -> list[pb.TopicPartitions]:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(partition)
    return [pb.TopicPartitions(topic=t, partitions=p) for t, p in by_topic.items()]


class ConsumerGroupServicer(pb_grpc.GroupsServicer):
    def __init__(
        self, service: ConsumerGroupService, leader_address: Callable[[int | None], str]
    ) -> None:
        self._service = service
        self._leader_address = leader_address

    def _not_coordinator(self) -> pb.Error:
        controller = self._service.controller_id()
        return pb.Error(
            code=pb.NOT_COORDINATOR,
            message=f"not the group coordinator (the controller is node {controller})",
            retriable=True,
            leader_id=-1 if controller is None else int(controller),
            leader_address=self._leader_address(controller),
        )

    async def ConsumerGroupHeartbeat(
        self, request: pb.ConsumerGroupHeartbeatRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ConsumerGroupHeartbeatResponse:
        service = self._service
        if not service.coordinating():
            return pb.ConsumerGroupHeartbeatResponse(error=self._not_coordinator())
        now_ms = service.clock_ms()
        service.coordinator.expire(now_ms)
        heartbeat = HeartbeatRequest(
            group_id=request.group_id,
            member_id=request.member_id,
            member_epoch=request.member_epoch,
            topics=tuple(sorted(set(request.topics))),
            owned=_partitions(request.owned),
            rebalance_timeout_ms=request.rebalance_timeout_ms,
        )
        answer = service.coordinator.heartbeat(
            heartbeat, partition_counts=service.partition_counts(), now_ms=now_ms
        )
        return pb.ConsumerGroupHeartbeatResponse(
            error=_group_error(answer.error, answer.message),
            member_id=answer.member_id,
            member_epoch=answer.member_epoch,
            assignment=_topic_partitions(answer.assignment),
            heartbeat_interval_ms=answer.heartbeat_interval_ms,
            session_timeout_ms=service.coordinator.limits.session_timeout_ms,
        )

    async def OffsetCommit(
        self, request: pb.OffsetCommitRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.OffsetCommitResponse:
        service = self._service
        if not service.coordinating():
            return pb.OffsetCommitResponse(error=self._not_coordinator())
        if not 1 <= len(request.offsets) <= OFFSETS_PER_COMMIT_MAX:
            message = f"offsets: 1-{OFFSETS_PER_COMMIT_MAX} per commit, got {len(request.offsets)}"
            return pb.OffsetCommitResponse(error=_error(pb.INVALID_REQUEST, message))
        code, message = service.coordinator.check_commit(
            request.group_id,
            request.member_id,
            request.member_epoch,
            [(o.topic, o.partition) for o in request.offsets],
        )
        refusal = _group_error(code, message)
        if refusal is not None:
            return pb.OffsetCommitResponse(error=refusal)
        if any(o.partition < 0 or o.offset < 0 for o in request.offsets):
            message = "offsets: partitions and offsets must not be negative"
            return pb.OffsetCommitResponse(error=_error(pb.INVALID_REQUEST, message))
        command = CommitGroupOffsets(
            request.group_id,
            tuple((o.topic, PartitionId(o.partition), o.offset) for o in request.offsets),
        )
        return pb.OffsetCommitResponse(error=await self._submit(command, request.timeout_ms))

    async def _submit(self, command: Command, timeout_ms: int) -> pb.Error | None:
        try:
            result = await self._service.submit_command(command, timeout_ms)
        except errors.NotLeaderError:
            return self._not_coordinator()
        except (errors.RaftlogError, TimeoutError) as error:
            message = f"not committed in time: {error or 'timeout'}"
            return _error(pb.REQUEST_TIMED_OUT, message, retriable=True)
        if result.ok:
            return None
        code = _RESULT_CODES.get(result.code, pb.INVALID_REQUEST)
        return _error(code, f"{result.code.value}: {result.message}")

    async def OffsetFetch(
        self, request: pb.OffsetFetchRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.OffsetFetchResponse:
        service = self._service
        if not service.coordinating():
            return pb.OffsetFetchResponse(error=self._not_coordinator())
        committed = service.metadata().committed_offsets(request.group_id)
        wanted = sorted(_partitions(request.partitions)) or sorted(committed)
        offsets = [
            pb.PartitionOffset(topic=t, partition=p, offset=committed.get((t, p), -1))
            for t, p in wanted
        ]
        return pb.OffsetFetchResponse(offsets=offsets)

    async def LeaveGroup(
        self, request: pb.LeaveGroupRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.LeaveGroupResponse:
        if not self._service.coordinating():
            return pb.LeaveGroupResponse(error=self._not_coordinator())
        if not self._service.coordinator.leave(request.group_id, request.member_id):
            message = f"member {request.member_id!r} is not in group {request.group_id!r}"
            return pb.LeaveGroupResponse(error=_error(pb.UNKNOWN_MEMBER, message))
        return pb.LeaveGroupResponse()

    async def DeleteGroup(
        self, request: pb.DeleteGroupRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DeleteGroupResponse:
        service = self._service
        if not service.coordinating():
            return pb.DeleteGroupResponse(error=self._not_coordinator())
        if service.coordinator.has_members(request.group_id):
            message = f"group {request.group_id!r} has members; they must leave first"
            return pb.DeleteGroupResponse(error=_error(pb.NON_EMPTY_GROUP, message))
        command = DeleteGroup(request.group_id)
        return pb.DeleteGroupResponse(error=await self._submit(command, request.timeout_ms))
