"""The Producer against the fake cluster: acks, compression, keys, retries, idempotence, bounds."""

from __future__ import annotations

import gc
import random
import re
import threading
import time
import warnings
from concurrent.futures import Future

import pytest
from client_fake_cluster import FakeCluster, ManualClock

from raftlog.client import Consumer, Producer, RecordMetadata
from raftlog.client._sender import serialized_produce_request
from raftlog.client.accumulator import RecordFuture
from raftlog.client.errors import (
    BufferFullError,
    ClientClosedError,
    ClientError,
    ConnectionFailedError,
    DeliveryFailedError,
    NotLeaderForPartitionError,
    RecordTooLargeError,
    ServerError,
    UnknownTopicOrPartitionError,
)
from raftlog.errors import ConfigError
from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.storage.batch import Compression, parse_header
from raftlog.storage.records import RecordInput, decode_batch, encode_batch

with warnings.catch_warnings():
    # kafka/__init__ calls the deprecated importlib.resources.read_text at import time.
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.partitioner.default import murmur2 as kafka_murmur2

TIMEOUT_S = 10


def read_all(cluster: FakeCluster, topic: str, partition: int) -> list[tuple[int, bytes | None]]:
    """(offset, value) of every user record in a partition, read with our Consumer."""
    consumer = Consumer(cluster.bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=0)
    try:
        consumer.assign([(topic, partition)])
        records = []
        end = cluster.state.partition(topic, partition).high_watermark
        while consumer.position((topic, partition)) < end:
            records.extend(consumer.poll(timeout_ms=0))
        return [(record.offset, record.value) for record in records]
    finally:
        consumer.close()


@pytest.mark.parametrize(("acks", "idempotence"), [("all", True), (1, False), (0, False)])
def test_round_trip_with_each_acks(
    cluster: FakeCluster, acks: str | int, idempotence: bool
) -> None:
    cluster.state.create_topic("events", 1)
    with Producer(cluster.bootstrap, acks=acks, enable_idempotence=idempotence) as producer:  # type: ignore[arg-type]
        futures = [producer.send("events", value=b"v%d" % i) for i in range(50)]
        producer.flush()
    metadata = [future.result(TIMEOUT_S) for future in futures]
    if acks == 0:
        assert {meta.offset for meta in metadata} == {-1}  # nobody waited for an offset
    else:
        # A fresh partition's first record is at offset 0: records follow in send order.
        assert [meta.offset for meta in metadata] == list(range(50))
    assert read_all(cluster, "events", 0) == [(i, b"v%d" % i) for i in range(50)]


@pytest.mark.parametrize(
    ("codec", "expected"), [("lz4", Compression.LZ4), ("zstd", Compression.ZSTD)]
)
def test_compressed_batches_round_trip(
    cluster: FakeCluster, codec: str, expected: Compression
) -> None:
    cluster.state.create_topic("events", 1)
    values = [bytes([i % 7]) * 300 for i in range(40)]
    with Producer(cluster.bootstrap, compression=codec, linger_ms=60_000) as producer:  # type: ignore[arg-type]
        for value in values:
            producer.send("events", value=value, headers=[("h", b"x")])
    stored = cluster.state.stored_batches("events", 0)
    assert stored and all(parse_header(batch).compression is expected for batch in stored)
    assert sum(len(batch) for batch in stored) < sum(map(len, values)) // 4
    assert [value for _, value in read_all(cluster, "events", 0)] == values


def test_keys_hash_to_partitions_like_kafka(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 6, replication_factor=2)
    keys = [b"user-%d" % i for i in range(40)]
    with Producer(cluster.bootstrap) as producer:
        futures = [producer.send("events", value=b"x", key=key) for key in keys]
        producer.flush()
        for key, future in zip(keys, futures, strict=True):
            assert future.result(TIMEOUT_S).partition == (kafka_murmur2(key) & 0x7FFFFFFF) % 6


def test_keyless_records_stick_to_one_partition_per_batch(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 4, replication_factor=2)
    with Producer(cluster.bootstrap, linger_ms=60_000, rng=random.Random(3)) as producer:
        futures = [producer.send("events", value=b"x") for _ in range(30)]
        producer.flush()
    assert len({future.result(TIMEOUT_S).partition for future in futures}) == 1


def test_sticky_partitioner_moves_on_when_a_batch_fills(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 4, replication_factor=2)
    with Producer(
        cluster.bootstrap, linger_ms=60_000, batch_bytes_max=1024, rng=random.Random(5)
    ) as producer:
        futures = [producer.send("events", value=b"v" * 200) for _ in range(12)]
        producer.flush()
    partitions = [future.result(TIMEOUT_S).partition for future in futures]
    assert len(set(partitions)) > 1
    # Each run of one partition is a whole batch: at most 4 records of ~221 bytes in 1 KiB.
    runs = [partitions[i] != partitions[i - 1] for i in range(1, len(partitions))]
    assert sum(runs) >= 2


def test_not_leader_hint_is_followed_and_remembered(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 1)
    partition = cluster.state.partition("events", 0)
    partition.leader_id = 2
    partition.advertised_leader = 1  # metadata still names the old leader
    with Producer(cluster.bootstrap, retry_backoff_ms=0) as producer:
        first = producer.send("events", value=b"a").result(TIMEOUT_S)
        second = producer.send("events", value=b"b").result(TIMEOUT_S)
    assert (first.offset, second.offset) == (0, 1)
    # One NOT_LEADER from node 1, then straight to node 2 thanks to the hint.
    assert cluster.state.requests[(1, "Produce")] == 1
    assert cluster.state.requests[(2, "Produce")] == 2


def test_not_leader_without_hint_refreshes_metadata(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 1)
    cluster.state.hint_leader = False
    partition = cluster.state.partition("events", 0)
    partition.leader_id = 2
    partition.advertised_leader = 1
    with Producer(cluster.bootstrap, retry_backoff_ms=0) as producer:
        future = producer.send("events", value=b"a")
        # Once the first refusal is in, the metadata quorum "learns" the new leader.
        with cluster.state.condition:
            cluster.state.condition.wait_for(
                lambda: cluster.state.requests[(1, "Produce")] > 0, TIMEOUT_S
            )
            partition.advertised_leader = None
        assert future.result(TIMEOUT_S).offset == 0
    assert cluster.state.requests[(2, "Produce")] == 1


def test_first_requests_refused_with_not_leader_then_delivered(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 1)
    cluster.state.fail_next["Produce"] = [pb.NOT_LEADER] * 3
    with Producer(cluster.bootstrap, retry_backoff_ms=0) as producer:
        assert producer.send("events", value=b"a").result(TIMEOUT_S).offset == 0
    assert cluster.state.requests[(1, "Produce")] == 4


def test_idempotent_retry_after_a_lost_response_writes_once(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 1)
    cluster.state.drop_next_produce_responses = 1
    with Producer(cluster.bootstrap, retry_backoff_ms=0, linger_ms=60_000) as producer:
        futures = [producer.send("events", value=b"v%d" % i) for i in range(3)]
        producer.flush()
        after = producer.send("events", value=b"after")
        producer.flush()
        later = after.result(TIMEOUT_S)
    # The retry was answered DUPLICATE_SEQUENCE with the first attempt's offsets.
    assert [future.result(TIMEOUT_S).offset for future in futures] == [0, 1, 2]
    assert later.offset == 3
    assert cluster.state.requests[(1, "Produce")] == 3
    assert read_all(cluster, "events", 0) == [(0, b"v0"), (1, b"v1"), (2, b"v2"), (3, b"after")]
    user_batches = [decode_batch(b) for b in cluster.state.stored_batches("events", 0)]
    assert [(b.header.base_sequence, b.header.record_count) for b in user_batches] == [
        (0, 3),
        (3, 1),
    ]


def test_retries_exhausted_fail_the_future_naming_the_partition(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 1)
    cluster.state.fail_next["Produce"] = [pb.NOT_ENOUGH_REPLICAS] * 5
    with Producer(cluster.bootstrap, retries=2, retry_backoff_ms=0) as producer:
        future = producer.send("events", value=b"a")
        with pytest.raises(DeliveryFailedError, match="events/0 failed after 3 attempt") as caught:
            future.result(TIMEOUT_S)
    assert isinstance(caught.value.__cause__, ServerError)
    assert caught.value.__cause__.code == "NOT_ENOUGH_REPLICAS"


def test_non_retriable_error_fails_at_once_and_later_records_still_go(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 1)
    cluster.state.fail_next["Produce"] = [pb.CORRUPT_BATCH]
    with Producer(cluster.bootstrap, retry_backoff_ms=0) as producer:
        with pytest.raises(DeliveryFailedError, match="CORRUPT_BATCH"):
            producer.send("events", value=b"bad").result(TIMEOUT_S)
        # The failed batch's sequence numbers are gone: the producer bumps its epoch
        # (KIP-360) and numbers from 0 again, under the same id.
        assert producer.send("events", value=b"good").result(TIMEOUT_S).offset == 0
    requests = cluster.state.requests
    assert requests[(1, "InitProducerId")] + requests[(2, "InitProducerId")] == 1
    [(_, batches)] = cluster.state.partition("events", 0).producers.items()
    assert [(batch[0], batch[4]) for batch in batches] == [(0, 1)]  # sequence 0, epoch 1


def test_a_producer_at_the_last_epoch_asks_for_a_new_id_instead_of_bumping(
    cluster: FakeCluster,
) -> None:
    cluster.state.create_topic("events", 1)
    cluster.state.producer_epoch = 2**15 - 1  # int16: no epoch follows it
    cluster.state.fail_next["Produce"] = [pb.CORRUPT_BATCH]
    with Producer(cluster.bootstrap, retry_backoff_ms=0) as producer:
        with pytest.raises(DeliveryFailedError, match="CORRUPT_BATCH"):
            producer.send("events", value=b"bad").result(TIMEOUT_S)
        assert producer.send("events", value=b"good").result(TIMEOUT_S).offset == 0
    requests = cluster.state.requests
    assert requests[(1, "InitProducerId")] + requests[(2, "InitProducerId")] == 2


def test_buffer_bound_blocks_send_then_frees_space(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 1)
    cluster.state.produce_gate.clear()  # the leader holds every produce answer
    producer = Producer(
        cluster.bootstrap, batch_bytes_max=2048, buffer_bytes_max=4096, max_block_ms=0, linger_ms=0
    )
    try:
        accepted = []
        with pytest.raises(BufferFullError, match="buffer_bytes_max=4096"):
            for _ in range(100):
                accepted.append(producer.send("events", value=b"x" * 500))
        assert 4 <= len(accepted) <= 8  # about 4096 / 521 bytes
        cluster.state.produce_gate.set()
        producer.flush(timeout_ms=TIMEOUT_S * 1000)
        assert all(future.result(0).offset >= 0 for future in accepted)
        producer.send("events", value=b"x" * 500).result(TIMEOUT_S)
    finally:
        producer.close()


def test_record_larger_than_a_batch_is_refused_at_send(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 1)
    with (
        Producer(cluster.bootstrap, batch_bytes_max=1024) as producer,
        pytest.raises(RecordTooLargeError, match="batch_bytes_max=1024"),
    ):
        producer.send("events", value=b"x" * 2000)


def test_unknown_topic_and_partition_are_refused_at_send(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 2)
    with Producer(cluster.bootstrap, max_block_ms=0) as producer:
        with pytest.raises(UnknownTopicOrPartitionError, match="'nope'"):
            producer.send("nope", value=b"a")
        with pytest.raises(Exception, match="partition 5 of topic 'events' does not exist"):
            producer.send("events", value=b"a", partition=5)


def test_unreachable_bootstrap_is_named(cluster: FakeCluster) -> None:
    dead = "127.0.0.1:1"
    with (
        Producer(dead, max_block_ms=0, request_timeout_ms=2000) as producer,
        pytest.raises(ConnectionFailedError, match=re.escape(dead)) as caught,
    ):
        producer.send("events", value=b"a")
    assert caught.value.retriable


def test_explicit_partition_headers_and_timestamp_are_kept(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 2)
    with Producer(cluster.bootstrap) as producer:
        meta = producer.send(
            "events",
            value=b"v",
            key=b"k",
            partition=1,
            headers=[("a", b"1"), ("b", None)],
            timestamp_ms=1234,
        ).result(TIMEOUT_S)
    assert meta == RecordMetadata("events", 1, 0, 1234)
    batch = decode_batch(cluster.state.stored_batches("events", 1)[0])
    record = batch.records[0]
    assert (record.key, record.value, record.headers, record.timestamp_ms) == (
        b"k",
        b"v",
        (("a", b"1"), ("b", None)),
        1234,
    )


def test_callbacks_may_send_again_without_deadlock(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 1)
    chained: list[Future[RecordMetadata]] = []
    done = threading.Event()
    with Producer(cluster.bootstrap, linger_ms=60_000) as producer:

        def on_done(_: Future[RecordMetadata]) -> None:
            assert threading.current_thread().name == "raftlog-producer-sender"
            chained.append(producer.send("events", value=b"second"))
            done.set()

        # Lingering: the callback is in place before delivery, so the sender thread runs it.
        producer.send("events", value=b"first").add_done_callback(on_done)
        producer.flush()
        assert done.wait(TIMEOUT_S)
        producer.flush()
        assert chained[0].result(TIMEOUT_S).offset == 1


def test_close_delivers_buffered_records_and_refuses_more(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 1)
    producer = Producer(cluster.bootstrap, linger_ms=60_000)
    futures = [producer.send("events", value=b"v") for _ in range(5)]
    producer.close()
    assert [future.result(0).offset for future in futures] == [0, 1, 2, 3, 4]
    with pytest.raises(ClientClosedError):
        producer.send("events", value=b"late")
    producer.close()  # idempotent


def test_close_with_timeout_fails_what_it_could_not_deliver(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 1)
    cluster.state.produce_gate.clear()
    producer = Producer(cluster.bootstrap, linger_ms=0)
    future = producer.send("events", value=b"stuck")
    producer.close(timeout_ms=50)
    with pytest.raises(DeliveryFailedError, match="closed before delivery"):
        future.result(0)
    cluster.state.produce_gate.set()


def test_options_are_validated_eagerly() -> None:
    with pytest.raises(ConfigError, match="acks"):
        Producer("127.0.0.1:9", acks="some")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="enable_idempotence"):
        Producer("127.0.0.1:9", acks=1)
    with pytest.raises(ConfigError, match="compression"):
        Producer("127.0.0.1:9", compression="brotli")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="batch_bytes_max"):
        Producer("127.0.0.1:9", batch_bytes_max=10 * 1024 * 1024, buffer_bytes_max=1024 * 1024)
    with pytest.raises(Exception, match="not host:port"):
        Producer("localhost")


def test_not_leader_error_carries_the_hint() -> None:
    from raftlog.client.errors import server_error

    error = server_error(
        pb.Error(code=pb.NOT_LEADER, message="moved", leader_id=3, leader_address="h:1"),
        concerning="events/0",
    )
    assert isinstance(error, NotLeaderForPartitionError)
    assert (error.retriable, error.leader_id, error.leader_address) == (True, 3, "h:1")
    assert "events/0" in str(error) and "node 3 at h:1" in str(error)


def test_queued_batch_expires_after_delivery_timeout(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 2)
    cluster.state.produce_gate.clear()  # the first batch stays in flight
    clock = ManualClock()
    # One batch in flight per partition, so the second one waits in the queue.
    with Producer(
        cluster.bootstrap, linger_ms=0, clock=clock, max_in_flight_per_partition=1
    ) as producer:
        first = producer.send("events", value=b"in flight", partition=0)
        with cluster.state.condition:
            cluster.state.condition.wait_for(
                lambda: cluster.state.requests[(1, "Produce")] == 1, TIMEOUT_S
            )
        queued = producer.send("events", value=b"queued", partition=0)  # behind the first
        clock.now_s += 121  # past delivery_timeout_ms=120000
        producer.send("events", value=b"wake", partition=1)  # a new batch wakes the sender
        with pytest.raises(DeliveryFailedError, match="delivery_timeout_ms=120000 expired"):
            queued.result(TIMEOUT_S)
        cluster.state.produce_gate.set()
        assert first.result(TIMEOUT_S).offset == 0  # an answer that arrives still counts


def test_expiry_behind_a_batch_in_flight_keeps_one_batch_in_flight(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 2)
    cluster.state.produce_gate.clear()
    clock = ManualClock()
    # One batch in flight per partition, so the second one waits in the queue.
    with Producer(
        cluster.bootstrap, linger_ms=0, clock=clock, max_in_flight_per_partition=1
    ) as producer:
        first = producer.send("events", value=b"in flight", partition=0)
        with cluster.state.condition:
            cluster.state.condition.wait_for(
                lambda: cluster.state.requests[(1, "Produce")] == 1, TIMEOUT_S
            )
        expired = producer.send("events", value=b"expires", partition=0)
        clock.now_s += 121
        producer.send("events", value=b"wake", partition=1)
        with pytest.raises(DeliveryFailedError):
            expired.result(TIMEOUT_S)
        later = producer.send("events", value=b"later", partition=0)
        producer.send("events", value=b"wake again", partition=1)
        # The partition is still muted by the first batch: "later" must not overtake it.
        assert cluster.state.requests[(1, "Produce")] == 1
        cluster.state.produce_gate.set()
        assert (first.result(TIMEOUT_S).offset, later.result(TIMEOUT_S).offset) == (0, 1)


def test_a_crash_of_the_sender_thread_fails_futures_instead_of_hanging(
    cluster: FakeCluster,
) -> None:
    cluster.state.create_topic("events", 1)
    armed = threading.Event()

    def failing_clock() -> float:
        # A clock port that breaks under the sender thread once armed: the crash a bug
        # in the sender would cause, brought in through the port rather than a patch.
        if armed.is_set() and threading.current_thread().name == "raftlog-producer-sender":
            raise RuntimeError("planted clock failure")
        return time.monotonic()

    producer = Producer(cluster.bootstrap, linger_ms=60_000, clock=failing_clock)
    future = producer.send("events", value=b"a")
    crashes: list[BaseException | None] = []
    threading.excepthook = lambda args: crashes.append(args.exc_value)
    try:
        armed.set()
        producer.flush()  # wakes the sender, which reads the clock and crashes
        with pytest.raises(DeliveryFailedError, match=r"sender thread crashed.*planted clock"):
            future.result(TIMEOUT_S)
        with pytest.raises(ClientClosedError):
            producer.send("events", value=b"b")
    finally:
        producer.close()
        threading.excepthook = threading.__excepthook__
    assert isinstance(crashes[0], RuntimeError)


def test_flush_from_a_delivery_callback_is_refused_not_deadlocked(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 1)
    raised: list[BaseException] = []
    done = threading.Event()
    with Producer(cluster.bootstrap, linger_ms=60_000) as producer:

        def on_done(_: Future[RecordMetadata]) -> None:
            try:
                producer.flush()
            except ClientError as error:
                raised.append(error)
            done.set()

        # Lingering: the record cannot be delivered before the callback is in place.
        producer.send("events", value=b"a").add_done_callback(on_done)
        producer.flush()
        assert done.wait(TIMEOUT_S)
    assert "would deadlock" in str(raised[0])


def test_send_blocks_on_a_full_buffer_until_space_frees(cluster: FakeCluster) -> None:
    cluster.state.create_topic("events", 1)
    cluster.state.produce_gate.clear()

    def open_gate_once_a_request_waits() -> None:
        with cluster.state.condition:
            cluster.state.condition.wait_for(
                lambda: cluster.state.requests[(1, "Produce")] > 0, TIMEOUT_S
            )
        cluster.state.produce_gate.set()

    opener = threading.Thread(target=open_gate_once_a_request_waits)
    with Producer(
        cluster.bootstrap,
        batch_bytes_max=2048,
        buffer_bytes_max=2048,
        max_block_ms=TIMEOUT_S * 1000,
        linger_ms=0,
    ) as producer:
        opener.start()
        # Far more than the buffer holds: each send past the first few waits for a delivery.
        futures = [producer.send("events", value=b"x" * 500) for _ in range(20)]
        producer.flush()
    opener.join()
    assert [future.result(0).offset for future in futures] == list(range(20))


@pytest.mark.parametrize("value_bytes", [0, 300, 200_000])
def test_a_produce_request_serialized_around_its_batch_reads_as_the_message(
    value_bytes: int,
) -> None:
    # The sender appends the batch to protobuf's serialization of the small fields (one copy
    # of the batch); the node must read exactly the message the stub would have sent.
    batch = encode_batch([RecordInput(None, b"v" * value_bytes, 5)])
    wire = serialized_produce_request("events", 3, batch, acks=pb.ACKS_ALL, timeout_ms=24_000)
    expected = pb.ProduceRequest(
        topic="events", partition=3, batches=[batch], acks=pb.ACKS_ALL, timeout_ms=24_000
    )
    assert pb.ProduceRequest.FromString(wire) == expected


def test_buffered_records_are_tuples_the_garbage_collector_stops_tracking(
    cluster: FakeCluster,
) -> None:
    # Every tracked object in the buffer is walked again by each collection; a producer of
    # small records buffers hundreds of thousands. Headers too are plain tuples (a nested
    # tuple is untracked one level per collection).
    cluster.state.create_topic("events", 1)
    with Producer(cluster.bootstrap, linger_ms=60_000) as producer:
        plain = producer.send("events", value=b"v", key=b"k")
        with_headers = producer.send("events", value=b"v", headers=[("h", b"x")])
        assert isinstance(plain, RecordFuture) and isinstance(with_headers, RecordFuture)
        gc.collect()
        assert plain._batch.records[0] == (b"k", b"v", plain._timestamp_ms, ())
        assert not gc.is_tracked(plain._batch.records[0])
        gc.collect()
        gc.collect()
        assert not gc.is_tracked(with_headers._batch.records[1])
