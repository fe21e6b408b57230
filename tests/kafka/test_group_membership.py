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
from collections.abc import Callable
from typing import Any

import pytest

from raftlog.local_cluster import LocalCluster
from tests.kafka.confluent_groups import consumer as confluent_consumer
from tests.kafka.kafka_wire import create_topic

kafka = pytest.importorskip("confluent_kafka")
admin_module = pytest.importorskip("confluent_kafka.admin")
kafka_python = pytest.importorskip("kafka")

PARTITIONS = 4


def _consumer(cluster: LocalCluster, group: str, **settings: Any) -> Any:
    timeouts = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
    return confluent_consumer(cluster.kafka_bootstrap, group, **{**timeouts, **settings})


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
    _poll_until(consumers, lambda: time.monotonic() - start >= seconds, seconds + 5)


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


def test_a_restarted_static_member_takes_its_place_without_a_rebalance(
    kafka_cluster: LocalCluster,
) -> None:
    """A static member closes (no LeaveGroup: KIP-345) and a new process with its instance id
    joins within the session timeout: it gets the old member's partitions, and the other
    member sees no rebalance."""
    topic, group = "static-restart", "static-restart-group"
    create_topic(kafka_cluster, topic, partitions=PARTITIONS)
    rebalances: list[str] = []
    settings = {"session.timeout.ms": 20000}
    with (
        _static(kafka_cluster, group, "b", **settings) as steady,
        contextlib.ExitStack() as first_life,
    ):
        leaving = first_life.enter_context(_static(kafka_cluster, group, "a", **settings))
        leaving.subscribe([topic])
        _poll_until([leaving], lambda: _owned([leaving]) == list(range(PARTITIONS)), 30)
        steady.subscribe(
            [topic],
            on_assign=lambda _, parts: rebalances.append(f"assign {len(parts)}"),
            on_revoke=lambda _, parts: rebalances.append(f"revoke {len(parts)}"),
        )
        _poll_until([leaving, steady], _shared([leaving, steady]), 30)
        theirs, mine = _owned([leaving]), _owned([steady])
        rebalances.clear()
        first_life.close()  # closes `leaving`: a static member sends no LeaveGroup

        with _static(kafka_cluster, group, "a", **settings) as restarted:
            restarted.subscribe([topic])
            _poll_until([restarted, steady], lambda: _owned([restarted]) == theirs, 15)
            _poll_for([restarted, steady], 2)
            assert rebalances == [] and _owned([steady]) == mine


def test_describe_groups_names_static_members(kafka_cluster: LocalCluster) -> None:
    """DescribeGroups returns each member's group_instance_id (librdkafka 0102 read it)."""
    topic, group = "static-described", "static-described-group"
    create_topic(kafka_cluster, topic, partitions=PARTITIONS)
    with _static(kafka_cluster, group, "described-1") as consumer:
        consumer.subscribe([topic])
        _poll_until([consumer], lambda: bool(consumer.assignment()), 30)
        client = admin_module.AdminClient({"bootstrap.servers": kafka_cluster.kafka_bootstrap})
        described = client.describe_consumer_groups([group])[group].result(timeout=20)
    (member,) = described.members
    assert member.group_instance_id == "described-1"


def test_a_second_instance_with_the_same_id_fences_the_first(kafka_cluster: LocalCluster) -> None:
    """Two processes with one instance id: the later join replaces the first member, whose next
    heartbeat gets FENCED_INSTANCE_ID (fatal for librdkafka)."""
    topic, group = "static-fenced", "static-fenced-group"
    create_topic(kafka_cluster, topic, partitions=PARTITIONS)
    with _static(kafka_cluster, group, "twin") as first:
        first.subscribe([topic])
        _poll_until([first], lambda: _owned([first]) == list(range(PARTITIONS)), 30)
        with _static(kafka_cluster, group, "twin") as second:
            second.subscribe([topic])
            fatal = None
            deadline = time.monotonic() + 20
            while fatal is None:
                assert time.monotonic() < deadline, "the first instance was never fenced"
                second.poll(0.05)
                message = first.poll(0.05)
                if message is not None and message.error() is not None:
                    fatal = message.error()
            assert fatal.code() == kafka.KafkaError._FATAL, fatal
            assert "fenced by other consumer with same group.instance.id" in fatal.str(), fatal
            _poll_until([second], lambda: _owned([second]) == list(range(PARTITIONS)), 15)


def test_leave_group_by_instance_id(kafka_cluster: LocalCluster) -> None:
    """LeaveGroup v3+ names a static member by instance id (kafka-python's
    remove_group_members, Kafka's AdminClient.removeMembersFromConsumerGroup): it leaves at
    once, the other member takes its partitions; an unknown instance is UNKNOWN_MEMBER_ID."""
    from kafka.admin import MemberToRemove

    topic, group = "static-removed", "static-removed-group"
    create_topic(kafka_cluster, topic, partitions=PARTITIONS)
    with (
        _static(kafka_cluster, group, "kept", **{"session.timeout.ms": 30000}) as kept,
        _static(kafka_cluster, group, "removed", **{"session.timeout.ms": 30000}) as gone,
    ):
        kept.subscribe([topic])
        gone.subscribe([topic])
        _poll_until([kept, gone], _shared([kept, gone]), 30)
        admin = kafka_python.KafkaAdminClient(
            bootstrap_servers=kafka_cluster.kafka_bootstrap.split(",")
        )
        try:
            answer = admin.remove_group_members(
                group,
                [
                    MemberToRemove(group_instance_id="removed"),
                    MemberToRemove(group_instance_id="x"),
                ],
            )
        finally:
            admin.close()
        errors = kafka_python.errors
        assert answer == {"removed": errors.NoError, "x": errors.UnknownMemberIdError}
        _poll_until([kept], lambda: _owned([kept]) == list(range(PARTITIONS)), 15)


# -- 6: static membership in KIP-848 groups ----------------------------------------------------


def test_a_kip848_static_member_keeps_its_assignment_across_a_restart(
    kafka_cluster: LocalCluster,
) -> None:
    """`group.protocol=consumer` with `group.instance.id`: closing sends member epoch -2, which
    keeps the member's assignment for the session timeout (no other member gets it); a new
    process with the same instance id gets the same partitions."""
    topic, group = "static-848", "static-848-group"
    create_topic(kafka_cluster, topic, partitions=PARTITIONS)
    with _kip848_static(kafka_cluster, group, "x") as steady:
        with _kip848_static(kafka_cluster, group, "y") as leaving:
            steady.subscribe([topic])
            leaving.subscribe([topic])
            _poll_until([steady, leaving], _shared([steady, leaving]), 30)
            theirs, mine = _owned([leaving]), _owned([steady])
        # `leaving` closed with epoch -2: its partitions wait for it.
        start = time.monotonic()
        while time.monotonic() - start < 3:
            assert steady.poll(0.1) is None
            assert _owned([steady]) == mine, "a static member's partitions moved while it was away"
        with _kip848_static(kafka_cluster, group, "y") as restarted:
            restarted.subscribe([topic])
            _poll_until([steady, restarted], lambda: _owned([restarted]) == theirs, 15)
            assert _owned([steady]) == mine


def _kip848_static(cluster: LocalCluster, group: str, instance: str) -> Any:
    """A KIP-848 consumer (session and heartbeat timing are the coordinator's)."""
    settings = {"group.protocol": "consumer", "group.instance.id": instance}
    return confluent_consumer(cluster.kafka_bootstrap, group, **settings)
