"""The consumer's group membership against the real Groups servicer on a loopback gRPC
server, with one manual clock shared by the clients and the coordinator (no sleeps): a
revoked partition's position is committed before it moves and the new owner starts there;
a member whose heartbeats go unanswered for the session timeout drops its partitions."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest

from raftlog.client import Consumer, TopicPartition
from raftlog.metadata.commands import CommitGroupOffsets
from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.rpc.v1 import raftlog_pb2_grpc as pb_grpc
from tests.unit.rpc.test_consumer_group_servicer import Ports

TOPIC = "orders"  # three partitions in Ports' metadata


class ManualClock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.now_s += seconds

    def now_ms(self) -> int:
        return int(self.now_s * 1000)


class FakeNode(pb_grpc.LogServicer, pb_grpc.GroupsServicer):  # type: ignore[misc]
    """One node that is the controller: Metadata, empty partitions, and the real Groups
    servicer (its async handlers run one at a time on this thread pool's threads)."""

    def __init__(self, clock: ManualClock) -> None:
        self.ports = Ports()
        self.clock = clock
        self.address = ""
        self._lock = threading.Lock()
        self.service, _ = self.ports.servicer()
        self.service.clock_ms = clock.now_ms
        self.groups = type(_)(self.service, lambda node: "")

    def _run(self, handler: str, request: Any) -> Any:
        with self._lock:
            return asyncio.run(getattr(self.groups, handler)(request, None))

    def ConsumerGroupHeartbeat(self, request: Any, context: Any) -> Any:
        return self._run("ConsumerGroupHeartbeat", request)

    def OffsetCommit(self, request: Any, context: Any) -> Any:
        return self._run("OffsetCommit", request)

    def OffsetFetch(self, request: Any, context: Any) -> Any:
        return self._run("OffsetFetch", request)

    def LeaveGroup(self, request: Any, context: Any) -> Any:
        return self._run("LeaveGroup", request)

    def Metadata(self, request: pb.MetadataRequest, context: Any) -> pb.MetadataResponse:
        partitions = [
            pb.PartitionInfo(partition=p, leader_id=1, leader_epoch=1, replicas=[1])
            for p in range(3)
        ]
        return pb.MetadataResponse(
            cluster_id="fake",
            controller_id=1,
            nodes=[pb.Node(node_id=1, address=self.address, alive=True)],
            topics=[pb.TopicInfo(name=TOPIC, topic_id="t", partitions=partitions)],
        )

    def ListOffsets(self, request: pb.ListOffsetsRequest, context: Any) -> pb.ListOffsetsResponse:
        return pb.ListOffsetsResponse(offset=0)

    def Fetch(self, request: pb.FetchRequest, context: Any) -> pb.FetchResponse:
        return pb.FetchResponse(high_watermark=100)  # nothing to read: positions stay put


@pytest.fixture
def node() -> Iterator[FakeNode]:
    yield from serve(FakeNode(ManualClock()))


def serve(fake: FakeNode) -> Iterator[FakeNode]:
    """`fake` on a loopback gRPC server until the generator is closed."""
    clock = fake.clock
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_LogServicer_to_server(fake, server)
    pb_grpc.add_GroupsServicer_to_server(fake, server)
    fake.address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    clock.now_s = 1.0  # the coordinator's first session timeout has passed: it grants
    try:
        yield fake
    finally:
        server.stop(grace=None).wait()


def member(node: FakeNode) -> Consumer:
    return Consumer(
        node.address,
        group_id="g",
        auto_offset_reset="earliest",
        fetch_max_wait_ms=0,
        request_timeout_ms=1000,  # bounds the retries of close()'s commit to a lost coordinator
        clock=node.clock,
        sleep=node.clock.sleep,
    )


def beat_all(node: FakeNode, *consumers: Consumer, rounds: int = 3) -> None:
    """A few heartbeat intervals in which every consumer polls."""
    for _ in range(rounds):
        node.clock.now_s += 0.1
        for consumer in consumers:
            consumer.poll(timeout_ms=0)


def test_a_revoked_position_is_committed_and_the_new_owner_starts_there(node: FakeNode) -> None:
    first = member(node)
    first.subscribe([TOPIC])
    beat_all(node, first)
    assert first.assignment() == {TopicPartition(TOPIC, p) for p in range(3)}
    for partition in range(3):
        first.seek((TOPIC, partition), 10 + partition)

    second = member(node)
    second.subscribe([TOPIC])
    beat_all(node, first, second, rounds=4)
    moved = second.assignment()
    assert len(moved) == 1 and not moved & first.assignment()
    (tp,) = moved
    assert CommitGroupOffsets("g", ((TOPIC, tp.partition, 10 + tp.partition),)) in (  # type: ignore[comparison-overlap]
        node.ports.submitted
    ), "the old owner committed its position before giving the partition up"
    assert second.position(tp) == 10 + tp.partition
    assert second.committed(tp) == 10 + tp.partition
    first.close()
    second.close()


def test_a_member_without_answers_for_the_session_timeout_drops_its_partitions(
    node: FakeNode,
) -> None:
    consumer = member(node)
    consumer.subscribe([TOPIC])
    beat_all(node, consumer)
    assert len(consumer.assignment()) == 3
    node.ports.term = None  # the node stops coordinating: every heartbeat is refused
    beat_all(node, consumer, rounds=9)  # 0.9 s: still within the 1 s session
    assert len(consumer.assignment()) == 3, "a few lost heartbeats cost nothing"
    beat_all(node, consumer, rounds=3)
    assert consumer.assignment() == set(), "the coordinator may have moved them by now"
    consumer.close()
