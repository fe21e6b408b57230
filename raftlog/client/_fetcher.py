"""The consumer's fetch pipeline: one Fetch in flight per partition, decoded records buffered.

Theory of operation. Each assigned partition has a `PartitionState`: `fetch_offset` (the next
offset to ask for), a buffer of decoded records not yet returned, and at most one Fetch in
flight (`in_flight`), always for `fetch_offset`. `Fetcher.send` starts a Fetch for every
partition that has a position, nothing in flight, no retry backoff pending, and either an
empty buffer or room under `fetch_buffer_bytes_max` (bytes of fetched batches buffered over
all partitions); the caller (`Consumer.poll`) calls it on every round, so the next Fetch goes
out as soon as the previous answer is decoded, while the caller is still consuming the
records it holds: the round trip overlaps the caller's work instead of adding to it (Kafka's
consumer pipelines the same way). What may be held is bounded: `fetch_buffer_bytes_max` plus
one answer (`partition_fetch_bytes_max`, or one larger batch) per partition.

A gRPC thread only queues a finished call (`_finished`); `Fetcher.collect`, on the caller's
thread, decodes it, so buffers and positions change on that thread alone. A finished call is
delivered only if it is still its partition's `in_flight`: `seek`, a reset, a revocation or
`unassign` replace or drop the state (cancelling the call), and its answer is then dropped,
never delivered: it was for an offset the caller no longer wants.

Each delivered answer is checked as before pipelining: only batches wholly below the high
watermark (committed, the server's promise: a record past it could be lost in a leader
change), offsets strictly increasing since the last seek; control batches (a leader's no-op,
a membership change) are skipped but advance `fetch_offset`, and records before it (a batch
is returned whole even when the position lies inside it) are dropped.

With `isolation_level="read_committed"` the server answers up to the last stable offset and
lists the aborted transactions (producer id, first offset) among the batches; as Kafka's
consumer, a producer joins the aborted set when the walk reaches its first offset, its
transactional batches are skipped while it is in the set, and its transaction marker (a
control batch that is transactional: told by attributes alone) takes it out again.
"""

from __future__ import annotations

import contextlib
import queue
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from raftlog.client._connection import Cluster, TopicPartition
from raftlog.client.config import AutoOffsetReset, ConsumerConfig
from raftlog.client.errors import ClientError, NotLeaderForPartitionError, server_error
from raftlog.errors import CorruptBatchError
from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.storage.batch import BatchHeader
from raftlog.storage.records import Headers, RecordOutFields, decode_batch_fields

__all__ = ["ConsumerRecord", "Fetcher", "PartitionState"]


class ConsumerRecord(NamedTuple):
    """A record read from `topic`/`partition` at `offset` (a named tuple, as kafka-python's
    is: a consumer builds one per record, and a tuple takes a fifth of a frozen dataclass's
    time to build)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    headers: Headers


@dataclass(slots=True)
class _Chunk:
    """The records of one fetched batch not yet returned: `records[next_index:]`."""

    records: list[ConsumerRecord]
    size_bytes: int  # the batch's size as fetched, counted against fetch_buffer_bytes_max
    next_index: int = 0


@dataclass(slots=True, eq=False)
class InFlightFetch:
    """A Fetch for `tp` at `offset`, sent to `address`; `future` is the gRPC call."""

    tp: TopicPartition
    offset: int
    address: str
    future: Any


@dataclass(slots=True)
class PartitionState:
    fetch_offset: int | None = None
    reset: AutoOffsetReset | None = None  # a pending seek_to_beginning / seek_to_end / reset
    chunks: deque[_Chunk] = field(default_factory=deque)
    buffered_bytes: int = 0  # the size_bytes of `chunks`
    high_watermark: int | None = None
    last_offset: int = -1  # the highest offset buffered since the last seek
    group_offset_pending: bool = False  # given by the group: look up its committed offset
    in_flight: InFlightFetch | None = None
    retry_at_s: float = 0.0  # after a retriable error, no Fetch before this (clock seconds)

    def position(self) -> int | None:
        if self.chunks:
            chunk = self.chunks[0]
            return chunk.records[chunk.next_index].offset
        return self.fetch_offset

    def move_to(self, fetch_offset: int | None, reset: AutoOffsetReset | None) -> None:
        """Forget buffered records and the Fetch in flight (its answer will be dropped)."""
        self.drop_fetch()
        self.chunks.clear()
        self.buffered_bytes = 0
        self.fetch_offset = fetch_offset
        self.reset = reset
        self.last_offset = -1
        assert self.position() == fetch_offset

    def drop_fetch(self) -> None:
        if self.in_flight is not None:
            self.in_flight.future.cancel()
            self.in_flight = None


class Fetcher:
    """Sends Fetches, decodes their answers into partition buffers and drains them."""

    def __init__(self, cluster: Cluster, config: ConsumerConfig) -> None:
        self._cluster = cluster
        self._config = config
        # Finished calls, queued by gRPC threads; at most one per partition (one in flight).
        self._finished: queue.SimpleQueue[InFlightFetch] = queue.SimpleQueue()
        self._waited: deque[InFlightFetch] = deque()  # taken off _finished by wait()
        self._drain_start = 0

    def send(
        self, partitions: Mapping[TopicPartition, PartitionState], now_s: float
    ) -> list[tuple[TopicPartition, ClientError]]:
        """A Fetch for each partition that may fetch now; returns the errors met sending."""
        # Most calls find every partition with its Fetch out: one cheap pass says so (an
        # iterating caller polls once per record).
        idle = [
            (tp, state)
            for tp, state in partitions.items()
            if state.in_flight is None and state.retry_at_s <= now_s
        ]
        if not idle:
            return []
        buffered_bytes = sum(state.buffered_bytes for state in partitions.values())
        errors: list[tuple[TopicPartition, ClientError]] = []
        for tp, state in idle:
            if self._may_fetch(state, buffered_bytes):
                try:
                    self._start(tp, state)
                except ClientError as error:
                    errors.append((tp, error))
        return errors

    def _may_fetch(self, state: PartitionState, buffered_bytes: int) -> bool:
        """Whether `state` may send a Fetch, with `buffered_bytes` held over all partitions."""
        if state.in_flight is not None or state.fetch_offset is None:
            return False
        return not state.chunks or buffered_bytes < self._config.fetch_buffer_bytes_max

    def _start(self, tp: TopicPartition, state: PartitionState) -> None:
        offset = state.fetch_offset
        assert offset is not None and state.in_flight is None, (tp, state)
        address = self._cluster.leader_address(tp)
        request = pb.FetchRequest(
            topic=tp.topic,
            partition=tp.partition,
            offset=offset,
            max_bytes=self._config.partition_fetch_bytes_max,
            # The call may outlive this poll (the next collects it), so it waits the whole
            # fetch_max_wait_ms: a shorter wait would only make an idle consumer ask more often.
            max_wait_ms=self._config.fetch_max_wait_ms,
            min_bytes=self._config.fetch_min_bytes,
            isolation_level=int(self._config.isolation_level == "read_committed"),
        )
        timeout_ms = self._config.connection.request_timeout_ms
        future = self._cluster.call_future(address, "Log.Fetch", request, timeout_ms=timeout_ms)
        fetch = InFlightFetch(tp, offset, address, future)
        state.in_flight = fetch  # before the callback can queue it: it may run right here
        future.add_done_callback(lambda _: self._finished.put(fetch))

    def wait(self, timeout_s: float) -> None:
        """Block until a call finishes or `timeout_s` passes."""
        with contextlib.suppress(queue.Empty):
            self._waited.append(self._finished.get(timeout=max(0.0, timeout_s)))

    def any_finished(self) -> bool:
        """Whether a call has finished since the last `collect` (a cheap look)."""
        return bool(self._waited) or not self._finished.empty()

    def collect(
        self, partitions: Mapping[TopicPartition, PartitionState]
    ) -> Iterator[tuple[TopicPartition, ClientError | None]]:
        """Decode every finished call still wanted, sending that partition's next Fetch
        right after its answer (prefetch); yields `(tp, None)` for each answer delivered and
        `(tp, error)` for each retriable failure. A final error found in an answer (a corrupt
        batch, a broken promise) is raised; later calls stay queued."""
        buffered_bytes = sum(state.buffered_bytes for state in partitions.values())
        for fetch in self._finished_calls():
            state = partitions.get(fetch.tp)
            if state is None or state.in_flight is not fetch:
                continue  # dropped by a seek, a reset or a revocation: not wanted any more
            assert state.fetch_offset == fetch.offset, (state.fetch_offset, fetch.offset)
            state.in_flight = None
            try:
                response = self._cluster.result(
                    fetch.future,
                    address=fetch.address,
                    rpc="Log.Fetch",
                    timeout_ms=self._config.connection.request_timeout_ms,
                )
                buffered_bytes -= state.buffered_bytes
                self._on_response(fetch, state, response)
                buffered_bytes += state.buffered_bytes
            except ClientError as error:
                if not error.retriable:
                    raise
                yield fetch.tp, error
                continue
            yield fetch.tp, None
            if self._may_fetch(state, buffered_bytes):
                try:
                    self._start(fetch.tp, state)
                except ClientError as error:
                    yield fetch.tp, error

    def _finished_calls(self) -> Iterator[InFlightFetch]:
        """The calls finished so far; not those finishing meanwhile (a prefetch answered at
        once, at the end of the log, would otherwise keep one collect going)."""
        finished = len(self._waited) + self._finished.qsize()
        for _ in range(finished):
            yield self._waited.popleft() if self._waited else self._finished.get_nowait()

    def _on_response(
        self, fetch: InFlightFetch, state: PartitionState, response: pb.FetchResponse
    ) -> None:
        code = response.error.code
        if code == pb.OFFSET_OUT_OF_RANGE and self._config.auto_offset_reset != "error":
            state.fetch_offset = None  # the next round asks for a new one per auto_offset_reset
            return
        if code != pb.NONE:
            error = server_error(
                response.error,
                concerning=f"fetch {fetch.tp.topic}/{fetch.tp.partition} at offset "
                f"{fetch.offset} from {fetch.address}",
            )
            if isinstance(error, NotLeaderForPartitionError):
                self._cluster.apply_leader_hint(fetch.tp, error.leader_id, error.leader_address)
            raise error
        if state.high_watermark is None or response.high_watermark > state.high_watermark:
            state.high_watermark = response.high_watermark
        self._buffer_batches(fetch, state, response)

    def _buffer_batches(
        self, fetch: InFlightFetch, state: PartitionState, response: pb.FetchResponse
    ) -> None:
        """Decode whole batches; buffer user records at or past the position."""
        assert state.fetch_offset is not None
        tp = fetch.tp
        data = response.batches
        position = 0
        where = f"fetch {tp.topic}/{tp.partition} from {fetch.address}"
        aborted = AbortedFilter(
            (a.producer_id, a.first_offset) for a in response.aborted_transactions
        )
        while position < len(data):
            try:
                header, fields = decode_batch_fields(
                    data, position, decompressed_bytes_max=self._config.decompressed_bytes_max
                )
            except CorruptBatchError as error:
                raise ClientError(f"{where}: {error}") from error
            # The server promises committed data only; a record past the high watermark
            # could still be lost in a leader change, so it must never reach the caller.
            if header.last_offset >= response.high_watermark:
                raise ClientError(
                    f"{where}: batch ending at offset {header.last_offset} is not below the "
                    f"high watermark {response.high_watermark}"
                )
            position += header.size_bytes
            skipped = aborted.skips(header)  # fed every batch, in order
            if header.last_offset < state.fetch_offset:
                continue  # wholly before the position (a batch is returned whole)
            if not skipped:
                records = _consumer_records(tp, state, fields, where)
                if records:
                    state.chunks.append(_Chunk(records, header.size_bytes))
                    state.buffered_bytes += header.size_bytes
            state.fetch_offset = header.last_offset + 1
        assert position == len(data)

    def drain(self, partitions: Iterable[PartitionState], limit: int) -> list[ConsumerRecord]:
        """Up to `limit` buffered records, starting one partition further each time so a
        partition with a deep buffer cannot hold the others back."""
        states = list(partitions)
        if not states:
            return []
        self._drain_start = (self._drain_start + 1) % len(states)
        records: list[ConsumerRecord] = []
        for state in states[self._drain_start :] + states[: self._drain_start]:
            chunks = state.chunks
            while chunks and len(records) < limit:
                chunk = chunks[0]
                start = chunk.next_index
                stop = min(len(chunk.records), start + limit - len(records))
                records += chunk.records[start:stop]
                chunk.next_index = stop
                if stop == len(chunk.records):
                    chunks.popleft()
                    state.buffered_bytes -= chunk.size_bytes
            assert state.buffered_bytes >= 0 and bool(chunks) == (state.buffered_bytes > 0)
        assert len(records) <= limit
        return records


class AbortedFilter:
    """Which batches of one fetch answer a read_committed consumer skips (module
    docstring): control batches, and batches of aborted transactions. Fed every batch of
    the answer in offset order, those before the position included."""

    __slots__ = ("_aborted", "_producers")

    def __init__(self, aborted: Iterable[tuple[int, int]]) -> None:
        # (first offset, producer id), latest first, so the earliest pops from the end.
        self._aborted = sorted(((first, pid) for pid, first in aborted), reverse=True)
        self._producers: set[int] = set()

    def skips(self, header: BatchHeader) -> bool:
        while self._aborted and self._aborted[-1][0] <= header.last_offset:
            self._producers.add(self._aborted.pop()[1])
        if header.is_control:
            if header.is_transactional:  # a COMMIT/ABORT marker ends its producer's run
                self._producers.discard(header.producer_id)
            return True
        return header.is_transactional and header.producer_id in self._producers


def _consumer_records(
    tp: TopicPartition, state: PartitionState, fields: list[RecordOutFields], where: str
) -> list[ConsumerRecord]:
    """The batch's records at or past `fetch_offset`, each after the last one buffered.

    `fields` are `(offset, key, value, timestamp_ms, headers)`, a consumer record's fields
    after its topic and partition. decode_batch_fields has checked that offsets increase
    within the batch, so the order against the records buffered before is checked once, at
    the first record kept.
    """
    fetch_offset = state.fetch_offset
    assert fetch_offset is not None
    start = 0
    while start < len(fields) and fields[start][0] < fetch_offset:
        start += 1  # the position lies inside this batch (a batch is returned whole)
    if start == len(fields):
        return []
    first_offset = fields[start][0]
    if first_offset <= state.last_offset:
        raise ClientError(f"{where}: offset {first_offset} does not follow {state.last_offset}")
    prefix = (tp.topic, tp.partition)
    new = tuple.__new__  # ConsumerRecord's own __new__ is a Python call per record
    out = [new(ConsumerRecord, prefix + record) for record in fields[start:]]
    assert out[-1].offset >= first_offset > state.last_offset
    state.last_offset = out[-1].offset
    return out
