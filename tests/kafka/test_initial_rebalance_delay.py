"""group.initial.rebalance.delay.ms: consumers started together join one generation of an empty
classic group, as on Kafka (librdkafka's 0089, 0102, 0113 and 0118 start two consumers and
count their rebalances). A cluster of its own: the other Kafka tests run with no delay."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from raftlog.client import Admin
from raftlog.local_cluster import LocalCluster
from tests.kafka.kafka_wire import started_cluster

kafka = pytest.importorskip("confluent_kafka")

DELAY_MS = 1_000


@pytest.fixture(scope="module")
def delayed_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    flags = ("--set", f"kafka.group_initial_rebalance_delay_ms={DELAY_MS}")
    directory = tmp_path_factory.mktemp("kafka-delay")
    with started_cluster(directory, node_count=1, flags=flags) as cluster:
        yield cluster


def test_consumers_started_together_share_the_first_generation(
    delayed_cluster: LocalCluster,
) -> None:
    """The second consumer subscribes within the first one's initial delay: each gets half the
    partitions in the group's first generation, and the first one never has any revoked (with
    no delay the first took all four alone, then gave them back when the second joined)."""
    with Admin(delayed_cluster.bootstrap) as admin:
        admin.create_topic("delayed", partitions=4, replication_factor=1)
    events: dict[str, list[tuple[str, int]]] = {"a": [], "b": []}

    def consumer(name: str) -> Any:
        made = kafka.Consumer(
            {
                "bootstrap.servers": delayed_cluster.kafka_bootstrap,
                "group.id": "delayed-group",
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 200,
            }
        )
        made.subscribe(
            ["delayed"],
            on_assign=lambda _c, parts: events[name].append(("assign", len(parts))),
            on_revoke=lambda _c, parts: events[name].append(("revoke", len(parts))),
        )
        return made

    first = consumer("a")
    first.poll(0.2)  # its JoinGroup is in: the group's initial delay runs
    second = consumer("b")
    consumers = {"a": first, "b": second}
    try:
        deadline = time.monotonic() + 20
        while not all(events.values()) and time.monotonic() < deadline:
            for made in consumers.values():
                made.poll(0.1)
        for _ in range(10):  # a rebalance after the first generation would show by now
            for made in consumers.values():
                made.poll(0.1)
        assert events == {"a": [("assign", 2)], "b": [("assign", 2)]}
    finally:
        for made in consumers.values():
            made.close()
