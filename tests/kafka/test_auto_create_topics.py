"""Topic auto-creation (`kafka.auto_create_topics_enable`, off by default), on a cluster started
by `raftlog cluster up --auto-create-topics`: a Metadata request naming an unknown topic, with
allow_auto_topic_creation, creates it with `kafka.num_partitions` partitions and
`kafka.default_replication_factor` replicas (capped at the live nodes), as Kafka's
auto.create.topics.enable does."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12 import request as md

from raftlog.client import Admin
from raftlog.local_cluster import LocalCluster
from tests.kafka.kafka_wire import kafka_call

kafka = pytest.importorskip("confluent_kafka")
admin_module = pytest.importorskip("confluent_kafka.admin")


def _raftlog(*args: str) -> None:
    # A process of its own, as from a shell: the nodes it starts outlive it.
    subprocess.run([sys.executable, "-m", "raftlog", *args], check=True, timeout=120)


@pytest.fixture(scope="module")
def auto_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory: Path = tmp_path_factory.mktemp("kafka-auto") / "c"
    try:
        _raftlog("cluster", "up", "--nodes", "3", "--dir", str(directory),
                 "--auto-create-topics", "--timeout", "60")  # fmt: skip
        yield LocalCluster.load(directory)
    finally:
        _raftlog("cluster", "down", "--dir", str(directory))


def _metadata(cluster: LocalCluster, name: str, *, allow: bool) -> ErrorCode:
    request = md.MetadataRequest(
        topics=(md.MetadataRequestTopic(topic_id=None, name=md.TopicName(name)),),
        allow_auto_topic_creation=allow,
        include_topic_authorized_operations=False,
    )
    node = next(iter(cluster.nodes.values()))
    (topic,) = kafka_call(f"127.0.0.1:{node.kafka_port}", request).topics
    return topic.error_code  # type: ignore[no-any-return]


def test_a_producer_creates_the_unknown_topic_it_writes_to(auto_cluster: LocalCluster) -> None:
    producer = kafka.Producer({"bootstrap.servers": auto_cluster.kafka_bootstrap, "acks": "all"})
    delivered: list[object] = []
    producer.produce(
        "auto-orders", key=b"k", value=b"v", on_delivery=lambda e, m: delivered.append(e)
    )
    assert producer.flush(30) == 0
    assert delivered == [None]
    with Admin(auto_cluster.bootstrap) as admin:
        described = admin.describe_topic("auto-orders")
    assert len(described.partitions) == 1  # num.partitions
    assert all(len(p.replicas) == 3 for p in described.partitions)  # at most the live nodes


def test_metadata_creates_only_when_the_request_allows_it(auto_cluster: LocalCluster) -> None:
    assert (
        _metadata(auto_cluster, "auto-refused", allow=False) == ErrorCode.unknown_topic_or_partition
    )
    time.sleep(1)
    assert (
        _metadata(auto_cluster, "auto-refused", allow=False) == ErrorCode.unknown_topic_or_partition
    )
    assert _metadata(auto_cluster, "auto|bad", allow=True) == ErrorCode.invalid_topic_exception
    # The first answer is retriable until the topic's leaders exist.
    assert _metadata(auto_cluster, "auto-asked", allow=True) == ErrorCode.leader_not_available
    deadline = time.monotonic() + 30
    while _metadata(auto_cluster, "auto-asked", allow=False) != ErrorCode.none:
        assert time.monotonic() < deadline, "auto-asked was not created"
        time.sleep(0.2)


def test_the_setting_is_described_as_a_broker_config(auto_cluster: LocalCluster) -> None:
    client = admin_module.AdminClient({"bootstrap.servers": auto_cluster.kafka_bootstrap})
    broker = admin_module.ConfigResource(admin_module.ResourceType.BROKER, "2")
    configs = client.describe_configs([broker])[broker].result(timeout=20)  # type: ignore[attr-defined]
    entry = configs["auto.create.topics.enable"]
    assert entry.value == "true" and not entry.is_default
    assert entry.source == admin_module.ConfigSource.STATIC_BROKER_CONFIG.value
