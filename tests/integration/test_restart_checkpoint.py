"""A node restarted from a partition checkpoint still deduplicates exactly as before.

One node, a single-replica partition, a tiny `checkpoint_interval_bytes` so the replica writes
many checkpoints. An idempotent producer (raw batches over gRPC, so the test picks every
sequence) writes, the node is SIGKILLed and restarted, and then: a retry of the last batch is
answered with its original offsets and not written again, the next sequence is accepted at the
log's end, and a gap is refused. Then the same after a clean stop (SIGTERM: the node closes its
logs, so the active segment is resumed from its clean-shutdown marker rather than scanned).
"""

from __future__ import annotations

import signal
from pathlib import Path

import grpc

from raftlog.client import Admin
from raftlog.config import LogConfig
from raftlog.local_cluster import LocalCluster
from raftlog.partition.checkpoint import CHECKPOINT_FILE_NAME, PartitionCheckpoint
from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.rpc.v1 import raftlog_pb2_grpc as pb_grpc
from raftlog.storage.clean_shutdown import CLEAN_SHUTDOWN_FILE_NAME
from raftlog.storage.raft_log_storage import RaftLogStorage
from raftlog.storage.records import RecordInput, encode_batch
from tests.integration.conftest import start_cluster, wait_until

TOPIC = "checkpointed"
PRODUCER_ID = 4242
RECORDS_PER_BATCH = 3


def _batch(sequence: int) -> bytes:
    records = [
        RecordInput(None, b"v-%06d-%d" % (sequence, i) + b"x" * 200, 1)
        for i in range(RECORDS_PER_BATCH)
    ]
    return encode_batch(records, producer_id=PRODUCER_ID, producer_epoch=0, base_sequence=sequence)


def _produce(cluster: LocalCluster, sequence: int) -> pb.ProduceResponse:
    with grpc.insecure_channel(cluster.nodes[1].client_address) as channel:
        stub = pb_grpc.LogStub(channel)
        request = pb.ProduceRequest(
            topic=TOPIC,
            partition=0,
            batches=[_batch(sequence)],
            acks=pb.ACKS_ALL,
            timeout_ms=10_000,
        )
        return stub.Produce(request, timeout=15)


def _serves(cluster: LocalCluster) -> bool:
    try:
        with grpc.insecure_channel(cluster.nodes[1].client_address) as channel:
            response = pb_grpc.LogStub(channel).Fetch(
                pb.FetchRequest(topic=TOPIC, partition=0, offset=0, max_bytes=1024), timeout=2
            )
    except grpc.RpcError:
        return False
    return response.error.code == pb.NONE


def _high_watermark(cluster: LocalCluster) -> int:
    with grpc.insecure_channel(cluster.nodes[1].client_address) as channel:
        response = pb_grpc.LogStub(channel).ListOffsets(
            pb.ListOffsetsRequest(topic=TOPIC, partition=0, spec=pb.LATEST), timeout=5
        )
    assert response.error.code == pb.NONE, response.error
    return int(response.offset)


def _log_dir(cluster: LocalCluster) -> Path:
    return Path(cluster.nodes[1].data_dir) / "partitions" / f"{TOPIC}-0" / "log"


def _checkpoint(cluster: LocalCluster) -> PartitionCheckpoint:
    return PartitionCheckpoint.decode((_log_dir(cluster) / CHECKPOINT_FILE_NAME).read_bytes())


def _restart_and_check(
    cluster: LocalCluster, *, sig: int, next_sequence: int, restarts: int
) -> int:
    """Stop node 1 with `sig`, start it, and check the producer state it rebuilt."""
    last = _produce(cluster, next_sequence - RECORDS_PER_BATCH)  # a retry before the stop
    assert last.error.code == pb.NONE and last.base_offset >= 0
    cluster.kill_node(1, sig=sig)
    marker = _log_dir(cluster) / CLEAN_SHUTDOWN_FILE_NAME
    assert marker.exists() == (sig == signal.SIGTERM), "only a clean stop leaves the marker"
    if sig == signal.SIGTERM:  # a clean stop checkpoints everything applied
        storage = RaftLogStorage.open(_log_dir(cluster), config=LogConfig())
        try:  # the checkpoint is in Raft offsets, the log's own
            assert _checkpoint(cluster).offset == storage.last_offset()
            assert storage.kafka_offset(storage.last_offset()) == last.last_offset
        finally:
            storage.close()
    cluster.start_node(1, "--set", "log.checkpoint_interval_bytes=2048")
    wait_until(lambda: _serves(cluster), timeout_s=60, what="the restarted node serves")
    resumed = Path(cluster.nodes[1].log_file).read_text().split("resuming after the checkpoint")
    assert len(resumed) == restarts + 1, "the restart did not resume from a checkpoint"

    end = _high_watermark(cluster)
    assert end > last.last_offset
    retried = _produce(cluster, next_sequence - RECORDS_PER_BATCH)
    assert retried.error.code == pb.NONE, retried.error
    assert (retried.base_offset, retried.last_offset) == (last.base_offset, last.last_offset)
    assert _high_watermark(cluster) == end, "the retry was not written again"

    gap = _produce(cluster, next_sequence + RECORDS_PER_BATCH)
    assert gap.error.code == pb.OUT_OF_ORDER_SEQUENCE, gap.error
    accepted = _produce(cluster, next_sequence)
    assert accepted.error.code == pb.NONE, accepted.error
    assert accepted.base_offset == end
    return next_sequence + RECORDS_PER_BATCH


def test_a_restarted_node_deduplicates_from_its_checkpoint(tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path, 1, "--set", "log.checkpoint_interval_bytes=2048")
    try:
        with Admin(cluster.bootstrap) as admin:
            admin.create_topic(TOPIC, partitions=1, replication_factor=1)
        wait_until(lambda: _serves(cluster), timeout_s=60, what="the partition serves")
        sequence = 0
        for _ in range(40):
            response = _produce(cluster, sequence)
            assert response.error.code == pb.NONE, response.error
            sequence += RECORDS_PER_BATCH
        checkpoint = _checkpoint(cluster)
        assert 0 < checkpoint.offset < 40 * RECORDS_PER_BATCH + 1
        assert str(PRODUCER_ID).encode() in checkpoint.state

        sequence = _restart_and_check(
            cluster, sig=signal.SIGKILL, next_sequence=sequence, restarts=1
        )
        _restart_and_check(cluster, sig=signal.SIGTERM, next_sequence=sequence, restarts=2)
        assert _checkpoint(cluster).offset >= checkpoint.offset
    finally:
        cluster.stop()
