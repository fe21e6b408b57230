"""kafka-python and aiokafka against the Kafka listener: 10,000 keyed acks=all records (with
idempotence where the client has it), a group of two consumers reading them exactly once
between them, committing, one leaving and the other taking over from the committed offsets,
and a restarted consumer resuming there."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from typing import Any

import pytest

from raftlog.local_cluster import LocalCluster
from tests.kafka.kafka_wire import create_topic

PARTITIONS = 3


def _keys(start: int, count: int) -> Counter[bytes]:
    return Counter(b"key-%d" % i for i in range(start, start + count))


def _wait_all_assigned(poll: Any, assignment: Any) -> None:
    """Until the remaining member holds every partition (it took over the leaver's): records
    produced before would be read under the old generation and, uncommitted, read again."""
    deadline = time.monotonic() + 30
    while len(assignment()) < PARTITIONS:
        assert not poll()
        assert time.monotonic() < deadline, "the remaining member never took over"


def test_kafka_python_group(kafka_cluster: LocalCluster) -> None:
    kafka = pytest.importorskip("kafka")
    topic, group = "kp-grp", "kp-group"
    create_topic(kafka_cluster, topic, partitions=PARTITIONS)
    boot = kafka_cluster.kafka_bootstrap.split(",")

    def produce(start: int, count: int) -> None:
        producer = kafka.KafkaProducer(bootstrap_servers=boot, acks="all", linger_ms=5)
        for i in range(start, start + count):
            producer.send(topic, key=b"key-%d" % i, value=b"value-%d" % i)
        producer.flush(30)
        producer.close()

    def consumer(opened: contextlib.ExitStack) -> Any:
        made = kafka.KafkaConsumer(
            bootstrap_servers=boot,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            heartbeat_interval_ms=300,
            session_timeout_ms=6000,
        )
        # A leaked client keeps threads that retry connections (and draw from `random`)
        # while later tests run: every consumer is closed, whatever the test's outcome.
        opened.callback(made.close)
        # The topic's partitions known before the first join: a group leader whose metadata
        # lacks them assigns nothing, and kafka-python does not rejoin when they appear.
        assert made.partitions_for_topic(topic) == set(range(PARTITIONS))
        made.subscribe([topic])
        return made

    def drain(consumers: list[Any], count: int) -> Counter[bytes]:
        seen: Counter[bytes] = Counter()
        deadline = time.monotonic() + 60
        while sum(seen.values()) < count and time.monotonic() < deadline:
            for c in consumers:
                for records in c.poll(timeout_ms=50, max_records=1000).values():
                    seen.update(r.key for r in records)
        return seen

    with contextlib.ExitStack() as opened:
        first, second = consumer(opened), consumer(opened)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert not any(c.poll(timeout_ms=100) for c in (first, second))
            owned = sorted(tp.partition for c in (first, second) for tp in c.assignment())
            if owned == list(range(PARTITIONS)) and first.assignment() and second.assignment():
                break
        else:
            raise AssertionError("no stable assignment in 30 s")
        produce(0, 10_000)
        assert drain([first, second], 10_000) == _keys(0, 10_000)
        first.commit()
        second.commit()
        second.close()
        _wait_all_assigned(lambda: first.poll(timeout_ms=100), first.assignment)
        produce(10_000, 1_000)
        assert drain([first], 1_000) == _keys(10_000, 1_000)
        first.commit()
        first.close()
        restarted = consumer(opened)
        produce(11_000, 500)
        assert drain([restarted], 500) == _keys(11_000, 500)


def test_aiokafka_group(kafka_cluster: LocalCluster) -> None:
    aiokafka = pytest.importorskip("aiokafka")
    topic, group = "aio-grp", "aio-group"
    create_topic(kafka_cluster, topic, partitions=PARTITIONS)
    boot = kafka_cluster.kafka_bootstrap

    async def produce(start: int, count: int) -> None:
        producer = aiokafka.AIOKafkaProducer(
            bootstrap_servers=boot, acks="all", enable_idempotence=True, linger_ms=5
        )
        await producer.start()
        try:
            sends = [
                await producer.send(topic, key=b"key-%d" % i, value=b"value-%d" % i)
                for i in range(start, start + count)
            ]
            await asyncio.gather(*sends)
        finally:
            await producer.stop()

    async def consumer(opened: contextlib.AsyncExitStack) -> Any:
        made = aiokafka.AIOKafkaConsumer(
            topic,
            bootstrap_servers=boot,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            heartbeat_interval_ms=300,
            session_timeout_ms=6000,
        )
        opened.push_async_callback(made.stop)
        await made.start()
        return made

    async def drain(consumers: list[Any], count: int) -> Counter[bytes]:
        seen: Counter[bytes] = Counter()
        deadline = time.monotonic() + 60
        while sum(seen.values()) < count and time.monotonic() < deadline:
            for c in consumers:
                batches = await c.getmany(timeout_ms=50, max_records=1000)
                for records in batches.values():
                    seen.update(r.key for r in records)
        return seen

    async def scenario() -> None:
        async with contextlib.AsyncExitStack() as opened:
            first, second = await consumer(opened), await consumer(opened)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                for c in (first, second):
                    assert not await c.getmany(timeout_ms=100)
                owned = sorted(tp.partition for c in (first, second) for tp in c.assignment())
                if owned == list(range(PARTITIONS)) and first.assignment() and second.assignment():
                    break
            else:
                raise AssertionError("no stable assignment in 30 s")
            await produce(0, 10_000)
            assert await drain([first, second], 10_000) == _keys(0, 10_000)
            await first.commit()
            await second.commit()
            await second.stop()
            deadline = time.monotonic() + 30
            while len(first.assignment()) < PARTITIONS:
                assert not await first.getmany(timeout_ms=100)
                assert time.monotonic() < deadline, "the remaining member never took over"
            await produce(10_000, 1_000)
            assert await drain([first], 1_000) == _keys(10_000, 1_000)
            await first.commit()
            await first.stop()
            restarted = await consumer(opened)
            await produce(11_000, 500)
            assert await drain([restarted], 500) == _keys(11_000, 500)

    asyncio.run(scenario())
