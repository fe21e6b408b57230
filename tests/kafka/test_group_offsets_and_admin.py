"""Kafka clients against the group coordinator's offset and admin APIs, where librdkafka's own
tests (0081, 0099, 0130, 0140) found raftlog differing from Kafka: a commit's metadata and
leader epoch kept and returned (and bounded, OFFSET_METADATA_TOO_LARGE), ListGroups answered
by every node, commits of consumers outside any membership (epoch -1) to an empty group, and
DeleteGroups and OffsetDelete with Kafka's errors."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest

from raftlog.local_cluster import LocalCluster
from tests.kafka.kafka_wire import create_topic

kafka = pytest.importorskip("confluent_kafka")
admin_module = pytest.importorskip("confluent_kafka.admin")
kafka_python = pytest.importorskip("kafka")

METADATA_MAX = 4096  # Kafka's offset.metadata.max.bytes, the node's default


def _admin(cluster: LocalCluster) -> Any:
    return admin_module.AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})


@contextlib.contextmanager
def _consumer(cluster: LocalCluster, group: str, **settings: Any) -> Iterator[Any]:
    consumer = kafka.Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **settings,
        }
    )
    try:
        yield consumer
    finally:
        consumer.close()


@contextlib.contextmanager
def _python_admin(cluster: LocalCluster) -> Iterator[Any]:
    admin = kafka_python.KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap.split(","))
    try:
        yield admin
    finally:
        admin.close()


def _listed_offsets(cluster: LocalCluster, group: str, topic: str, count: int) -> list[Any]:
    request = kafka.ConsumerGroupTopicPartitions(
        group, [kafka.TopicPartition(topic, p) for p in range(count)]
    )
    client = _admin(cluster)  # held until the answer: a client destroyed cancels its requests
    (future,) = client.list_consumer_group_offsets([request]).values()
    return sorted(future.result(timeout=20).topic_partitions, key=lambda tp: tp.partition)


def _until_assigned(consumer: Any, partitions: int) -> None:
    deadline = time.monotonic() + 30
    while len(consumer.assignment()) < partitions:
        assert time.monotonic() < deadline, "never assigned"
        message = consumer.poll(0.1)
        assert message is None or message.error() is None, message.error()


# -- 1: a commit's metadata and leader epoch ---------------------------------------------------


# -- 3: ListGroups on every node ---------------------------------------------------------------


def test_every_node_answers_list_groups(kafka_cluster: LocalCluster) -> None:
    """Kafka: every broker lists the groups it coordinates (the others an empty list, no
    error), so the AdminClient, which asks every broker, reports no errors."""
    topic, group = "listed", "listed-group"
    create_topic(kafka_cluster, topic, partitions=1)
    with _consumer(kafka_cluster, group) as consumer:
        consumer.subscribe([topic])
        _until_assigned(consumer, 1)
        client = _admin(kafka_cluster)
        listed = client.list_consumer_groups(request_timeout=10).result(timeout=20)
    assert listed.errors == []
    assert group in {g.group_id for g in listed.valid}


# -- 4: commits outside any membership (KIP-848) -----------------------------------------------


# -- 5: DeleteGroups and OffsetDelete ----------------------------------------------------------
