"""What the transaction tests share: a confluent-kafka transactional producer, a reader that
collects every value of some partitions at one isolation level, and how a producer ends a
transaction and reports what it learned."""

from __future__ import annotations

import time
from typing import Any

import pytest

kafka = pytest.importorskip("confluent_kafka")

# What a producer learned of a transaction it ended (`end_transaction`).
COMMITTED, ABORTED, FATAL = "committed", "aborted", "fatal"


def transactional_producer(boot: str, transactional_id: str, **settings: Any) -> Any:
    """A confluent-kafka producer with `transactional_id`, its transactions initialised."""
    producer = kafka.Producer(
        {
            "bootstrap.servers": boot,
            "transactional.id": transactional_id,
            "transaction.timeout.ms": 30_000,
            **settings,
        }
    )
    producer.init_transactions(30)
    return producer


def read_values(
    boot: str, isolation: str, topics: dict[str, int], count_min: int, tags: tuple[str, ...] = ()
) -> list[str]:
    """Every value in `topics` from the start (of those starting with one of `tags`, when
    given), reading until `count_min` of them were seen and then one more second (so anything
    that should not be there has time to show up)."""
    consumer = kafka.Consumer(
        {
            "bootstrap.servers": boot,
            "group.id": f"reader-{isolation}-{time.monotonic_ns()}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
        }
    )
    consumer.assign(
        [
            kafka.TopicPartition(name, p, kafka.OFFSET_BEGINNING)
            for name, partitions in topics.items()
            for p in range(partitions)
        ]
    )
    values: list[str] = []
    settle_until = None
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            if settle_until is None and len(values) >= count_min:
                settle_until = time.monotonic() + 1.0
            if settle_until is not None and time.monotonic() > settle_until:
                break
            message = consumer.poll(0.2)
            if message is None or message.error() is not None:
                continue
            value = message.value().decode()
            if not tags or value.startswith(tags):
                values.append(value)
    finally:
        consumer.close()
    return sorted(values)


def end_transaction(producer: Any, *, commit: bool, timeout_s: float = 60) -> str:
    """Commit (or abort) the open transaction as librdkafka's documentation says an application
    must: retry a retriable error, abort after an abortable one. What the producer learned:
    COMMITTED, ABORTED, or FATAL (the producer is unusable; the outcome is the coordinator's)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if commit:
                producer.commit_transaction(max(1.0, deadline - time.monotonic()))
                return COMMITTED
            producer.abort_transaction(max(1.0, deadline - time.monotonic()))
            return ABORTED
        except kafka.KafkaException as raised:
            error = raised.args[0]
            if error.fatal():
                return FATAL
            if error.txn_requires_abort():
                commit = False
            elif not error.retriable() or time.monotonic() > deadline:
                raise
