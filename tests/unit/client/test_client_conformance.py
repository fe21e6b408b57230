"""Behaviour every raftlog cluster must show the client: runs on the fake, or on a real cluster.

These tests use only the public client API (no fake-cluster knobs), so the same file checks
the fake against the real servers: set RAFTLOG_TEST_BOOTSTRAP=host:port,... to run them
against a running cluster (topics get unique names). Offsets are never assumed absolute: a
real partition may hold control batches (transaction markers) that take offsets, so only order
and density are checked.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from client_fake_cluster import FakeCluster

from raftlog.client import Admin, Consumer, Producer
from raftlog.client.partitioner import partition_for_key

TIMEOUT_S = 30


@pytest.fixture
def bootstrap() -> Iterator[str]:
    real = os.environ.get("RAFTLOG_TEST_BOOTSTRAP")
    if real:
        yield real
        return
    fake = FakeCluster(nodes=3)
    try:
        yield fake.bootstrap
    finally:
        fake.stop()


def new_topic(bootstrap: str, partitions: int) -> str:
    name = f"conformance-{uuid.uuid4().hex[:8]}"
    with Admin(bootstrap) as admin:
        admin.create_topic(name, partitions=partitions, replication_factor=1)
    return name


def read_to_end(bootstrap: str, topic: str, partitions: int) -> list[tuple[int, int, bytes | None]]:
    with Consumer(bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=100) as consumer:
        tps = [(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        end = consumer.end_offsets(tps)
        got: list[tuple[int, int, bytes | None]] = []
        while any(consumer.position(tp) < end[tp] for tp in end):
            got.extend((r.partition, r.offset, r.value) for r in consumer.poll(timeout_ms=1000))
        return got


@pytest.mark.parametrize("acks", ["all", 1])
def test_every_acknowledged_record_is_read_back_in_order(bootstrap: str, acks: str | int) -> None:
    topic = new_topic(bootstrap, 2)
    idempotent = acks == "all"
    with Producer(bootstrap, acks=acks, enable_idempotence=idempotent) as producer:  # type: ignore[arg-type]
        futures = [producer.send(topic, value=b"%d" % i, partition=i % 2) for i in range(100)]
        producer.flush()
    sent = [
        (f.result(TIMEOUT_S).partition, f.result(TIMEOUT_S).offset, b"%d" % i)
        for i, f in enumerate(futures)
    ]
    assert sorted(read_to_end(bootstrap, topic, 2)) == sorted(sent)
    for partition in (0, 1):
        offsets = [offset for p, offset, _ in sent if p == partition]
        assert offsets == sorted(set(offsets))


def test_keyed_records_land_where_kafka_would_put_them(bootstrap: str) -> None:
    topic = new_topic(bootstrap, 3)
    with Producer(bootstrap, compression="lz4") as producer:
        keys = [b"key-%d" % i for i in range(30)]
        futures = [producer.send(topic, value=key, key=key) for key in keys]
        producer.flush()
    for key, future in zip(keys, futures, strict=True):
        assert future.result(TIMEOUT_S).partition == partition_for_key(key, 3)
    read = read_to_end(bootstrap, topic, 3)
    assert sorted(value or b"" for _, _, value in read) == sorted(keys)


def test_seek_position_and_end(bootstrap: str) -> None:
    topic = new_topic(bootstrap, 1)
    with Producer(bootstrap) as producer:
        metas = [producer.send(topic, value=b"v%d" % i).result(TIMEOUT_S) for i in range(5)]
    tp = (topic, 0)
    with Consumer(bootstrap, fetch_max_wait_ms=100) as consumer:
        consumer.assign([tp])
        assert consumer.position(tp) == metas[-1].offset + 1  # latest: the high watermark
        consumer.seek(tp, metas[2].offset)
        records = []
        while len(records) < 3:
            records.extend(consumer.poll(timeout_ms=1000))
        assert [r.value for r in records] == [b"v2", b"v3", b"v4"]
        assert consumer.position(tp) == metas[-1].offset + 1


def test_admin_describes_what_it_created(bootstrap: str) -> None:
    topic = new_topic(bootstrap, 2)
    with Admin(bootstrap) as admin:
        assert topic in admin.list_topics()
        description = admin.describe_topic(topic)
        assert [p.id for p in description.partitions] == [0, 1]
        nodes = {node.node_id for node in admin.describe_cluster().nodes}
        assert all(set(p.replicas) <= nodes for p in description.partitions)
        admin.delete_topic(topic)
        assert topic not in admin.list_topics()
