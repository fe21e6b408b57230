"""Stateful test of the producer's Accumulator against a plain model.

Rules append records (with a buffer that may be full), drain ready batches, answer batches in
flight (delivered, failed, or retried) and move a manual clock. After every step: the bytes
reserved equal the estimated sizes of undelivered records, at most one batch per partition is
in flight, and each partition delivers its records in the order they were appended.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from raftlog.client._connection import TopicPartition
from raftlog.client.accumulator import (
    Accumulator,
    ProducerBatch,
    RecordFuture,
    estimate_record_bytes,
)
from raftlog.client.errors import BufferFullError
from raftlog.storage.records import RecordInput

PARTITIONS = [TopicPartition("t", 0), TopicPartition("t", 1)]
BATCH_BYTES_MAX = 1024
BUFFER_BYTES_MAX = 3000
LINGER_MS = 10


class AccumulatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.accumulator = Accumulator(
            batch_bytes_max=BATCH_BYTES_MAX,
            buffer_bytes_max=BUFFER_BYTES_MAX,
            linger_ms=LINGER_MS,
            clock=lambda: self.now,
        )
        self.next_id = 0
        self.appended: dict[TopicPartition, list[int]] = {tp: [] for tp in PARTITIONS}
        self.delivered: dict[TopicPartition, list[int]] = {tp: [] for tp in PARTITIONS}
        self.failed: set[int] = set()
        self.in_flight: list[ProducerBatch] = []
        self.futures: dict[int, RecordFuture] = {}
        self.next_base_offset = 0
        self.model_reserved_bytes = 0

    @rule(partition=st.sampled_from(PARTITIONS), value_bytes=st.integers(0, 600))
    def append(self, partition: TopicPartition, value_bytes: int) -> None:
        record = RecordInput(None, self.next_id.to_bytes(4, "big") + b"x" * value_bytes, 0)
        size = estimate_record_bytes(record)
        fits = self.model_reserved_bytes + size <= BUFFER_BYTES_MAX
        try:
            future = self.accumulator.append(partition, record, max_block_ms=0)
        except BufferFullError:
            assert not fits
            return
        assert fits and future is not None and not future.done()
        self.futures[self.next_id] = future
        self.model_reserved_bytes += size
        self.appended[partition].append(self.next_id)
        self.next_id += 1

    @rule(elapsed_ms=st.sampled_from([0, 5, 10, 50]))
    def tick_and_drain(self, elapsed_ms: int) -> None:
        self.now += elapsed_ms / 1000
        with self.accumulator.condition:
            drained = self.accumulator.drain_ready(self.now)
        flying = {batch.tp for batch in self.in_flight}
        for batch in drained:
            assert batch.tp not in flying, "two batches of one partition in flight"
            flying.add(batch.tp)
            assert batch.retry_at <= self.now
        self.in_flight.extend(drained)

    @rule(data=st.data(), outcome=st.sampled_from(["delivered", "failed", "retry"]))
    @precondition(lambda self: bool(self.in_flight))
    def answer(self, data: st.DataObject, outcome: str) -> None:
        batch = self.in_flight.pop(data.draw(st.integers(0, len(self.in_flight) - 1)))
        ids = [int.from_bytes((r.value or b"")[:4], "big") for r in batch.records]
        with self.accumulator.condition:
            if outcome == "retry":
                self.accumulator.requeue(batch, retry_at=self.now + 0.005)
                return
            self.accumulator.complete(batch, in_flight=True)
        self.model_reserved_bytes -= sum(estimate_record_bytes(r) for r in batch.records)
        if outcome == "delivered":
            self.delivered[batch.tp].extend(ids)
            batch.future.set_result(self.next_base_offset)
            # Every record of the batch resolves from the batch's one completion.
            for index, record_id in enumerate(ids):
                meta = self.futures.pop(record_id).result(timeout=0)
                assert (meta.topic, meta.partition) == batch.tp
                assert meta.offset == self.next_base_offset + index
            self.next_base_offset += len(ids)
        else:
            self.failed.update(ids)
            error = RuntimeError("failed")
            batch.future.set_exception(error)
            assert all(
                self.futures.pop(record_id).exception(timeout=0) is error for record_id in ids
            )

    @rule()
    def flush_everything_ready(self) -> None:
        with self.accumulator.condition:
            self.accumulator.flushes_under_way += 1
            self.in_flight.extend(self.accumulator.drain_ready(self.now))
            self.accumulator.flushes_under_way -= 1
        assert len({batch.tp for batch in self.in_flight}) == len(self.in_flight)

    @invariant()
    def reserved_bytes_match_undelivered_records(self) -> None:
        assert self.accumulator.reserved_bytes == self.model_reserved_bytes
        assert 0 <= self.accumulator.reserved_bytes <= BUFFER_BYTES_MAX

    @invariant()
    def each_partition_delivers_in_append_order(self) -> None:
        for tp in PARTITIONS:
            expected = [i for i in self.appended[tp] if i not in self.failed]
            delivered = self.delivered[tp]
            assert delivered == expected[: len(delivered)]

    @invariant()
    def batches_stay_within_their_bound(self) -> None:
        with self.accumulator.condition:
            batches = self.accumulator.queued() + self.in_flight
        assert all(batch.size_bytes <= BATCH_BYTES_MAX for batch in batches)


AccumulatorMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
test_accumulator_against_model = AccumulatorMachine.TestCase
