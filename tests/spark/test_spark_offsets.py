"""One record, one offset, through every front end, whatever Raft does underneath.

Records written through raftlog's gRPC client and through a Kafka client, with leader changes
in between (each adds a no-op to the Raft log), read back through the gRPC client, a Kafka
client and the Spark source: the three agree on every record's offset, the offsets are
0..N-1 with no gap (Raft's own entries take none), and the high watermark every interface
reports is N (docs/offsets.md).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from raftlog.client import Admin, Consumer, Producer
from raftlog.local_cluster import LocalCluster

TOPIC = "one-offset"
PER_ROUND = 20
ROUNDS = 3


def _leader(admin: Admin) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        leader = admin.describe_topic(TOPIC).partitions[0].leader
        if leader is not None:
            return int(leader)
        time.sleep(0.2)
    raise AssertionError(f"no leader of {TOPIC}-0 in 60 s")


def _change_leader(cluster: LocalCluster, admin: Admin) -> None:
    """Kill the partition's leader, wait for another, bring the old one back."""
    old = _leader(admin)
    cluster.kill_node(old)
    deadline = time.monotonic() + 60
    while _leader(admin) == old and time.monotonic() < deadline:
        time.sleep(0.2)
    cluster.start_node(old)


def _write(cluster: LocalCluster, kafka: Any, round_number: int) -> list[bytes]:
    values = [b"r%d-%03d" % (round_number, i) for i in range(PER_ROUND)]
    if round_number % 2 == 0:
        with Producer(cluster.bootstrap, acks="all") as producer:
            for value in values:
                producer.send(TOPIC, value=value, partition=0).result(timeout=60)
    else:
        producer = kafka.Producer(
            {"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all",
             "enable.idempotence": True, "message.timeout.ms": 60_000}
        )  # fmt: skip
        for value in values:
            producer.produce(TOPIC, value=value, partition=0)
            producer.poll(0)
        assert producer.flush(90) == 0
    return values


def _read_grpc(cluster: LocalCluster, count: int) -> list[tuple[int, bytes]]:
    consumer = Consumer(cluster.bootstrap, auto_offset_reset="earliest")
    consumer.assign([(TOPIC, 0)])
    read: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 60
    while len(read) < count and time.monotonic() < deadline:
        read.extend((r.offset, r.value or b"") for r in consumer.poll(timeout_ms=500))
    end = next(iter(consumer.end_offsets([(TOPIC, 0)]).values()))
    consumer.close()
    assert end == count, f"the gRPC client's high watermark is {end}, not {count}"
    return read


def _watermarks(consumer: Any, kafka: Any) -> tuple[int, int]:
    """Ask until the partition's current leader answers.

    The restarted node is the preferred replica and may take leadership back at any moment;
    librdkafka's watermark query answers NOT_LEADER_FOR_PARTITION then instead of retrying,
    as it does against Kafka.
    """
    deadline = time.monotonic() + 60
    while True:
        try:
            low, high = consumer.get_watermark_offsets(kafka.TopicPartition(TOPIC, 0), timeout=30)
            return int(low), int(high)
        except kafka.KafkaException as error:
            code = error.args[0].code()
            if code != kafka.KafkaError.NOT_LEADER_FOR_PARTITION or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _read_kafka(cluster: LocalCluster, kafka: Any, count: int) -> list[tuple[int, bytes]]:
    consumer = kafka.Consumer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "group.id": "offsets-check",
         "enable.auto.commit": False}
    )  # fmt: skip
    partition = kafka.TopicPartition(TOPIC, 0, kafka.OFFSET_BEGINNING)
    consumer.assign([partition])
    read: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 60
    while len(read) < count and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            read.append((message.offset(), message.value()))
    low, high = _watermarks(consumer, kafka)
    consumer.close()
    assert (low, high) == (0, count), f"Kafka's watermarks are {(low, high)}, not (0, {count})"
    return read


def _read_spark(spark: Any, cluster: LocalCluster) -> list[tuple[int, bytes]]:
    frame = (
        spark.read.format("raftlog")
        .option("bootstrap", cluster.bootstrap)
        .option("subscribe", TOPIC)
        .load()
    )
    return sorted((row.offset, bytes(row.value)) for row in frame.collect())


def test_a_record_has_one_offset_through_grpc_kafka_and_spark_across_leader_changes(
    spark: Any, cluster: LocalCluster
) -> None:
    kafka = pytest.importorskip("confluent_kafka")
    with Admin(cluster.bootstrap) as setup:
        setup.create_topic(TOPIC, partitions=1, replication_factor=3)
    admin = Admin(cluster.bootstrap)
    written: list[bytes] = []
    for round_number in range(ROUNDS):
        if round_number:
            _change_leader(cluster, admin)
        written.extend(_write(cluster, kafka, round_number))
    admin.close()
    expected = list(enumerate(written))  # offsets 0..N-1, in the order written
    assert _read_grpc(cluster, len(written)) == expected
    assert _read_kafka(cluster, kafka, len(written)) == expected
    assert _read_spark(spark, cluster) == expected
