"""An idempotent producer's records land in the order sent, whatever fails for good meanwhile.

The scenario the chaos suite found on a loaded machine (seed 412, one `send_reorder`),
replayed step by step: the client's clock is a `ManualClock`, and the fake leader holds
chosen requests (`produce_holds`) and answers them when the test says. Batch B fails for good
(its delivery timeout passed) although its first attempt was written; batch C, sent before B
failed and so numbered under the old producer epoch, is still in flight; batch D is sent
after the failure. Kafka's promise (KIP-98, and KIP-360 for what follows an expired batch):
records sent to one partition are written in the order sent. So D must not be written until
C is resolved, and a late attempt of C's must never land after D.

Each test fails on a client that starts D under a fresh producer id while C is unresolved:
D is written first, and C's retry, which continues the old id's sequence, lands after it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future

import pytest
from client_fake_cluster import FakeCluster, ManualClock

from raftlog.client import Consumer, Producer
from raftlog.client.accumulator import RecordMetadata
from raftlog.rpc.v1 import raftlog_pb2 as pb

TIMEOUT_S = 30.0
# Over half of batch_bytes_max (1 KiB): every record opens its own batch.
VALUE_BYTES = 600
# Long enough that records sent after B never expire while the test moves the clock on.
DELIVERY_TIMEOUT_S = 60.0
RETRY_BACKOFF_S = 1.0


def value(index: int) -> bytes:
    return bytes([index]) * VALUE_BYTES


def stored_values(cluster: FakeCluster) -> list[bytes]:
    consumer = Consumer(cluster.bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=0)
    consumer.assign([("events", 0)])
    end = cluster.state.partition("events", 0).high_watermark
    got: list[bytes] = []
    while consumer.position(("events", 0)) < end:
        got.extend(record.value or b"" for record in consumer.poll(timeout_ms=0))
    consumer.close()
    return got


def produce_requests(cluster: FakeCluster) -> int:
    return sum(n for (_, rpc), n in cluster.state.requests.items() if rpc == "Produce")


def wait_for_produce_requests(cluster: FakeCluster, count: int, timeout_s: float) -> bool:
    with cluster.state.condition:
        return cluster.state.condition.wait_for(
            lambda: produce_requests(cluster) >= count, timeout_s
        )


def hold_next_request(cluster: FakeCluster) -> threading.Event:
    release = threading.Event()
    with cluster.state.condition:
        cluster.state.produce_holds.append(release)
    return release


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def client(cluster: FakeCluster, clock: ManualClock) -> Iterator[Producer]:
    cluster.state.create_topic("events", 1)
    with Producer(
        cluster.bootstrap,
        linger_ms=0,
        batch_bytes_max=1024,
        retry_backoff_ms=int(RETRY_BACKOFF_S * 1000),
        request_timeout_ms=4_000,
        delivery_timeout_ms=int(DELIVERY_TIMEOUT_S * 1000),
        clock=clock,
    ) as producer:
        try:
            yield producer
        finally:  # a failed test must not leave close() waiting on a held request
            cluster.release_produce_holds()
            clock.now_s += 3600


def send(client: Producer, index: int) -> Future[RecordMetadata]:
    return client.send("events", value=value(index), partition=0)


def fail_b_while_c_is_in_flight(
    cluster: FakeCluster, client: Producer, clock: ManualClock, *, b_written: bool
) -> tuple[list[Future[RecordMetadata]], threading.Event]:
    """Records 0 (acknowledged), 1 (B: fails for good), 2 (C: in flight, held), 3 (D: sent
    after B failed, its batch closed by record 4). Returns the futures of 0..4 and the event
    that releases C's attempt, which the leader answers REQUEST_TIMED_OUT (retriable)."""
    first = send(client, 0)
    assert first.result(TIMEOUT_S).offset == 0  # a fresh partition's first record
    release_b = hold_next_request(cluster)
    with cluster.state.condition:
        if b_written:  # B's attempt is appended, its answer lost
            cluster.state.drop_next_produce_responses = 1
        else:  # B's attempt is refused: nothing written
            cluster.state.fail_next["Produce"] = [pb.NOT_LEADER]
    b = send(client, 1)
    assert wait_for_produce_requests(cluster, 2, TIMEOUT_S)
    clock.now_s += DELIVERY_TIMEOUT_S - 1.0
    release_c = hold_next_request(cluster)
    with cluster.state.condition:
        cluster.state.fail_next["Produce"] = [pb.REQUEST_TIMED_OUT]
    c = send(client, 2)
    d = send(client, 3)  # closes C's batch, which then goes out behind B's
    assert wait_for_produce_requests(cluster, 3, TIMEOUT_S)
    # B is past its delivery timeout when its answer comes back: it fails for good.
    clock.now_s += 1.5
    release_b.set()
    with pytest.raises(Exception, match=r"delivery_timeout|NOT_LEADER|dropped"):
        b.result(TIMEOUT_S)
    e = send(client, 4)  # closes D's batch: it may leave now, if the client lets it
    # A client that lets D overtake C sends it at once; one that holds D sends nothing.
    wait_for_produce_requests(cluster, 4, timeout_s=1.0)
    return [first, b, c, d, e], release_c


def finish(
    client: Producer,
    clock: ManualClock,
    release_c: threading.Event,
    futures: list[Future[RecordMetadata]],
) -> list[int]:
    """Release C's attempt, then move the client's clock on in small steps (C's retry waits
    out its backoff on it) until every record is resolved, within every delivery timeout;
    return the offsets records 0, 2, 3 and 4 were acknowledged at."""
    advanced_from = clock.now_s
    release_c.set()
    deadline = time.monotonic() + TIMEOUT_S
    while not all(future.done() for future in futures) and time.monotonic() < deadline:
        if clock.now_s < advanced_from + DELIVERY_TIMEOUT_S / 2:
            clock.now_s += 0.1
        time.sleep(0.05)
    client.flush(timeout_ms=int(TIMEOUT_S * 1000))
    first, _, c, d, e = futures
    return [future.result(TIMEOUT_S).offset for future in (first, c, d, e)]


def test_a_batch_sent_before_a_failure_is_written_before_one_sent_after(
    cluster: FakeCluster, client: Producer, clock: ManualClock
) -> None:
    futures, release_c = fail_b_while_c_is_in_flight(cluster, client, clock, b_written=True)
    offsets = finish(client, clock, release_c, futures)
    assert offsets == sorted(offsets), f"records 0, 2, 3, 4 acknowledged at {offsets}"
    # B's outcome was unknown to the client; here it was written, before everything after it.
    assert stored_values(cluster) == [value(i) for i in range(5)]


def test_a_batch_behind_an_unwritten_failure_is_renumbered_not_failed(
    cluster: FakeCluster, client: Producer, clock: ManualClock
) -> None:
    # B was never written, so C's old sequence numbers leave a gap the leader refuses
    # (OUT_OF_ORDER_SEQUENCE). C was then certainly not written: as Kafka's producer after an
    # expired batch (KIP-360), the client renumbers it under its next epoch instead of
    # failing it, and D follows it.
    futures, release_c = fail_b_while_c_is_in_flight(cluster, client, clock, b_written=False)
    assert finish(client, clock, release_c, futures) == [0, 1, 2, 3]
    assert stored_values(cluster) == [value(i) for i in (0, 2, 3, 4)]


def test_a_late_attempt_of_an_old_epoch_is_fenced_once_the_new_epoch_wrote(
    cluster: FakeCluster, clock: ManualClock
) -> None:
    # B's only attempt is delayed at the leader past the client's deadline, so B fails for
    # good; D and E are written after it. When B's attempt finally arrives it must not be
    # written behind them: the producer kept its id and bumped its epoch (KIP-360), and the
    # leader refuses an epoch older than one it has written.
    cluster.state.create_topic("events", 1)
    with Producer(
        cluster.bootstrap,
        linger_ms=0,
        batch_bytes_max=1024,
        request_timeout_ms=500,
        delivery_timeout_ms=1_000,
        clock=clock,
    ) as client:
        try:
            send(client, 0).result(TIMEOUT_S)
            release_b = hold_next_request(cluster)
            b = send(client, 1)
            assert wait_for_produce_requests(cluster, 2, TIMEOUT_S)
            clock.now_s += 2.0  # past B's delivery timeout once its deadline passes
            with pytest.raises(Exception, match=r"DEADLINE_EXCEEDED|timed out"):
                b.result(TIMEOUT_S)
            later = [send(client, 3), send(client, 4)]
            assert [future.result(TIMEOUT_S).offset for future in later] == [1, 2]
            with cluster.state.condition:
                answers = cluster.state.produce_answers
            release_b.set()  # B's attempt reaches the leader now
            with cluster.state.condition:
                assert cluster.state.condition.wait_for(
                    lambda: cluster.state.produce_answers > answers, TIMEOUT_S
                )
        finally:
            cluster.release_produce_holds()
    assert stored_values(cluster) == [value(0), value(3), value(4)]
    producers = cluster.state.partition("events", 0).producers
    assert [batch[4] for batch in next(iter(producers.values()))] == [0, 1, 1]


def test_a_partitions_first_batch_goes_alone_so_no_batch_overtakes_it(
    cluster: FakeCluster, client: Producer
) -> None:
    # A leader accepts any sequence from a producer it does not know (Kafka's rule, for a
    # producer whose state was deleted), and gRPC may hand two concurrent calls to the leader
    # in either order. A second batch sent while the partition's first is unanswered could
    # so be written first, and the first then refused out of order (make test, loaded:
    # "producer 0 sent sequence 0, expected 3000"). Here the leader holds the first request,
    # and takes a second one, if the client sends it meanwhile, before it.
    release_first = hold_next_request(cluster)
    release_second = hold_next_request(cluster)
    futures = [send(client, i) for i in range(3)]  # record 2 closes record 1's batch
    if wait_for_produce_requests(cluster, 2, timeout_s=2.0):
        release_second.set()  # the second batch overtakes the first
        with cluster.state.condition:
            assert cluster.state.condition.wait_for(
                lambda: cluster.state.produce_answers >= 1, TIMEOUT_S
            )
    release_first.set()
    release_second.set()
    assert [future.result(TIMEOUT_S).offset for future in futures] == [0, 1, 2]
    assert stored_values(cluster) == [value(i) for i in range(3)]
