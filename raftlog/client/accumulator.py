"""The producer's record accumulator: per-partition batches inside one bounded buffer.

Theory of operation. `send()` appends a record to the open batch of its partition (opening a
new one when the last is full) after reserving the record's estimated size in a buffer of
`buffer_bytes_max` bytes; when the buffer is full it waits up to `max_block_ms` for the sender
to release space, then raises `BufferFullError`. The sender thread asks for `ready` batches:
the head batch of a partition is ready when it is full (another batch follows it), when it has
lingered `linger_ms`, when a flush or close is under way, and never while the partition already
has `max_in_flight` batches in flight; with linger 0 a batch with room left (not full, no
flush) also waits while any batch of its partition is in flight, filling meanwhile (the answer
is its linger), so only full batches pipeline. Batches leave a partition's queue in order and
each gets a `drain_order` when it first leaves; a partition's drained batches not yet finished
are its `unresolved` batches, oldest first. A batch that must be retried goes back into its
partition's queue after the retries older than it and before every batch never sent, with a
`retry_at` time, and it leaves again only once it is the partition's oldest unresolved batch
(Kafka's rule): retries go out one at a time and in order, so the leader sees each partition's
sequence numbers in order again. With idempotence, a partition's first batch under a producer
identity goes alone, and the batches behind it wait for its answer (`_alone`). A finished batch
releases its bytes.

All state is guarded by one `threading.Condition`, which the producer's sender also waits on;
every change that could make a batch ready notifies it.

Completion is per batch: each batch has one `concurrent.futures.Future` (its base offset), and
a record's `RecordFuture` is a light view of it (the batch's future plus the record's index).
A `Future` per record cost a `threading.Condition` to build and a notify to complete, a third
of the producer's CPU with small records (py-spy); Kafka's FutureRecordMetadata shares its
batch's ProduceRequestResult the same way. Record callbacks wait in a list on their batch (one
plain Lock per batch) and run when the batch's future resolves, and a resolved batch keeps a
copy of its outcome that `result()`/`exception()` read without a lock: a callback per record
on the batch's Future took its Condition each time, a fifth of the CPU again.

The hot path of `append` is a record joining an open batch with room in it and in the buffer:
the lock taken directly, a handful of field updates, no clock read and no wake-up.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from raftlog.client._connection import TopicPartition
from raftlog.client.errors import BufferFullError, ClientClosedError, RecordTooLargeError
from raftlog.storage.batch import BATCH_HEADER_BYTES
from raftlog.storage.records import RecordFields

__all__ = [
    "Accumulator",
    "ProducerBatch",
    "RecordFuture",
    "RecordMetadata",
    "estimate_record_bytes",
]

# A record's varint lengths, deltas and attribute byte take at most this many bytes
# (Kafka's DefaultRecord.MAX_RECORD_OVERHEAD).
_RECORD_OVERHEAD_BYTES = 21
_LOGGER = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where an acknowledged record landed; offset is -1 when acks=0 (nobody waited)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int


@dataclass(slots=True, eq=False)
class ProducerBatch:
    """Records bound for one partition, sent (and retried) as one RecordBatch."""

    tp: TopicPartition
    created_at: float
    # Plain tuples from the producer (see `RecordFields`), or RecordInputs.
    records: list[RecordFields] = field(default_factory=list)
    # Resolved once, with the batch's base offset (-1 for acks=0) or its DeliveryFailedError;
    # every record's RecordFuture reads it.
    future: Future[int] = field(default_factory=lambda: _running_future())
    size_bytes: int = BATCH_HEADER_BYTES
    closed: bool = False
    attempts: int = 0
    retry_at: float = 0.0
    # Built once at the first attempt so every retry carries the same sequence numbers.
    encoded: bytes | None = None
    base_sequence: int = -1
    # The accumulator's producer generation when `encoded` was built (-1: not encoded).
    producer_generation: int = -1
    last_error: Exception | None = None
    # Set when the batch first leaves its queue; orders a partition's unresolved batches.
    drain_order: int = -1
    # Whether an earlier batch of the partition was unresolved when this one was last sent.
    sent_behind_unresolved: bool = False
    # The future's outcome, copied by its first done-callback (`_on_resolved`) so a record's
    # result() and exception() read two fields instead of taking the future's Condition.
    resolved: bool = False
    base_offset: int = -1
    error: BaseException | None = None
    # Record callbacks waiting for the batch, side by side with their record futures (a pair
    # costs no tuple). One cheap Lock per batch instead of Future.add_done_callback's
    # Condition per record.
    callback_futures: list[RecordFuture] = field(default_factory=list)
    callbacks: list[Callable[[Future[RecordMetadata]], object]] = field(default_factory=list)
    callbacks_lock: threading.Lock = field(default_factory=threading.Lock)
    # Set (under callbacks_lock) when gRPC's thread that got the batch's answer will complete
    # it, which it does only for a batch without record callbacks (`claim_inline_completion`).
    completing_inline: bool = False
    # Record futures made full Futures (`RecordFuture.__getattr__`): each completes through a
    # done-callback on `future`, run by whichever thread completes the batch.
    materialized_futures: int = 0

    def __post_init__(self) -> None:
        self.future.add_done_callback(self._on_resolved)

    def _on_resolved(self, future: Future[int]) -> None:
        # Runs once, first of the future's callbacks, on the thread that completed it.
        assert future.done() and not self.resolved
        self.error = future.exception()
        if self.error is None:
            self.base_offset = future.result()
        self.resolved = True
        with self.callbacks_lock:
            futures, self.callback_futures = self.callback_futures, []
            callbacks, self.callbacks = self.callbacks, []
        # Record callbacks never run on gRPC's thread: none was queued when it claimed the
        # batch, and add_done_callback queues none after that.
        assert not (self.completing_inline and callbacks), "a callback on gRPC's thread"
        for record_future, callback in zip(futures, callbacks, strict=True):
            # `_run_callback` inline: this loop runs once per record of the batch.
            try:
                callback(record_future)
            except Exception:
                _LOGGER.exception("exception calling callback for %r", record_future)
        # Later callbacks run at once in add_done_callback, which sees `resolved` set.
        assert not self.callbacks, "a callback was queued after the batch resolved"

    def claim_inline_completion(self) -> bool:
        """Whether the thread that got the batch's answer may complete it (the producer's
        sender: gRPC's thread). Only a batch without record callbacks or materialized record
        futures: user code and per-record work stay off gRPC's thread, which also drives its
        channel's I/O (a batch of a thousand records with a callback each held it ~1 ms and
        cost acks=all throughput). After a claim, add_done_callback runs its callback on its
        caller's thread."""
        with self.callbacks_lock:
            assert not self.resolved and not self.completing_inline
            if self.callbacks or self.materialized_futures:
                return False
            self.completing_inline = True
            return True


def _run_callback(
    record_future: RecordFuture, callback: Callable[[Future[RecordMetadata]], object]
) -> None:
    # As concurrent.futures does: one failing callback is logged and the others still run.
    try:
        callback(record_future)
    except Exception:
        _LOGGER.exception("exception calling callback for %r", record_future)


def _running_future() -> Future[int]:
    future: Future[int] = Future()
    future.set_running_or_notify_cancel()  # a record in a batch cannot be taken back
    return future


# What concurrent.futures.wait() and as_completed() read of a Future directly.
_FUTURE_INTERNALS = frozenset(
    ("_condition", "_state", "_result", "_exception", "_waiters", "_done_callbacks")
)
_MATERIALIZE_LOCK = threading.Lock()


class RecordFuture(Future[RecordMetadata]):
    """One record's result: a view of its batch's future (what `Producer.send` returns).

    It behaves as a running `concurrent.futures.Future` that cannot be cancelled: `result`,
    `exception`, `done` and `add_done_callback` read the batch (the callback gets this
    record's future). `Future.__init__` is skipped on purpose: its Condition is the cost this
    class exists to avoid. Only `concurrent.futures.wait`/`as_completed`, which reach into a
    Future's internals, make it build them (`__getattr__`), and the batch then completes it.
    Once the batch resolved, `result` and `exception` read its copied outcome, lock-free.
    """

    # Slots keep a record's future small (no instance dict unless `__getattr__` builds the
    # Future internals): a buffer of small records holds hundreds of thousands of them.
    __slots__ = ("_batch", "_index", "_timestamp_ms")

    def __init__(self, batch: ProducerBatch, index: int, timestamp_ms: int) -> None:
        self._batch = batch
        self._index = index
        self._timestamp_ms = timestamp_ms

    def _metadata(self, base_offset: int) -> RecordMetadata:
        tp = self._batch.tp
        offset = base_offset + self._index if base_offset >= 0 else -1
        return RecordMetadata(tp.topic, tp.partition, offset, self._timestamp_ms)

    def cancel(self) -> bool:
        return False

    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return not self.done()

    def done(self) -> bool:
        return self._batch.resolved or self._batch.future.done()

    def result(self, timeout: float | None = None) -> RecordMetadata:
        batch = self._batch
        if not batch.resolved:
            return self._metadata(batch.future.result(timeout))
        if batch.error is not None:
            raise batch.error
        return self._metadata(batch.base_offset)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        batch = self._batch
        return batch.error if batch.resolved else batch.future.exception(timeout)

    def add_done_callback(self, fn: Callable[[Future[RecordMetadata]], object]) -> None:
        batch = self._batch
        with batch.callbacks_lock:
            if not batch.resolved and not batch.completing_inline:
                batch.callback_futures.append(self)
                batch.callbacks.append(fn)
                return
        if not batch.resolved:
            # Acknowledged and being completed on gRPC's thread (`claim_inline_completion`):
            # wait the moment it takes, then run the callback here, not there.
            batch.future.exception()
        _run_callback(self, fn)  # done already: run at once, as Future does

    def set_result(self, result: RecordMetadata) -> None:
        raise RuntimeError("a record's future is completed by its producer, not by callers")

    def set_exception(self, exception: BaseException | None) -> None:
        raise RuntimeError("a record's future is completed by its producer, not by callers")

    def __repr__(self) -> str:
        state = "finished" if self.done() else "running"
        tp = self._batch.tp
        return f"<RecordFuture {tp.topic}/{tp.partition}#{self._index} {state}>"

    def __getattr__(self, name: str) -> Any:
        # Reached only for attributes never set, i.e. Future's internals before they exist.
        if name not in _FUTURE_INTERNALS:
            raise AttributeError(name)
        with _MATERIALIZE_LOCK:
            if "_condition" not in self.__dict__:
                Future.__init__(self)
                Future.set_running_or_notify_cancel(self)
                self._batch.materialized_futures += 1
                self._batch.future.add_done_callback(self._complete_materialized)
        return self.__dict__[name]

    def _complete_materialized(self, batch_future: Future[int]) -> None:
        error = batch_future.exception()
        if error is not None:
            Future.set_exception(self, error)
        else:
            Future.set_result(self, self._metadata(batch_future.result()))


def estimate_record_bytes(record: RecordFields) -> int:
    """An upper bound on a record's encoded size (before compression)."""
    key, value, _, headers = record
    size = _RECORD_OVERHEAD_BYTES + len(key or b"") + len(value or b"")
    for header_key, header_value in headers:
        size += 10 + len(header_key.encode("utf-8")) + len(header_value or b"")
    return size


class Accumulator:
    """Per-partition queues of batches, bounded by `buffer_bytes_max` bytes in total."""

    def __init__(
        self,
        *,
        batch_bytes_max: int,
        buffer_bytes_max: int,
        linger_ms: int,
        clock: Callable[[], float],
        max_in_flight: int = 1,
        sequenced: bool = False,
    ) -> None:
        assert BATCH_HEADER_BYTES < batch_bytes_max <= buffer_bytes_max
        assert max_in_flight >= 1
        self.max_in_flight = max_in_flight
        # Idempotence: a partition's first batch under an identity goes alone (`_alone`).
        self.sequenced = sequenced
        self.batch_bytes_max = batch_bytes_max
        self.buffer_bytes_max = buffer_bytes_max
        self.linger_s = linger_ms / 1000
        self.clock = clock
        # A plain Lock (not the default RLock) so `_is_held` can assert it is held.
        self._lock = threading.Lock()
        self.condition = threading.Condition(self._lock)
        self.reserved_bytes = 0
        # send() calls waiting in `_reserve` for buffer space: a release must wake them.
        self.space_waiters = 0
        self.flushes_under_way = 0
        self.closing = False
        self._queues: dict[TopicPartition, deque[ProducerBatch]] = {}
        # Batches of a partition being sent now (at most max_in_flight).
        self._in_flight: dict[TopicPartition, int] = {}
        # Drained batches not finished yet (in flight or queued for a retry), oldest first.
        self._unresolved: dict[TopicPartition, deque[ProducerBatch]] = {}
        self._drained_batches = 0
        self.incomplete: set[ProducerBatch] = set()
        # Counts the producer's identities (id and epoch); the sender moves it on when one is
        # given up. A batch never encoded leaves only behind batches encoded under the
        # current one (see `may_encode`).
        self.producer_generation = 0
        # Per partition, the generation under which a batch of it was last written.
        self._written_generation: dict[TopicPartition, int] = {}

    def append(
        self,
        tp: TopicPartition,
        record: RecordFields,
        *,
        max_block_ms: int,
        abort_on_new_batch: bool = False,
    ) -> RecordFuture | None:
        """Add `record` to `tp`'s open batch (opening one if needed) and return its future;
        None if it was not added.

        With `abort_on_new_batch` a record that would open a new batch is not added and None
        is returned: the sticky partitioner then moves on and the record goes to another
        partition's batch (Kafka's KIP-480 "abortOnNewBatch").
        """
        size = estimate_record_bytes(record)
        if size + BATCH_HEADER_BYTES > self.batch_bytes_max:
            raise RecordTooLargeError(
                record_bytes=size, limit_name="batch_bytes_max", limit_bytes=self.batch_bytes_max
            )
        # The condition's own lock, taken directly: Condition.__enter__/__exit__ are two
        # Python calls per record on the producer's hottest path.
        with self._lock:
            # Checked under the lock: once closing is set the sender may exit as soon as the
            # last batch completes, and a record added after that would never be sent.
            if self.closing:
                raise ClientClosedError(
                    f"producer closed: cannot send to {tp.topic}/{tp.partition}"
                )
            queue = self._queues.get(tp)
            batch = queue[-1] if queue else None
            if (
                batch is None
                or batch.closed
                or batch.size_bytes + size > self.batch_bytes_max
                or self.reserved_bytes + size > self.buffer_bytes_max
            ):
                # A new batch, or a wait for buffer space: the rare path.
                return self._append_slowly(tp, record, size, max_block_ms, abort_on_new_batch)
            # The common case: room in the open batch and in the buffer. No deadline changes,
            # so the sender needs no wake-up.
            self.reserved_bytes += size
            records = batch.records
            records.append(record)
            batch.size_bytes += size
            return RecordFuture(batch, len(records) - 1, record[2])

    def _append_slowly(
        self,
        tp: TopicPartition,
        record: RecordFields,
        size: int,
        max_block_ms: int,
        abort_on_new_batch: bool,
    ) -> RecordFuture | None:
        """`append` when a batch must be opened or buffer space waited for (lock held)."""
        assert self._is_held()
        queue = self._queues.setdefault(tp, deque())
        needs_new = (
            not queue or queue[-1].closed or queue[-1].size_bytes + size > self.batch_bytes_max
        )
        if needs_new and abort_on_new_batch:
            return None
        self._reserve(size, max_block_ms)
        # _reserve may have waited (releasing the lock): look at the queue again.
        if queue and not queue[-1].closed:
            needs_new = queue[-1].size_bytes + size > self.batch_bytes_max
        else:
            needs_new = True
        if needs_new:
            if queue:
                queue[-1].closed = True
            queue.append(ProducerBatch(tp, self.clock()))
            self.incomplete.add(queue[-1])
        batch = queue[-1]
        records = batch.records
        records.append(record)
        batch.size_bytes += size
        assert batch.size_bytes <= self.batch_bytes_max
        if needs_new:
            # A batch closed (ready now) or one opened (its linger starts): wake the
            # sender. Records joining an open batch change no deadline, so no wake-up.
            self.condition.notify_all()
        return RecordFuture(batch, len(records) - 1, record[2])

    def _reserve(self, size: int, max_block_ms: int) -> None:
        # Called with the condition held; waits for the sender to release space.
        deadline = self.clock() + max_block_ms / 1000
        while self.reserved_bytes + size > self.buffer_bytes_max:
            if self.closing:
                raise ClientClosedError("producer closed while send() waited for buffer space")
            remaining = deadline - self.clock()
            if remaining <= 0:
                raise BufferFullError(
                    buffer_bytes_max=self.buffer_bytes_max,
                    max_block_ms=max_block_ms,
                    record_bytes=size,
                )
            self.space_waiters += 1
            try:
                self.condition.wait(remaining)
            finally:
                self.space_waiters -= 1
        assert self.space_waiters >= 0
        self.reserved_bytes += size
        assert self.reserved_bytes <= self.buffer_bytes_max

    def drain_ready(self, now: float) -> list[ProducerBatch]:
        """Close and take every ready head batch of each partition below its in-flight bound.

        A retry (a batch drained before) leaves only as its partition's oldest unresolved
        batch, and nothing queued behind it leaves before it.
        """
        assert self._is_held()
        drained: list[ProducerBatch] = []
        urgent = self.flushes_under_way > 0 or self.closing
        for tp, queue in self._queues.items():
            while queue and self._in_flight.get(tp, 0) < self.max_in_flight:
                head = queue[0]
                if head.retry_at > now:
                    break
                if head.drain_order >= 0:
                    if self._unresolved[tp][0] is not head:
                        break  # an older batch of this partition is still unresolved
                elif not (head.closed or urgent or now - head.created_at >= self.linger_s):
                    break
                elif not self.may_encode(head):
                    break  # a batch of an earlier producer identity is unresolved
                elif self._alone(tp):
                    break  # the partition's first batch under this identity is unanswered
                elif (
                    self.linger_s == 0
                    and not (head.closed or urgent)
                    and self._in_flight.get(tp, 0)
                ):
                    # Linger 0: a batch with room left waits for the partition's batches in
                    # flight and fills meanwhile (the answer is its linger, as Nagle's
                    # algorithm): many tiny requests cost the nodes more per record than the
                    # wait (30% load: p50 13 ms with one batch in flight, 22-27 ms with five
                    # unfilled ones). Full batches, and lingered ones, pipeline.
                    break
                head.closed = True
                queue.popleft()
                if head.drain_order < 0:
                    head.drain_order = self._drained_batches
                    self._drained_batches += 1
                    self._unresolved.setdefault(tp, deque()).append(head)
                self._in_flight[tp] = self._in_flight.get(tp, 0) + 1
                head.sent_behind_unresolved = self._unresolved[tp][0] is not head
                drained.append(head)
        assert all(batch.closed for batch in drained)
        return drained

    def next_ready_at(self) -> float | None:
        """When the earliest head batch that may leave becomes ready (None: no batch waits).

        A retry waiting for an older batch of its partition, or a partition at its in-flight
        bound, has no time: a response wakes the sender.
        """
        assert self._is_held()
        times = []
        for tp, queue in self._queues.items():
            if not queue or self._in_flight.get(tp, 0) >= self.max_in_flight:
                continue
            head = queue[0]
            if head.drain_order >= 0:
                if self._unresolved[tp][0] is head:
                    times.append(head.retry_at)
            elif not self.may_encode(head) or self._alone(tp):
                continue  # behind an earlier identity's or a first batch: an answer wakes
            elif head.closed:
                times.append(head.retry_at)
            elif self.linger_s == 0 and self._in_flight.get(tp, 0) > 0:
                continue  # an open batch behind batches in flight: an answer wakes the sender
            else:
                times.append(max(head.retry_at, head.created_at + self.linger_s))
        return min(times) if times else None

    def may_encode(self, batch: ProducerBatch) -> bool:
        """Whether `batch` may be numbered under the current producer identity now: every
        unresolved batch of its partition drained before it was encoded under that identity.

        Records of one partition are written in the order sent (KIP-98). A batch numbered
        under the old identity may still be written (a retry, or a late attempt); one
        numbered under the new identity and sent beside it could be written first. So a
        partition's new batches wait until its old ones are resolved (Kafka's producer
        drains the same way before it bumps its epoch, KIP-360)."""
        assert self._is_held()
        generation = self.producer_generation
        for earlier in self._unresolved.get(batch.tp, ()):
            if earlier is batch:
                break
            if earlier.producer_generation != generation:
                return False
        return True

    def _alone(self, tp: TopicPartition) -> bool:
        """Whether `tp` has a batch in flight that must stay alone: the partition has no
        batch written under the current identity yet.

        A leader accepts any sequence from a producer it does not know (Kafka does, for
        producers whose state was deleted), and gRPC may hand two concurrent calls to the
        leader in either order. Were a second batch sent beside the first, it could be
        written first, at its own sequence, and the first then refused out of order: the
        records written out of the order sent. Once one batch is written the leader knows
        the producer, and a batch overtaking another is refused and retried in order."""
        return (
            self.sequenced
            and self._in_flight.get(tp, 0) > 0
            and self._written_generation.get(tp) != self.producer_generation
        )

    def written(self, batch: ProducerBatch) -> None:
        """`batch` was written: the leader of its partition knows its producer identity."""
        assert self._is_held()
        if batch.producer_generation == self.producer_generation:
            self._written_generation[batch.tp] = batch.producer_generation

    def may_follow_unresolved(self, batch: ProducerBatch) -> bool:
        """Whether an OUT_OF_ORDER answer to in-flight `batch` may be explained by an earlier
        batch of its partition: one was unresolved when `batch` was sent (it may have reached
        the leader later, or failed since), or one still is. A retry leaves only as the oldest
        unresolved batch, so a real gap is found at the latest on its retry."""
        assert self._is_held()
        unresolved = self._unresolved[batch.tp]
        return batch.sent_behind_unresolved or unresolved[0] is not batch

    def requeue(self, batch: ProducerBatch, *, retry_at: float) -> None:
        """Put an in-flight batch back in its queue, to be retried at `retry_at`: after the
        retries drained before it, before every batch never sent."""
        assert self._is_held() and self._in_flight.get(batch.tp, 0) > 0
        assert batch.drain_order >= 0
        queue = self._queues.setdefault(batch.tp, deque())
        position = 0
        while position < len(queue) and 0 <= queue[position].drain_order < batch.drain_order:
            position += 1
        queue.insert(position, batch)
        batch.retry_at = retry_at
        self._in_flight[batch.tp] -= 1
        self.condition.notify_all()

    def complete(self, batch: ProducerBatch, *, in_flight: bool, notify: bool = True) -> None:
        """A batch is done (delivered or failed): release its bytes, and its in-flight slot
        if it was being sent. A queued batch that expires frees no slot: the batches in flight
        ahead of it still hold theirs. With `notify` False the caller wakes the waiters
        itself, if `wake_needed()` says so."""
        assert self._is_held() and batch in self.incomplete
        assert not in_flight or self._in_flight.get(batch.tp, 0) > 0
        self.incomplete.discard(batch)
        if in_flight:
            self._in_flight[batch.tp] -= 1
        if batch.drain_order >= 0:
            self._unresolved[batch.tp].remove(batch)
        self.reserved_bytes -= batch.size_bytes - BATCH_HEADER_BYTES
        assert self.reserved_bytes >= 0, self.reserved_bytes
        if notify:
            self.condition.notify_all()

    def wake_needed(self) -> bool:
        """Whether a batch completed just now may unblock a waiter: a queued batch (held by
        its partition's in-flight bound, an unresolved batch ahead of it, or linger 0 behind
        one in flight), a close waiting for the last batch, or a send() waiting for space.
        With none of them, nobody waits on the condition for a completion."""
        assert self._is_held()
        return (
            self.closing or self.space_waiters > 0 or any(queue for queue in self._queues.values())
        )

    def has_records_for(self, tp: TopicPartition) -> bool:
        """Whether any record was ever appended for `tp` (its queue exists once one was)."""
        with self.condition:
            return tp in self._queues

    def queued(self) -> list[ProducerBatch]:
        """Every batch not in flight (for expiry checks and close)."""
        assert self._is_held()
        return [batch for queue in self._queues.values() for batch in queue]

    def remove_queued(self, batch: ProducerBatch) -> None:
        assert self._is_held()
        self._queues[batch.tp].remove(batch)

    def _is_held(self) -> bool:
        # Condition wraps an RLock-free Lock: acquiring without blocking fails iff it is held.
        if self.condition.acquire(blocking=False):
            self.condition.release()
            return False
        return True
