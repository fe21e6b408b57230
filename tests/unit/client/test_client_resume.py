"""Resumable producers: a derived producer id, Log.DescribeProducers and `Producer.resume`.

A writer that restarts as the same producer (the Spark sink's retried task) must learn how
many of its records a partition has *committed*, skip them, and continue the sequence; a
second incarnation writing at the same time must be refused by the sequence check.
"""

from __future__ import annotations

import json

import pytest
from client_fake_cluster import FakeCluster

from raftlog.client import Producer
from raftlog.client.errors import ClientError, DeliveryFailedError
from raftlog.client.producer import DERIVED_PRODUCER_ID_MIN, derived_producer_id
from raftlog.metadata.commands import AllocateProducerIds, ErrorCode
from raftlog.metadata.state import ALLOCATED_PRODUCER_ID_LIMIT, MetadataState
from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.storage.batch import parse_header

TIMEOUT_S = 10
PRODUCER_ID = derived_producer_id("test-writer/0/0")


def headers(cluster: FakeCluster, topic: str, partition: int) -> list[tuple[int, int, int, int]]:
    """(producer id, epoch, base sequence, record count) of every data batch stored."""
    result = []
    for batch in cluster.state.stored_batches(topic, partition):
        header = parse_header(batch)
        if not header.is_control:
            result.append(
                (
                    header.producer_id,
                    header.producer_epoch,
                    header.base_sequence,
                    header.record_count,
                )
            )
    return result


def write(cluster: FakeCluster, values: list[bytes], *, resume: bool = True) -> int:
    """One incarnation of a resumable writer: skip what is committed, send the rest."""
    with Producer(cluster.bootstrap, producer_id=PRODUCER_ID, linger_ms=0) as producer:
        skip = producer.resume("events", 0) if resume else 0
        futures = [producer.send("events", value=v, partition=0) for v in values[skip:]]
        producer.flush()
    for future in futures:
        future.result(TIMEOUT_S)
    return skip


def test_derived_ids_are_stable_distinct_and_outside_the_allocated_range() -> None:
    assert DERIVED_PRODUCER_ID_MIN == ALLOCATED_PRODUCER_ID_LIMIT == 1 << 62
    names = [f"query/{batch}/{part}" for batch in range(50) for part in range(20)]
    ids = [derived_producer_id(name) for name in names]
    assert ids == [derived_producer_id(name) for name in names]
    assert len(set(ids)) == len(ids)
    assert all(DERIVED_PRODUCER_ID_MIN <= i < 1 << 63 for i in ids)


def test_the_allocator_never_reaches_the_derived_range() -> None:
    data = MetadataState("c").snapshot()  # a format-version byte, then JSON
    snapshot = json.loads(data[1:])
    snapshot["next_producer_id"] = ALLOCATED_PRODUCER_ID_LIMIT - 1
    state = MetadataState.restore(data[:1] + json.dumps(snapshot).encode())
    refused = state.check(AllocateProducerIds(2))
    assert (refused.code, refused.message) == (
        ErrorCode.INVALID_REQUEST,
        "producer ids are exhausted",
    )
    assert state.check(AllocateProducerIds(1)).ok


def test_a_fixed_producer_uses_its_id_and_never_asks_for_one(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 1)
    write(cluster, [b"a", b"b", b"c"], resume=False)
    assert headers(cluster, "events", 0) == [(PRODUCER_ID, 0, 0, 3)]
    assert not any(rpc == "InitProducerId" for _, rpc in cluster.state.requests)


def test_a_restarted_writer_skips_committed_records_and_continues_the_sequence(
    cluster: FakeCluster,
) -> None:
    cluster.state.create_topic("events", 1)
    values = [b"v%d" % i for i in range(12)]
    assert write(cluster, values[:7]) == 0  # the first attempt got 7 records in, then died
    assert write(cluster, values) == 7
    assert write(cluster, values) == 12  # a third run writes nothing
    stored = headers(cluster, "events", 0)
    assert [(s, n) for _, _, s, n in stored] == [(0, 7), (7, 5)]
    assert {pid for pid, _, _, _ in stored} == {PRODUCER_ID}


def test_only_committed_records_are_skipped(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 1)
    write(cluster, [b"a", b"b"])
    partition = cluster.state.partition("events", 0)
    with cluster.state.condition:
        partition.high_watermark_lag = 1  # "b" is appended but not committed
    with Producer(cluster.bootstrap, producer_id=PRODUCER_ID) as producer:
        assert producer.resume("events", 0) == 0
    with cluster.state.condition:
        partition.high_watermark_lag = 0
    with Producer(cluster.bootstrap, producer_id=PRODUCER_ID) as producer:
        assert producer.resume("events", 0) == 2


def test_resume_follows_a_not_leader_answer(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 1)
    write(cluster, [b"a"])
    cluster.state.fail_next["DescribeProducers"] = [pb.NOT_LEADER, pb.REQUEST_TIMED_OUT]
    with Producer(cluster.bootstrap, producer_id=PRODUCER_ID, retry_backoff_ms=1) as producer:
        assert producer.resume("events", 0) == 1
    described = sum(
        n for (_, rpc), n in cluster.state.requests.items() if rpc == "DescribeProducers"
    )
    assert described == 2 + 2  # one per write() plus the two refused attempts


def test_a_concurrent_zombie_incarnation_is_refused(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 1)
    zombie = Producer(cluster.bootstrap, producer_id=PRODUCER_ID, linger_ms=0)
    try:
        assert zombie.resume("events", 0) == 0
        write(cluster, [b"a", b"b", b"c"])
        write(cluster, [b"a", b"b", b"c", b"d"])  # the retry went on after the first run
        late = zombie.send("events", value=b"a", partition=0)
        with pytest.raises(DeliveryFailedError) as failure:
            late.result(TIMEOUT_S)
        assert "OUT_OF_ORDER_SEQUENCE" in str(failure.value.__cause__)
    finally:
        zombie.close()
    assert [(s, n) for _, _, s, n in headers(cluster, "events", 0)] == [(0, 3), (3, 1)]


def test_misuse_is_refused_with_a_clear_error(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 1)
    with pytest.raises(ClientError, match="producer_id must be a derived id"):
        Producer(cluster.bootstrap, producer_id=5)
    with pytest.raises(ClientError, match="producer_epoch must be in"):
        Producer(cluster.bootstrap, producer_id=PRODUCER_ID, producer_epoch=1 << 15)
    with pytest.raises(ClientError, match="enable_idempotence"):
        Producer(cluster.bootstrap, producer_id=PRODUCER_ID, enable_idempotence=False)
    with Producer(cluster.bootstrap) as normal, pytest.raises(ClientError, match="producer_id="):
        normal.resume("events", 0)
    with Producer(cluster.bootstrap, producer_id=PRODUCER_ID) as producer:
        with pytest.raises(ClientError, match="partition 3 of topic 'events' does not exist"):
            producer.resume("events", 3)
        producer.send("events", value=b"x", partition=0)
        with pytest.raises(ClientError, match="after records were sent"):
            producer.resume("events", 0)
