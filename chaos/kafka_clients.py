"""`--client kafka`: the chaos workload through confluent-kafka (librdkafka) on the Kafka listeners.

Theory of operation. Producers are librdkafka producers (acks=all and idempotence by default,
as Kafka's own clients are configured); a background thread serves their delivery reports,
which resolve the futures the workload waits on. Consumers read committed data
(`isolation.level=read_committed`) either by assigning every partition from offset 0 with
`auto.offset.reset=error` (a silent reset would hide a skip or a rewind), or as members of a
classic consumer group whose rebalance callbacks record each assignment and revocation
(librdkafka calls them inside `consume`, before it returns any record of the new
assignment). High watermarks come from ListOffsets through the Kafka listener too.

The final read, the judge's view of each log, goes through raftlog's own gRPC client on
purpose: a Kafka front-end bug then shows as a difference between what Kafka clients saw and
what the log holds, instead of being read back the same wrong way. Every delivery failure is
`info` (unknown): librdkafka does not say whether a failed batch was ever appended.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, InvalidStateError
from typing import Any

import confluent_kafka as kafka
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from raftlog.chaos.clients import (
    ChaosConsumer,
    ChaosProducer,
    FinalRead,
    RaftlogClients,
    ReadRecord,
)
from raftlog.chaos.consumer_groups import AssignmentListener, ChaosGroupConsumer

__all__ = ["KafkaClientError", "KafkaClients"]

POLL_INTERVAL_S = 0.05
# librdkafka reports every refused connection (each kill does that); to logging, not stderr.
_LIBRDKAFKA_LOG = logging.getLogger("raftlog.chaos.librdkafka")
_LIBRDKAFKA_LOG.addHandler(logging.NullHandler())  # not Python's last-resort stderr either
RECORDS_PER_POLL_MAX = 500


class KafkaClientError(Exception):
    """A librdkafka error, with Kafka's own word on whether retrying may help."""

    def __init__(self, error: Any) -> None:
        super().__init__(str(error))
        self.retriable = bool(error.retriable()) if hasattr(error, "retriable") else False


class _KafkaProducer:
    def __init__(self, config: dict[str, Any]) -> None:
        self._producer = kafka.Producer(config)
        self._closed = threading.Event()
        self._poller = threading.Thread(target=self._serve, name="chaos-kafka-poll", daemon=True)
        self._poller.start()

    def _serve(self) -> None:
        while not self._closed.is_set():
            self._producer.poll(POLL_INTERVAL_S)  # runs the delivery callbacks

    def send(self, topic: str, partition: int, value: str, key: str | None = None) -> Future[int]:
        """Queue the record on librdkafka; the future gives its offset (-1 under acks=0) or a
        KafkaClientError. BufferError or KafkaException is raised when it cannot be queued."""
        offset: Future[int] = Future()

        def delivered(error: Any, message: Any) -> None:
            """librdkafka's delivery report: resolve `offset` with the record's offset, or fail it
            with the error."""
            # Never raise here: confluent-kafka turns an exception in a callback into a
            # SystemError at the next poll or flush, on whichever thread makes it.
            with contextlib.suppress(InvalidStateError):
                if error is not None:
                    offset.set_exception(KafkaClientError(error))
                else:
                    offset.set_result(max(-1, message.offset()))  # acks=0: librdkafka: -1001

        # BufferError or KafkaException here: refused before it was queued (the workload's
        # `fail`).
        self._producer.produce(topic, value=value.encode(), partition=partition,
                               key=None if key is None else key.encode(),
                               on_delivery=delivered)  # fmt: skip
        return offset

    def close(self, timeout_s: float) -> None:
        """Stop the delivery-report thread, then flush queued records for up to `timeout_s`.

        One thread at a time calls into librdkafka: a flush beside the thread's poll ran the
        delivery callbacks on both, and confluent-kafka crashed the poll with a SystemError
        (seed 15 of a loaded sweep, at the end of the run)."""
        self._closed.set()
        self._poller.join(timeout_s)
        self._producer.flush(timeout_s)


def _records(messages: list[Any]) -> list[ReadRecord]:
    records = []
    for message in messages:
        if message.error() is not None:
            raise KafkaClientError(message.error())
        value = (message.value() or b"").decode(errors="replace")
        records.append(ReadRecord(message.partition(), message.offset(), value))
    return records


class _KafkaConsumer:
    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer

    def poll(self, timeout_ms: int) -> list[ReadRecord]:
        """Up to 500 records consumed within `timeout_ms`; raises KafkaClientError for a message
        that carries an error."""
        return _records(self._consumer.consume(RECORDS_PER_POLL_MAX, timeout_ms / 1000))

    def close(self) -> None:
        """Close the librdkafka consumer (leaving its group, if any)."""
        self._consumer.close()


class _KafkaGroupConsumer(_KafkaConsumer):
    def __init__(self, consumer: Any, topic: str, listener: AssignmentListener) -> None:
        super().__init__(consumer)
        self._topic = topic
        self._listener = listener
        self._closing = False
        consumer.subscribe([topic], on_assign=self._assigned, on_revoke=self._revoked,
                           on_lost=self._revoked)  # fmt: skip

    def _assigned(self, consumer: Any, partitions: list[Any]) -> None:
        if partitions:
            self._listener("assign", sorted(p.partition for p in partitions))

    def _revoked(self, consumer: Any, partitions: list[Any]) -> None:
        if partitions and not self._closing:
            self._listener("revoke", sorted(p.partition for p in partitions))

    def commit(self, offsets: Mapping[int, int]) -> None:
        """Commit the next offsets per partition synchronously; raises KafkaClientError for the
        first partition the coordinator refused."""
        chosen = [kafka.TopicPartition(self._topic, p, o) for p, o in sorted(offsets.items())]
        answered = self._consumer.commit(offsets=chosen, asynchronous=False)
        for tp in answered or []:
            if tp.error is not None:
                raise KafkaClientError(tp.error)

    def close(self) -> None:
        """Close without reporting the last partitions as revoked: leaving is not a revocation the
        history needs."""
        self._closing = True  # leaving is not a revocation the history needs
        super().close()


class KafkaClients:
    """`LogClients` and `GroupClients` through confluent-kafka (module docstring)."""

    def __init__(self, kafka_bootstrap: str, grpc_bootstrap: str, *, timeout_ms: int = 2_000):
        assert kafka_bootstrap and grpc_bootstrap and timeout_ms > 0
        self.bootstrap = kafka_bootstrap
        self._judge = RaftlogClients(grpc_bootstrap, request_timeout_ms=timeout_ms)
        self._timeout_ms = timeout_ms
        self._common = {
            "bootstrap.servers": kafka_bootstrap,
            "socket.timeout.ms": timeout_ms * 5,
            "reconnect.backoff.max.ms": 1000,
            "topic.metadata.refresh.interval.ms": 5000,
            "logger": _LIBRDKAFKA_LOG,
        }

    def create_topic(
        self,
        topic: str,
        partitions: int,
        replication_factor: int,
        config: Mapping[str, str] | None = None,
    ) -> None:
        """Create the topic through the Kafka AdminClient; raises its KafkaException if refused or
        not answered within 15 s."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        new = NewTopic(topic, partitions, replication_factor, config=dict(config or {}))
        (future,) = admin.create_topics([new], request_timeout=10).values()
        future.result(timeout=15)

    def producer(self, *, acks: str, idempotence: bool) -> ChaosProducer:
        """A librdkafka producer with `acks` and idempotence as asked, a 2 ms linger and the short
        request timeout (message timeout five times it)."""
        return _KafkaProducer(
            {
                **self._common,
                "acks": acks if acks == "all" else int(acks),
                "enable.idempotence": idempotence,
                "linger.ms": 2,
                "request.timeout.ms": self._timeout_ms,
                "message.timeout.ms": self._timeout_ms * 5,
            }
        )

    def _consumer(self, **config: Any) -> Any:
        return kafka.Consumer(
            {
                **self._common,
                "enable.auto.commit": False,  # the workload commits, so the history has it
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": 200,
                **config,
            }
        )

    def consumer(self, topic: str, partitions: Sequence[int]) -> ChaosConsumer:
        """A librdkafka consumer assigned `partitions` from offset 0, with auto.offset.reset=error
        so that a skip or a rewind shows."""
        consumer = self._consumer(**{"group.id": "chaos-assign", "auto.offset.reset": "error"})
        consumer.assign([kafka.TopicPartition(topic, p, 0) for p in partitions])
        return _KafkaConsumer(consumer)

    def group_consumer(
        self, topic: str, group: str, listener: AssignmentListener
    ) -> ChaosGroupConsumer:
        """A classic consumer-group member of `group` subscribed to `topic`, whose rebalance
        callbacks report assignments and revocations to `listener`."""
        consumer = self._consumer(
            **{
                "group.id": group,
                "auto.offset.reset": "earliest",  # no committed offset yet: start at 0
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 500,
            }
        )
        return _KafkaGroupConsumer(consumer, topic, listener)

    def committed(self, topic: str, group: str, partitions: Sequence[int]) -> dict[int, int]:
        """The group's committed offsets of `partitions` (those with none left out); raises
        KafkaClientError for a partition the coordinator answered with an error."""
        consumer = self._consumer(**{"group.id": group})
        try:
            wanted = [kafka.TopicPartition(topic, p) for p in partitions]
            found = consumer.committed(wanted, timeout=self._timeout_ms / 1000)
        finally:
            consumer.close()
        errors = [tp.error for tp in found if tp.error is not None]
        if errors:
            raise KafkaClientError(errors[0])
        return {tp.partition: tp.offset for tp in found if tp.offset >= 0}

    def high_watermarks(self, topic: str, partitions: Sequence[int]) -> dict[int, int]:
        """Each partition's high watermark, asked of its leader (ListOffsets) through the Kafka
        listener; raises KafkaException when not answered in time."""
        consumer = self._consumer(**{"group.id": "chaos-watermarks"})
        try:
            return {
                p: consumer.get_watermark_offsets(
                    kafka.TopicPartition(topic, p), timeout=self._timeout_ms / 1000, cached=False
                )[1]
                for p in partitions
            }
        finally:
            consumer.close()

    def final_read(self, topic: str, partition: int, *, timeout_s: float) -> FinalRead:
        """The judge's read of the partition, through raftlog's gRPC client on purpose so a Kafka
        front-end bug cannot hide itself; raises TimeoutError past `timeout_s`."""
        return self._judge.final_read(topic, partition, timeout_s=timeout_s)
