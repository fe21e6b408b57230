"""The consumer-group scenario that both Kafka group protocols run with confluent-kafka (the
classic one in test_groups_confluent.py, KIP-848's in test_groups_kip848.py): every record
exactly once between two members, offsets committed through the metadata quorum, a member's
partitions taken over from the committed offsets when it leaves, a restart resuming there.
Only how a consumer is made, and what each protocol checks besides, differ."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

kafka = pytest.importorskip("confluent_kafka")

Consumer = Any  # confluent_kafka.Consumer, untyped


@contextlib.contextmanager
def consumer(boot: str, group: str, **settings: Any) -> Iterator[Consumer]:
    """A confluent-kafka consumer of `group` (no auto-commit, from the earliest offset unless
    `settings` say otherwise), closed on the way out."""
    made = kafka.Consumer(
        {
            "bootstrap.servers": boot,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **settings,
        }
    )
    try:
        yield made
    finally:
        made.close()


def produce(boot: str, topic: str, start: int, count: int) -> None:
    producer = kafka.Producer(
        {"bootstrap.servers": boot, "acks": "all", "enable.idempotence": True, "linger.ms": 5}
    )
    for i in range(start, start + count):
        producer.produce(topic, key=b"key-%d" % i, value=b"value-%d" % i)
    assert producer.flush(30) == 0


def until_assigned(consumers: list[Consumer], partitions: int) -> None:
    """Until the members own every partition between them, each some (a new controller of a
    KIP-848 group grants nothing for one session timeout after its election)."""
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


def drain(consumers: list[Consumer], count: int) -> Counter[bytes]:
    seen: Counter[bytes] = Counter()
    deadline = time.monotonic() + 60
    while sum(seen.values()) < count and time.monotonic() < deadline:
        for consumer in consumers:
            for message in consumer.consume(500, 0.05):
                assert message.error() is None, message.error()
                seen[message.key()] += 1
    return seen


def keys(start: int, count: int) -> Counter[bytes]:
    return Counter(b"key-%d" % i for i in range(start, start + count))


def reads_once_commits_takes_over_and_resumes(
    boot: str,
    topic: str,
    partitions: int,
    make_consumer: Callable[[], Consumer],
    *,
    once_assigned: Callable[[], None] = lambda: None,
    once_resumed: Callable[[], None] = lambda: None,
) -> None:
    """The scenario; `once_assigned` runs when both members share the partitions,
    `once_resumed` when the restarted member has read what the group had not."""
    first, second = make_consumer(), make_consumer()
    first.subscribe([topic])
    second.subscribe([topic])
    until_assigned([first, second], partitions)
    once_assigned()
    produce(boot, topic, 0, 10_000)
    assert drain([first, second], 10_000) == keys(0, 10_000)  # exactly once between them
    first.commit(asynchronous=False)
    second.commit(asynchronous=False)
    # Committed through the metadata quorum: every partition's offset is its end.
    assigned = [kafka.TopicPartition(topic, p) for p in range(partitions)]
    for committed in first.committed(assigned, timeout=10):
        _, high = first.get_watermark_offsets(committed, timeout=10)
        assert committed.offset == high, committed

    second.close()  # leaves the group: the first takes over its partitions
    until_assigned([first], partitions)  # before producing: nothing is read twice
    produce(boot, topic, 10_000, 1_000)
    assert drain([first], 1_000) == keys(10_000, 1_000)
    first.commit(asynchronous=False)
    first.close()

    restarted = make_consumer()  # resumes where the group committed
    restarted.subscribe([topic])
    produce(boot, topic, 11_000, 500)
    try:
        assert drain([restarted], 500) == keys(11_000, 500)
        assert restarted.consume(100, 1.0) == []  # and nothing before it again
        once_resumed()
    finally:
        restarted.close()
