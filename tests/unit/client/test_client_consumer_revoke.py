"""A revocation drops the revoked partition's Fetch in flight: its answer is never delivered.

The real Groups servicer on a loopback gRPC server with one manual clock (as in
test_client_groups), and a Log whose every partition holds a record at every offset, so each
Fetch the consumer keeps in flight carries a record. Once the group moves a partition to
another member, the first member must not return a record of it again, even from an answer
to a Fetch it sent while it still owned the partition.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from raftlog.client import Consumer, TopicPartition
from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.storage.records import RecordInput, encode_batch
from tests.unit.client.test_client_groups import TOPIC, FakeNode, ManualClock, member, serve


class EndlessLogNode(FakeNode):
    """Every Fetch answers one committed record at the offset asked for."""

    def Fetch(self, request: pb.FetchRequest, context: Any) -> pb.FetchResponse:
        batch = encode_batch([RecordInput(None, b"v", 0)], base_offset=request.offset)
        return pb.FetchResponse(batches=batch, high_watermark=request.offset + 1)


@pytest.fixture
def node() -> Iterator[FakeNode]:
    yield from serve(EndlessLogNode(ManualClock()))


def poll_round(node: FakeNode, *consumers: Consumer) -> dict[int, set[TopicPartition]]:
    """One heartbeat interval; the partitions whose records each consumer returned."""
    node.clock.now_s += 0.1
    returned: dict[int, set[TopicPartition]] = {}
    for index, consumer in enumerate(consumers):
        records = consumer.poll(timeout_ms=0)
        returned[index] = {TopicPartition(r.topic, r.partition) for r in records}
    return returned


def test_a_revoked_partition_returns_no_record_from_a_fetch_sent_before(node: FakeNode) -> None:
    first = member(node)
    first.subscribe([TOPIC])
    for _ in range(3):
        poll_round(node, first)
    assert len(first.assignment()) == 3
    read: set[TopicPartition] = set()
    for _ in range(100):  # the clock stands still: no heartbeat falls due meanwhile
        read |= {TopicPartition(r.topic, r.partition) for r in first.poll(timeout_ms=100)}
        if read == first.assignment():
            break
    assert read == first.assignment(), "every partition's fetches carry records"
    second = member(node)
    second.subscribe([TOPIC])
    moved: set[TopicPartition] = set()
    for _ in range(6):
        # Each poll of `first` leaves a Fetch in flight for every partition it still owns.
        owned_before = first.assignment()
        returned = poll_round(node, first, second)
        moved |= owned_before - first.assignment()
        assert not returned[0] & moved, "a record of a revoked partition was delivered"
        assert returned[0] <= first.assignment()
    assert len(moved) == 1 and moved == second.assignment()
    first.close()
    second.close()
