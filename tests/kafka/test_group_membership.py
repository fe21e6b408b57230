"""Group membership with confluent-kafka and kafka-python where librdkafka's tests (0084, 0102)
found raftlog differing from Kafka: a dead classic member expires by its session timeout, on the
coordinator's timer, so a pending rebalance completes without it; static membership (KIP-345,
`group.instance.id`) in classic groups and in KIP-848 groups."""

from __future__ import annotations

import contextlib
import select
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from raftlog.local_cluster import LocalCluster
from tests.kafka.kafka_wire import create_topic

kafka = pytest.importorskip("confluent_kafka")
admin_module = pytest.importorskip("confluent_kafka.admin")
kafka_python = pytest.importorskip("kafka")

PARTITIONS = 4


@contextlib.contextmanager
def _consumer(cluster: LocalCluster, group: str, **settings: Any) -> Iterator[Any]:
    consumer = kafka.Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            **settings,
        }
    )
    try:
        yield consumer
    finally:
        consumer.close()


def _owned(consumers: list[Any]) -> list[int]:
    return sorted(tp.partition for c in consumers for tp in c.assignment())


def _poll_until(consumers: list[Any], done: Callable[[], bool], timeout_s: float) -> float:
    """Poll every consumer until `done()`; the seconds it took. Fails past `timeout_s`."""
    start = time.monotonic()
    while not done():
        assert time.monotonic() - start < timeout_s, f"not done in {timeout_s} s"
        for consumer in consumers:
            message = consumer.poll(0.05)
            assert message is None or message.error() is None, message.error()
    return time.monotonic() - start


def _poll_for(consumers: list[Any], seconds: float) -> None:
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        for consumer in consumers:
            message = consumer.poll(0.05)
            assert message is None or message.error() is None, message.error()


def _shared(consumers: list[Any]) -> Callable[[], bool]:
    """Every partition owned, each consumer some."""
    return lambda: (
        _owned(consumers) == list(range(PARTITIONS)) and all(c.assignment() for c in consumers)
    )


# -- 2: a dead classic member expires by its session timeout ----------------------------------

_MEMBER_PROCESS = """
import sys, confluent_kafka
consumer = confluent_kafka.Consumer({
    "bootstrap.servers": sys.argv[1], "group.id": sys.argv[2], "session.timeout.ms": 6000,
    "heartbeat.interval.ms": 500, "max.poll.interval.ms": 30000,
})
consumer.subscribe([sys.argv[3]])
said = False
while True:
    consumer.poll(0.1)
    if consumer.assignment() and not said:
        print("assigned", flush=True)
        said = True
"""


def test_a_dead_member_does_not_stall_a_rebalance_past_its_session(
    kafka_cluster: LocalCluster,
) -> None:
    """librdkafka 0084: a member killed (no LeaveGroup) while a rebalance starts must not hold
    the others in JoinGroup for the rebalance timeout (30 s here): its session (6 s) ends,
    the coordinator removes it, and the rebalance completes with the members that rejoined."""
    topic, group = "dead-member", "dead-member-group"
    create_topic(kafka_cluster, topic, partitions=PARTITIONS)
    settings = {"max.poll.interval.ms": 30000}
    with _consumer(kafka_cluster, group, **settings) as survivor:
        survivor.subscribe([topic])
        _poll_until([survivor], lambda: _owned([survivor]) == list(range(PARTITIONS)), 30)
        script = textwrap.dedent(_MEMBER_PROCESS)
        command = [sys.executable, "-c", script, kafka_cluster.kafka_bootstrap, group, topic]
        with subprocess.Popen(command, stdout=subprocess.PIPE) as doomed:
            try:
                assert doomed.stdout is not None
                deadline = time.monotonic() + 30
                while not select.select([doomed.stdout], [], [], 0)[0]:
                    assert time.monotonic() < deadline, "the other member never got partitions"
                    assert survivor.poll(0.05) is None
                assert doomed.stdout.readline() == b"assigned\n"
                _poll_until([survivor], lambda: 0 < len(survivor.assignment()) < PARTITIONS, 30)
            finally:
                doomed.kill()  # SIGKILL: no LeaveGroup, no last heartbeat
        with _consumer(kafka_cluster, group, **settings) as newcomer:
            newcomer.subscribe([topic])  # a rebalance the dead member will never join
            took_s = _poll_until([survivor, newcomer], _shared([survivor, newcomer]), 25)
    assert took_s < 15, f"the rebalance waited {took_s:.1f} s for a member dead for good"


# -- 6: static membership (KIP-345) in classic groups ------------------------------------------


def _static(cluster: LocalCluster, group: str, instance: str, **settings: Any) -> Any:
    return _consumer(cluster, group, **{"group.instance.id": instance, **settings})


# -- 6: static membership in KIP-848 groups ----------------------------------------------------


@contextlib.contextmanager
def _kip848_static(cluster: LocalCluster, group: str, instance: str) -> Iterator[Any]:
    consumer = kafka.Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": group,
            "group.protocol": "consumer",
            "group.instance.id": instance,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        yield consumer
    finally:
        consumer.close()
