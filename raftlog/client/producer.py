"""The Producer: send records to topics, batched, compressed, retried and idempotent.

Theory of operation. `send()` runs on the caller's thread: it looks up the topic's partitions
(from cached metadata, asking the cluster when it has none), picks the partition (explicit,
by murmur2 of the key, or sticky for keyless records), reserves the record's bytes in the
bounded buffer (blocking up to `max_block_ms`) and appends it to that partition's open batch.
It returns a `concurrent.futures.Future` that resolves to a `RecordMetadata` once the batch is
acknowledged with the requested `acks`, or fails with a `DeliveryFailedError` (a light
`RecordFuture` reading its batch's one future: no Condition per record). The background
sender thread (`raftlog.client._sender`) does everything else: linger, InitProducerId,
encoding, routing to leaders, retries and completion, except that a written batch whose
records have no callbacks is completed by gRPC's thread that got the answer. Up to
`max_in_flight_per_partition` batches of a partition are in flight at once (default 5 with
idempotence, whose sequence numbers keep them in order across retries; 1 without, where a
retry could be reordered).

Transactions (Kafka's transactional.id): built with `transactional_id=`, the producer calls
`init_transactions()` once, then `begin_transaction()`, `send()`s, optionally
`send_offsets_to_transaction()`, and `commit_transaction()` or `abort_transaction()`
(`raftlog.client._transactions`; docs/transactions.md). Its batches carry the transactional
bit and the producer id and epoch the coordinator handed out.

`flush()` makes every batch ready at once and waits for the records sent before it; `close()`
flushes, stops the sender and closes the channels (also on leaving a `with` block).

Resumable writers (the Spark sink's exactly-once tasks). Normally the cluster hands out the
producer id. A writer that must be able to crash and start again *as the same producer*
derives its id instead (`derived_producer_id(name)`: ids from `DERIVED_PRODUCER_ID_MIN` =
2**62 up, a range the controller never allocates) and passes `producer_id=`. Before its first
record to a partition it calls `resume(topic, partition)`: the partition leader reports the
producer's last *committed* sequence (Log.DescribeProducers, as Kafka's KIP-664), the
producer continues numbering after it, and the caller learns how many of its records (in its
own deterministic order) the partition already holds, so it can skip exactly those. A
concurrent earlier incarnation is harmless: the leader's strict sequence check lets only one
of two writers continue a sequence; the other's batches fail OUT_OF_ORDER_SEQUENCE.
"""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, wait
from types import TracebackType

from raftlog.client._connection import ConnectionOptions, TopicPartition
from raftlog.client._sender import Sender, start_sender
from raftlog.client._transactions import ConsumerGroupMetadata, TransactionManager
from raftlog.client.accumulator import Accumulator, RecordFuture, RecordMetadata
from raftlog.client.admin import Admin
from raftlog.client.config import (
    KIB,
    MIB,
    AcksOption,
    CompressionOption,
    ProducerConfig,
)
from raftlog.client.errors import (
    ClientClosedError,
    ClientError,
    NotLeaderForPartitionError,
    RequestTimedOutError,
    server_error,
)
from raftlog.client.partitioner import StickyPartitioner, partition_for_key
from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.storage.records import Headers, RecordFields
from raftlog.types import DERIVED_PRODUCER_ID_MIN

__all__ = ["DERIVED_PRODUCER_ID_MIN", "Producer", "derived_producer_id"]

HeadersInput = Sequence[tuple[str, bytes | None]]

_PRODUCER_ID_LIMIT = 1 << 63  # ids are non-negative int64
_PRODUCER_EPOCH_MAX = 2**15 - 1  # int16 in the RecordBatch header


def derived_producer_id(name: str) -> int:
    """A stable producer id for `name`, in the derived range (62 bits of BLAKE2b of it).

    Distinct names collide with probability about n**2 / 2**63 for n names in use at once.
    """
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest()
    producer_id = DERIVED_PRODUCER_ID_MIN | (
        int.from_bytes(digest, "big") % DERIVED_PRODUCER_ID_MIN
    )
    assert DERIVED_PRODUCER_ID_MIN <= producer_id < _PRODUCER_ID_LIMIT
    return producer_id


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class Producer:
    """Sends records to a raftlog cluster; thread-safe (see the module docstring)."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        acks: AcksOption = "all",
        linger_ms: int = 5,
        batch_bytes_max: int = 256 * KIB,
        buffer_bytes_max: int = 32 * MIB,
        max_block_ms: int = 60_000,
        compression: CompressionOption = None,
        enable_idempotence: bool = True,
        retries: int = 2**31 - 1,
        delivery_timeout_ms: int = 120_000,
        max_in_flight_per_partition: int | None = None,
        request_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 100,
        metadata_max_age_ms: int = 300_000,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        tls_ca: str | os.PathLike[str] | None = None,  # TLS, trusting this CA
        token: str | None = None,  # bearer token (docs/security.md)
        tls_cert: str | os.PathLike[str] | None = None,  # client certificate (mTLS)
        tls_key: str | os.PathLike[str] | None = None,  # its private key
        wall_clock_ms: Callable[[], int] = _wall_clock_ms,
        rng: random.Random | None = None,
        producer_id: int | None = None,
        producer_epoch: int = 0,
        transactional_id: str | None = None,
        transaction_timeout_ms: int = 60_000,
    ) -> None:
        """`producer_id` (derived, see the module docstring) fixes the producer's identity;
        None asks the cluster for a fresh one (InitProducerId). `transactional_id` makes a
        transactional producer (Kafka's transactional.id; `init_transactions()` first)."""
        if transactional_id is not None and (
            producer_id is not None or not enable_idempotence or acks != "all"
        ):
            raise ClientError(
                "transactional_id needs enable_idempotence=True and acks='all', "
                "and no producer_id (the coordinator hands it out)"
            )
        if producer_id is not None:
            if not DERIVED_PRODUCER_ID_MIN <= producer_id < _PRODUCER_ID_LIMIT:
                raise ClientError(
                    f"producer_id must be a derived id in [2**62, 2**63), got {producer_id} "
                    "(use derived_producer_id)"
                )
            if not 0 <= producer_epoch <= _PRODUCER_EPOCH_MAX:
                raise ClientError(
                    f"producer_epoch must be in [0, {_PRODUCER_EPOCH_MAX}], got {producer_epoch}"
                )
            if not enable_idempotence:
                raise ClientError("producer_id needs enable_idempotence=True")
        options = ConnectionOptions.from_arguments(locals())
        connection = options.config
        self.config = ProducerConfig(
            acks=acks,
            linger_ms=linger_ms,
            batch_bytes_max=batch_bytes_max,
            buffer_bytes_max=buffer_bytes_max,
            max_block_ms=max_block_ms,
            compression=compression,
            enable_idempotence=enable_idempotence,
            retries=retries,
            delivery_timeout_ms=delivery_timeout_ms,
            max_in_flight_per_partition=max_in_flight_per_partition,
            connection=connection,
        ).validate()
        self._cluster = options.connect(bootstrap)
        self._clock = clock
        # Clock and sleep are ports: tests pass a manual clock whose sleep moves it.
        self._sleep = sleep
        self._wall_clock_ms = wall_clock_ms
        self._partitioner = StickyPartitioner(rng if rng is not None else random.Random())
        self._accumulator = Accumulator(
            batch_bytes_max=batch_bytes_max,
            buffer_bytes_max=buffer_bytes_max,
            linger_ms=linger_ms,
            clock=clock,
            max_in_flight=self.config.in_flight_per_partition_max,
            sequenced=self.config.enable_idempotence,
        )
        self._sender = Sender(
            cluster=self._cluster,
            accumulator=self._accumulator,
            config=self.config,
            clock=clock,
            fixed_producer=None if producer_id is None else (producer_id, producer_epoch),
        )
        self._txn: TransactionManager | None = None
        self._coordinator: Admin | None = None
        if transactional_id is not None:
            self._coordinator = Admin(
                bootstrap, request_timeout_ms=request_timeout_ms,
                retry_backoff_ms=retry_backoff_ms, clock=clock, sleep=sleep, tls_ca=tls_ca,
                token=token, tls_cert=tls_cert, tls_key=tls_key,
            )  # fmt: skip
            call = self._coordinator.call_controller
            self._txn = TransactionManager(
                transactional_id=transactional_id,
                transaction_timeout_ms=transaction_timeout_ms,
                call_controller=lambda rpc, request, what: call(rpc, request, concerning=what),
                request_timeout_ms=request_timeout_ms,
                retry_backoff_ms=retry_backoff_ms,
                clock=clock,
                sleep=sleep,
            )
        self._closed = False
        self._close_lock = threading.Lock()
        self._thread = start_sender(self._sender)

    def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        headers: HeadersInput | None = None,
        timestamp_ms: int | None = None,
    ) -> Future[RecordMetadata]:
        """Queue one record; the future resolves when the cluster acknowledged it.

        Raises at once (not through the future) for a closed producer, a bad argument, an
        unknown topic or partition, a record too large, or a buffer full for `max_block_ms`.
        """
        if self._closed:
            raise ClientClosedError(f"producer closed: cannot send to topic {topic!r}")
        if not isinstance(topic, str) or not topic:
            raise ClientError(f"topic must be a non-empty string, got {topic!r}")
        if timestamp_ms is None:
            timestamp_ms = self._wall_clock_ms()
        elif not 0 <= timestamp_ms < 2**63:
            raise ClientError(f"timestamp_ms must be a non-negative int64, got {timestamp_ms}")
        # Plain bytes (nearly every call) skip the conversion calls.
        if key is not None and type(key) is not bytes:
            key = _optional_bytes("key", key)
        if value is not None and type(value) is not bytes:
            value = _optional_bytes("value", value)
        # A plain tuple, not a RecordInput: cheaper, and the cyclic GC stops tracking it.
        record: RecordFields = (
            key,
            value,
            timestamp_ms,
            () if headers is None else _headers(headers),
        )
        # Fresh routes are one dict read; otherwise metadata is fetched, up to max_block_ms.
        routes = self._cluster.cached_topic_partitions(topic) or self._topic_partitions(topic)
        max_block_ms = self.config.max_block_ms
        if partition is not None and not 0 <= partition < len(routes):
            raise ClientError(
                f"partition {partition} of topic {topic!r} does not exist (it has {len(routes)})"
            )
        if key is not None and partition is None:
            partition = partition_for_key(key, len(routes))
        future: RecordFuture | None
        if partition is None:
            future = self._append_sticky(routes, record)
        else:
            if self._txn is not None:
                self._txn.before_append(topic, partition)
            future = self._accumulator.append(routes[partition], record, max_block_ms=max_block_ms)
        assert future is not None
        if self._txn is not None:
            self._txn.track(future)
        return future

    def _append_sticky(
        self, routes: tuple[TopicPartition, ...], record: RecordFields
    ) -> RecordFuture:
        topic, partitions = routes[0].topic, len(routes)
        chosen = self._partitioner.partition(topic, partitions)
        max_block_ms = self.config.max_block_ms
        if self._txn is not None:
            self._txn.before_append(topic, chosen)
        future = self._accumulator.append(
            routes[chosen], record, max_block_ms=max_block_ms, abort_on_new_batch=True
        )
        if future is not None:
            return future
        # The sticky partition's batch is full: move on, then open a batch wherever we land.
        self._partitioner.on_batch_closed(topic, chosen, partitions)
        tp = routes[self._partitioner.partition(topic, partitions)]
        if self._txn is not None:
            self._txn.before_append(tp.topic, tp.partition)
        future = self._accumulator.append(tp, record, max_block_ms=max_block_ms)
        assert future is not None
        return future

    def resume(self, topic: str, partition: int) -> int:
        """Continue this fixed producer's sequence on `topic`/`partition`; return how many of
        its records (in send order) the partition has committed, which the caller must skip.

        Call it before the first send() to that partition. Retriable errors (an election, stale
        metadata) are retried until `max_block_ms`; a record of a newer epoch of this id means
        another writer took over, a `ClientError`.
        """
        fixed = self._sender.fixed_producer
        if fixed is None:
            raise ClientError("resume() needs a producer built with producer_id=")
        if self._closed:
            raise ClientClosedError(f"producer closed: cannot resume {topic}/{partition}")
        partitions = self._partition_count(topic)
        if not 0 <= partition < partitions:
            raise ClientError(
                f"partition {partition} of topic {topic!r} does not exist (it has {partitions})"
            )
        tp = TopicPartition(topic, partition)
        if self._accumulator.has_records_for(tp):
            raise ClientError(f"resume({topic!r}, {partition}) after records were sent there")
        producer_id, epoch = fixed
        response = self._describe_producer(tp, producer_id)
        if not response.known or response.producer_epoch < epoch:
            next_sequence = 0  # nothing committed under this epoch: a new epoch starts at 0
        elif response.producer_epoch > epoch:
            raise ClientError(
                f"producer {producer_id} on {topic}/{partition} has epoch "
                f"{response.producer_epoch}, newer than this producer's {epoch}"
            )
        else:
            next_sequence = response.last_sequence + 1
        self._sender.resume_at(tp, next_sequence)
        return next_sequence

    def _describe_producer(
        self, tp: TopicPartition, producer_id: int
    ) -> pb.DescribeProducersResponse:
        """Log.DescribeProducers at `tp`'s leader, retrying retriable failures."""
        request = pb.DescribeProducersRequest(
            topic=tp.topic, partition=tp.partition, producer_id=producer_id
        )
        deadline = self._clock() + self.config.max_block_ms / 1000
        backoff_s = self.config.connection.retry_backoff_ms / 1000
        concerning = f"DescribeProducers for {tp.topic}/{tp.partition}"
        while True:
            try:
                address = self._cluster.leader_address(tp)
                response: pb.DescribeProducersResponse = self._cluster.call(
                    address, "Log.DescribeProducers", request
                )
                if response.error.code == pb.NONE:
                    return response
                refusal = server_error(response.error, concerning=concerning)
                if isinstance(refusal, NotLeaderForPartitionError):
                    self._cluster.apply_leader_hint(tp, refusal.leader_id, refusal.leader_address)
                else:
                    self._cluster.mark_stale(tp.topic)
                raise refusal
            except ClientError as error:
                if not error.retriable or self._clock() + backoff_s >= deadline:
                    raise
                if not isinstance(error, NotLeaderForPartitionError):
                    self._cluster.mark_stale(tp.topic)
            self._sleep(backoff_s)  # an election under way: the caller blocks by design

    def _partition_count(self, topic: str) -> int:
        return len(self._topic_partitions(topic))

    def _topic_partitions(self, topic: str) -> tuple[TopicPartition, ...]:
        """`topic`'s partitions, retrying retriable metadata errors up to max_block_ms."""
        deadline = self._clock() + self.config.max_block_ms / 1000
        backoff_s = self.config.connection.retry_backoff_ms / 1000
        while True:
            try:
                return self._cluster.topic_partitions(topic)
            except ClientError as error:
                if not error.retriable or self._clock() + backoff_s >= deadline:
                    raise
            self._sleep(backoff_s)  # waiting for metadata to spread: the caller blocks by design

    def partitions_for(self, topic: str) -> set[int]:
        """The partition ids of `topic` as this producer routes to them."""
        if self._closed:
            raise ClientClosedError(f"producer closed: cannot look up topic {topic!r}")
        count = self._partition_count(topic)
        return set(range(count))

    # -- transactions (a producer built with transactional_id) ------------------------------

    def init_transactions(self) -> None:
        """Take the transactional id's producer id at its next epoch, fencing any older
        instance (its open transaction is aborted); once, before the first send."""
        txn = self._transactional("init_transactions")
        with self._accumulator.condition:
            if self._accumulator.incomplete or self._sender.transactional:
                raise ClientError("init_transactions() once, before the first send()")
        producer_id, epoch = txn.init()
        with self._accumulator.condition:
            self._sender.fixed_producer = (producer_id, epoch)
            self._sender.producer_id, self._sender.producer_epoch = producer_id, epoch
            self._sender.next_sequence.clear()
            self._sender.transactional = True

    def begin_transaction(self) -> None:
        self._transactional("begin_transaction").begin()

    def send_offsets_to_transaction(
        self, offsets: Mapping[tuple[str, int], int], group_id: str | ConsumerGroupMetadata
    ) -> None:
        """Commit `offsets` ({(topic, partition): next offset to consume}) for a consumer group
        with this transaction: they become its committed offsets only if the transaction
        commits. Pass the consumer's `group_metadata()` (or the group id alone): the
        coordinator then refuses them (UNKNOWN_MEMBER, FENCED_MEMBER_EPOCH,
        NOT_PARTITION_OWNER: abort the transaction) once that consumer is no longer the
        member it was, so a zombie cannot commit for partitions that moved on (KIP-447)."""
        self._transactional("send_offsets_to_transaction").send_offsets(offsets, group_id)

    def commit_transaction(self, timeout_ms: int | None = None) -> None:
        """Flush, then commit; TransactionError (abort it) if any record of it failed,
        ProducerFencedError if another instance or the coordinator took over."""
        txn = self._transactional("commit_transaction")
        txn.end(commit=True, flush=lambda: self.flush(timeout_ms), renumber=self._renumber)

    def abort_transaction(self, timeout_ms: int | None = None) -> None:
        """Wait for the records sent to settle, then abort: read_committed consumers never
        see them."""
        txn = self._transactional("abort_transaction")
        txn.end(commit=False, flush=lambda: self.flush(timeout_ms), renumber=self._renumber)

    def _renumber(self, producer_id: int, epoch: int) -> None:
        """Number the next transaction's batches with the epoch EndTxn bumped to, from
        sequence 0 (a new epoch starts there); every batch of the ended one is settled."""
        with self._accumulator.condition:
            if (producer_id, epoch) == self._sender.fixed_producer:
                return  # the epoch could not be bumped (its last value): numbering continues
            self._sender.fixed_producer = (producer_id, epoch)
            self._sender.producer_id, self._sender.producer_epoch = producer_id, epoch
            self._sender.next_sequence.clear()

    def _transactional(self, operation: str) -> TransactionManager:
        if self._txn is None:
            raise ClientError(f"{operation}() needs a producer built with transactional_id=")
        if self._closed:
            raise ClientClosedError(f"producer closed: cannot {operation}()")
        return self._txn

    def flush(self, timeout_ms: int | None = None) -> None:
        """Send every buffered record now and wait until those sent before this call finish."""
        self._refuse_from_sender_thread("flush")
        with self._accumulator.condition:
            self._accumulator.flushes_under_way += 1
            pending = [batch.future for batch in self._accumulator.incomplete]
            self._accumulator.condition.notify_all()
        try:
            _, not_done = wait(pending, timeout=None if timeout_ms is None else timeout_ms / 1000)
        finally:
            with self._accumulator.condition:
                self._accumulator.flushes_under_way -= 1
        if not_done:
            raise RequestTimedOutError(
                f"flush ({len(not_done)} batches unacknowledged)",
                address="partition leaders",
                timeout_ms=timeout_ms or 0,
            )

    def close(self, timeout_ms: int | None = None) -> None:
        """Deliver what is buffered (waiting up to `timeout_ms`), then stop; idempotent."""
        self._refuse_from_sender_thread("close")
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        with self._accumulator.condition:
            self._accumulator.closing = True
            self._accumulator.condition.notify_all()
        self._thread.join(None if timeout_ms is None else timeout_ms / 1000)
        if self._thread.is_alive():
            with self._accumulator.condition:
                self._sender.abort = True
                self._accumulator.condition.notify_all()
            self._thread.join()
        self._cluster.close()
        if self._coordinator is not None:
            self._coordinator.close()
        assert not self._thread.is_alive()

    def _refuse_from_sender_thread(self, operation: str) -> None:
        # Delivery callbacks run on the sender thread; waiting there for deliveries that only
        # that thread can complete would never return.
        if threading.current_thread() is self._thread:
            raise ClientError(f"{operation}() from a delivery callback would deadlock")

    def __enter__(self) -> Producer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _optional_bytes(name: str, data: object) -> bytes | None:
    if data is None or isinstance(data, bytes):
        return data
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    raise TypeError(f"{name} must be bytes or None, got {type(data).__name__}")


def _headers(headers: HeadersInput | None) -> Headers:
    if headers is None:
        return ()
    result: list[tuple[str, bytes | None]] = []
    for item in headers:
        if not isinstance(item, tuple) or len(item) != 2 or not isinstance(item[0], str):
            raise TypeError(f"each header must be a (str, bytes | None) pair, got {item!r}")
        result.append((item[0], _optional_bytes(f"header {item[0]!r}", item[1])))
    return tuple(result)
