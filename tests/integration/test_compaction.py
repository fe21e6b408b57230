"""A compacted topic on three real nodes (docs/compaction.md).

Many keyed writes over a fixed key space; every node's cleaner brings its log under the bound
of docs/compaction.md (live records + 61 bytes per batch + two segments); a consumer reading
from 0 gets exactly the last value of every key, across the gaps; a node killed in the middle
of a cleaning pass restarts with an intact log; a replica wiped and re-replicated from the
compacted leader holds the same key -> value map. `make soak` runs the issue's size,
1,000,000 writes over 10,000 keys (about 3 minutes here); `make test` a scaled-down twin.
"""

from __future__ import annotations

import random
import shutil
import signal
import time
from pathlib import Path

import pytest

from raftlog.client import Admin, Consumer, Producer
from raftlog.config import LogConfig
from raftlog.errors import RaftlogError
from raftlog.local_cluster import LocalCluster
from raftlog.storage.batch import BATCH_HEADER_BYTES
from raftlog.storage.log import SegmentedLog
from raftlog.storage.records import decode_batch
from raftlog.storage.scrub import verify_closed_segment
from tests.integration.conftest import start_cluster, wait_until

WRITES, KEYS = 20_000, 1_000
SEGMENT_BYTES = 64 * 1024
TOPIC = "table"
# A record of a 6-byte key and a value of at most 14 bytes takes under 32 bytes.
RECORD_BYTES_MAX = 32


def _log_dir(cluster: LocalCluster, node_id: int) -> Path:
    return Path(cluster.nodes[node_id].data_dir) / "partitions" / f"{TOPIC}-0" / "log"


def _bytes_on_disk(cluster: LocalCluster, node_id: int) -> int:
    return sum(p.stat().st_size for p in _log_dir(cluster, node_id).glob("*.log"))


def _batch_count(cluster: LocalCluster, node_id: int) -> int:
    """Batches in a running node's segments (headers only, read-only)."""
    count = 0
    for path in _log_dir(cluster, node_id).glob("*.log"):
        data, position = path.read_bytes(), 0
        while position + BATCH_HEADER_BYTES <= len(data):
            length = int.from_bytes(data[position + 8 : position + 12], "big", signed=True)
            position += length + 12
            count += 1
    return count


def _bound_bytes(batches: int, keys: int) -> int:
    """docs/compaction.md: live records, one header per batch, the two newest segments."""
    return keys * RECORD_BYTES_MAX + batches * BATCH_HEADER_BYTES + 2 * SEGMENT_BYTES


def _stopped_key_map(cluster: LocalCluster, node_id: int) -> dict[bytes, bytes | None]:
    """The key -> value map a stopped node's log holds, after checking it end to end."""
    log = SegmentedLog.open(_log_dir(cluster, node_id), config=LogConfig())
    try:
        assert log.damage is None, log.damage
        for path, base, end in log.closed_segments():
            problem = verify_closed_segment(
                log.files, path, base_offset=base, end_offset=end, chunk_bytes=1 << 20
            )
            assert problem is None, problem
        values: dict[bytes, bytes | None] = {}
        offset = log.log_start_offset
        while offset < log.log_end_offset:
            result = log.read(offset, bytes_max=1 << 22)
            position = 0
            for header in result.headers:
                assert header.base_offset == offset, "dense in batches"
                if not header.is_control:
                    for record in decode_batch(result.data, position).records:
                        assert record.key is not None
                        values[record.key] = record.value
                position += header.size_bytes
                offset = header.last_offset + 1
        return values
    finally:
        log.close()


def _write(
    cluster: LocalCluster, count: int, keys: int, expected: dict[bytes, bytes], seed: int
) -> None:
    rng = random.Random(seed)
    futures = []
    with Producer(cluster.bootstrap, acks="all", linger_ms=5, batch_bytes_max=16384) as producer:
        for i in range(count):
            key = b"k%05d" % rng.randrange(keys)
            value = b"%d-%d" % (seed, i)
            futures.append(producer.send(TOPIC, key=key, value=value, partition=0))
            expected[key] = value
        producer.flush()
    for future in futures:
        future.result(timeout=60)


def _consumed_map(cluster: LocalCluster) -> tuple[dict[bytes, bytes | None], int]:
    consumer = Consumer(cluster.bootstrap)
    try:
        end = next(iter(consumer.end_offsets([(TOPIC, 0)]).values()))
        consumer.assign([(TOPIC, 0)])
        consumer.seek_to_beginning((TOPIC, 0))
        values: dict[bytes, bytes | None] = {}
        last, count = -1, 0
        deadline = time.monotonic() + 60
        # A poll may return nothing before the end: a fetch of batches emptied by the cleaner.
        while time.monotonic() < deadline:
            records = consumer.poll(500)
            if not records and consumer.position((TOPIC, 0)) >= end:
                break
            for record in records:
                assert record.offset > last
                assert record.key is not None
                values[record.key], last = record.value, record.offset
                count += 1
        return values, count
    finally:
        consumer.close()


def _kafka_consumed_map(cluster: LocalCluster) -> dict[bytes, bytes | None]:
    """The same read by a Kafka client (librdkafka) through the Kafka listener: it steps over
    emptied batches and gaps inside batches on its own."""
    kafka = pytest.importorskip("confluent_kafka")
    consumer = Consumer(cluster.bootstrap)
    end = next(iter(consumer.end_offsets([(TOPIC, 0)]).values()))
    consumer.close()
    reader = kafka.Consumer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "group.id": "unused",
         "enable.auto.commit": False}
    )  # fmt: skip
    reader.assign([kafka.TopicPartition(TOPIC, 0, kafka.OFFSET_BEGINNING)])
    values: dict[bytes, bytes | None] = {}
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            message = reader.poll(0.5)
            if message is None:
                if reader.position([kafka.TopicPartition(TOPIC, 0)])[0].offset >= end:
                    break
                continue
            assert message.error() is None, message.error()
            values[message.key()] = message.value()
    finally:
        reader.close()
    return values


def _follower(admin: Admin) -> int:
    description = admin.describe_topic(TOPIC).partitions[0]
    return next(r for r in description.replicas if r != description.leader)


def test_compacted_topic_on_three_nodes(tmp_path: Path) -> None:
    _compacted_topic_on_three_nodes(tmp_path, WRITES, KEYS)


@pytest.mark.soak
def test_compacted_topic_on_three_nodes_at_issue_scale(tmp_path: Path) -> None:
    _compacted_topic_on_three_nodes(tmp_path, 1_000_000, 10_000)


def test_a_kafka_client_reads_across_segments_of_emptied_batches(tmp_path: Path) -> None:
    """One key written in single-record batches (a value fills one), so once cleaned every
    segment but the active one holds only emptied batches. librdkafka takes each fetch
    answer that holds batches but no record as a sign its size limit was too small, and
    after ten reports the partition stuck; the Kafka listener answers with the next batch
    that holds a record instead."""
    writes = 300
    cluster = start_cluster(
        tmp_path, 1, "--set", "cleaner_interval_ms=200", "--set", "cleaner_bytes_per_s=8388608"
    )
    try:
        Admin(cluster.bootstrap).create_topic(TOPIC, partitions=1, replication_factor=1, config={
            "cleanup.policy": "compact", "segment.bytes": "4096",
            "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "0",
        })  # fmt: skip
        expected: dict[bytes, bytes] = {}
        with Producer(cluster.bootstrap, acks="all", batch_bytes_max=1024) as producer:
            futures = [
                producer.send(TOPIC, key=b"k", value=b"%600d" % i, partition=0)
                for i in range(writes)
            ]
            producer.flush()
        for future in futures:
            future.result(timeout=60)
        expected[b"k"] = b"%600d" % (writes - 1)
        segments = len(list(_log_dir(cluster, 1).glob("*.log")))
        assert segments > 20, f"{segments} segments: too few for the client's ten doublings"
        wait_until(
            lambda: _consumed_map(cluster)[1] < writes // 20,
            timeout_s=120,
            what="the cleaner to empty every closed segment",
        )
        assert _kafka_consumed_map(cluster) == expected
    finally:
        cluster.stop()


def _compacted_topic_on_three_nodes(tmp_path: Path, writes: int, keys: int) -> None:
    # A budget that grows with the run, so the issue-sized run cleans within the waits.
    budget = max(2 * 1024 * 1024, writes * 64)
    cluster = start_cluster(
        tmp_path, 3, "--set", "cleaner_interval_ms=300", "--set", f"cleaner_bytes_per_s={budget}"
    )
    try:
        admin = Admin(cluster.bootstrap)
        admin.create_topic(TOPIC, partitions=1, replication_factor=3, config={
            "cleanup.policy": "compact", "segment.bytes": str(SEGMENT_BYTES),
            "min.cleanable.dirty.ratio": "0.2", "delete.retention.ms": "0",
        })  # fmt: skip
        expected: dict[bytes, bytes] = {}
        _write(cluster, writes, keys, expected, seed=1)
        for node_id in cluster.nodes:
            wait_until(
                lambda n=node_id: (
                    _bytes_on_disk(cluster, n) <= _bound_bytes(_batch_count(cluster, n), keys)
                ),
                timeout_s=120 + writes // 5000,
                what=f"node {node_id}'s cleaner to bring its log under the bound",
            )
        values, count = _consumed_map(cluster)
        assert values == expected
        assert count < writes, "the consumer read a compacted log, across its gaps"
        assert _kafka_consumed_map(cluster) == expected
        _kill_during_cleaning(cluster, admin, expected, writes // 2, keys)
        _wipe_and_replicate(cluster, admin, expected)
        _keyless_records_refused(cluster, admin)
    finally:
        cluster.stop()


def _kill_during_cleaning(
    cluster: LocalCluster, admin: Admin, expected: dict[bytes, bytes], writes: int, keys: int
) -> None:
    """SIGKILL a follower while its cleaner has copies under cleaner/ (a pass is under way);
    restarted, it holds an intact log with the same map."""
    follower = _follower(admin)
    cleaner_dir = _log_dir(cluster, follower) / "cleaner"
    _write(cluster, writes, keys, expected, seed=2)
    wait_until(
        lambda: any(cleaner_dir.glob("*.log")), timeout_s=120, what="a cleaning pass under way"
    )
    cluster.kill_node(follower, sig=signal.SIGKILL)
    cluster.start_node(follower)
    _wait_caught_up(cluster, admin, follower)
    cluster.kill_node(follower, sig=signal.SIGTERM)
    assert _stopped_key_map(cluster, follower) == expected
    cluster.start_node(follower)


def _wipe_and_replicate(cluster: LocalCluster, admin: Admin, expected: dict[bytes, bytes]) -> None:
    follower = _follower(admin)
    cluster.kill_node(follower, sig=signal.SIGKILL)
    shutil.rmtree(cluster.nodes[follower].data_dir)
    cluster.start_node(follower)
    _wait_caught_up(cluster, admin, follower)
    cluster.kill_node(follower, sig=signal.SIGTERM)
    assert _stopped_key_map(cluster, follower) == expected
    cluster.start_node(follower)


def _wait_caught_up(cluster: LocalCluster, admin: Admin, node_id: int) -> None:
    consumer = Consumer(cluster.bootstrap)
    end = next(iter(consumer.end_offsets([(TOPIC, 0)]).values()))
    consumer.close()

    def caught_up() -> bool:
        path = _log_dir(cluster, node_id)
        return _last_offset(path) >= end - 1

    wait_until(caught_up, timeout_s=120, what=f"node {node_id} to hold offsets below {end}")


def _last_offset(directory: Path) -> int:
    segments = sorted(directory.glob("*.log"))
    if not segments:
        return -1
    data, position, last = segments[-1].read_bytes(), 0, int(segments[-1].stem) - 1
    while position + BATCH_HEADER_BYTES <= len(data):
        base = int.from_bytes(data[position : position + 8], "big")
        length = int.from_bytes(data[position + 8 : position + 12], "big", signed=True)
        if position + length + 12 > len(data):
            break
        delta = int.from_bytes(data[position + 23 : position + 27], "big", signed=True)
        last, position = base + delta, position + length + 12
    return last


def _keyless_records_refused(cluster: LocalCluster, admin: Admin) -> None:
    """A topic altered to compact refuses keyless records, and a bad setting by name."""
    admin.create_topic("keyed", partitions=1, replication_factor=3)
    topic = admin.alter_topic_config("keyed", set_config={"cleanup.policy": "compact"})
    assert topic.config["cleanup.policy"] == "compact"
    # Through each node: the answer describes the topic as altered (a node other than the
    # controller sends the client there; forwarded, its own copy could still lag).
    for ratio, node in zip(("0.3", "0.4", "0.5"), cluster.nodes.values(), strict=True):
        with Admin(node.client_address) as one:
            altered = one.alter_topic_config(
                "keyed", set_config={"min.cleanable.dirty.ratio": ratio}
            )
        assert altered.config["min.cleanable.dirty.ratio"] == ratio, (node.node_id, altered)
    # Retries stay on: the keyed topic was just created, on a node restarted a moment ago, so
    # its leader may still be settling (a retriable NOT_LEADER); INVALID_RECORD is final anyway.
    with Producer(cluster.bootstrap, acks="all") as producer:
        with pytest.raises(RaftlogError, match=r"INVALID_RECORD.*no key"):
            producer.send("keyed", value=b"v", partition=0).result(timeout=30)
        producer.send("keyed", key=b"k", value=b"v", partition=0).result(timeout=30)
    with pytest.raises(RaftlogError, match=r"min\.cleanable\.dirty\.ratio='2'"):
        admin.alter_topic_config("keyed", set_config={"min.cleanable.dirty.ratio": "2"})
