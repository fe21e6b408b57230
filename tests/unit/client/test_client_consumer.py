"""The Consumer against the fake cluster: positions, seeks, control batches, high watermark."""

from __future__ import annotations

import re

import pytest
from client_fake_cluster import FakeCluster

from raftlog.client import Consumer, ConsumerRecord, Producer
from raftlog.client.errors import (
    ClientClosedError,
    ClientError,
    OffsetOutOfRangeError,
    ServerError,
)
from raftlog.errors import ConfigError
from raftlog.rpc.v1 import raftlog_pb2 as pb

TP = ("events", 0)
TIMEOUT_S = 10


def produce(cluster: FakeCluster, values: list[bytes], partition: int = 0) -> None:
    with Producer(cluster.bootstrap) as producer:
        for value in values:
            producer.send("events", value=value, partition=partition)
        producer.flush()


def consumer(cluster: FakeCluster, **options: object) -> Consumer:
    options.setdefault("fetch_max_wait_ms", 0)
    return Consumer(cluster.bootstrap, **options)  # type: ignore[arg-type]


def poll_values(c: Consumer, count: int) -> list[tuple[int, bytes | None]]:
    """(offset, value) of the next `count` records; gives up after a few empty polls."""
    got: list[ConsumerRecord] = []
    for _ in range(20):
        got.extend(c.poll(timeout_ms=100))
        if len(got) >= count:
            break
    return [(record.offset, record.value) for record in got]


def test_seek_and_position_semantics(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 1)
    produce(cluster, [b"a", b"b", b"c", b"d"])  # offsets 0..3
    c = consumer(cluster, auto_offset_reset="earliest")
    c.assign([TP])
    assert c.position(TP) == 0  # earliest: the log start
    c.seek(TP, 2)
    assert c.position(TP) == 2
    assert poll_values(c, 2) == [(2, b"c"), (3, b"d")]
    assert c.position(TP) == 4
    assert c.highwater(TP) == 4
    c.seek_to_beginning()
    assert poll_values(c, 4) == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d")]
    c.seek_to_end(TP)
    assert c.position(TP) == 4
    assert c.poll(timeout_ms=0) == []
    produce(cluster, [b"e"])
    assert poll_values(c, 1) == [(4, b"e")]
    c.close()


def test_latest_reset_starts_at_the_high_watermark(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 1)
    produce(cluster, [b"old"])
    c = consumer(cluster)  # Kafka's default: latest
    c.assign([TP])
    assert c.position(TP) == 1
    produce(cluster, [b"new"])
    assert poll_values(c, 1) == [(1, b"new")]
    c.close()


def test_seek_into_a_batch_skips_its_earlier_records(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 1)
    with Producer(cluster.bootstrap, linger_ms=60_000) as producer:
        for value in (b"a", b"b", b"c"):
            producer.send("events", value=value)
    assert len(cluster.state.stored_batches("events", 0)) == 1  # one batch of 3, at 0..2
    c = consumer(cluster)
    c.assign([TP])
    c.seek(TP, 1)
    assert poll_values(c, 2) == [(1, b"b"), (2, b"c")]
    c.close()


def test_control_batches_are_skipped_but_advance_the_position(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 1)
    # A control batch first in the log (this was the leader's no-op, which no longer takes
    # an offset): the consumer must step over one at the log start too.
    cluster.state.append_control("events", 0)  # offset 0
    produce(cluster, [b"a"])
    cluster.state.append_control("events", 0)  # offset 2: a transaction marker, say
    produce(cluster, [b"b"])
    cluster.state.append_control("events", 0)  # offset 4, last in the log
    c = consumer(cluster, auto_offset_reset="earliest")
    c.assign([TP])
    assert poll_values(c, 2) == [(1, b"a"), (3, b"b")]
    c.poll(timeout_ms=0)
    assert c.position(TP) == 5  # past the trailing control batch
    c.close()


def test_records_above_the_high_watermark_are_not_returned(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 1)
    produce(cluster, [b"a"])
    produce(cluster, [b"b"])  # a batch of its own
    cluster.state.partition("events", 0).high_watermark_lag = 1  # b not committed yet
    c = consumer(cluster, auto_offset_reset="earliest")
    c.assign([TP])
    assert poll_values(c, 1) == [(0, b"a")]
    assert c.poll(timeout_ms=0) == []
    assert c.position(TP) == 1
    cluster.state.commit_all("events", 0)
    assert poll_values(c, 1) == [(1, b"b")]
    c.close()


def poll_until_raises(c: Consumer, polls: int = 300) -> None:
    """Poll until the error surfaces: a poll returns empty-handed when its fetch is still on
    the wire at its timeout (a loaded machine), so one short poll is no proof either way;
    pytest.raises fails the test if `polls` polls pass without the error."""
    for _ in range(polls):
        c.poll(timeout_ms=100)


def test_a_batch_at_or_above_the_high_watermark_is_refused(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 1)
    produce(cluster, [b"a"])
    # A planted server bug: Fetch reports a high watermark below the batch it returns.
    cluster.state.lying_fetch_high_watermark = 0
    c = consumer(cluster)
    c.assign([TP])
    c.seek(TP, 0)
    with pytest.raises(ClientError, match="ending at offset 0 is not below the high watermark 0"):
        poll_until_raises(c)
    c.close()


def test_offset_out_of_range_resets_per_policy(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 1)
    produce(cluster, [b"a"])
    c = consumer(cluster, auto_offset_reset="earliest")
    c.assign([TP])
    c.seek(TP, 100)
    assert poll_values(c, 1) == [(0, b"a")]
    c.close()
    strict = consumer(cluster, auto_offset_reset="error")
    strict.assign([TP])
    with pytest.raises(OffsetOutOfRangeError, match="NO_POSITION"):
        strict.position(TP)
    strict.seek(TP, 100)
    with pytest.raises(OffsetOutOfRangeError, match="events/0 at offset 100"):
        poll_until_raises(strict)
    strict.close()


def test_fetch_follows_not_leader_hint(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 1)
    produce(cluster, [b"a"])
    partition = cluster.state.partition("events", 0)
    partition.leader_id = 2
    partition.advertised_leader = 1
    c = consumer(cluster, retry_backoff_ms=0)
    c.assign([TP])
    c.seek(TP, 0)
    assert poll_values(c, 1) == [(0, b"a")]
    assert cluster.state.requests[(1, "Fetch")] == 1
    c.close()


def test_planted_retriable_fetch_errors_are_retried(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 1)
    produce(cluster, [b"a"])
    cluster.state.fail_next["Fetch"] = [pb.NOT_LEADER, pb.REQUEST_TIMED_OUT]
    c = consumer(cluster, retry_backoff_ms=0)
    c.assign([TP])
    c.seek(TP, 0)
    assert poll_values(c, 1) == [(0, b"a")]
    c.close()


def test_unreachable_leader_is_named_when_poll_times_out(cluster: FakeCluster) -> None:
    c = Consumer("127.0.0.1:1", request_timeout_ms=1000, retry_backoff_ms=0, fetch_max_wait_ms=0)
    c.assign([TP])
    c.seek(TP, 0)
    with pytest.raises(ClientError, match=re.escape("no node answered: 127.0.0.1:1: ")) as caught:
        c.poll(timeout_ms=0)
    assert caught.value.retriable
    c.close()


def test_max_poll_records_and_several_partitions(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 2, replication_factor=2)
    produce(cluster, [b"p0-%d" % i for i in range(5)], partition=0)
    produce(cluster, [b"p1-%d" % i for i in range(5)], partition=1)
    c = consumer(cluster, auto_offset_reset="earliest", max_poll_records=3)
    c.assign([("events", 0), ("events", 1)])
    batches = [c.poll(timeout_ms=100) for _ in range(6)]
    assert all(len(batch) <= 3 for batch in batches)
    records = [record for batch in batches for record in batch]
    for partition in (0, 1):
        offsets = [r.offset for r in records if r.partition == partition]
        assert offsets == [0, 1, 2, 3, 4]
    assert c.assignment() == {("events", 0), ("events", 1)}
    c.close()


def test_iteration_stops_after_consumer_timeout(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 1)
    produce(cluster, [b"a", b"b", b"c"])
    with Consumer(
        cluster.bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=50,
        fetch_max_wait_ms=10,
    ) as c:
        c.assign([TP])
        assert [record.value for record in c] == [b"a", b"b", b"c"]


def test_misuse_is_reported_clearly(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 1)
    c = consumer(cluster)
    with pytest.raises(ClientError, match="not assigned"):
        c.position(TP)
    c.assign([TP])
    with pytest.raises(ClientError, match="non-negative"):
        c.seek(TP, -1)
    with pytest.raises(ClientError, match="topic, partition"):
        c.assign([("events", -1)])
    c.close()
    with pytest.raises(ClientClosedError):
        c.poll()
    with pytest.raises(ConfigError, match="auto_offset_reset"):
        Consumer(cluster.bootstrap, auto_offset_reset="middle")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="fetch_max_wait_ms"):
        Consumer(cluster.bootstrap, fetch_max_wait_ms=5000, request_timeout_ms=1000)


def test_partition_discovery_and_offset_lookups(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 2, replication_factor=2)
    produce(cluster, [b"a", b"b"], partition=1)
    c = consumer(cluster)
    assert c.partitions_for_topic("events") == {0, 1}
    tps = [("events", 0), ("events", 1)]
    assert c.beginning_offsets(tps) == {("events", 0): 0, ("events", 1): 0}
    assert c.end_offsets(tps) == {("events", 0): 0, ("events", 1): 2}
    c.close()


def test_position_lookup_rides_out_an_election(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 1)
    produce(cluster, [b"a"])
    cluster.state.fail_next["ListOffsets"] = [pb.NOT_LEADER, pb.REQUEST_TIMED_OUT, pb.FENCED]
    c = consumer(cluster, retry_backoff_ms=0)
    c.assign([TP])
    assert c.position(TP) == 1
    assert cluster.state.requests[(1, "ListOffsets")] == 4
    cluster.state.fail_next["ListOffsets"] = [pb.UNKNOWN_PRODUCER_ID]  # not retriable
    with pytest.raises(ServerError, match="UNKNOWN_PRODUCER_ID"):
        c.end_offsets([TP])
    c.close()


def test_next_yields_one_record_and_position_follows(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 1)
    produce(cluster, [b"a", b"b", b"c"])
    with Consumer(
        cluster.bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=50,
        fetch_max_wait_ms=10,
    ) as c:
        c.assign([TP])
        assert next(c).value == b"a"
        assert c.position(TP) == 1  # b is fetched but not yet returned
        c.seek(TP, 0)
        assert [record.offset for record in c] == [0, 1, 2]
        with pytest.raises(StopIteration):
            next(c)
