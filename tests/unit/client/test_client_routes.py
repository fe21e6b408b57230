"""Cluster.topic_partitions: the routes send() reads lock-free, never older than the metadata.

The producer asks for a topic's partitions on every send(); the answer is cached until the
topic's metadata goes stale (a NOT_LEADER without a usable hint, a failed call), fresh
metadata arrives, or `metadata_max_age_ms` passes, exactly when `Cluster.topic` would ask the
cluster again.
"""

from __future__ import annotations

import pytest
from client_fake_cluster import FakeCluster, ManualClock

from raftlog.client import Producer
from raftlog.client._connection import Cluster, TopicPartition
from raftlog.client.config import ConnectionConfig
from raftlog.client.errors import ClientError

METADATA_MAX_AGE_MS = 1000


def metadata_requests(cluster: FakeCluster) -> int:
    return sum(n for (_, rpc), n in cluster.state.requests.items() if rpc == "Metadata")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def client(cluster: FakeCluster, clock: ManualClock) -> Cluster:
    config = ConnectionConfig(metadata_max_age_ms=METADATA_MAX_AGE_MS)
    client = Cluster(cluster.bootstrap, config, clock=clock)
    cluster.state.create_topic("events", 2)
    return client


def test_routes_are_the_topic_partitions_and_cached(cluster: FakeCluster, client: Cluster) -> None:
    routes = client.topic_partitions("events")
    assert routes == (TopicPartition("events", 0), TopicPartition("events", 1))
    asked = metadata_requests(cluster)
    assert client.topic_partitions("events") is routes
    assert metadata_requests(cluster) == asked


def test_a_stale_topic_is_asked_again_and_sees_new_partitions(
    cluster: FakeCluster, client: Cluster
) -> None:
    assert len(client.topic_partitions("events")) == 2
    cluster.state.create_topic("events", 1)  # a third partition
    assert len(client.topic_partitions("events")) == 2  # cached: nothing said it changed
    client.mark_stale("events")
    assert len(client.topic_partitions("events")) == 3


def test_routes_expire_with_the_metadata_age(
    cluster: FakeCluster, client: Cluster, clock: ManualClock
) -> None:
    client.topic_partitions("events")
    cluster.state.create_topic("events", 2)
    clock.now_s += METADATA_MAX_AGE_MS / 1000 * 0.9
    assert len(client.topic_partitions("events")) == 2
    clock.now_s += METADATA_MAX_AGE_MS / 1000 * 0.2
    assert len(client.topic_partitions("events")) == 4


def test_a_full_metadata_refresh_drops_every_route(cluster: FakeCluster, client: Cluster) -> None:
    client.topic_partitions("events")
    cluster.state.create_topic("events", 1)
    client.refresh_metadata()
    assert len(client.topic_partitions("events")) == 3


def test_a_leader_hint_keeps_the_route(cluster: FakeCluster, client: Cluster) -> None:
    routes = client.topic_partitions("events")
    asked = metadata_requests(cluster)
    client.apply_leader_hint(routes[0], 2, cluster.address(2))
    assert client.topic_partitions("events") is routes
    assert metadata_requests(cluster) == asked
    client.apply_leader_hint(routes[0], None, None)  # no usable hint: stale
    client.topic_partitions("events")
    assert metadata_requests(cluster) == asked + 1


def test_the_producer_sees_added_partitions_once_its_metadata_ages(
    cluster: FakeCluster, clock: ManualClock
) -> None:
    cluster.state.create_topic("events", 1)
    with Producer(
        cluster.bootstrap, clock=clock, metadata_max_age_ms=METADATA_MAX_AGE_MS, max_block_ms=0
    ) as producer:
        producer.send("events", value=b"a", partition=0)
        cluster.state.create_topic("events", 1)
        with pytest.raises(ClientError, match="partition 1 of topic 'events' does not exist"):
            producer.send("events", value=b"b", partition=1)
        clock.now_s += METADATA_MAX_AGE_MS / 1000 + 0.1
        producer.send("events", value=b"b", partition=1)
        assert producer.partitions_for("events") == {0, 1}


def test_an_unknown_topic_costs_one_metadata_request_per_attempt(cluster: FakeCluster) -> None:
    with Producer(cluster.bootstrap, max_block_ms=0) as producer:
        asked = metadata_requests(cluster)
        with pytest.raises(ClientError, match="'nope'"):
            producer.send("nope", value=b"a")
        assert metadata_requests(cluster) == asked + 1
