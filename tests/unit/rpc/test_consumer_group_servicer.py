"""The Groups servicer with simulated ports (no sockets, no node): routing to the controller,
a fresh coordinator per controller term, ownership-checked commits through the metadata
quorum, and offset fetches."""

from __future__ import annotations

import asyncio
from typing import Any

from raftlog.config import MetadataConfig
from raftlog.metadata.commands import (
    ApplyResult,
    Command,
    CommitGroupOffsets,
    DeleteGroup,
    ErrorCode,
    encode_command,
)
from raftlog.metadata.consumer_group_service import ConsumerGroupService
from raftlog.metadata.state import MetadataState
from raftlog.rpc.consumer_group_servicer import ConsumerGroupServicer
from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.types import NodeId
from tests.unit.metadata.test_metadata_state import Log, create, register


class Ports:
    """The node as the group service sees it: controller term, metadata, submit, clock."""

    def __init__(self) -> None:
        self.log = Log()
        self.log.ok(register(1), register(2), register(3), create("orders"))
        self.term: int | None = 1
        self.now_ms = 0
        self.submitted: list[Command] = []

    async def submit(self, command: Command, *, timeout_s: float) -> ApplyResult:
        assert timeout_s > 0
        self.submitted.append(command)
        return self.log.state.apply(self.log.offset + len(self.submitted), encode_command(command))

    def metadata(self) -> MetadataState:
        return self.log.state

    def servicer(self) -> tuple[ConsumerGroupService, ConsumerGroupServicer]:
        service = ConsumerGroupService.create(
            MetadataConfig(group_session_timeout_ms=1000, group_heartbeat_interval_ms=100),
            controller_term=lambda: self.term,
            controller_id=lambda: NodeId(2),
            metadata=self.metadata,
            submit=self.submit,
            clock_ms=lambda: self.now_ms,
        )
        # The first request of a term starts a coordinator: it grants after a session timeout.
        assert service.coordinating() == (self.term is not None)
        return service, ConsumerGroupServicer(service, lambda node: f"n{node}:9092")


def call(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def heartbeat(
    servicer: ConsumerGroupServicer, member: str, epoch: int, owned: list[int] | None = None
) -> pb.ConsumerGroupHeartbeatResponse:
    request = pb.ConsumerGroupHeartbeatRequest(
        group_id="g",
        member_id=member,
        member_epoch=epoch,
        topics=["orders"],
        owned=[pb.TopicPartitions(topic="orders", partitions=owned or [])],
        rebalance_timeout_ms=5000,
    )
    return call(servicer.ConsumerGroupHeartbeat(request, None))  # type: ignore[arg-type]


def commit(
    servicer: ConsumerGroupServicer, member: str, epoch: int, partition: int, offset: int
) -> Any:
    request = pb.OffsetCommitRequest(
        group_id="g",
        member_id=member,
        member_epoch=epoch,
        offsets=[pb.PartitionOffset(topic="orders", partition=partition, offset=offset)],
        timeout_ms=1000,
    )
    return call(servicer.OffsetCommit(request, None))  # type: ignore[arg-type]


def test_a_node_that_is_not_the_controller_points_to_it() -> None:
    ports = Ports()
    ports.term = None
    _, servicer = ports.servicer()
    answer = heartbeat(servicer, "m1", 0)
    assert answer.error.code == pb.NOT_COORDINATOR and answer.error.retriable
    assert (answer.error.leader_id, answer.error.leader_address) == (2, "n2:9092")


def test_join_commit_fetch_and_the_offsets_are_in_the_metadata_state() -> None:
    ports = Ports()
    _, servicer = ports.servicer()
    ports.now_ms = 1000
    joined = heartbeat(servicer, "m1", 0)
    assert joined.error.code == pb.NONE and joined.session_timeout_ms == 1000
    assert [list(tp.partitions) for tp in joined.assignment] == [[0, 1, 2]]
    assert commit(servicer, "m1", joined.member_epoch, 1, 42).error.code == pb.NONE
    assert ports.submitted == [CommitGroupOffsets("g", (("orders", 1, 42),))]  # type: ignore[arg-type]
    assert ports.log.state.committed_offset("g", "orders", 1) == 42

    refused = commit(servicer, "stranger", 1, 1, 43)
    assert refused.error.code == pb.UNKNOWN_MEMBER and "stranger" in refused.error.message
    fetch = pb.OffsetFetchRequest(
        group_id="g", partitions=[pb.TopicPartitions(topic="orders", partitions=[0, 1])]
    )
    fetched = call(servicer.OffsetFetch(fetch, None))  # type: ignore[arg-type]
    assert [(o.partition, o.offset) for o in fetched.offsets] == [(0, -1), (1, 42)]


def test_a_new_term_starts_an_empty_coordinator_and_members_rebuild_it() -> None:
    ports = Ports()
    service, servicer = ports.servicer()
    ports.now_ms = 1000
    joined = heartbeat(servicer, "m1", 0)
    ports.term = 3  # leadership was lost and won back: what happened between is unknown
    ports.now_ms = 1100
    again = heartbeat(servicer, "m1", joined.member_epoch, [0, 1, 2])
    assert again.error.code == pb.NONE
    description = service.coordinator.describe("g")
    assert description is not None and description.group_epoch == 1, "rebuilt from scratch"
    assert [list(tp.partitions) for tp in again.assignment] == [[0, 1, 2]]


def test_silent_members_expire_at_the_next_heartbeat_and_groups_delete_when_empty() -> None:
    ports = Ports()
    _, servicer = ports.servicer()
    ports.now_ms = 1000
    heartbeat(servicer, "m1", 0)
    ports.log.ok(CommitGroupOffsets("g", (("orders", 0, 5),)))  # type: ignore[arg-type]
    delete = pb.DeleteGroupRequest(group_id="g", timeout_ms=1000)
    refused = call(servicer.DeleteGroup(delete, None))  # type: ignore[arg-type]
    assert refused.error.code == pb.NON_EMPTY_GROUP
    ports.now_ms = 2500
    second = heartbeat(servicer, "m2", 0)
    assert len(second.assignment[0].partitions) == 3, "m1 expired; m2 gets everything"
    leave = pb.LeaveGroupRequest(group_id="g", member_id="m2")
    assert call(servicer.LeaveGroup(leave, None)).error.code == pb.NONE  # type: ignore[arg-type]
    assert call(servicer.DeleteGroup(delete, None)).error.code == pb.NONE  # type: ignore[arg-type]
    assert ports.submitted[-1] == DeleteGroup("g")
    assert ports.log.state.consumer_group_ids() == ()
    assert ErrorCode.UNKNOWN_GROUP.value == "UNKNOWN_GROUP"
