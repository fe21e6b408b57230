"""Kafka transactions end to end with confluent-kafka (librdkafka): commit and abort across three
partitions of two topics seen by read_committed and read_uncommitted consumers, zombie fencing
of an older instance of a transactional id, and send_offsets_to_transaction in a
consume-transform-produce loop. One cluster for the module."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kio.schema.describe_producers.v0 import request as dp
from kio.schema.errors import ErrorCode
from kio.schema.list_offsets.v6 import request as lo
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i8, i32, i64

from raftlog.client import Consumer
from raftlog.cluster_cli import wait_for_controller
from raftlog.local_cluster import LocalCluster
from tests.kafka.kafka_wire import create_topic, kafka_call

kafka = pytest.importorskip("confluent_kafka")

TOPICS = {"txn-a": 2, "txn-b": 1}  # three partitions over two topics


@pytest.fixture(scope="module")
def txn_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster.create(tmp_path_factory.mktemp("txn"), node_count=3)
    cluster.start()
    try:
        wait_for_controller(cluster.bootstrap, timeout_s=60)
        for name, partitions in TOPICS.items():
            create_topic(cluster, name, partitions=partitions)
        create_topic(cluster, "txn-in", partitions=1)
        create_topic(cluster, "txn-out", partitions=1)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def boot(txn_cluster: LocalCluster) -> str:
    return txn_cluster.kafka_bootstrap


def _producer(boot: str, transactional_id: str) -> object:
    producer = kafka.Producer(
        {
            "bootstrap.servers": boot,
            "transactional.id": transactional_id,
            "transaction.timeout.ms": 30_000,
        }
    )
    producer.init_transactions(30)
    return producer


def _send_everywhere(producer: object, tag: str) -> None:
    for name, partitions in TOPICS.items():
        for partition in range(partitions):
            value = f"{tag}-{name}-{partition}".encode()
            producer.produce(name, value=value, partition=partition)  # type: ignore[attr-defined]


def _read(boot: str, isolation: str, topics: dict[str, int], count_min: int) -> list[str]:
    """Every value in `topics` from the start, reading until `count_min` values were seen and
    then one more second (so anything that should not be there has time to show up)."""
    consumer = kafka.Consumer(
        {
            "bootstrap.servers": boot,
            "group.id": f"reader-{isolation}-{time.monotonic_ns()}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
        }
    )
    consumer.assign(
        [
            kafka.TopicPartition(name, p, kafka.OFFSET_BEGINNING)
            for name, partitions in topics.items()
            for p in range(partitions)
        ]
    )
    values: list[str] = []
    settle_until = None
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            if settle_until is None and len(values) >= count_min:
                settle_until = time.monotonic() + 1.0
            if settle_until is not None and time.monotonic() > settle_until:
                break
            message = consumer.poll(0.2)
            if message is None or message.error() is not None:
                continue
            values.append(message.value().decode())
    finally:
        consumer.close()
    return sorted(values)


def test_commit_and_abort_across_partitions(boot: str) -> None:
    producer = _producer(boot, "txn-commit-abort")
    producer.begin_transaction()  # type: ignore[attr-defined]
    _send_everywhere(producer, "committed")
    producer.commit_transaction(30)  # type: ignore[attr-defined]
    producer.begin_transaction()  # type: ignore[attr-defined]
    _send_everywhere(producer, "aborted")
    producer.flush(30)  # type: ignore[attr-defined]
    producer.abort_transaction(30)  # type: ignore[attr-defined]
    committed = sorted(
        f"committed-{n}-{p}" for n, partitions in TOPICS.items() for p in range(partitions)
    )
    aborted = [v.replace("committed", "aborted") for v in committed]
    assert _read(boot, "read_committed", TOPICS, 3) == committed
    assert _read(boot, "read_uncommitted", TOPICS, 6) == sorted(committed + aborted)


def test_an_older_instance_is_fenced_and_its_writes_never_visible(boot: str) -> None:
    topics = {"txn-b": 1}
    older = _producer(boot, "txn-zombie")
    older.begin_transaction()  # type: ignore[attr-defined]
    older.produce("txn-b", value=b"zombie-1", partition=0)  # type: ignore[attr-defined]
    older.flush(30)  # type: ignore[attr-defined]
    newer = _producer(boot, "txn-zombie")  # aborts the older one's transaction
    older.produce("txn-b", value=b"zombie-2", partition=0)  # type: ignore[attr-defined]
    with pytest.raises(kafka.KafkaException) as raised:
        # The partition refuses the late batch (its epoch is older than the abort marker's,
        # INVALID_PRODUCER_EPOCH), which librdkafka raises as fatal _FENCED from flush
        # already; otherwise the commit fails.
        older.flush(10)  # type: ignore[attr-defined]
        older.commit_transaction(10)  # type: ignore[attr-defined]
    assert raised.value.args[0].fatal() or raised.value.args[0].txn_requires_abort()
    newer.begin_transaction()  # type: ignore[attr-defined]
    newer.produce("txn-b", value=b"newer", partition=0)  # type: ignore[attr-defined]
    newer.commit_transaction(30)  # type: ignore[attr-defined]
    seen = _read(boot, "read_committed", topics, 1)
    assert "newer" in seen
    assert not [v for v in seen if v.startswith("zombie")], seen


def test_consume_transform_produce_commits_offsets_with_the_output(boot: str) -> None:
    feeder = kafka.Producer({"bootstrap.servers": boot, "acks": "all"})
    for i in range(10):
        feeder.produce("txn-in", value=f"in-{i}".encode(), partition=0)
    assert feeder.flush(30) == 0
    group = "txn-transformer"
    consumer = kafka.Consumer(
        {
            "bootstrap.servers": boot,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign([kafka.TopicPartition("txn-in", 0, kafka.OFFSET_BEGINNING)])
    producer = _producer(boot, "txn-transformer")
    taken: list[object] = []
    deadline = time.monotonic() + 30
    while len(taken) < 10 and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            taken.append(message)
    assert len(taken) == 10
    for aborting, batch in ((True, taken[:5]), (False, taken[:5]), (False, taken[5:])):
        producer.begin_transaction()  # type: ignore[attr-defined]
        for message in batch:
            value = message.value().decode().replace("in", "out")  # type: ignore[attr-defined]
            producer.produce("txn-out", value=value.encode(), partition=0)  # type: ignore[attr-defined]
        last = batch[-1].offset()  # type: ignore[attr-defined]
        offsets = [kafka.TopicPartition("txn-in", 0, last + 1)]
        producer.send_offsets_to_transaction(  # type: ignore[attr-defined]
            offsets, consumer.consumer_group_metadata(), 30
        )
        if aborting:
            producer.abort_transaction(30)  # type: ignore[attr-defined]
            committed = consumer.committed([kafka.TopicPartition("txn-in", 0)], 10)
            assert committed[0].offset < 0  # nothing committed by the aborted transaction
        else:
            producer.commit_transaction(30)  # type: ignore[attr-defined]
    consumer.close()
    assert _read(boot, "read_committed", {"txn-out": 1}, 10) == sorted(
        f"out-{i}" for i in range(10)
    )
    checker = kafka.Consumer({"bootstrap.servers": boot, "group.id": group})
    committed = checker.committed([kafka.TopicPartition("txn-in", 0)], 10)
    checker.close()
    assert committed[0].offset == 10


def _leader_answer(boot: str, request: object, pick: Callable[[Any], Any]) -> Any:
    """The one node whose answer for txn-b's partition is not NOT_LEADER_OR_FOLLOWER."""
    answers = [pick(kafka_call(address, request)) for address in boot.split(",")]
    led = [a for a in answers if a.error_code != ErrorCode.not_leader_or_follower]
    assert len(led) == 1, answers
    return led[0]


def _lso_and_open_start(boot: str, producer_id: int) -> tuple[int, int, int]:
    """(read_committed LATEST, read_uncommitted LATEST, the producer's
    current_txn_start_offset) of txn-b/0, from its leader."""
    offsets = []
    for isolation in (1, 0):
        request = lo.ListOffsetsRequest(
            replica_id=BrokerId(-1),
            isolation_level=i8(isolation),
            topics=(
                lo.ListOffsetsTopic(
                    name=TopicName("txn-b"),
                    partitions=(
                        lo.ListOffsetsPartition(
                            partition_index=i32(0),
                            current_leader_epoch=i32(-1),
                            timestamp=i64(-1),
                        ),
                    ),
                ),
            ),
        )
        answer = _leader_answer(boot, request, lambda r: r.topics[0].partitions[0])
        assert answer.error_code == ErrorCode.none
        offsets.append(int(answer.offset))
    request = dp.DescribeProducersRequest(
        topics=(dp.TopicRequest(name=TopicName("txn-b"), partition_indexes=(i32(0),)),)
    )
    answer = _leader_answer(boot, request, lambda r: r.topics[0].partitions[0])
    assert answer.error_code == ErrorCode.none
    starts = [
        int(p.current_txn_start_offset)
        for p in answer.active_producers
        if int(p.producer_id) == producer_id
    ]
    return offsets[0], offsets[1], starts[0] if starts else -1


def test_an_open_transaction_holds_the_lso_and_describe_producers_shows_it(boot: str) -> None:
    producer = _producer(boot, "txn-lso")
    plain = kafka.Producer({"bootstrap.servers": boot, "acks": "all"})
    producer.begin_transaction()  # type: ignore[attr-defined]
    producer.produce("txn-b", value=b"open", partition=0)  # type: ignore[attr-defined]
    producer.flush(30)  # type: ignore[attr-defined]
    plain.produce("txn-b", value=b"plain", partition=0)
    assert plain.flush(30) == 0
    # The transactional producer is the one with an open transaction on txn-b/0.
    request = dp.DescribeProducersRequest(
        topics=(dp.TopicRequest(name=TopicName("txn-b"), partition_indexes=(i32(0),)),)
    )
    answer = _leader_answer(boot, request, lambda r: r.topics[0].partitions[0])
    (open_producer,) = [
        int(p.producer_id) for p in answer.active_producers if p.current_txn_start_offset >= 0
    ]
    lso, high_watermark, start = _lso_and_open_start(boot, open_producer)
    assert lso == start < high_watermark  # the plain record after it is not stable yet
    producer.commit_transaction(30)  # type: ignore[attr-defined]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        lso, high_watermark, start = _lso_and_open_start(boot, open_producer)
        if start == -1 and lso == high_watermark:
            break
        time.sleep(0.05)
    assert start == -1 and lso == high_watermark  # the marker ended it
    assert "plain" in _read(boot, "read_committed", {"txn-b": 1}, 1)


def test_raftlog_s_consumer_reads_committed_over_grpc(txn_cluster: LocalCluster) -> None:
    """raftlog's own Consumer, on the gRPC fetch path, with isolation_level: read_committed
    skips aborted records and markers, read_uncommitted sees the aborted records too."""
    producer = _producer(txn_cluster.kafka_bootstrap, "txn-grpc-reader")
    producer.begin_transaction()  # type: ignore[attr-defined]
    producer.produce("txn-a", value=b"grpc-committed", partition=1)  # type: ignore[attr-defined]
    producer.commit_transaction(30)  # type: ignore[attr-defined]
    producer.begin_transaction()  # type: ignore[attr-defined]
    producer.produce("txn-a", value=b"grpc-aborted", partition=1)  # type: ignore[attr-defined]
    producer.flush(30)  # type: ignore[attr-defined]
    producer.abort_transaction(30)  # type: ignore[attr-defined]
    seen = {}
    for isolation in ("read_committed", "read_uncommitted"):
        with Consumer(
            txn_cluster.bootstrap,
            auto_offset_reset="earliest",
            isolation_level=isolation,  # type: ignore[arg-type]
            consumer_timeout_ms=1500,
        ) as consumer:
            consumer.assign([("txn-a", 1)])
            seen[isolation] = {
                r.value for r in consumer if r.value is not None and b"grpc" in r.value
            }
    assert seen["read_committed"] == {b"grpc-committed"}
    assert seen["read_uncommitted"] == {b"grpc-committed", b"grpc-aborted"}
