"""A partition leader SIGKILLed under confluent-kafka acks=all idempotent load: every
acknowledged record is read back exactly once, in the order produced."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from raftlog.client import Admin
from raftlog.local_cluster import LocalCluster
from tests.kafka.kafka_wire import create_topic, started_cluster

kafka = pytest.importorskip("confluent_kafka")

COUNT, KILL_AT = 3000, 1000


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with started_cluster(tmp_path_factory.mktemp("kafka-kill")) as made:
        yield made


def test_acknowledged_records_survive_a_leader_kill_once_and_in_order(
    cluster: LocalCluster,
) -> None:
    create_topic(cluster, "kill", partitions=1)
    with Admin(cluster.bootstrap) as admin:
        (partition,) = admin.describe_topic("kill").partitions
    assert partition.leader is not None
    boot = (
        ",".join(
            f"127.0.0.1:{n.kafka_port}"
            for n in cluster.nodes.values()
            if n.node_id != partition.leader
        )
        + f",127.0.0.1:{cluster.nodes[partition.leader].kafka_port}"
    )
    producer = kafka.Producer(
        {
            "bootstrap.servers": boot,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 2,
            "message.timeout.ms": 60_000,
        }
    )
    acknowledged: list[bytes] = []
    failed: list[str] = []

    def on_delivery(error: object, message: object) -> None:
        if error is None:
            acknowledged.append(message.value())  # type: ignore[attr-defined]
        else:
            failed.append(str(error))

    for i in range(COUNT):
        producer.produce("kill", value=b"%06d" % i, partition=0, on_delivery=on_delivery)
        if i == KILL_AT:
            producer.flush(30)
            cluster.kill_node(partition.leader)  # SIGKILL
        if i % 100 == 0:
            producer.poll(0.01)
    producer.flush(90)
    assert len(acknowledged) + len(failed) == COUNT, "deliveries still pending after 90 s"
    assert len(acknowledged) > KILL_AT

    consumer = kafka.Consumer(
        {"bootstrap.servers": boot, "group.id": "x", "enable.auto.commit": False}
    )
    consumer.assign([kafka.TopicPartition("kill", 0, kafka.OFFSET_BEGINNING)])
    read: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while len(read) < len(acknowledged) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                read.append(message.value())
        time.sleep(0.5)
        read.extend(m.value() for m in consumer.consume(1000, 1.0) if m.error() is None)
    finally:
        consumer.close()
    assert len(read) == len(set(read)), "a record was stored twice"
    assert read == sorted(read), "records out of the order produced"
    assert set(acknowledged) <= set(read), "an acknowledged record was lost"
