"""DeleteRecords (Kafka API 21) through real clients: confluent-kafka's, kafka-python's and
aiokafka's admin clients move a partition's log start offset; reads, ListOffsets and a new
leader after the old one is SIGKILLed all honour it, and retention drops the segments below
it on every replica."""

from __future__ import annotations

import asyncio
import datetime
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.delete_records.v2 import request as dr
from kio.schema.errors import ErrorCode
from kio.schema.types import TopicName
from kio.static.primitive import i32, i32Timedelta, i64

from raftlog.client import Admin, Consumer
from raftlog.client.errors import OffsetOutOfRangeError
from raftlog.local_cluster import LocalCluster
from raftlog.storage.segment import LOG_SUFFIX
from tests.kafka.kafka_wire import kafka_call, started_cluster, wait_for_preferred_leaders

kafka = pytest.importorskip("confluent_kafka")
admin_module = pytest.importorskip("confluent_kafka.admin")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # Retention looks every 200 ms, so segments below a moved log start go within the test.
    flags = ("--set", "retention_check_interval_ms=200")
    with started_cluster(tmp_path_factory.mktemp("delete-records"), flags=flags) as made:
        yield made


def _topic(cluster: LocalCluster, name: str, partitions: int, **config: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(name, partitions=partitions, replication_factor=3, config=config)
        wait_for_preferred_leaders(admin, name)


def _produce(cluster: LocalCluster, topic: str, counts: dict[int, int], size: int = 10) -> None:
    # Batches of at most 3,000 bytes: within a topic's 4 KiB segment.bytes.
    producer = kafka.Producer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "acks": "all",
            "linger.ms": 0,
            "batch.size": 3000,
        }
    )
    failed: list[object] = []
    for partition, count in counts.items():
        for i in range(count):
            producer.produce(
                topic,
                value=bytes([i % 256]) * size,
                partition=partition,
                on_delivery=lambda error, _: failed.append(error) if error else None,
            )
            producer.poll(0)
    assert producer.flush(60) == 0
    assert not failed, failed


def _delete(client: Any, topic: str, offsets: dict[int, int]) -> dict[int, Any]:
    """partition -> the low watermark, or the KafkaError the deletion got."""
    asked = [kafka.TopicPartition(topic, p, o) for p, o in offsets.items()]
    futures = client.delete_records(asked, operation_timeout=30)
    answers: dict[int, Any] = {}
    for tp, future in futures.items():
        try:
            answers[tp.partition] = future.result(timeout=40).low_watermark
        except kafka.KafkaException as error:
            answers[tp.partition] = error.args[0].code()
    return answers


def _earliest(cluster: LocalCluster, topic: str, partition: int) -> int:
    """ListOffsets EARLIEST through a new AdminClient each try: after a leader is killed,
    librdkafka's admin client keeps asking the dead one and answers -1001 with no error."""
    tp = kafka.TopicPartition(topic, partition)
    spec = {tp: admin_module.OffsetSpec.earliest()}
    deadline = time.monotonic() + 60
    while True:
        client = admin_module.AdminClient({"bootstrap.servers": _live_bootstrap(cluster)})
        try:
            offset = int(client.list_offsets(spec, request_timeout=10)[tp].result(15).offset)
        except (kafka.KafkaException, TimeoutError):
            offset = -1
        if offset >= 0:
            return offset
        assert time.monotonic() < deadline, f"no earliest offset of {tp}"
        time.sleep(0.2)


def _live_bootstrap(cluster: LocalCluster) -> str:
    return ",".join(
        f"127.0.0.1:{n.kafka_port}" for n in cluster.nodes.values() if cluster.is_running(n.node_id)
    )


def _read_offsets(cluster: LocalCluster, topic: str, partition: int, start: int) -> list[int]:
    """The offsets a consumer reads from `start` (auto.offset.reset earliest) to the end."""
    consumer = kafka.Consumer(
        {
            "bootstrap.servers": _live_bootstrap(cluster),
            "group.id": f"dr-{topic}-{partition}-{start}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        consumer.assign([kafka.TopicPartition(topic, partition, start)])
        offsets: list[int] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            error = message.error()
            if error is not None and error.code() == kafka.KafkaError._PARTITION_EOF:
                return offsets
            assert error is None, error
            offsets.append(message.offset())
        raise AssertionError(f"no end of {topic}-{partition} reached; read {offsets}")
    finally:
        consumer.close()


def test_confluent_kafka_deletes_records_and_every_read_honours_it(
    cluster: LocalCluster,
) -> None:
    _topic(cluster, "dr", 2)
    _produce(cluster, "dr", {0: 10, 1: 5})
    client = admin_module.AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})

    assert _delete(client, "dr", {0: 4, 1: -1}) == {0: 4, 1: 5}  # -1: the high watermark
    assert (_earliest(cluster, "dr", 0), _earliest(cluster, "dr", 1)) == (4, 5)
    assert _read_offsets(cluster, "dr", 0, kafka.OFFSET_BEGINNING) == list(range(4, 10))
    # A fetch below the log start is out of range: the consumer resets to the earliest.
    assert _read_offsets(cluster, "dr", 0, 1) == list(range(4, 10))
    assert _read_offsets(cluster, "dr", 1, kafka.OFFSET_BEGINNING) == []

    # A lower offset changes nothing; past the high watermark is Kafka's OFFSET_OUT_OF_RANGE.
    assert _delete(client, "dr", {0: 2}) == {0: 4}
    assert _delete(client, "dr", {0: 11}) == {0: kafka.KafkaError.OFFSET_OUT_OF_RANGE}
    assert _delete(client, "dr", {0: 10}) == {0: 10}
    assert _read_offsets(cluster, "dr", 0, kafka.OFFSET_BEGINNING) == []
    _produce(cluster, "dr", {0: 2})
    assert _read_offsets(cluster, "dr", 0, kafka.OFFSET_BEGINNING) == [10, 11]

    _topic(cluster, "dr-compacted", 1, **{"cleanup.policy": "compact"})
    assert _delete(client, "dr-compacted", {0: 0}) == {0: kafka.KafkaError.POLICY_VIOLATION}


def _wire_delete(cluster: LocalCluster, node_id: int, topic: str, offsets: dict[int, int]) -> Any:
    request = dr.DeleteRecordsRequest(
        topics=(
            dr.DeleteRecordsTopic(
                name=TopicName(topic),
                partitions=tuple(
                    dr.DeleteRecordsPartition(partition_index=i32(p), offset=i64(o))
                    for p, o in offsets.items()
                ),
            ),
        ),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
    )
    (answer,) = kafka_call(f"127.0.0.1:{cluster.nodes[node_id].kafka_port}", request).topics
    return {int(p.partition_index): (p.error_code, int(p.low_watermark)) for p in answer.partitions}


def test_bad_deletions_get_kafka_errors_on_the_wire(cluster: LocalCluster) -> None:
    # What clients check before sending (librdkafka knows partition 7 does not exist), sent
    # anyway: each partition gets its own error and low watermark -1.
    _topic(cluster, "dr-wire", 1)
    _produce(cluster, "dr-wire", {0: 3})
    with Admin(cluster.bootstrap) as admin:
        (partition,) = admin.describe_topic("dr-wire").partitions
    assert partition.leader is not None
    follower = next(n for n in cluster.nodes if n != partition.leader)
    leader_answer = _wire_delete(cluster, partition.leader, "dr-wire", {0: -5, 7: 0})
    assert leader_answer == {
        0: (ErrorCode.offset_out_of_range, -1),
        7: (ErrorCode.unknown_topic_or_partition, -1),
    }
    follower_answer = _wire_delete(cluster, follower, "dr-wire", {0: 1})
    assert follower_answer == {0: (ErrorCode.not_leader_or_follower, -1)}
    assert _wire_delete(cluster, partition.leader, "dr-wire", {0: 1, 1: 0})[0] == (
        ErrorCode.none,
        1,
    )
    missing = _wire_delete(cluster, partition.leader, "dr-nope", {0: 0})
    assert missing == {0: (ErrorCode.unknown_topic_or_partition, -1)}


def test_kafka_python_and_aiokafka_delete_records(cluster: LocalCluster) -> None:
    kafka_python = pytest.importorskip("kafka")
    aiokafka_admin = pytest.importorskip("aiokafka.admin")
    aiokafka_structs = pytest.importorskip("aiokafka.structs")
    _topic(cluster, "dr-py", 1)
    _produce(cluster, "dr-py", {0: 8})

    admin = kafka_python.KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    try:
        tp = kafka_python.TopicPartition("dr-py", 0)
        answer = admin.delete_records({tp: 3}, timeout_ms=30_000)
        assert answer[tp]["low_watermark"] == 3
    finally:
        admin.close()

    async def with_aiokafka() -> dict[Any, int]:
        client = aiokafka_admin.AIOKafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
        await client.start()
        try:
            tp = aiokafka_structs.TopicPartition("dr-py", 0)
            deleted: dict[Any, int] = await client.delete_records(
                {tp: aiokafka_admin.RecordsToDelete(before_offset=6)}, timeout_ms=30_000
            )
            return deleted
        finally:
            await client.close()

    assert list(asyncio.run(with_aiokafka()).values()) == [6]
    assert _read_offsets(cluster, "dr-py", 0, kafka.OFFSET_BEGINNING) == [6, 7]


def test_the_last_stable_offset_never_falls_below_a_log_start_past_an_open_transaction(
    cluster: LocalCluster,
) -> None:
    # Kafka's rule: DeleteRecords may pass an open transaction's first offset, and the
    # first unstable offset is then bounded by the log start.
    _topic(cluster, "dr-txn", 1)
    producer = kafka.Producer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "transactional.id": "dr-txn-open"}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce("dr-txn", b"open", partition=0)
    assert producer.flush(30) == 0
    _produce(cluster, "dr-txn", {0: 3})
    client = admin_module.AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    assert _delete(client, "dr-txn", {0: -1}) == {0: 4}
    consumer = kafka.Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": "dr-txn-reader",
            "isolation.level": "read_committed",
        }
    )
    try:
        low, stable = consumer.get_watermark_offsets(
            kafka.TopicPartition("dr-txn", 0), timeout=20, cached=False
        )
    finally:
        consumer.close()
    assert (low, stable) == (4, 4)
    producer.abort_transaction(30)


def test_raftlogs_own_admin_client_and_cli_delete_records(cluster: LocalCluster) -> None:
    # The gRPC front end: raftlog's Admin and `raftlog topic delete-records` (Kafka's
    # kafka-delete-records.sh), then raftlog's own consumer and Kafka's clients agree.
    _topic(cluster, "dr-grpc", 2)
    _produce(cluster, "dr-grpc", {0: 6, 1: 6})
    with Admin(cluster.bootstrap) as admin:
        assert admin.delete_records("dr-grpc", {0: 2, 1: -1}) == {0: 2, 1: 6}
        assert admin.delete_records("dr-grpc", {0: 1}) == {0: 2}
        with pytest.raises(OffsetOutOfRangeError):
            admin.delete_records("dr-grpc", {0: 7})
        led = [p for p in admin.describe_topic("dr-grpc").partitions if p.high_watermark >= 0]
        assert all(p.log_start_offset == {0: 2, 1: 6}[p.id] for p in led)
    cli = subprocess.run(
        [
            *(sys.executable, "-m", "raftlog", "topic", "delete-records", "dr-grpc"),
            *("--partition", "0", "--offset", "4", "--bootstrap", cluster.bootstrap),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.strip() == "topic dr-grpc partition 0: log start offset 4"
    consumer = Consumer(cluster.bootstrap)
    try:
        starts = consumer.beginning_offsets([("dr-grpc", 0), ("dr-grpc", 1)])
        assert {tp.partition: o for tp, o in starts.items()} == {0: 4, 1: 6}
    finally:
        consumer.close()
    assert _earliest(cluster, "dr-grpc", 0) == 4
    assert _read_offsets(cluster, "dr-grpc", 0, kafka.OFFSET_BEGINNING) == [4, 5]


def _segment_bases(cluster: LocalCluster, node_id: int, name: str) -> list[int]:
    directory = Path(cluster.nodes[node_id].data_dir) / "partitions" / name
    return sorted(int(p.name.split(".")[0]) for p in directory.rglob(f"*{LOG_SUFFIX}"))


def test_a_new_leader_keeps_the_log_start_and_retention_drops_segments_below_it(
    cluster: LocalCluster,
) -> None:
    # Small segments (4 KiB: a few 1 KiB records each), so the log start leaves some wholly
    # below it.
    _topic(cluster, "dr-seg", 1, **{"segment.bytes": "4096"})
    _produce(cluster, "dr-seg", {0: 60}, size=1000)
    before = {n: _segment_bases(cluster, n, "dr-seg-0") for n in cluster.nodes}
    assert all(len(bases) > 10 for bases in before.values()), before
    client = admin_module.AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    assert _delete(client, "dr-seg", {0: 40}) == {0: 40}

    # Every replica drops the segments wholly below offset 40 and keeps the one holding it
    # (Raft offsets: the first leader's no-op sits before the records, so Kafka's 40 is at
    # Raft offset 41 unless another leader wrote one since).
    deadline = time.monotonic() + 30
    while True:
        after = {n: _segment_bases(cluster, n, "dr-seg-0") for n in cluster.nodes}
        if all(bases and 30 < bases[0] <= 41 for bases in after.values()):
            break
        assert time.monotonic() < deadline, (before, after)
        time.sleep(0.2)

    with Admin(cluster.bootstrap) as admin:
        (partition,) = admin.describe_topic("dr-seg").partitions
    assert partition.leader is not None
    cluster.kill_node(partition.leader)
    try:
        assert _earliest(cluster, "dr-seg", 0) == 40
        assert _read_offsets(cluster, "dr-seg", 0, kafka.OFFSET_BEGINNING) == list(range(40, 60))
    finally:
        cluster.start_node(partition.leader)
