"""confluent-kafka's AdminClient: topics created, grown, described and deleted over Kafka."""

from __future__ import annotations

import datetime
import time

import pytest
from kio.schema.create_topics.v7 import request as ct
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i32, i32Timedelta

from raftlog.client import Admin
from raftlog.local_cluster import LocalCluster
from tests.kafka.kafka_wire import kafka_call

kafka = pytest.importorskip("confluent_kafka")
admin_module = pytest.importorskip("confluent_kafka.admin")


def _client(cluster: LocalCluster) -> object:
    return admin_module.AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})


def test_create_grow_describe_and_delete_a_topic(kafka_cluster: LocalCluster) -> None:
    client = _client(kafka_cluster)
    new = admin_module.NewTopic(
        "admin-t", num_partitions=2, replication_factor=3, config={"retention.ms": "60000"}
    )
    client.create_topics([new], operation_timeout=30)["admin-t"].result(timeout=40)  # type: ignore[attr-defined]
    with Admin(kafka_cluster.bootstrap) as admin:
        described = admin.describe_topic("admin-t")
    assert len(described.partitions) == 2 and described.config["retention.ms"] == "60000"

    grow = admin_module.NewPartitions("admin-t", 3)
    client.create_partitions([grow], operation_timeout=30)["admin-t"].result(timeout=40)  # type: ignore[attr-defined]
    listed = client.list_topics(timeout=10)  # type: ignore[attr-defined]
    assert len(listed.topics["admin-t"].partitions) == 3

    resource = admin_module.ConfigResource(admin_module.ResourceType.TOPIC, "admin-t")
    configs = client.describe_configs([resource])[resource].result(timeout=20)  # type: ignore[attr-defined]
    assert configs["retention.ms"].value == "60000" and not configs["retention.ms"].is_default
    assert configs["cleanup.policy"].value == "delete" and configs["cleanup.policy"].is_default

    client.delete_topics(["admin-t"], operation_timeout=30)["admin-t"].result(timeout=40)  # type: ignore[attr-defined]
    deadline = time.monotonic() + 20
    while "admin-t" in client.list_topics(timeout=10).topics:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, "topic still listed after its deletion"
        time.sleep(0.1)


def test_bad_requests_get_kafka_errors_and_validate_only_creates_nothing(
    kafka_cluster: LocalCluster,
) -> None:
    client = _client(kafka_cluster)
    checked = admin_module.NewTopic("admin-dry", num_partitions=1, replication_factor=3)
    client.create_topics([checked], validate_only=True)["admin-dry"].result(timeout=40)  # type: ignore[attr-defined]
    assert "admin-dry" not in client.list_topics(timeout=10).topics  # type: ignore[attr-defined]

    bad = admin_module.NewTopic(
        "admin-bad", num_partitions=1, replication_factor=3, config={"no.such.key": "1"}
    )
    with pytest.raises(kafka.KafkaException) as raised:
        client.create_topics([bad])["admin-bad"].result(timeout=40)  # type: ignore[attr-defined]
    assert raised.value.args[0].code() == kafka.KafkaError.INVALID_CONFIG
    assert "no.such.key" in raised.value.args[0].str()

    placed = ct.CreateTopicsRequest(
        topics=(
            ct.CreatableTopic(
                name=ct.TopicName("admin-placed"),
                num_partitions=i32(-1),
                replication_factor=i16(-1),
                assignments=(
                    ct.CreatableReplicaAssignment(
                        partition_index=i32(0), broker_ids=(ct.BrokerId(1), ct.BrokerId(2))
                    ),
                ),
                configs=(),
            ),
        ),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)),
        validate_only=False,
    )
    node = next(iter(kafka_cluster.nodes.values()))
    (result,) = kafka_call(f"127.0.0.1:{node.kafka_port}", placed).topics
    assert result.error_code == ErrorCode.invalid_replica_assignment
    assert result.error_message == "raftlog places replicas itself"

    with pytest.raises(kafka.KafkaException) as raised:
        client.delete_topics(["admin-missing"])["admin-missing"].result(timeout=40)  # type: ignore[attr-defined]
    assert raised.value.args[0].code() == kafka.KafkaError.UNKNOWN_TOPIC_OR_PART
