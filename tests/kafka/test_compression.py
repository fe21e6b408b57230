"""Compressed batches from librdkafka (gzip, lz4, zstd, snappy): stored as sent and read back;
snappy batches by every client (confluent-kafka, kafka-python, aiokafka, kcat, raftlog's own)."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from raftlog.client import Consumer, Producer
from raftlog.local_cluster import LocalCluster
from raftlog.storage.batch import Compression, parse_header
from tests.kafka.kafka_wire import create_topic, kcat_path

kafka = pytest.importorskip("confluent_kafka")

COUNT = 100


def _produce(boot: str, topic: str, codec: str) -> list[object]:
    producer = kafka.Producer(
        {
            "bootstrap.servers": boot,
            "acks": "all",
            "compression.codec": codec,
            "linger.ms": 5,
            "message.send.max.retries": 0,
        }
    )
    errors: list[object] = []

    def on_delivery(error: object, message: object) -> None:
        if error is not None:
            errors.append(error)

    for i in range(COUNT):
        producer.produce(
            topic, key=b"%d" % i, value=b"compressible " * 20, partition=0, on_delivery=on_delivery
        )
    assert producer.flush(30) == 0
    return errors


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd", "snappy"])
def test_compressed_batches_are_stored_and_read_back(
    kafka_cluster: LocalCluster, codec: str
) -> None:
    topic = f"zip-{codec}"
    create_topic(kafka_cluster, topic, partitions=1)
    boot = kafka_cluster.kafka_bootstrap
    assert _produce(boot, topic, codec) == []
    consumer = kafka.Consumer(
        {"bootstrap.servers": boot, "group.id": "x", "enable.auto.commit": False}
    )
    consumer.assign([kafka.TopicPartition(topic, 0, kafka.OFFSET_BEGINNING)])
    keys: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        while len(keys) < COUNT and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None:
                assert message.error() is None and message.value() == b"compressible " * 20
                keys.append(message.key())
    finally:
        consumer.close()
    assert keys == [b"%d" % i for i in range(COUNT)]


VALUE = b"compressible " * 20
KEYS = [b"%d" % i for i in range(COUNT)]


def _kafka_python_keys(boot: str, topic: str) -> list[bytes]:
    kafka_python = pytest.importorskip("kafka")
    consumer = kafka_python.KafkaConsumer(
        bootstrap_servers=boot.split(","), auto_offset_reset="earliest", consumer_timeout_ms=5000
    )
    consumer.assign([kafka_python.TopicPartition(topic, 0)])
    try:
        records = [r for r, _ in zip(consumer, range(COUNT), strict=False)]
    finally:
        consumer.close()
    assert all(r.value == VALUE for r in records)
    return [r.key for r in records]


def _aiokafka_keys(boot: str, topic: str) -> list[bytes]:
    aiokafka = pytest.importorskip("aiokafka")

    async def read() -> list[Any]:
        consumer = aiokafka.AIOKafkaConsumer(bootstrap_servers=boot, auto_offset_reset="earliest")
        await consumer.start()
        consumer.assign([aiokafka.TopicPartition(topic, 0)])
        records: list[Any] = []
        try:
            while len(records) < COUNT:
                records.append(await asyncio.wait_for(consumer.getone(), 30))
        finally:
            await consumer.stop()
        return records

    records = asyncio.run(read())
    assert all(r.value == VALUE for r in records)
    return [r.key for r in records]


def _kcat_keys(boot: str, topic: str) -> list[bytes]:
    done = subprocess.run(
        [kcat_path(), "-b", boot, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e",
         "-c", str(COUNT), "-f", "%k=%s\n"],
        capture_output=True, timeout=60, check=True,
    )  # fmt: skip
    lines = done.stdout.splitlines()
    assert all(line.endswith(b"=" + VALUE) for line in lines), lines[:2]
    return [line.split(b"=", 1)[0] for line in lines]


def _raftlog_keys(grpc_boot: str, topic: str) -> list[bytes]:
    with Consumer(grpc_boot, auto_offset_reset="earliest", consumer_timeout_ms=5000) as consumer:
        consumer.assign([(topic, 0)])
        records = [r for r, _ in zip(consumer, range(COUNT), strict=False)]
    assert all(r.value == VALUE for r in records)
    return [r.key or b"" for r in records]


def _stored_codecs(cluster: LocalCluster, topic: str) -> set[Compression]:
    """The codec of every data batch of partition 0 in every replica's log."""
    codecs: set[Compression] = set()
    for node in cluster.nodes.values():
        for segment in Path(node.data_dir).glob(f"partitions/{topic}-0/log/*.log"):
            data, position = segment.read_bytes(), 0
            while position < len(data):
                header = parse_header(data, position)
                if not header.is_control:
                    codecs.add(header.compression)
                position += header.size_bytes
    return codecs


def _snappy_read_by_every_client(cluster: LocalCluster, topic: str) -> None:
    boot = cluster.kafka_bootstrap
    assert _stored_codecs(cluster, topic) == {Compression.SNAPPY}
    assert _kafka_python_keys(boot, topic) == KEYS
    assert _aiokafka_keys(boot, topic) == KEYS
    assert _kcat_keys(boot, topic) == KEYS
    assert _raftlog_keys(cluster.bootstrap, topic) == KEYS


def test_snappy_batches_are_stored_as_sent_and_read_by_every_client(
    kafka_cluster: LocalCluster,
) -> None:
    topic = "zip-snappy-all"
    create_topic(kafka_cluster, topic, partitions=1)
    boot = kafka_cluster.kafka_bootstrap
    assert _produce(boot, topic, "snappy") == []
    _snappy_read_by_every_client(kafka_cluster, topic)


def _topic_in_codec(client: Any, codec: str) -> str:
    """A new topic `zip-topic-<codec>` whose compression.type is `codec`; its name."""
    admin_module = pytest.importorskip("confluent_kafka.admin")
    topic = f"zip-topic-{codec}"
    new = admin_module.NewTopic(
        topic, num_partitions=1, replication_factor=3, config={"compression.type": codec}
    )
    client.create_topics([new], operation_timeout=30)[topic].result(timeout=40)
    return topic


def test_a_topics_compression_type_recompresses_batches_on_the_leader(
    kafka_cluster: LocalCluster,
) -> None:
    # Kafka's topic-level compression.type: the leader stores every batch in the topic's
    # codec whatever the producer sent; an idempotent producer's sequences are kept.
    admin_module = pytest.importorskip("confluent_kafka.admin")
    boot = kafka_cluster.kafka_bootstrap
    client = admin_module.AdminClient({"bootstrap.servers": boot})
    topic = _topic_in_codec(client, "zstd")
    assert _produce(boot, topic, "snappy") == []
    assert _stored_codecs(kafka_cluster, topic) == {Compression.ZSTD}
    assert _kafka_python_keys(boot, topic) == KEYS
    assert _raftlog_keys(kafka_cluster.bootstrap, topic) == KEYS

    resource = admin_module.ConfigResource(admin_module.ResourceType.TOPIC, topic)
    entry = admin_module.ConfigEntry(
        "compression.type",
        "uncompressed",
        incremental_operation=admin_module.AlterConfigOpType.SET,
    )
    resource.add_incremental_config(entry)
    client.incremental_alter_configs([resource])[resource].result(timeout=40)
    described = client.describe_configs([resource])[resource].result(timeout=20)
    assert described["compression.type"].value == "uncompressed"
    producer = kafka.Producer(
        {"bootstrap.servers": boot, "enable.idempotence": True, "compression.codec": "lz4"}
    )
    for i in range(COUNT):
        producer.produce(topic, key=b"%d" % (COUNT + i), value=VALUE, partition=0)
    assert producer.flush(30) == 0
    assert _stored_codecs(kafka_cluster, topic) == {Compression.ZSTD, Compression.NONE}
    every = [b"%d" % i for i in range(2 * COUNT)]
    with Consumer(
        kafka_cluster.bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=5000
    ) as consumer:
        consumer.assign([(topic, 0)])
        assert [r.key for r, _ in zip(consumer, range(2 * COUNT), strict=False)] == every

    refused = admin_module.NewTopic(
        "zip-topic-brotli",
        num_partitions=1,
        replication_factor=3,
        config={"compression.type": "brotli"},
    )
    with pytest.raises(kafka.KafkaException) as raised:
        client.create_topics([refused])["zip-topic-brotli"].result(timeout=40)
    assert raised.value.args[0].code() == kafka.KafkaError.INVALID_CONFIG
    assert "snappy" in raised.value.args[0].str()  # the message lists the codecs allowed


def test_a_snappy_topic_is_written_xerial_framed_and_read_by_every_client(
    kafka_cluster: LocalCluster,
) -> None:
    """compression.type=snappy: zstd batches from librdkafka are stored as snappy (xerial
    framing, as Kafka's JVM code writes it) and every client reads them; raftlog's own
    producer writes snappy too."""
    admin_module = pytest.importorskip("confluent_kafka.admin")
    boot = kafka_cluster.kafka_bootstrap
    topic = _topic_in_codec(admin_module.AdminClient({"bootstrap.servers": boot}), "snappy")
    assert _produce(boot, topic, "zstd") == []
    _snappy_read_by_every_client(kafka_cluster, topic)

    own = "zip-own-snappy"
    create_topic(kafka_cluster, own, partitions=1)
    with Producer(kafka_cluster.bootstrap, compression="snappy") as producer:
        for i in range(COUNT):
            producer.send(own, key=b"%d" % i, value=b"compressible " * 20, partition=0)
        producer.flush()
    assert _stored_codecs(kafka_cluster, own) == {Compression.SNAPPY}
    assert _kafka_python_keys(boot, own) == KEYS
    assert _kcat_keys(boot, own) == KEYS
