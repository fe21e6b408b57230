"""A worker's range read (`read_range`) against a simulated partition leader, no Spark needed.

The simulated cluster answers Fetch and ListOffsets from a list of batches the way a node does
(whole batches from the one holding the offset, only below the high watermark, errors as
`pb.Error`), and can be scripted to fail: a NOT_LEADER with a hint, an unreachable node, a new
leader whose high watermark still lags, offsets removed by retention. The clock is simulated,
so retry windows pass instantly.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest

from raftlog.client._connection import TopicPartition
from raftlog.client.errors import ClientError, ConnectionFailedError
from raftlog.connectors.spark.access import DataLossError, read_range
from raftlog.connectors.spark.options import parse_source_options
from raftlog.connectors.spark.planning import OffsetRange
from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.storage.records import (
    CONTROL_LEADER_CHANGE,
    RecordInput,
    encode_batch,
    encode_control_batch,
)

pytestmark = pytest.mark.spark


class SimulatedLeader:
    """The part of `Cluster` a worker uses, over an in-memory log of batches."""

    def __init__(self, batches: list[tuple[int, bytes]], *, high_watermark: int) -> None:
        self.batches = batches  # (base offset, bytes), in offset order
        self.log_start = batches[0][0]
        self.high_watermark = high_watermark
        self.faults: deque[Any] = deque()  # scripted: an exception or a pb.Error, per Fetch
        self.hints: list[int | None] = []
        self.stale = 0
        self.now_s = 0.0

    def clock(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.now_s += seconds

    def leader_address(self, tp: TopicPartition) -> str:
        return "sim:1"

    def mark_stale(self, topic: str) -> None:
        self.stale += 1

    def apply_leader_hint(
        self, tp: TopicPartition, leader_id: int | None, address: str | None
    ) -> None:
        self.hints.append(leader_id)

    def call(self, address: str, rpc: str, request: Any, **_: Any) -> Any:
        if rpc == "Log.ListOffsets":
            assert request.spec == pb.EARLIEST
            return pb.ListOffsetsResponse(offset=self.log_start)
        assert rpc == "Log.Fetch"
        if self.faults:
            fault = self.faults.popleft()
            if isinstance(fault, Exception):
                raise fault
            return pb.FetchResponse(error=fault)
        if not self.log_start <= request.offset <= self.high_watermark:
            return pb.FetchResponse(error=pb.Error(code=pb.OFFSET_OUT_OF_RANGE))
        chosen = [
            data
            for base, data in self.batches
            if base + _count(data) > request.offset and base + _count(data) <= self.high_watermark
        ][:2]  # a small max_bytes: at most two batches per answer
        if not chosen:
            self.now_s += request.max_wait_ms / 1000  # a long poll that found nothing new
        return pb.FetchResponse(batches=b"".join(chosen), high_watermark=self.high_watermark)


def _count(batch: bytes) -> int:
    from raftlog.storage.batch import parse_header

    return parse_header(batch).offset_count


def _log() -> list[tuple[int, bytes]]:
    """Offset 0: a leader's no-op; 1..30: three batches of ten records "v1".."v30"."""
    batches = [(0, encode_control_batch(CONTROL_LEADER_CHANGE, b"", timestamp_ms=1))]
    for base in (1, 11, 21):
        records = [RecordInput(None, b"v%d" % (base + i), 1000) for i in range(10)]
        batches.append((base, encode_batch(records, base_offset=base)))
    return batches


def _read(leader: SimulatedLeader, low: int, high: int, **extra: str) -> list[bytes]:
    options = parse_source_options(
        {"bootstrap": "sim:1", "subscribe": "t", **extra}, streaming=True
    )
    batches = read_range(
        options,
        OffsetRange("t", 0, low, high),
        cluster=leader,  # type: ignore[arg-type]
        clock=leader.clock,
        sleep=leader.sleep,
    )
    return [value for batch in batches for value in batch.column("value").to_pylist()]


def test_reads_exactly_the_range_across_batches_and_control_offsets() -> None:
    leader = SimulatedLeader(_log(), high_watermark=31)
    assert _read(leader, 0, 31) == [b"v%d" % i for i in range(1, 31)]
    assert _read(leader, 5, 23) == [b"v%d" % i for i in range(5, 23)]


def test_leader_changes_and_unreachable_nodes_are_retried_without_loss_or_duplicates() -> None:
    leader = SimulatedLeader(_log(), high_watermark=31)
    leader.faults.extend(
        [
            pb.Error(code=pb.NOT_LEADER, leader_id=2, leader_address="sim:2", retriable=True),
            ConnectionFailedError("sim:2", "connection refused", operation="Log.Fetch"),
        ]
    )
    assert _read(leader, 1, 31) == [b"v%d" % i for i in range(1, 31)]
    assert leader.hints == [2] and leader.stale == 1


def test_a_new_leader_lagging_behind_is_waited_for() -> None:
    """A new leader may report a lower high watermark than the offsets planned from its
    predecessor's: the worker reads what is committed and polls until the rest is."""
    leader = SimulatedLeader(_log(), high_watermark=11)
    original_call = leader.call

    def catching_up(address: str, rpc: str, request: Any, **kw: Any) -> Any:
        answer = original_call(address, rpc, request, **kw)
        leader.high_watermark = 31  # committed on the next round
        return answer

    leader.call = catching_up  # type: ignore[method-assign]
    assert _read(leader, 1, 31) == [b"v%d" % i for i in range(1, 31)]


def test_no_progress_for_the_retry_window_fails_naming_the_partition() -> None:
    leader = SimulatedLeader(_log(), high_watermark=11)
    with pytest.raises(ClientError, match="t/0"):
        _read(leader, 1, 31, retryWindowMs="2000")


def test_offsets_removed_by_retention_fail_or_are_skipped_per_fail_on_data_loss() -> None:
    leader = SimulatedLeader(_log()[2:], high_watermark=31)  # offsets 0..10 are gone
    with pytest.raises(DataLossError, match=r"t/0: offsets 1\.\.10 were removed"):
        _read(leader, 1, 31)
    assert _read(leader, 1, 31, failOnDataLoss="false") == [b"v%d" % i for i in range(11, 31)]
