"""The Admin client against the fake cluster: topic lifecycle, controller hints, errors."""

from __future__ import annotations

import re

import pytest
from client_fake_cluster import FakeCluster

from raftlog.client import Admin, Producer
from raftlog.client.errors import (
    ClientError,
    ConnectionFailedError,
    RequestTimedOutError,
    ServerError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from raftlog.rpc.v1 import raftlog_pb2 as pb


def test_topic_lifecycle(cluster: FakeCluster) -> None:
    with Admin(cluster.bootstrap) as admin:
        created = admin.create_topic("events", partitions=3, replication_factor=2)
        assert [p.id for p in created.partitions] == [0, 1, 2]
        assert admin.list_topics() == ["events"]
        described = admin.describe_topic("events")
        assert described.replication_factor == 2
        assert [(p.leader, p.replicas) for p in described.partitions] == [
            (1, (1, 2)),
            (2, (2, 1)),
            (1, (1, 2)),
        ]
        assert all(p.high_watermark == 0 for p in described.partitions)  # nothing written yet
        admin.create_partitions("events", 5)
        assert len(admin.describe_topic("events").partitions) == 5
        admin.delete_topic("events")
        assert admin.list_topics() == []


def test_describe_topic_reports_the_high_watermark(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 1)
    with Producer(cluster.bootstrap) as producer:
        producer.send("events", value=b"a").result(10)
    with Admin(cluster.bootstrap) as admin:
        (partition,) = admin.describe_topic("events").partitions
        assert (partition.high_watermark, partition.epoch) == (1, 1)


def test_requests_follow_the_not_controller_hint(cluster: FakeCluster) -> None:
    with Admin(cluster.address(2)) as admin:  # node 2 is not the controller
        admin.create_topic("events", partitions=1, replication_factor=1)
    assert cluster.state.requests[(2, "CreateTopic")] == 1
    assert cluster.state.requests[(1, "CreateTopic")] == 1


def test_not_controller_without_address_is_resolved_through_metadata(cluster: FakeCluster) -> None:
    cluster.state.hint_leader = False  # only the controller's id comes back
    with Admin(cluster.address(2)) as admin:
        admin.create_topic("events", partitions=1, replication_factor=1)
    assert cluster.state.requests[(1, "CreateTopic")] == 1


def test_server_errors_carry_code_message_and_topic(cluster: FakeCluster) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic("events", partitions=1, replication_factor=1)
        with pytest.raises(TopicAlreadyExistsError, match=r"create topic 'events'.*already exists"):
            admin.create_topic("events", partitions=1, replication_factor=1)
        with pytest.raises(ServerError, match="INVALID_REPLICATION_FACTOR") as caught:
            admin.create_topic("big", partitions=1, replication_factor=3)
        assert "exceeds 2 nodes" in caught.value.server_message
        with pytest.raises(UnknownTopicOrPartitionError, match="'nope'"):
            admin.describe_topic("nope")
        with pytest.raises(ServerError, match="INVALID_PARTITIONS"):
            admin.create_partitions("events", 1)
        with pytest.raises(ClientError, match="must be positive"):
            admin.create_topic("zero", partitions=0, replication_factor=1)


def test_describe_cluster(cluster: FakeCluster) -> None:
    with Admin(cluster.bootstrap) as admin:
        description = admin.describe_cluster()
    assert description.controller_id == 1
    assert [(n.node_id, n.address) for n in description.nodes] == [
        (1, cluster.address(1)),
        (2, cluster.address(2)),
    ]


def test_unreachable_nodes_are_skipped_then_named(cluster: FakeCluster) -> None:
    dead = "127.0.0.1:1"
    with Admin(f"{dead},{cluster.address(1)}", request_timeout_ms=2000) as admin:
        assert admin.list_topics() == []
    with (
        Admin(dead, request_timeout_ms=2000) as admin,
        pytest.raises(ConnectionFailedError, match=re.escape(f"no node answered: {dead}: ")),
    ):
        admin.list_topics()


def test_timeouts_name_the_operation_address_and_limit(cluster: FakeCluster) -> None:
    cluster.state.produce_gate.clear()
    with Producer(
        cluster.bootstrap,
        request_timeout_ms=100,
        delivery_timeout_ms=100,
        linger_ms=0,
        retry_backoff_ms=0,
    ) as producer:
        cluster.state.create_topic("events", 1)
        future = producer.send("events", value=b"a")
        with pytest.raises(
            ClientError, match=r"Log.Produce to 127\.0\.0\.1:\d+ timed out after 100 ms"
        ):
            future.result(10)
        cluster.state.produce_gate.set()
    assert isinstance(future.exception(0).__cause__, RequestTimedOutError)  # type: ignore[union-attr]


def test_create_waits_out_a_controller_election(cluster: FakeCluster) -> None:
    cluster.state.fail_next["CreateTopic"] = [pb.NOT_CONTROLLER, pb.NOT_CONTROLLER]  # no hint
    with Admin(cluster.address(1), retry_backoff_ms=0) as admin:
        admin.create_topic("events", partitions=1, replication_factor=1)
    assert cluster.state.requests[(1, "CreateTopic")] == 3


def test_ambiguous_timeouts_are_not_retried(cluster: FakeCluster) -> None:
    cluster.state.fail_next["CreateTopic"] = [pb.REQUEST_TIMED_OUT]
    with (
        Admin(cluster.address(1), retry_backoff_ms=0) as admin,
        pytest.raises(ServerError, match="REQUEST_TIMED_OUT"),
    ):
        admin.create_topic("events", partitions=1, replication_factor=1)
    assert cluster.state.requests[(1, "CreateTopic")] == 1


class ManualClock:
    """Clock and sleep ports in one: sleeping moves the clock, no real time passes."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self.slept_s = 0.0

    def __call__(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.now_s += seconds
        self.slept_s += seconds


def test_an_election_that_outlasts_the_request_timeout_is_reported(cluster: FakeCluster) -> None:
    cluster.state.fail_next["CreateTopic"] = [pb.NOT_CONTROLLER] * 1000
    clock = ManualClock()
    with (
        Admin(
            cluster.address(1),
            request_timeout_ms=1000,
            retry_backoff_ms=100,
            clock=clock,
            sleep=clock.sleep,
        ) as admin,
        pytest.raises(ServerError, match=r"create topic 'events' at .*NOT_CONTROLLER") as caught,
    ):
        admin.create_topic("events", partitions=1, replication_factor=1)
    assert caught.value.retriable
    assert clock.slept_s == pytest.approx(1.0)  # backed off until the request timeout
    assert cluster.state.requests[(1, "CreateTopic")] == 11
