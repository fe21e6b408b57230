"""confluent-kafka (librdkafka) against raftlog's Kafka listener, partitions assigned by hand."""

from __future__ import annotations

import time

import pytest
from kio.schema.errors import ErrorCode

from raftlog.client import Admin
from raftlog.local_cluster import LocalCluster
from raftlog.storage.records import RecordInput, encode_batch
from tests.kafka.kafka_wire import (
    create_topic,
    kafka_call,
    produce_request,
    wait_for_preferred_leaders,
)

kafka = pytest.importorskip("confluent_kafka")
admin_module = pytest.importorskip("confluent_kafka.admin")

COUNT = 200


def _produce(
    boot: str,
    topic: str,
    *,
    partitions: int,
    timestamp_ms: int = 1_700_000_000_000,
    **config: object,
) -> list[tuple[int, int]]:
    producer = kafka.Producer({"bootstrap.servers": boot, "acks": "all", **config})
    delivered: list[tuple[int, int]] = []
    failed: list[str] = []

    def on_delivery(error: object, message: object) -> None:
        if error is not None:
            failed.append(str(error))
        else:
            delivered.append((message.partition(), message.offset()))  # type: ignore[attr-defined]

    for i in range(COUNT):
        producer.produce(
            topic,
            key=b"key-%d" % i,
            value=b"value-%d" % i,
            partition=i % partitions,
            headers=[("n", str(i).encode())],
            timestamp=timestamp_ms + i,
            on_delivery=on_delivery,
        )
    assert producer.flush(30) == 0
    assert not failed, failed
    return delivered


def _consume_all(boot: str, topic: str, partitions: int, count: int) -> list[object]:
    consumer = kafka.Consumer(
        {"bootstrap.servers": boot, "group.id": "unused", "enable.auto.commit": False}
    )
    consumer.assign(
        [kafka.TopicPartition(topic, p, kafka.OFFSET_BEGINNING) for p in range(partitions)]
    )
    messages: list[object] = []
    deadline = time.monotonic() + 30
    try:
        while len(messages) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None:
                assert message.error() is None, message.error()
                messages.append(message)
    finally:
        consumer.close()
    return messages


def test_acks_all_records_read_back_with_offsets_keys_headers_timestamps(
    kafka_cluster: LocalCluster,
) -> None:
    create_topic(kafka_cluster, "cf-data", partitions=2)
    boot = kafka_cluster.kafka_bootstrap
    delivered = _produce(boot, "cf-data", partitions=2)
    assert len(set(delivered)) == COUNT
    messages = _consume_all(boot, "cf-data", 2, COUNT)
    assert sorted((m.partition(), m.offset()) for m in messages) == sorted(delivered)  # type: ignore[attr-defined]
    for m in messages:
        i = int(m.headers()[0][1])  # type: ignore[attr-defined]
        assert (m.key(), m.value()) == (b"key-%d" % i, b"value-%d" % i)  # type: ignore[attr-defined]
        assert m.timestamp() == (kafka.TIMESTAMP_CREATE_TIME, 1_700_000_000_000 + i)  # type: ignore[attr-defined]


def test_list_offsets_earliest_latest_and_by_timestamp(kafka_cluster: LocalCluster) -> None:
    """Earliest, latest, and a timestamp resolved to the first record at or after it."""
    create_topic(kafka_cluster, "cf-offsets", partitions=1)
    boot = kafka_cluster.kafka_bootstrap
    now_ms = int(time.time() * 1000)
    first = _produce(boot, "cf-offsets", partitions=1, timestamp_ms=now_ms + 60_000)
    second = _produce(boot, "cf-offsets", partitions=1, timestamp_ms=now_ms + 120_000)
    consumer = kafka.Consumer({"bootstrap.servers": boot, "group.id": "unused"})
    try:
        partition = kafka.TopicPartition("cf-offsets", 0)
        low, high = consumer.get_watermark_offsets(partition, timeout=10)
        assert high == max(offset for _, offset in second) + 1
        assert 0 <= low <= min(offset for _, offset in first)
        wanted = kafka.TopicPartition("cf-offsets", 0, now_ms + 120_000)
        (found,) = consumer.offsets_for_times([wanted], timeout=10)
        assert found.error is None and found.offset == min(offset for _, offset in second)
        later = kafka.TopicPartition("cf-offsets", 0, now_ms + 3_600_000)
        (none,) = consumer.offsets_for_times([later], timeout=10)
        assert none.offset == -1  # no record that late: Kafka's "no such offset"
    finally:
        consumer.close()


def test_list_offsets_by_timestamp_finds_the_record_inside_a_batch(
    kafka_cluster: LocalCluster,
) -> None:
    """A timestamp resolves to the first record at or after it, inside one batch too (as
    Kafka's log answers; librdkafka's 0054_offset_time): 200 records lingered into one batch
    with timestamps T, T+1, ..."""
    create_topic(kafka_cluster, "cf-offsets-in-batch", partitions=1)
    boot = kafka_cluster.kafka_bootstrap
    base = int(time.time() * 1000)
    delivered = _produce(
        boot, "cf-offsets-in-batch", partitions=1, timestamp_ms=base, **{"linger.ms": 1000}
    )
    assert sorted(offset for _, offset in delivered) == list(range(COUNT))
    consumer = kafka.Consumer({"bootstrap.servers": boot, "group.id": "unused"})
    try:
        found = []
        for asked in [base, base + 1, base + 150, base + COUNT - 1, base + COUNT]:
            # One query per timestamp: librdkafka keeps one entry per partition in a query.
            wanted = kafka.TopicPartition("cf-offsets-in-batch", 0, asked)
            (answer,) = consumer.offsets_for_times([wanted], timeout=10)
            assert answer.error is None, answer.error
            found.append(answer.offset)
        assert found == [0, 1, 150, COUNT - 1, -1]
    finally:
        consumer.close()


def test_acks_zero_gets_no_response_and_is_still_written(kafka_cluster: LocalCluster) -> None:
    create_topic(kafka_cluster, "cf-acks0", partitions=1)
    boot = kafka_cluster.kafka_bootstrap
    delivered = _produce(boot, "cf-acks0", partitions=1, acks="0")
    assert len(delivered) == COUNT  # librdkafka reports acks=0 deliveries at once
    assert len(_consume_all(boot, "cf-acks0", 1, COUNT)) == COUNT


def test_long_poll_returns_when_a_record_arrives(kafka_cluster: LocalCluster) -> None:
    create_topic(kafka_cluster, "cf-poll", partitions=1)
    boot = kafka_cluster.kafka_bootstrap
    consumer = kafka.Consumer(
        {
            "bootstrap.servers": boot,
            "group.id": "unused",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 5000,
        }
    )
    consumer.assign([kafka.TopicPartition("cf-poll", 0, kafka.OFFSET_END)])
    try:
        assert consumer.poll(1.0) is None  # nothing committed yet: the fetch waits
        producer = kafka.Producer({"bootstrap.servers": boot, "acks": "all"})
        producer.produce("cf-poll", value=b"late", partition=0)
        assert producer.flush(30) == 0
        message = None
        deadline = time.monotonic() + 20
        while message is None and time.monotonic() < deadline:
            message = consumer.poll(0.5)
        assert message is not None and message.value() == b"late"
    finally:
        consumer.close()


def _create(cluster: LocalCluster, name: str, config: dict[str, str]) -> None:
    """Create `name` through Kafka's CreateTopics and wait for its preferred leader: the tests
    send with retries off, so a leader change just after creation would fail their batch."""
    client = admin_module.AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    topic = admin_module.NewTopic(name, num_partitions=1, replication_factor=3, config=config)
    client.create_topics([topic], operation_timeout=30)[name].result(timeout=40)  # type: ignore[attr-defined]
    with Admin(cluster.bootstrap) as admin:
        wait_for_preferred_leaders(admin, name)


def _send_one_batch(
    boot: str, topic: str, records: list[tuple[bytes | None, bytes]]
) -> list[object]:
    """Produce `records` to partition 0 as one batch; each record's delivery error (or None)."""
    producer = kafka.Producer(
        {"bootstrap.servers": boot, "linger.ms": 1000, "batch.size": 1_000_000,
         "message.send.max.retries": 0}
    )  # fmt: skip
    outcomes: dict[int, object] = {}
    for index, (key, value) in enumerate(records):
        producer.produce(
            topic, key=key, value=value, partition=0,
            on_delivery=lambda e, m, i=index: outcomes.update({i: e}),
        )  # fmt: skip
    assert producer.flush(30) == 0
    return [outcomes[i] for i in range(len(records))]


def test_keyless_records_on_a_compacted_topic_are_named_in_record_errors(
    kafka_cluster: LocalCluster,
) -> None:
    """A batch holding records without a key on a compacted topic is refused INVALID_RECORD with
    record_errors naming each keyless record (KIP-467), so librdkafka fails those with their own
    message and the others of the batch as _INVALID_DIFFERENT_RECORD (librdkafka's 0011)."""
    boot = kafka_cluster.kafka_bootstrap
    _create(kafka_cluster, "cf-compact", {"cleanup.policy": "compact"})
    errors = _send_one_batch(
        boot, "cf-compact", [(b"k0", b"v0"), (None, b"v1"), (b"k2", b"v2"), (None, b"v3")]
    )
    codes = [None if e is None else e.code() for e in errors]  # type: ignore[attr-defined]
    invalid, other = kafka.KafkaError.INVALID_RECORD, kafka.KafkaError._INVALID_DIFFERENT_RECORD
    assert codes == [other, invalid, other, invalid], errors

    # librdkafka does not hand out the messages: read them off the wire.
    with Admin(kafka_cluster.bootstrap) as admin:
        (partition,) = admin.describe_topic("cf-compact").partitions
    assert partition.leader is not None
    leader = f"127.0.0.1:{kafka_cluster.nodes[partition.leader].kafka_port}"
    batch = encode_batch([RecordInput(key, b"v", 0) for key in (b"k", None, None)])
    answer = kafka_call(leader, produce_request("cf-compact", batch))
    (refused,) = answer.responses[0].partition_responses
    assert refused.error_code == ErrorCode.invalid_record
    assert [e.batch_index for e in refused.record_errors] == [1, 2]
    assert "record 1 has no key" in refused.record_errors[0].batch_index_error_message
    assert refused.error_message.startswith("2 records of the batch refused")
    answer = kafka_call(leader, produce_request("cf-compact", batch, version=7))  # no such field
    assert answer.responses[0].partition_responses[0].error_code == ErrorCode.invalid_record


def test_max_message_bytes_and_segment_bytes_bound_a_batch_as_kafka_does(
    kafka_cluster: LocalCluster,
) -> None:
    """max.message.bytes may exceed segment.bytes (Kafka checks neither against the other); a
    batch above max.message.bytes gets MESSAGE_TOO_LARGE and one above segment.bytes
    RECORD_LIST_TOO_LARGE (Kafka's UnifiedLog.append), while batches that fit roll segments
    and are all read back."""
    boot = kafka_cluster.kafka_bootstrap
    big = [(b"k%d" % i, bytes(2048)) for i in range(90)]  # one batch of about 185 KB
    segments = {"segment.bytes": "65536", "max.message.bytes": "1048576"}
    _create(kafka_cluster, "cf-segments", segments)
    (error, *_) = _send_one_batch(boot, "cf-segments", big)
    assert error is not None and error.code() == kafka.KafkaError.RECORD_LIST_TOO_LARGE, error  # type: ignore[attr-defined]
    _create(kafka_cluster, "cf-messages", {"max.message.bytes": "65536"})
    (error, *_) = _send_one_batch(boot, "cf-messages", big)
    assert error is not None and error.code() == kafka.KafkaError.MSG_SIZE_TOO_LARGE, error  # type: ignore[attr-defined]

    for _ in range(6):  # batches of 40 KiB: a segment of 64 KiB holds one of them
        assert _send_one_batch(boot, "cf-segments", big[:20]) == [None] * 20
    assert len(_consume_all(boot, "cf-segments", 1, 120)) == 120
