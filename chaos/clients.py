"""The client layer: what the workload calls, for raftlog and for any other log under test.

Theory of operation. The workload speaks to a `LogClients` port: producers whose `send`
returns a future offset, consumers that poll assigned partitions from offset 0, a reader of
high watermarks, and a final read of one partition. `RaftlogClients` implements it with the
raftlog client library; `raftlog.chaos.syncobj_log` implements it over pysyncobj, so the
same workload, nemesis and checker judge an outside log too.

Classifying outcomes is the one subtle part. A send is `fail` only when it certainly did not
reach the log: it was refused before it was queued, its batch was never sent (no attempt), or
its only attempt was refused by a server with a code that means nothing was appended. Every
other failure (a timeout, a lost connection, NOT_LEADER after the batch may have been
appended, a retry after any of those) is `info`: the record may or may not be in the log.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Literal, Protocol

from raftlog.client import Admin, Consumer, Producer, RecordMetadata
from raftlog.client.errors import DeliveryFailedError, ServerError

__all__ = ["ChaosConsumer", "ChaosProducer", "LogClients", "RaftlogClients", "ReadRecord"]
__all__ += ["DefiniteSendFailure", "FinalRead", "send_outcome"]

# Server codes that mean the batch was refused before anything was appended.
DEFINITE_REFUSALS = frozenset(
    {
        "UNKNOWN_TOPIC_OR_PARTITION",
        "CORRUPT_BATCH",
        "BATCH_TOO_LARGE",
        "INVALID_REQUEST",
        "OUT_OF_ORDER_SEQUENCE",
        "UNKNOWN_PRODUCER_ID",
        "INVALID_PRODUCER_EPOCH",
    }
)


class DefiniteSendFailure(Exception):
    """A log under test refused a send before appending it anywhere (so: `fail`)."""


@dataclass(frozen=True, slots=True)
class ReadRecord:
    partition: int
    offset: int
    value: str
    key: str | None = None


def send_outcome(error: BaseException) -> Literal["fail", "info"]:
    """`fail` when the record certainly is not in the log, else `info` (see module doc)."""
    if isinstance(error, DefiniteSendFailure):
        return "fail"
    if isinstance(error, DeliveryFailedError):
        if error.attempts == 0:
            return "fail"
        cause = error.__cause__
        if error.attempts == 1 and isinstance(cause, ServerError):
            return "fail" if cause.code in DEFINITE_REFUSALS else "info"
    return "info"


class ChaosProducer(Protocol):
    def send(self, topic: str, partition: int, value: str, key: str | None = None) -> Future[int]:
        """Queue one record; the future gives its offset (-1 when acks=0 says none). A
        `key` only for logs that keep keys (the keyed workload on a compacted topic)."""
        ...

    def close(self, timeout_s: float) -> None:
        """Deliver what is queued for up to `timeout_s`, then release the producer."""
        ...


class ChaosConsumer(Protocol):
    def poll(self, timeout_ms: int) -> list[ReadRecord]:
        """The records that arrived within `timeout_ms` on the assigned partitions (maybe none)."""
        ...

    def close(self) -> None:
        """Release the consumer."""
        ...


class LogClients(Protocol):
    """Factory of the clients one run uses against one log (raftlog or a baseline)."""

    def create_topic(
        self,
        topic: str,
        partitions: int,
        replication_factor: int,
        config: Mapping[str, str] | None = None,
    ) -> None:
        """Create `topic` with `partitions`, `replication_factor` and the topic `config`; raises if
        the log refuses or does not answer."""
        ...

    def producer(self, *, acks: str, idempotence: bool) -> ChaosProducer:
        """A new producer with `acks` ("all", "1" or "0") and idempotence as asked."""
        ...

    def consumer(self, topic: str, partitions: Sequence[int]) -> ChaosConsumer:
        """A new consumer assigned `partitions` of `topic`, each read from offset 0."""
        ...

    def high_watermarks(self, topic: str, partitions: Sequence[int]) -> dict[int, int]:
        """The high watermark of each of `partitions`; raises when the log cannot answer."""
        ...

    def final_read(self, topic: str, partition: int, *, timeout_s: float) -> FinalRead:
        """Every record of the partition from offset 0 up to its high watermark read first; raises
        TimeoutError past `timeout_s`."""
        ...


@dataclass(frozen=True, slots=True)
class FinalRead:
    records: tuple[ReadRecord, ...]
    end_offset: int


def _acks(acks: str) -> Literal["all", 1, 0]:
    if acks == "all":
        return "all"
    if acks in ("1", "0"):
        return 1 if acks == "1" else 0
    raise ValueError(f"acks: 'all', '1' or '0', got {acks!r}")


class _RaftlogProducer:
    def __init__(self, producer: Producer) -> None:
        self._producer = producer

    def send(self, topic: str, partition: int, value: str, key: str | None = None) -> Future[int]:
        """Queue the record on the raftlog Producer; the future gives its offset or the delivery
        error."""
        offset: Future[int] = Future()
        encoded_key = None if key is None else key.encode()
        sent = self._producer.send(
            topic, key=encoded_key, value=value.encode(), partition=partition
        )

        def done(meta: Future[RecordMetadata]) -> None:
            """Hand the delivery's offset, or its error, to `offset`."""
            error = meta.exception()
            if error is not None:
                offset.set_exception(error)
            else:
                offset.set_result(meta.result().offset)

        sent.add_done_callback(done)
        return offset

    def close(self, timeout_s: float) -> None:
        """Close the raftlog Producer, waiting up to `timeout_s` for queued records."""
        self._producer.close(timeout_ms=int(timeout_s * 1000))


class _RaftlogConsumer:
    def __init__(self, consumer: Consumer, topic: str, partitions: Sequence[int]) -> None:
        self._consumer = consumer
        consumer.assign([(topic, p) for p in partitions])
        for p in partitions:
            consumer.seek((topic, p), 0)  # every consumer reads each partition from the start

    def poll(self, timeout_ms: int) -> list[ReadRecord]:
        """The records the raftlog Consumer fetched within `timeout_ms`, values and keys decoded as
        UTF-8 (bad bytes replaced)."""
        return [
            ReadRecord(r.partition, r.offset, _text(r.value), _key(r.key))
            for r in self._consumer.poll(timeout_ms=timeout_ms)
        ]

    def close(self) -> None:
        """Close the raftlog Consumer."""
        self._consumer.close()


class RaftlogClients:
    """`LogClients` over the raftlog client library, with short timeouts so faults show."""

    def __init__(self, bootstrap: str, *, request_timeout_ms: int = 2_000) -> None:
        assert bootstrap and request_timeout_ms > 0
        self.bootstrap = bootstrap
        self.request_timeout_ms = request_timeout_ms

    def create_topic(
        self,
        topic: str,
        partitions: int,
        replication_factor: int,
        config: Mapping[str, str] | None = None,
    ) -> None:
        """Create the topic through raftlog's Admin (10 s request timeout); raises the client's
        error if refused."""
        with Admin(self.bootstrap, request_timeout_ms=10_000) as admin:
            admin.create_topic(
                topic, partitions=partitions, replication_factor=replication_factor, config=config
            )

    def producer(self, *, acks: str, idempotence: bool) -> ChaosProducer:
        """A raftlog Producer with a 2 ms linger and the short request timeout (delivery timeout
        five times it); raises ValueError for unknown `acks`."""
        producer = Producer(
            self.bootstrap,
            acks=_acks(acks),
            enable_idempotence=idempotence,
            linger_ms=2,
            request_timeout_ms=self.request_timeout_ms,
            delivery_timeout_ms=self.request_timeout_ms * 5,
            max_block_ms=self.request_timeout_ms,
        )
        return _RaftlogProducer(producer)

    def _consumer(self) -> Consumer:
        return Consumer(
            self.bootstrap,
            auto_offset_reset="error",  # a silent reset would hide a skip or a rewind
            fetch_max_wait_ms=200,
            request_timeout_ms=self.request_timeout_ms,
        )

    def consumer(self, topic: str, partitions: Sequence[int]) -> ChaosConsumer:
        """A raftlog Consumer assigned `partitions` from offset 0, with auto_offset_reset="error" so
        that a skip or a rewind shows."""
        return _RaftlogConsumer(self._consumer(), topic, partitions)

    def high_watermarks(self, topic: str, partitions: Sequence[int]) -> dict[int, int]:
        """The end offsets of `partitions` from a short-lived Consumer; raises the client's error
        when they cannot be read."""
        consumer = self._consumer()
        try:
            consumer.assign([(topic, p) for p in partitions])
            ends = consumer.end_offsets([(topic, p) for p in partitions])
        finally:
            consumer.close()
        return {tp.partition: offset for tp, offset in ends.items()}

    def final_read(self, topic: str, partition: int, *, timeout_s: float) -> FinalRead:
        """Read the partition from offset 0 to its end offset with a fresh Consumer; raises
        TimeoutError past `timeout_s`."""
        return _read_partition(self._consumer(), topic, partition, timeout_s=timeout_s)


def _read_partition(
    consumer: Consumer, topic: str, partition: int, *, timeout_s: float
) -> FinalRead:
    """Every record of one partition from offset 0 up to the high watermark read first."""
    tp = (topic, partition)
    deadline = time.monotonic() + timeout_s
    records: list[ReadRecord] = []
    try:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        (end_offset,) = consumer.end_offsets([tp]).values()
        while consumer.position(tp) < end_offset:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"final read of {topic}/{partition}: at offset {consumer.position(tp)} "
                    f"of {end_offset} after {timeout_s:.0f}s"
                )
            for r in consumer.poll(timeout_ms=500):
                records.append(ReadRecord(r.partition, r.offset, _text(r.value), _key(r.key)))
    finally:
        consumer.close()
    assert all(a.offset < b.offset for a, b in itertools.pairwise(records)), topic
    return FinalRead(tuple(records), end_offset)


def _text(value: bytes | None) -> str:
    return (value or b"").decode(errors="replace")


def _key(key: bytes | None) -> str | None:
    return None if key is None else key.decode(errors="replace")
