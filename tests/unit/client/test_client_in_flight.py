"""Several batches of one partition in flight (max_in_flight_per_partition), with idempotence.

The fake cluster holds produce answers behind a gate; when the gate opens its handler threads
take the shared lock in any order, so batches sent N, N+1, ... reach the fake leader
reordered (as separate gRPC calls can reach a real one). Whatever the arrival order and the
planted faults, every record must be stored once, in send order, at the offset its future
reports.
"""

from __future__ import annotations

import pytest
from client_fake_cluster import FakeCluster

from raftlog.client import Consumer, Producer
from raftlog.client.config import ProducerConfig
from raftlog.errors import ConfigError
from raftlog.rpc.v1 import raftlog_pb2 as pb

TIMEOUT_S = 30.0
# Over half of batch_bytes_max (1 KiB): every record opens its own batch.
VALUE_BYTES = 600


def stored_values(cluster: FakeCluster, topic: str, partition: int) -> list[tuple[int, bytes]]:
    consumer = Consumer(cluster.bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=0)
    consumer.assign([(topic, partition)])
    end = cluster.state.partition(topic, partition).high_watermark
    got: list[tuple[int, bytes]] = []
    while consumer.position((topic, partition)) < end:
        got.extend((r.offset, r.value or b"") for r in consumer.poll(timeout_ms=0))
    consumer.close()
    return got


def value(index: int) -> bytes:
    return index.to_bytes(4, "big") * (VALUE_BYTES // 4)


def produce_requests(cluster: FakeCluster) -> int:
    """Produce requests that reached any node (events/0 is led by node 1, events/1 by 2)."""
    return sum(n for (_, rpc), n in cluster.state.requests.items() if rpc == "Produce")


def wait_for_produce_requests(cluster: FakeCluster, count: int) -> None:
    with cluster.state.condition:
        arrived = cluster.state.condition.wait_for(
            lambda: produce_requests(cluster) >= count, TIMEOUT_S
        )
    assert arrived, f"{count} produce requests did not arrive"


def producer(cluster: FakeCluster, **options: object) -> Producer:
    return Producer(
        cluster.bootstrap,
        linger_ms=0,
        batch_bytes_max=1024,
        retry_backoff_ms=1,
        **options,  # type: ignore[arg-type]
    )


def send_and_check(
    cluster: FakeCluster,
    client: Producer,
    count: int,
    *,
    in_flight: int,
    planted: tuple[int, ...] = (),
) -> list[int]:
    """Send `count` one-record batches to events/0 while answers are held; check that exactly
    `in_flight` are sent before the first answer; open the gate and return the offsets.
    `planted`: the errors the first of those requests get.

    A partition's first batch under a producer identity goes alone (raftlog.client.accumulator,
    `_alone`), so one record to each partition is written first, at offset 0."""
    for partition in (0, 1):
        assert client.send("events", value=b"first", partition=partition).result(TIMEOUT_S)
    with cluster.state.condition:
        cluster.state.requests.clear()
        cluster.state.fail_next["Produce"] = list(planted)
    cluster.state.produce_gate.clear()
    futures = [client.send("events", value=value(i), partition=0) for i in range(count)]
    wait_for_produce_requests(cluster, in_flight)
    # A batch to another partition goes through the sender after the ones above: once it
    # arrived, events/0's batches beyond the bound would have been sent too.
    wake = client.send("events", value=b"wake", partition=1)
    wait_for_produce_requests(cluster, in_flight + 1)
    with cluster.state.condition:
        assert produce_requests(cluster) == in_flight + 1
    cluster.state.produce_gate.set()
    offsets = [future.result(TIMEOUT_S).offset for future in futures]
    assert wake.result(TIMEOUT_S).offset == 1
    return offsets


def test_batches_in_flight_are_bounded_and_land_once_in_send_order(
    cluster: FakeCluster,
) -> None:
    cluster.state.create_topic("events", 2)
    with producer(cluster) as client:
        assert client.config.in_flight_per_partition_max == 5
        offsets = send_and_check(cluster, client, 12, in_flight=5)
    assert offsets == list(range(1, 13))
    assert stored_values(cluster, "events", 0)[1:] == [(i + 1, value(i)) for i in range(12)]


def test_a_failed_batch_and_those_after_it_are_retried_in_order(cluster: FakeCluster) -> None:
    # The first request to arrive is refused (NOT_LEADER, nothing written): the batches
    # after it in sequence then get OUT_OF_ORDER, retriable while the refused one is
    # unresolved, and all are resent in order with their sequence numbers.
    cluster.state.create_topic("events", 2)
    with producer(cluster) as client:
        offsets = send_and_check(cluster, client, 6, in_flight=5, planted=(pb.NOT_LEADER,))
    assert offsets == list(range(1, 7))
    assert stored_values(cluster, "events", 0)[1:] == [(i + 1, value(i)) for i in range(6)]


def test_lost_answers_are_answered_as_duplicates_with_their_offsets(cluster: FakeCluster) -> None:
    # The fake appends, then fails the call: the client cannot tell a lost answer from a lost
    # request and resends; the leader remembers the batch and answers DUPLICATE_SEQUENCE.
    cluster.state.create_topic("events", 2)
    cluster.state.drop_next_produce_responses = 3
    with producer(cluster) as client:
        futures = [client.send("events", value=value(i), partition=0) for i in range(10)]
        offsets = [future.result(TIMEOUT_S).offset for future in futures]
    assert offsets == list(range(10))
    assert stored_values(cluster, "events", 0) == [(i, value(i)) for i in range(10)]
    assert cluster.state.partition("events", 0).duplicates_answered >= 3


def test_reordered_arrivals_and_faults_keep_each_partition_in_order(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 2)
    cluster.state.fail_next["Produce"] = [pb.REQUEST_TIMED_OUT, pb.NOT_LEADER, pb.NOT_LEADER]
    cluster.state.drop_next_produce_responses = 2
    with producer(cluster) as client:
        for round_number in range(4):
            cluster.state.produce_gate.clear()
            with cluster.state.condition:
                arrived = produce_requests(cluster)
            futures = [
                (partition, client.send("events", value=value(i), partition=partition))
                for i in range(8 * round_number, 8 * round_number + 8)
                for partition in (0, 1)
            ]
            wait_for_produce_requests(cluster, arrived + 2)  # answers held: they reorder
            cluster.state.produce_gate.set()
            for _, future in futures:
                future.result(TIMEOUT_S)
    for partition in (0, 1):
        assert stored_values(cluster, "events", partition) == [(i, value(i)) for i in range(32)]


def test_out_of_order_with_no_earlier_batch_unresolved_is_fatal(cluster: FakeCluster) -> None:
    # A real gap (the leader expects another sequence and nothing of ours is pending): a
    # retry cannot help, the batch fails as before.
    cluster.state.create_topic("events", 2)
    cluster.state.fail_next["Produce"] = [pb.OUT_OF_ORDER_SEQUENCE]
    with producer(cluster) as client:
        future = client.send("events", value=value(0), partition=0)
        with pytest.raises(Exception, match="OUT_OF_ORDER_SEQUENCE"):
            future.result(TIMEOUT_S)
    assert produce_requests(cluster) == 1


def test_non_idempotent_producers_keep_one_batch_in_flight_unless_asked(
    cluster: FakeCluster,
) -> None:
    cluster.state.create_topic("events", 2)
    with producer(cluster, acks=1, enable_idempotence=False) as client:
        assert client.config.in_flight_per_partition_max == 1
        assert send_and_check(cluster, client, 3, in_flight=1) == [1, 2, 3]


@pytest.mark.parametrize("bad", [0, 6, -1, True, 2.5, "5"])
def test_max_in_flight_per_partition_is_validated(bad: object) -> None:
    config = ProducerConfig(max_in_flight_per_partition=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_in_flight_per_partition: must"):
        config.validate()


def test_with_linger_0_a_batch_with_room_waits_for_the_one_in_flight(
    cluster: FakeCluster,
) -> None:
    # Many one-record requests cost the nodes more than waiting one round trip: the records
    # sent while a batch is in flight gather in one batch, sent when the answer comes.
    cluster.state.create_topic("events", 2)
    with producer(cluster) as client:
        cluster.state.produce_gate.clear()
        first = client.send("events", value=b"first", partition=0)
        wait_for_produce_requests(cluster, 1)
        gathered = [client.send("events", value=b"gathered", partition=0) for _ in range(3)]
        wake = client.send("events", value=b"wake", partition=1)
        wait_for_produce_requests(cluster, 2)
        with cluster.state.condition:
            assert produce_requests(cluster) == 2  # the three records were not sent yet
        cluster.state.produce_gate.set()
        assert first.result(TIMEOUT_S).offset == 0
        assert [future.result(TIMEOUT_S).offset for future in gathered] == [1, 2, 3]
        assert wake.result(TIMEOUT_S).offset == 0
    # "first", then one batch of three.
    assert len(cluster.state.stored_batches("events", 0)) == 2
