"""The producer's sender thread: drains ready batches, sends them, retries, completes futures.

Theory of operation. One background thread owns the sending side. It sleeps on the
accumulator's condition until a batch is ready, a response arrived or a deadline passed; then
it (1) handles finished responses, (2) fails queued batches older than `delivery_timeout_ms`
and (3) sends every ready batch as its own Produce request to the partition's leader.
Requests run concurrently across partitions as gRPC futures. Up to
`max_in_flight_per_partition` batches of one partition are in flight at once (Kafka's
max.in.flight.requests.per.connection): with linger 0 and one batch in flight each record
waited for the whole round trip of the batch ahead of it.

Order within a partition across retries (the accumulator's rules, as Kafka's idempotent
producer): batches leave in sequence order; a batch that fails retriably goes back into the
queue ahead of every batch never sent, keeping its bytes and so its sequence numbers, and is
resent only once every earlier batch of its partition is resolved; the later batches in
flight then fail too (NOT_LEADER, or OUT_OF_ORDER because the leader has not seen the failed
one) and are resent after it, one at a time, in order. Separate gRPC calls may also reach the
leader out of order. So OUT_OF_ORDER is retriable when an earlier batch of the partition was
unresolved as the batch was sent (or still is), and fatal for a batch sent as the partition's
oldest unresolved one, as every retry is (a real gap, as before). At
most `max_in_flight_per_partition` (<= 5) batches of a partition are unresolved, and the
leader remembers the last 5 batches of each producer, so a resent batch it already wrote is
answered DUPLICATE_SEQUENCE with its original offsets.

Idempotence (as Kafka's idempotent producer): before the first batch the thread asks any node
for a producer id and epoch (InitProducerId). A batch is encoded once, at its first attempt,
with the partition's next sequence number; retries resend the same bytes, so a leader that
already wrote it answers DUPLICATE_SEQUENCE with the original offset, which is a success.

After a batch fails for good (KIP-360). Its sequence numbers are lost, and whether it was
written is unknown (its answer may have been lost). The producer keeps its id and bumps its
epoch, numbering every partition from 0 again (past epoch 32767 it asks for a new id), and
the accumulator's producer generation moves on. Records of a partition are still written in
the order sent:
- a batch not encoded yet leaves only once every batch of its partition encoded under an
  earlier epoch is resolved (`Accumulator.may_encode`), so the new epoch never races the old;
- such an old batch is retried with its own bytes; if the leader, with nothing earlier of
  ours unresolved, answers OUT_OF_ORDER, the batch is certainly not written and is renumbered
  under the new epoch instead of failing;
- once the new epoch wrote to a partition, the leader refuses the old one (a fenced epoch),
  so an old attempt delayed in the network can never land behind newer records.

A producer built with a fixed producer id (`fixed_producer`: a caller-derived id, see
`Producer`) never asks for one and never drops it: its sequences may start where an earlier
writer with the same id stopped (`resume_at`), and after a batch fails for good later
batches of that partition fail OUT_OF_ORDER at the leader instead of being renumbered.

Where an answer is handled. A success (NONE, or DUPLICATE_SEQUENCE) of a batch whose records
have no callbacks is settled on the thread that ran the gRPC future's callback (gRPC's thread
for the leader's channel): under the lock it releases the batch's in-flight slot and bytes,
as the sender thread would, then it completes the batch's future there, so the caller waiting
on `send().result()` is woken by gRPC's thread directly instead of by the sender thread woken
first (one thread hand-off less; benchmarks/README.md, "Removing the waits", measures it). It
wakes the sender thread only when a completion may unblock it (`Accumulator.wake_needed`).
Everything else goes to the sender thread, which alone retries, reads metadata, numbers
batches and gives up identities: a failed call, a refusal, any answer once close() gave up
(abort), and a batch with record callbacks (`ProducerBatch.claim_inline_completion`: user
code stays off gRPC's thread, which drives its channel's I/O; running a big batch's
callbacks there lowered acks=all throughput).
Settling a success on another thread changes no rule above: it takes the same lock, and of
what a retry decision reads it changes only which batches are unresolved, sooner than the
sender thread would have; answers already arrived in any order, and a batch sent behind an
unresolved one keeps `sent_behind_unresolved`, so its OUT_OF_ORDER stays retriable.

Outcomes: a retriable error (NOT_LEADER, timeouts, unreachable nodes, stale metadata) puts the
batch back at the head of its queue after `retry_backoff_ms`, first recording the leader hint
or marking the topic's metadata stale; anything else, or a batch past its attempts or its
delivery timeout, fails every record's future with a `DeliveryFailedError` naming the
topic-partition and chaining the last error. Futures are completed outside the lock: a user
callback may call send() again. Delivery callbacks run on the sender thread, or on the
thread that adds one to a batch already answered.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import InvalidStateError
from typing import Any

from raftlog.client._connection import Cluster
from raftlog.client.accumulator import Accumulator, ProducerBatch
from raftlog.client.config import ProducerConfig
from raftlog.client.errors import (
    ClientClosedError,
    ClientError,
    DeliveryFailedError,
    NotLeaderForPartitionError,
    server_error,
)
from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.storage.batch import Compression
from raftlog.storage.records import encode_batch, encode_unsigned_varint

__all__ = ["Sender"]

_SEQUENCE_MODULUS = 2**31  # Kafka's sequence numbers wrap at Integer.MAX_VALUE
_PRODUCER_EPOCH_MAX = 2**15 - 1  # int16 in the RecordBatch header
_OUT_OF_ORDER = pb.ErrorCode.Name(pb.OUT_OF_ORDER_SEQUENCE)
_ACKS = {"all": pb.ACKS_ALL, -1: pb.ACKS_ALL, 1: pb.ACKS_LEADER, 0: pb.ACKS_NONE}
_CODECS = {
    None: Compression.NONE,
    "lz4": Compression.LZ4,
    "zstd": Compression.ZSTD,
    "gzip": Compression.GZIP,
    "snappy": Compression.SNAPPY,
}
# Outcome of one batch: delivered at a base offset, or failed with an error.
Outcome = tuple[ProducerBatch, int | None, Exception | None]


class Sender:
    """The loop run by the producer's background thread (see the module docstring)."""

    def __init__(
        self,
        *,
        cluster: Cluster,
        accumulator: Accumulator,
        config: ProducerConfig,
        clock: Callable[[], float],
        fixed_producer: tuple[int, int] | None = None,
    ) -> None:
        self.cluster = cluster
        self.accumulator = accumulator
        self.config = config
        self.clock = clock
        self.fixed_producer = fixed_producer
        self.producer_id, self.producer_epoch = fixed_producer or (-1, -1)
        assert fixed_producer is None or config.enable_idempotence
        self.next_sequence: dict[tuple[str, int], int] = {}
        self.in_flight = 0
        self.abort = False
        # A transactional producer's batches carry the transactional bit (raftlog.client.
        # _transactions sets it with the producer id and epoch, before the first send).
        self.transactional = False
        self._responses: deque[tuple[ProducerBatch, str, Any]] = deque()
        # A bug raised while settling a success on gRPC's thread (which would only log it):
        # the sender thread raises it again, failing every batch (`run`).
        self._callback_crash: BaseException | None = None
        self._request_timeout_ms = config.connection.request_timeout_ms
        # The broker gets most of the request timeout so it can answer REQUEST_TIMED_OUT
        # before our own deadline cuts the call.
        self._broker_timeout_ms = max(1, self._request_timeout_ms * 4 // 5)

    def run(self) -> None:
        """Thread body: loop until close() and every batch is delivered or failed.

        A bug that escapes the loop must not leave callers waiting on futures forever: every
        batch not yet finished fails with the crash as its cause, then the error propagates.
        """
        try:
            self._loop()
        except BaseException as crash:
            with self.accumulator.condition:
                self.abort = True
                failed = self._fail_all_on_abort(f"producer sender thread crashed: {crash!r}")
                self.accumulator.closing = True
                self.accumulator.condition.notify_all()  # wake send() blocked on the buffer
            self._finish(failed)
            raise

    def _loop(self) -> None:
        condition = self.accumulator.condition
        while True:
            with condition:
                ready = self._wait_for_work()
                if ready is None:
                    failed = self._fail_all_on_abort() if self.abort else []
                else:
                    responses = list(self._responses)
                    self._responses.clear()
                    failed = self._expire_queued()
            if ready is None:
                self._finish(failed)
                return
            outcomes = [self._outcome(*response) for response in responses]
            self._finish(self._settle(outcomes) + failed)
            for batch in ready:
                self._send(batch)

    def _wait_for_work(self) -> list[ProducerBatch] | None:
        """Ready batches (maybe none, if responses or expiries wait); None when it must stop."""
        accumulator = self.accumulator
        while True:
            if self._callback_crash is not None:
                raise self._callback_crash
            if self.abort or (accumulator.closing and not accumulator.incomplete):
                return None
            now = self.clock()
            ready = accumulator.drain_ready(now)
            self.in_flight += len(ready)
            if ready or self._responses or self._has_expired(now):
                return ready
            wake_at = accumulator.next_ready_at()
            expiry = self._next_expiry()
            deadlines = [t for t in (wake_at, expiry) if t is not None]
            accumulator.condition.wait(max(0.0, min(deadlines) - now) if deadlines else None)

    # -- sending -----------------------------------------------------------------------------

    def _send(self, batch: ProducerBatch) -> None:
        if batch.encoded is None and not self._may_encode(batch):
            return
        tp = batch.tp
        try:
            if self.config.enable_idempotence and self.producer_id < 0:
                self._init_producer_id()
            if batch.encoded is None:
                try:
                    self._encode(batch)
                except ValueError as error:  # a field out of range: retrying cannot help
                    raise ClientError(f"cannot encode the batch: {error}") from error
            assert batch.encoded is not None
            address = self.cluster.leader_address(tp)
            request = serialized_produce_request(
                tp.topic,
                tp.partition,
                batch.encoded,
                acks=_ACKS[self.config.acks],
                timeout_ms=self._broker_timeout_ms,
            )
            future = self.cluster.call_future(
                address, "Log.Produce", request, timeout_ms=self._request_timeout_ms
            )
        except ClientError as error:
            batch.attempts += 1
            self._finish(self._settle([(batch, None, error)]))
            return
        batch.attempts += 1
        future.add_done_callback(lambda done: self._on_response(batch, address, done))

    def _may_encode(self, batch: ProducerBatch) -> bool:
        """Whether `batch` may be numbered now; if not, it goes back to its queue, no attempt
        counted, to leave once the batches ahead of it are resolved (the identity moved on
        between its drain and now, or an earlier batch in this round failed to encode)."""
        with self.accumulator.condition:
            if self.accumulator.may_encode(batch):
                return True
            self.in_flight -= 1
            self.accumulator.requeue(batch, retry_at=self.clock())
            return False

    def _on_response(self, batch: ProducerBatch, address: str, future: Any) -> None:
        """Runs on gRPC's thread (or inline in `_send` if the call already finished): settle a
        success here; hand anything else to the sender thread (module docstring)."""
        try:
            if self._settle_delivered(batch, future):
                return
        except BaseException as crash:
            # Its future may be settled already (no longer incomplete): fail it here, since
            # the sender thread's crash path fails only the batches still incomplete.
            with contextlib.suppress(InvalidStateError):
                batch.future.set_exception(ClientError(f"producer bug: {crash!r}"))
            with self.accumulator.condition:
                self._callback_crash = crash
                self.accumulator.condition.notify_all()
            raise
        with self.accumulator.condition:
            self._responses.append((batch, address, future))
            self.accumulator.condition.notify_all()

    def _settle_delivered(self, batch: ProducerBatch, future: Any) -> bool:
        """Complete `batch` if its call succeeded and the leader wrote it; False if the sender
        thread must handle the answer (a failed call, a refusal, or close() gave up)."""
        assert future.done()
        if future.cancelled() or future.exception() is not None:
            return False  # translated (and maybe diagnosed) on the sender thread
        offset = self._delivered_offset(future.result())
        if offset is None or not batch.claim_inline_completion():
            return False  # a refusal; or record callbacks, which run on the sender thread
        condition = self.accumulator.condition
        with condition:
            if self.abort:
                # `_fail_all_on_abort` fails (or failed) it on the sender thread; a callback
                # added meanwhile waits for that in add_done_callback.
                return False
            assert batch in self.accumulator.incomplete, "a batch in flight settled twice"
            self.in_flight -= 1
            assert self.in_flight >= 0
            self.accumulator.written(batch)
            self.accumulator.complete(batch, in_flight=True, notify=False)
            wake = self.accumulator.wake_needed()
        # Before waking the sender thread, so the caller is first in line. No other path
        # completes a batch no longer incomplete, and no record callback runs here.
        batch.future.set_result(offset)
        if wake:
            with condition:
                condition.notify_all()
        return True

    def _encode(self, batch: ProducerBatch) -> None:
        sequence = -1
        if self.config.enable_idempotence:
            sequence = self.next_sequence.get(batch.tp, 0)
            self.next_sequence[batch.tp] = (sequence + len(batch.records)) % _SEQUENCE_MODULUS
        batch.base_sequence = sequence
        # Read without the lock: only this thread moves the generation on.
        batch.producer_generation = self.accumulator.producer_generation
        batch.encoded = encode_batch(
            batch.records,
            compression=_CODECS[self.config.compression],
            producer_id=self.producer_id,
            producer_epoch=self.producer_epoch,
            base_sequence=sequence,
            is_transactional=self.transactional,
        )
        assert len(batch.encoded) <= self.config.connection.message_bytes_max

    def resume_at(self, tp: tuple[str, int], next_sequence: int) -> None:
        """Number `tp`'s next record `next_sequence` (a fixed producer continuing its id)."""
        assert self.fixed_producer is not None
        assert 0 <= next_sequence < _SEQUENCE_MODULUS, next_sequence
        with self.accumulator.condition:
            assert tp not in self.next_sequence, f"{tp}: records were numbered already"
            self.next_sequence[tp] = next_sequence

    def _init_producer_id(self) -> None:
        """Ask nodes in turn for a producer id; raise the last failure if none answers."""
        last_error: ClientError | None = None
        for address in self.cluster.addresses():
            try:
                response = self.cluster.call(
                    address, "Log.InitProducerId", pb.InitProducerIdRequest()
                )
            except ClientError as error:
                last_error = error
                continue
            if response.error.code != pb.NONE:
                last_error = server_error(response.error, concerning=f"InitProducerId at {address}")
                continue
            self.producer_id = response.producer_id
            self.producer_epoch = response.producer_epoch
            self.next_sequence.clear()
            assert self.producer_id >= 0, self.producer_id
            return
        assert last_error is not None
        raise last_error

    # -- outcomes ----------------------------------------------------------------------------

    def _outcome(self, batch: ProducerBatch, address: str, future: Any) -> Outcome:
        """Turn one answer into (batch, base offset, None) or (batch, None, error)."""
        concerning = f"produce to {batch.tp.topic}/{batch.tp.partition} at {address}"
        try:
            response = self.cluster.result(
                future, address=address, rpc="Log.Produce", timeout_ms=self._request_timeout_ms
            )
        except ClientError as error:
            self.cluster.mark_stale(batch.tp.topic)
            return batch, None, error
        offset = self._delivered_offset(response)
        if offset is not None:
            return batch, offset, None
        refusal = server_error(response.error, concerning=concerning)
        if refusal.code == _OUT_OF_ORDER:
            pass  # an earlier batch failed or is not there yet; _may_retry decides
        elif isinstance(refusal, NotLeaderForPartitionError):
            self.cluster.apply_leader_hint(batch.tp, refusal.leader_id, refusal.leader_address)
        elif refusal.retriable:
            self.cluster.mark_stale(batch.tp.topic)
        return batch, None, refusal

    def _delivered_offset(self, response: pb.ProduceResponse) -> int | None:
        """The base offset a written batch reports (-1 with acks=0); None for a refusal."""
        if response.error.code in (pb.NONE, pb.DUPLICATE_SEQUENCE):
            # A duplicate is a retry of a batch the leader already wrote: its offset stands.
            return response.base_offset if self.config.acks != 0 else -1
        return None

    def _settle(self, outcomes: list[Outcome]) -> list[Outcome]:
        """Requeue retriable failures; return the outcomes that are final."""
        final: list[Outcome] = []
        now = self.clock()
        with self.accumulator.condition:
            for batch, offset, error in outcomes:
                self.in_flight -= 1
                assert self.in_flight >= 0
                if error is not None and self._may_retry(batch, error, now):
                    batch.last_error = error
                    retry_at = now + self.config.connection.retry_backoff_ms / 1000
                    self.accumulator.requeue(batch, retry_at=retry_at)
                    continue
                if error is None:
                    self.accumulator.written(batch)
                self.accumulator.complete(batch, in_flight=True)
                final.append((batch, offset, error))
        return final

    def _may_retry(self, batch: ProducerBatch, error: Exception, now: float) -> bool:
        # The lock is held: whether an earlier batch is unresolved cannot change meanwhile.
        retriable = bool(getattr(error, "retriable", False))
        if getattr(error, "code", None) == _OUT_OF_ORDER:
            # The gap is an earlier batch still in flight or waiting for its retry: this one
            # goes after it. With none, a sequence was really lost: retrying cannot help,
            # unless the batch was numbered under an epoch given up since (the lost sequence
            # is that of the batch that failed): it was not written, so it is numbered anew.
            retriable = self.accumulator.may_follow_unresolved(batch)
            if not retriable and batch.producer_generation != self.accumulator.producer_generation:
                batch.encoded = None
                batch.base_sequence = batch.producer_generation = -1
                retriable = True
        within_attempts = batch.attempts <= self.config.retries
        within_time = (now - batch.created_at) * 1000 < self.config.delivery_timeout_ms
        return retriable and within_attempts and within_time and not self.abort

    def _finish(self, outcomes: list[Outcome]) -> None:
        """Complete futures (outside the lock: callbacks may call send())."""
        for batch, offset, error in outcomes:
            if error is None:
                assert offset is not None
                # One completion per batch: each record's RecordFuture reads this one.
                with contextlib.suppress(InvalidStateError):  # completed already (expiry)
                    batch.future.set_result(offset)
                continue
            if self.config.enable_idempotence and batch.encoded is not None:
                self._give_up_identity(batch)
            failure = DeliveryFailedError(
                batch.tp.topic, batch.tp.partition, str(error), attempts=batch.attempts
            )
            failure.__cause__ = error
            with contextlib.suppress(InvalidStateError):  # completed already (expiry)
                batch.future.set_exception(failure)

    def _give_up_identity(self, failed: ProducerBatch) -> None:
        """`failed`'s sequence numbers are gone: bump the epoch (KIP-360), once per identity.

        A fixed id keeps its epoch and numbering: the leader refuses the gap that follows.
        """
        if self.fixed_producer is not None:
            return
        with self.accumulator.condition:
            if failed.producer_generation != self.accumulator.producer_generation:
                return  # an earlier failure already gave that identity up
            self.accumulator.producer_generation += 1
            self.next_sequence.clear()
            if self.producer_epoch < _PRODUCER_EPOCH_MAX:
                self.producer_epoch += 1
            else:
                self.producer_id = -1  # the epoch is exhausted: ask for a new id

    # -- expiry and shutdown -----------------------------------------------------------------

    def _has_expired(self, now: float) -> bool:
        expiry = self._next_expiry()
        return expiry is not None and expiry <= now

    def _next_expiry(self) -> float | None:
        queued = self.accumulator.queued()
        if not queued:
            return None
        return min(batch.created_at for batch in queued) + self.config.delivery_timeout_ms / 1000

    def _expire_queued(self) -> list[Outcome]:
        """Fail queued batches whose delivery timeout passed (the lock is held)."""
        now = self.clock()
        expired: list[Outcome] = []
        for batch in self.accumulator.queued():
            if (now - batch.created_at) * 1000 < self.config.delivery_timeout_ms:
                continue
            cause = batch.last_error or "no attempt finished"
            error = ClientError(
                f"delivery_timeout_ms={self.config.delivery_timeout_ms} expired ({cause})"
            )
            self.accumulator.remove_queued(batch)
            self.accumulator.complete(batch, in_flight=False)
            expired.append((batch, None, error))
        return expired

    def _fail_all_on_abort(self, reason: str = "producer closed before delivery") -> list[Outcome]:
        """close() gave up waiting (or the thread crashed): fail every batch not delivered."""
        assert self.abort
        failed: list[Outcome] = []
        queued = set(self.accumulator.queued())
        for batch in list(self.accumulator.incomplete):
            if batch in queued:
                self.accumulator.remove_queued(batch)
            self.accumulator.incomplete.discard(batch)
            failed.append((batch, None, ClientClosedError(reason)))
        assert not self.accumulator.incomplete
        return failed


def serialized_produce_request(
    topic: str, partition: int, batch: bytes, *, acks: pb.Acks, timeout_ms: int
) -> bytes:
    """A ProduceRequest carrying `batch`, serialized with one copy of the batch.

    Protobuf serializes the small fields; the batch is appended as field 3 (`batches`, a
    length-delimited field may come in any order). Building the message around a megabyte
    and serializing it cost two copies and fresh arena pages (see `_connection`).
    """
    head = pb.ProduceRequest(
        topic=topic, partition=partition, acks=acks, timeout_ms=timeout_ms
    ).SerializeToString()
    return b"".join((head, _BATCHES_FIELD_TAG, encode_unsigned_varint(len(batch)), batch))


# Field 3 of ProduceRequest, wire type 2 (length-delimited): (3 << 3) | 2.
_BATCHES_FIELD_TAG = bytes(((pb.ProduceRequest.BATCHES_FIELD_NUMBER << 3) | 2,))


def start_sender(sender: Sender) -> threading.Thread:
    thread = threading.Thread(target=sender.run, name="raftlog-producer-sender", daemon=True)
    thread.start()
    return thread
