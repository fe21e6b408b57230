"""The consumer's fetch pipeline against the fake cluster: the next Fetch is sent as soon as an
answer is decoded (within `fetch_buffer_bytes_max`), and an answer for a partition that was
re-sought, reset or dropped while its Fetch was in flight is never delivered."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from client_fake_cluster import FakeCluster

from raftlog.client import Consumer, Producer
from raftlog.client._connection import Cluster, ConnectionOptions, TopicPartition
from raftlog.client._fetcher import Fetcher, PartitionState
from raftlog.client.config import ConsumerConfig
from raftlog.errors import ConfigError

TP = TopicPartition("events", 0)
TIMEOUT_S = 10.0
# Long enough that a Fetch at the end of the log is still waiting on the server when the test
# acts; the fake cluster answers at once when data arrives.
LONG_POLL_MS = 5000


def produce(cluster: FakeCluster, values: list[bytes], partition: int = 0) -> None:
    """One batch holding `values` (a long linger, then flush)."""
    with Producer(cluster.bootstrap, linger_ms=60_000) as producer:
        for value in values:
            producer.send("events", value=value, partition=partition)
        producer.flush()


@pytest.fixture
def connection(cluster: FakeCluster) -> Iterator[Cluster]:
    connected = ConnectionOptions().connect(cluster.bootstrap)
    try:
        yield connected
    finally:
        connected.close()


def fetcher(connection: Cluster, **options: int) -> Fetcher:
    # One batch per answer: any non-empty answer holds exactly one batch.
    options.setdefault("partition_fetch_bytes_max", 1)
    return Fetcher(connection, ConsumerConfig(fetch_max_wait_ms=0, **options).validate())  # type: ignore[arg-type]


def wait_answered(fetch: Fetcher, partitions: dict[TopicPartition, PartitionState]) -> None:
    """Collect until at least one answer was delivered (a prefetch may follow at once)."""
    for _ in range(100):
        fetch.wait(TIMEOUT_S)
        outcomes = list(fetch.collect(partitions))
        assert all(error is None for _, error in outcomes), outcomes
        if outcomes:
            return
    raise AssertionError("no Fetch answer arrived")


def drained_from(fetch: Fetcher, partitions: dict[TopicPartition, PartitionState]) -> int:
    """The first offset buffered, after checking that the buffered offsets run on from it."""
    offsets = [r.offset for r in fetch.drain(partitions.values(), limit=10)]
    assert offsets and offsets == list(range(offsets[0], offsets[0] + len(offsets))), offsets
    return offsets[0]


def test_the_next_fetch_is_sent_as_soon_as_an_answer_is_decoded(
    cluster: FakeCluster, connection: Cluster
) -> None:
    cluster.state.create_topic("events", 1)
    produce(cluster, [b"a", b"b"])  # offsets 0 and 1, one batch
    fetch = fetcher(connection)
    partitions = {TP: PartitionState(fetch_offset=0)}
    assert fetch.send(partitions, now_s=0.0) == []
    state = partitions[TP]
    assert state.in_flight is not None and state.in_flight.offset == 0
    wait_answered(fetch, partitions)
    # Records 0 and 1 are buffered and none returned yet: the Fetch for 2 is already out.
    assert state.position() == 0 and state.buffered_bytes > 0
    assert state.in_flight is not None and state.in_flight.offset == state.fetch_offset == 2
    assert [r.offset for r in fetch.drain(partitions.values(), limit=10)] == [0, 1]
    assert state.buffered_bytes == 0


def test_no_prefetch_while_the_buffer_bound_is_reached(
    cluster: FakeCluster, connection: Cluster
) -> None:
    cluster.state.create_topic("events", 1)
    produce(cluster, [b"a", b"b"])
    produce(cluster, [b"c"])
    fetch = fetcher(connection, fetch_buffer_bytes_max=0)  # fetch only once drained
    partitions = {TP: PartitionState(fetch_offset=0)}
    fetch.send(partitions, now_s=0.0)
    wait_answered(fetch, partitions)
    state = partitions[TP]
    assert state.in_flight is None and state.fetch_offset == 2  # 0 and 1 wait in the buffer
    assert fetch.send(partitions, now_s=0.0) == [] and state.in_flight is None
    assert [r.offset for r in fetch.drain(partitions.values(), limit=1)] == [0]
    fetch.send(partitions, now_s=0.0)
    assert state.in_flight is None, "record 1 is still buffered"
    assert [r.offset for r in fetch.drain(partitions.values(), limit=1)] == [1]
    fetch.send(partitions, now_s=0.0)
    assert state.in_flight is not None and state.in_flight.offset == 2


def test_a_partition_in_retry_backoff_is_not_fetched(
    cluster: FakeCluster, connection: Cluster
) -> None:
    cluster.state.create_topic("events", 1)
    fetch = fetcher(connection)
    partitions = {TP: PartitionState(fetch_offset=0, retry_at_s=5.0)}
    fetch.send(partitions, now_s=4.9)
    assert partitions[TP].in_flight is None
    fetch.send(partitions, now_s=5.0)
    assert partitions[TP].in_flight is not None


def test_an_answer_for_a_moved_partition_is_dropped(
    cluster: FakeCluster, connection: Cluster
) -> None:
    cluster.state.create_topic("events", 1)
    produce(cluster, [b"a"])
    produce(cluster, [b"b"])  # a batch of its own, at 1
    fetch = fetcher(connection)
    partitions = {TP: PartitionState(fetch_offset=1)}
    fetch.send(partitions, now_s=0.0)
    state = partitions[TP]
    state.move_to(0, None)  # a seek back while the Fetch for 1 is in flight
    assert state.in_flight is None
    fetch.send(partitions, now_s=0.0)
    # Delivering record 1 first would break the offset order (and the fetch offset).
    wait_answered(fetch, partitions)
    assert drained_from(fetch, partitions) == 0
    # A state replaced wholesale (a revocation, then the partition given back) drops too.
    assert state.in_flight is not None or state.fetch_offset == 2
    partitions[TP] = PartitionState(fetch_offset=0)
    fetch.send(partitions, now_s=0.0)
    wait_answered(fetch, partitions)
    assert drained_from(fetch, partitions) == 0


def consumer(cluster: FakeCluster) -> Consumer:
    return Consumer(cluster.bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=LONG_POLL_MS)


def poll_offsets(c: Consumer, count: int) -> list[tuple[int, int]]:
    got: list[tuple[int, int]] = []
    for _ in range(50):
        got += [(r.partition, r.offset) for r in c.poll(timeout_ms=100)]
        if len(got) >= count:
            break
    return got


def wait_fetch_requests(cluster: FakeCluster, count: int) -> None:
    def arrived() -> int:
        return sum(n for (_, rpc), n in cluster.state.requests.items() if rpc == "Fetch")

    with cluster.state.condition:
        assert cluster.state.condition.wait_for(lambda: arrived() >= count, TIMEOUT_S), arrived()


def test_seek_back_while_a_long_poll_is_in_flight(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 1)
    produce(cluster, [b"a", b"b"])
    with consumer(cluster) as c:
        c.assign([TP])
        assert poll_offsets(c, 2) == [(0, 0), (0, 1)]
        wait_fetch_requests(cluster, 2)  # at 0 (answered with all), then the long poll at 2
        c.seek(TP, 0)
        produce(cluster, [b"c"])  # the long poll at 2 would answer with record 2 now
        assert poll_offsets(c, 3) == [(0, 0), (0, 1), (0, 2)]
        assert c.position(TP) == 3


def test_a_partition_dropped_and_assigned_again_starts_afresh(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 2, replication_factor=2)
    produce(cluster, [b"a"], partition=0)
    produce(cluster, [b"b"], partition=1)
    other = TopicPartition("events", 1)
    with consumer(cluster) as c:
        c.assign([TP, other])
        assert sorted(poll_offsets(c, 2)) == [(0, 0), (1, 0)]
        wait_fetch_requests(cluster, 4)  # each: at 0 (answered with all), then a long poll at 1
        c.assign([TP])
        produce(cluster, [b"c"], partition=1)  # would answer the dropped long poll
        c.assign([TP, other])  # a fresh position: earliest
        assert poll_offsets(c, 2) == [(1, 0), (1, 1)]


def test_a_bad_buffer_bound_is_refused(cluster: FakeCluster) -> None:
    with pytest.raises(ConfigError, match="fetch_buffer_bytes_max: must not be negative"):
        Consumer(cluster.bootstrap, fetch_buffer_bytes_max=-1)
    with pytest.raises(ConfigError, match=r"fetch_buffer_bytes_max: .*non-negative int.*'1M'"):
        Consumer(cluster.bootstrap, fetch_buffer_bytes_max="1M")  # type: ignore[arg-type]
