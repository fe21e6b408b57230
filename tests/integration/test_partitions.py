"""Partition replicas on a real 3-node cluster (issue 4): acks, leader failure, catch-up,
committed-only fetch and bad input. Every node is a separate `raftlog serve` process."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import struct
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import grpc
import pytest

from raftlog.client import Admin, Consumer, Producer, RecordMetadata
from raftlog.config import LogConfig
from raftlog.errors import CorruptBatchError
from raftlog.local_cluster import LocalCluster
from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.rpc.v1 import raftlog_pb2_grpc as pb_grpc
from raftlog.storage.batch import iter_batches, verify_batch
from raftlog.storage.raft_log_storage import RaftLogStorage
from raftlog.storage.records import RecordInput, encode_batch
from tests.integration.conftest import leader_of, start_cluster, wait_until


def _read_all(bootstrap: str, topic: str, partition: int, expected: int) -> list[tuple[int, bytes]]:
    consumer = Consumer(bootstrap)
    try:
        consumer.assign([(topic, partition)])
        consumer.seek((topic, partition), 0)
        records: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + 60
        while len(records) < expected and time.monotonic() < deadline:
            for record in consumer.poll(timeout_ms=500):
                records.append((record.offset, record.value or b""))
        return records
    finally:
        consumer.close()


def _stub(cluster: LocalCluster, node_id: int) -> pb_grpc.LogStub:
    channel = grpc.insecure_channel(cluster.nodes[node_id].client_address)
    return pb_grpc.LogStub(channel)


@pytest.mark.parametrize("acks", [0, 1, "all"])
def test_produce_and_consume_with_each_acks(cluster3: LocalCluster, acks: int | str) -> None:
    topic = f"acks-{acks}"
    admin = Admin(cluster3.bootstrap)
    admin.create_topic(topic, partitions=1, replication_factor=3)
    values = [f"{topic}-{i}".encode() for i in range(300)]
    with Producer(
        cluster3.bootstrap,
        acks=acks,  # type: ignore[arg-type]
        enable_idempotence=acks == "all",
    ) as producer:
        futures = [producer.send(topic, value=v, partition=0) for v in values]
        producer.flush()
        for future in futures:
            future.result(timeout=30)
    records = _read_all(cluster3.bootstrap, topic, 0, len(values))
    assert [v for _, v in records] == values
    offsets = [o for o, _ in records]
    assert offsets == sorted(set(offsets)), "offsets strictly increase"


def test_fetch_never_returns_data_above_the_high_watermark(cluster3: LocalCluster) -> None:
    topic = "hw"
    admin = Admin(cluster3.bootstrap)
    admin.create_topic(topic, partitions=1, replication_factor=3)
    stop = threading.Event()

    def produce() -> None:
        with Producer(
            cluster3.bootstrap, acks=1, linger_ms=0, enable_idempotence=False
        ) as producer:
            while not stop.is_set():
                producer.send(topic, value=b"x" * 100, partition=0)
                time.sleep(0.001)

    writer = threading.Thread(target=produce)
    writer.start()
    try:
        # The window is counted in fetches that returned data, not in seconds, so a slow
        # machine (the producer's first batches late, a leader still settling) makes the test
        # slower, never vacuous.
        stub = _stub(cluster3, leader_of(admin, topic, 0))
        fetches_with_data = 0
        high_watermarks = []
        deadline = time.monotonic() + 90
        while fetches_with_data < 200 and time.monotonic() < deadline:
            response = stub.Fetch(
                pb.FetchRequest(topic=topic, partition=0, offset=0, max_bytes=1 << 20)
            )
            if response.error.code != pb.NONE:
                time.sleep(0.05)
                with contextlib.suppress(AssertionError):  # no leader known yet: ask again
                    stub = _stub(cluster3, leader_of(admin, topic, 0))
                high_watermarks.clear()  # a new leader's watermark is checked afresh
                continue
            high_watermarks.append(response.high_watermark)
            batches = 0
            for _, header in iter_batches(response.batches):
                assert header.last_offset < response.high_watermark
                batches += 1
            fetches_with_data += batches > 0
        assert fetches_with_data == 200, f"only {fetches_with_data} fetches returned data"
        assert high_watermarks == sorted(high_watermarks), "the high watermark never goes back"
    finally:
        stop.set()
        writer.join()


def test_bad_input_gets_clear_errors_and_leaves_the_log_untouched(cluster3: LocalCluster) -> None:
    topic = "bad-input"
    admin = Admin(cluster3.bootstrap)
    admin.create_topic(topic, partitions=1, replication_factor=3)
    stub = _stub(cluster3, leader_of(admin, topic, 0))
    good = encode_batch([RecordInput(key=None, value=b"ok", timestamp_ms=1)])
    before = stub.ListOffsets(pb.ListOffsetsRequest(topic=topic, partition=0, spec=pb.LATEST))

    corrupt = bytearray(good)
    corrupt[-1] ^= 0xFF
    response = stub.Produce(pb.ProduceRequest(topic=topic, partition=0, batches=[bytes(corrupt)]))
    assert response.error.code == pb.CORRUPT_BATCH and "CRC" in response.error.message

    huge = encode_batch([RecordInput(key=None, value=b"z" * (2 << 20), timestamp_ms=1)])
    response = stub.Produce(pb.ProduceRequest(topic=topic, partition=0, batches=[huge]))
    assert response.error.code == pb.BATCH_TOO_LARGE, response.error

    wrong_magic = bytearray(good)
    wrong_magic[16] = 1
    response = stub.Produce(
        pb.ProduceRequest(topic=topic, partition=0, batches=[bytes(wrong_magic)])
    )
    assert response.error.code == pb.CORRUPT_BATCH and "magic" in response.error.message

    response = stub.Produce(pb.ProduceRequest(topic="no-such-topic", partition=0, batches=[good]))
    assert response.error.code == pb.UNKNOWN_TOPIC_OR_PARTITION

    with pytest.raises(grpc.RpcError) as raised:
        stub.Fetch(pb.FetchRequest(topic=topic, partition=0, offset=-5, max_bytes=1024))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "offset" in (raised.value.details() or "")
    with pytest.raises(grpc.RpcError) as raised:
        stub.Produce(pb.ProduceRequest(topic=topic, partition=0, batches=[]))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    after = stub.ListOffsets(pb.ListOffsetsRequest(topic=topic, partition=0, spec=pb.LATEST))
    assert after.offset == before.offset, "rejected batches must not reach the log"
    response = stub.Fetch(
        pb.FetchRequest(topic=topic, partition=0, offset=after.offset + 10, max_bytes=1024)
    )
    assert response.error.code == pb.OFFSET_OUT_OF_RANGE


@pytest.mark.parametrize("nodes", [3, 5])
def test_leader_sigkill_under_acks_all_loses_and_duplicates_nothing(
    request: pytest.FixtureRequest, nodes: int
) -> None:
    cluster3: LocalCluster = request.getfixturevalue(f"cluster{nodes}")
    topic = f"failover-{nodes}"
    admin = Admin(cluster3.bootstrap)
    admin.create_topic(topic, partitions=1, replication_factor=nodes)
    victim = leader_of(admin, topic, 0)
    acked: dict[bytes, int] = {}
    futures: list[tuple[bytes, Future[RecordMetadata]]] = []
    with Producer(
        cluster3.bootstrap, acks="all", linger_ms=2, delivery_timeout_ms=60_000
    ) as producer:
        for i in range(3000):
            value = b"failover-%06d" % i
            futures.append((value, producer.send(topic, value=value, partition=0)))
            if i == 1000:
                cluster3.kill_node(victim, sig=signal.SIGKILL)
            if i == 2000:
                cluster3.start_node(victim)
            time.sleep(0.0005)
        producer.flush()
        for value, future in futures:
            # A failed send is allowed; a lost acknowledged one is not.
            with contextlib.suppress(Exception):
                acked[value] = future.result(timeout=60).offset
    assert len(acked) > 2000, f"only {len(acked)} of 3000 sends succeeded"
    records = _read_all(cluster3.bootstrap, topic, 0, len(acked))
    offsets = [o for o, _ in records]
    assert offsets == sorted(set(offsets)), "offsets strictly increase"
    seen: dict[bytes, int] = {}
    for offset, value in records:
        assert value not in seen, f"{value!r} at offsets {seen[value]} and {offset}: duplicate"
        seen[value] = offset
    lost = [v for v in acked if v not in seen]
    assert not lost, f"{len(lost)} acknowledged records lost, e.g. {lost[:3]}"
    for value, offset in acked.items():
        assert seen[value] == offset, f"{value!r} acknowledged at {offset}, read at {seen[value]}"


def _log_dir(cluster: LocalCluster, node_id: int, topic: str) -> Path:
    return Path(cluster.nodes[node_id].data_dir) / "partitions" / f"{topic}-0" / "log"


def _last_offset_on_disk(cluster: LocalCluster, node_id: int, topic: str) -> int:
    """Read-only look at a running node's segments: the last whole batch's last offset."""
    segments = sorted(_log_dir(cluster, node_id, topic).glob("*.log"))
    if not segments:
        return -1
    data = segments[-1].read_bytes()
    last = int(segments[-1].stem) - 1
    position = 0
    while position + 61 <= len(data):
        try:
            header = verify_batch(data, position)
        except CorruptBatchError:
            break  # a tail still being written
        last = header.last_offset
        position += header.size_bytes
    return last


def _follower(admin: Admin, topic: str) -> int:
    description = admin.describe_topic(topic).partitions[0]
    return next(r for r in description.replicas if r != description.leader)


def test_follower_restarted_from_an_empty_data_directory_catches_up(
    cluster3: LocalCluster,
) -> None:
    topic = "wipe"
    admin = Admin(cluster3.bootstrap)
    admin.create_topic(topic, partitions=1, replication_factor=3)
    with Producer(cluster3.bootstrap, acks="all") as producer:
        for i in range(200):
            producer.send(topic, value=b"before-%d" % i, partition=0)
        producer.flush()
    follower = _follower(admin, topic)
    cluster3.kill_node(follower, sig=signal.SIGKILL)
    shutil.rmtree(cluster3.nodes[follower].data_dir)
    cluster3.start_node(follower)
    with Producer(cluster3.bootstrap, acks="all") as producer:
        for i in range(200):
            producer.send(topic, value=b"after-%d" % i, partition=0).result(timeout=30)
    consumer = Consumer(cluster3.bootstrap)
    end = consumer.end_offsets([(topic, 0)])
    consumer.close()
    high_watermark = next(iter(end.values()))

    wait_until(
        lambda: _last_offset_on_disk(cluster3, follower, topic) >= high_watermark - 1,
        timeout_s=30,
        what=f"node {follower} to hold every offset below {high_watermark}",
    )


def test_follower_behind_the_retention_point_catches_up_by_snapshot(tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path, 3, "--set", "retention_check_interval_ms=200")
    try:
        topic = "retained"
        admin = Admin(cluster.bootstrap)
        admin.create_topic(
            topic,
            partitions=1,
            replication_factor=3,
            config={"segment.bytes": "65536", "retention.bytes": "131072"},
        )
        follower = _follower(admin, topic)
        cluster.kill_node(follower, sig=signal.SIGKILL)
        with Producer(
            cluster.bootstrap, acks="all", linger_ms=1, batch_bytes_max=16384
        ) as producer:
            futures = [
                producer.send(topic, value=b"r" * 200 + struct.pack(">I", i), partition=0)
                for i in range(2000)
            ]
            producer.flush()
            for future in futures:
                future.result(timeout=30)
        consumer = Consumer(cluster.bootstrap)
        wait_until(
            lambda: next(iter(consumer.beginning_offsets([(topic, 0)]).values())) > 0,
            timeout_s=30,
            what="retention to move the log start",
        )
        start = next(iter(consumer.beginning_offsets([(topic, 0)]).values()))
        end = next(iter(consumer.end_offsets([(topic, 0)]).values()))
        consumer.close()
        cluster.start_node(follower)

        wait_until(
            lambda: _last_offset_on_disk(cluster, follower, topic) >= end - 1,
            timeout_s=40,
            what=f"node {follower} to catch up to {end}",
        )
        cluster.kill_node(follower, sig=signal.SIGTERM)
        storage = RaftLogStorage.open(_log_dir(cluster, follower, topic), config=LogConfig())
        try:
            snapshot = storage.snapshot()
            assert snapshot is not None, "the follower was brought up by a snapshot"
            assert storage.first_offset() >= start > 0
            assert storage.last_offset() >= end - 1
        finally:
            storage.close()
    finally:
        cluster.stop()


def test_a_follower_serves_committed_reads_only_when_asked(cluster3: LocalCluster) -> None:
    topic = "follower-reads"
    admin = Admin(cluster3.bootstrap)
    admin.create_topic(topic, partitions=1, replication_factor=3)
    with Producer(cluster3.bootstrap, acks="all") as producer:
        for i in range(50):
            producer.send(topic, value=b"f-%d" % i, partition=0)
        producer.flush()
    leader_hw = (
        _stub(cluster3, leader_of(admin, topic, 0))
        .ListOffsets(pb.ListOffsetsRequest(topic=topic, partition=0, spec=pb.LATEST))
        .offset
    )
    follower = _stub(cluster3, _follower(admin, topic))
    request = pb.FetchRequest(topic=topic, partition=0, offset=0, max_bytes=1 << 20)
    assert follower.Fetch(request).error.code == pb.NOT_LEADER

    request.read_from_follower = True

    deadline = time.monotonic() + 10
    high_watermark = -1
    while high_watermark < leader_hw and time.monotonic() < deadline:
        response = follower.Fetch(request)
        assert response.error.code == pb.NONE, response.error
        assert high_watermark <= response.high_watermark <= leader_hw
        high_watermark = response.high_watermark
        for _, header in iter_batches(response.batches):
            assert header.last_offset < high_watermark, "a follower served uncommitted data"
    assert high_watermark == leader_hw, "the follower's high watermark caught up"


def test_topic_describe_shows_every_partitions_offsets_from_its_leader(
    cluster3: LocalCluster,
) -> None:
    """Only a partition's leader knows its log start and high watermark; the CLI asks each
    leader, so the node it happens to ask does not leave the partitions it does not lead
    at -1."""
    import subprocess
    import sys

    topic = "described"
    admin = Admin(cluster3.bootstrap)
    admin.create_topic(topic, partitions=3, replication_factor=3)
    with Producer(cluster3.bootstrap, acks="all") as producer:
        for partition in range(3):
            for index in range(5):
                producer.send(topic, value=b"v%d" % index, partition=partition).result(timeout=30)
    for node in cluster3.nodes.values():  # each node alone leads at most some of them
        shown = subprocess.run(
            [sys.executable, "-m", "raftlog", "topic", "describe", topic],
            env={**os.environ, "RAFTLOG_BOOTSTRAP": node.client_address},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        watermarks = [int(line.rsplit(" ", 1)[1]) for line in shown.splitlines()[1:]]
        assert len(watermarks) == 3 and all(w >= 5 for w in watermarks), shown
        assert all(" log start 0 " in line for line in shown.splitlines()[1:]), shown
