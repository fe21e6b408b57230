"""A consumer group of confluent-kafka consumers over KIP-848's consumer group protocol
(`group.protocol=consumer`: ConsumerGroupHeartbeat, the server assigns): every record exactly
once between two members, offsets committed through the metadata quorum, a member's partitions
taken over from the committed offsets when it leaves, a restart resuming there; and the same
group described by ConsumerGroupDescribe and listed by ListGroups."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

from raftlog.local_cluster import LocalCluster
from tests.kafka.kafka_wire import create_topic

kafka = pytest.importorskip("confluent_kafka")
admin_module = pytest.importorskip("confluent_kafka.admin")

TOPIC, GROUP, PARTITIONS = "kip848", "kip848-1", 4


def _consumer(boot: str, group: str = GROUP) -> Any:
    return kafka.Consumer(
        {
            "bootstrap.servers": boot,
            "group.id": group,
            "group.protocol": "consumer",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )


def _produce(boot: str, start: int, count: int) -> None:
    producer = kafka.Producer(
        {"bootstrap.servers": boot, "acks": "all", "enable.idempotence": True, "linger.ms": 5}
    )
    for i in range(start, start + count):
        producer.produce(TOPIC, key=b"key-%d" % i, value=b"value-%d" % i)
    assert producer.flush(30) == 0


def _until_assigned(consumers: list[Any], partitions: int) -> None:
    # A new controller grants nothing for one session timeout (10 s) after its election.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for consumer in consumers:
            message = consumer.poll(0.1)
            assert message is None or message.error() is None, message.error()
            assert message is None, "nothing is produced yet"
        owned = [p.partition for c in consumers for p in c.assignment()]
        if sorted(owned) == list(range(partitions)) and all(c.assignment() for c in consumers):
            return
    raise AssertionError(f"no stable assignment of {partitions} partitions in 30 s")


def _drain(consumers: list[Any], count: int) -> Counter[bytes]:
    seen: Counter[bytes] = Counter()
    deadline = time.monotonic() + 60
    while sum(seen.values()) < count and time.monotonic() < deadline:
        for consumer in consumers:
            for message in consumer.consume(500, 0.05):
                assert message.error() is None, message.error()
                seen[message.key()] += 1
    return seen


def _keys(start: int, count: int) -> Counter[bytes]:
    return Counter(b"key-%d" % i for i in range(start, start + count))


def _described(boot: str) -> Any:
    client = admin_module.AdminClient({"bootstrap.servers": boot})
    return client.describe_consumer_groups([GROUP])[GROUP].result(timeout=20)


def test_kip848_group_reads_once_commits_takes_over_and_resumes(
    kafka_cluster: LocalCluster,
) -> None:
    create_topic(kafka_cluster, TOPIC, partitions=PARTITIONS)
    boot = kafka_cluster.kafka_bootstrap
    first, second = _consumer(boot), _consumer(boot)
    first.subscribe([TOPIC])
    second.subscribe([TOPIC])
    _until_assigned([first, second], PARTITIONS)
    described = _described(boot)  # ConsumerGroupDescribe: the server's assignment
    assert str(described.type) == str(kafka.ConsumerGroupType.CONSUMER)
    assert sorted(
        p.partition for m in described.members for p in m.assignment.topic_partitions
    ) == list(range(PARTITIONS))

    _produce(boot, 0, 10_000)
    assert _drain([first, second], 10_000) == _keys(0, 10_000)  # exactly once between them
    first.commit(asynchronous=False)
    second.commit(asynchronous=False)
    # Committed through the metadata quorum: every partition's offset is its end.
    partitions = [kafka.TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
    for committed in first.committed(partitions, timeout=10):
        _, high = first.get_watermark_offsets(committed, timeout=10)
        assert committed.offset == high, committed

    second.close()  # leaves the group: the first takes over its partitions
    _until_assigned([first], PARTITIONS)  # before producing: nothing is read twice
    _produce(boot, 10_000, 1_000)
    assert _drain([first], 1_000) == _keys(10_000, 1_000)
    first.commit(asynchronous=False)
    first.close()

    restarted = _consumer(boot)  # resumes where the group committed
    restarted.subscribe([TOPIC])
    _produce(boot, 11_000, 500)
    try:
        assert _drain([restarted], 500) == _keys(11_000, 500)
        assert restarted.consume(100, 1.0) == []  # and nothing before it again
        client = admin_module.AdminClient({"bootstrap.servers": boot})
        listed = client.list_consumer_groups(request_timeout=10).result(timeout=20)
        assert GROUP in {g.group_id for g in listed.valid}
    finally:
        restarted.close()
