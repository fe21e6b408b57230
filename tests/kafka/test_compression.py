"""Compressed batches from librdkafka: stored as sent and read back; snappy, which raftlog's
record validation cannot read, is refused with a clear error instead of being stored."""

from __future__ import annotations

import time

import pytest

from raftlog.local_cluster import LocalCluster
from tests.kafka.kafka_wire import create_topic

kafka = pytest.importorskip("confluent_kafka")

COUNT = 100


def _produce(boot: str, topic: str, codec: str) -> list[object]:
    producer = kafka.Producer(
        {
            "bootstrap.servers": boot,
            "acks": "all",
            "compression.codec": codec,
            "linger.ms": 5,
            "message.send.max.retries": 0,
        }
    )
    errors: list[object] = []

    def on_delivery(error: object, message: object) -> None:
        if error is not None:
            errors.append(error)

    for i in range(COUNT):
        producer.produce(
            topic, key=b"%d" % i, value=b"compressible " * 20, partition=0, on_delivery=on_delivery
        )
    assert producer.flush(30) == 0
    return errors


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd"])
def test_compressed_batches_are_stored_and_read_back(
    kafka_cluster: LocalCluster, codec: str
) -> None:
    topic = f"zip-{codec}"
    create_topic(kafka_cluster, topic, partitions=1)
    boot = kafka_cluster.kafka_bootstrap
    assert _produce(boot, topic, codec) == []
    consumer = kafka.Consumer(
        {"bootstrap.servers": boot, "group.id": "x", "enable.auto.commit": False}
    )
    consumer.assign([kafka.TopicPartition(topic, 0, kafka.OFFSET_BEGINNING)])
    keys: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        while len(keys) < COUNT and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None:
                assert message.error() is None and message.value() == b"compressible " * 20
                keys.append(message.key())
    finally:
        consumer.close()
    assert keys == [b"%d" % i for i in range(COUNT)]


def test_snappy_is_refused_with_a_corrupt_message_error(kafka_cluster: LocalCluster) -> None:
    create_topic(kafka_cluster, "zip-snappy", partitions=1)
    errors = _produce(kafka_cluster.kafka_bootstrap, "zip-snappy", "snappy")
    # CORRUPT_MESSAGE (librdkafka's INVALID_MSG), non-retriable: nothing was stored.
    assert len(errors) == COUNT, errors[:2]
    assert all(e.code() == kafka.KafkaError.INVALID_MSG for e in errors), errors[:2]  # type: ignore[attr-defined]
