"""Across interfaces: records produced through raftlog's gRPC client are read through Kafka,
and the reverse, with the same offsets, keys, values, headers and timestamps (the same
batches, stored once, served to both)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from raftlog.client import Consumer, Producer
from raftlog.local_cluster import LocalCluster
from tests.kafka.kafka_wire import create_topic

kafka = pytest.importorskip("confluent_kafka")

COUNT = 50
BASE_MS = 1_700_000_000_000


def _expected(tag: bytes) -> list[tuple[bytes, bytes, list[tuple[str, bytes]], int]]:
    return [
        (
            tag + b"-key-%d" % i,
            tag + b"-value-%d" % i,
            [("n", b"%d" % i), ("tag", tag)],
            BASE_MS + i,
        )
        for i in range(COUNT)
    ]


def _read_with_kafka(boot: str, topic: str) -> list[tuple[int, Any]]:
    consumer = kafka.Consumer(
        {"bootstrap.servers": boot, "group.id": "x", "enable.auto.commit": False}
    )
    consumer.assign([kafka.TopicPartition(topic, 0, kafka.OFFSET_BEGINNING)])
    read: list[tuple[int, Any]] = []
    deadline = time.monotonic() + 30
    try:
        while len(read) < COUNT and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None:
                assert message.error() is None
                read.append(
                    (
                        message.offset(),
                        (
                            message.key(),
                            message.value(),
                            list(message.headers() or []),
                            message.timestamp()[1],
                        ),
                    )
                )
    finally:
        consumer.close()
    return read


def test_grpc_produced_records_read_through_kafka(kafka_cluster: LocalCluster) -> None:
    create_topic(kafka_cluster, "x-grpc-to-kafka", partitions=1)
    expected = _expected(b"g")
    producer = Producer(kafka_cluster.bootstrap, acks="all")
    try:
        futures = [
            producer.send("x-grpc-to-kafka", value, key, 0, headers, timestamp)
            for key, value, headers, timestamp in expected
        ]
        producer.flush()
        offsets = [f.result().offset for f in futures]
    finally:
        producer.close()
    read = _read_with_kafka(kafka_cluster.kafka_bootstrap, "x-grpc-to-kafka")
    assert [offset for offset, _ in read] == offsets
    assert [fields for _, fields in read] == [(k, v, h, t) for k, v, h, t in expected]


def test_kafka_produced_records_read_through_grpc(kafka_cluster: LocalCluster) -> None:
    create_topic(kafka_cluster, "x-kafka-to-grpc", partitions=1)
    expected = _expected(b"k")
    producer = kafka.Producer(
        {
            "bootstrap.servers": kafka_cluster.kafka_bootstrap,
            "acks": "all",
            "enable.idempotence": True,
        }
    )
    delivered: list[int] = []
    for key, value, headers, timestamp in expected:
        producer.produce(
            "x-kafka-to-grpc",
            value,
            key,
            0,
            headers=headers,
            timestamp=timestamp,
            on_delivery=lambda e, m: delivered.append(m.offset()),
        )
    assert producer.flush(30) == 0
    consumer = Consumer(kafka_cluster.bootstrap, auto_offset_reset="earliest")
    consumer.assign([("x-kafka-to-grpc", 0)])
    records: list[Any] = []
    deadline = time.monotonic() + 30
    try:
        while len(records) < COUNT and time.monotonic() < deadline:
            records.extend(consumer.poll(500))
    finally:
        consumer.close()
    assert [r.offset for r in records] == delivered
    assert [(r.key, r.value, list(r.headers), r.timestamp_ms) for r in records] == expected
