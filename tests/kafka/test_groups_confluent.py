"""A consumer group of confluent-kafka consumers over the classic group protocol: every record
exactly once between two members, offsets committed through the metadata quorum, a member's
partitions taken over from the committed offsets when it leaves, a restart resuming there."""

from __future__ import annotations

import time
from typing import Any

import pytest

from raftlog.local_cluster import LocalCluster
from tests.kafka.confluent_groups import reads_once_commits_takes_over_and_resumes
from tests.kafka.kafka_wire import create_topic

kafka = pytest.importorskip("confluent_kafka")

TOPIC, GROUP, PARTITIONS = "grp", "grp-1", 4


def _consumer(boot: str) -> Any:
    return kafka.Consumer(
        {
            "bootstrap.servers": boot,
            "group.id": GROUP,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 300,
        }
    )


def test_group_reads_once_commits_takes_over_and_resumes(kafka_cluster: LocalCluster) -> None:
    create_topic(kafka_cluster, TOPIC, partitions=PARTITIONS)
    boot = kafka_cluster.kafka_bootstrap
    reads_once_commits_takes_over_and_resumes(boot, TOPIC, PARTITIONS, lambda: _consumer(boot))


def test_list_and_describe_groups(kafka_cluster: LocalCluster) -> None:
    admin_module = pytest.importorskip("confluent_kafka.admin")
    create_topic(kafka_cluster, "grp-described", partitions=1)
    consumer = kafka.Consumer(
        {"bootstrap.servers": kafka_cluster.kafka_bootstrap, "group.id": "described"}
    )
    consumer.subscribe(["grp-described"])
    try:
        deadline = time.monotonic() + 30
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(0.1)
        client = admin_module.AdminClient({"bootstrap.servers": kafka_cluster.kafka_bootstrap})
        listed = client.list_consumer_groups(request_timeout=10).result(timeout=20)
        assert "described" in {g.group_id for g in listed.valid}
        described = client.describe_consumer_groups(["described"])["described"].result(timeout=20)
        assert str(described.state) == str(kafka.ConsumerGroupState.STABLE)
        (member,) = described.members
        assert [p.partition for p in member.assignment.topic_partitions] == [0]
    finally:
        consumer.close()
