"""A forward step of the nodes' wall clocks deletes nothing early (docs/chaos.md, clock faults).

Retention by age compares a node's wall clock with the batches' timestamps. With every
node's clock stepped 15 minutes ahead and `retention.ms` at 10 minutes, records produced
seconds before would all be deleted at the next check (they were, on the leader and a
follower, before the retention clock); the nodes hold the step back and keep every
segment. Retention by age still works: lowered to a second, it deletes on every node.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import grpc

from raftlog.client import Admin, Consumer, Producer
from raftlog.local_cluster import LocalCluster
from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.rpc.v1 import raftlog_pb2_grpc as pb_grpc
from tests.integration.conftest import leader_of, start_cluster, wait_until

TOPIC = "aged"
RECORDS = 300
STEP_MS = 15 * 60_000
CHECK_INTERVAL_MS = 200


def _segments(cluster: LocalCluster, node_id: int) -> list[str]:
    log_dir = Path(cluster.nodes[node_id].data_dir) / "partitions" / f"{TOPIC}-0" / "log"
    return sorted(p.name for p in log_dir.glob("*.log"))


def _node_log(cluster: LocalCluster, node_id: int) -> str:
    return Path(cluster.nodes[node_id].log_file).read_text(errors="replace")


def _set_clock_offset(cluster: LocalCluster, offset_ms: int) -> None:
    rules = json.dumps({"clock": {"offset_ms": offset_ms}})
    for node in cluster.nodes.values():
        with grpc.insecure_channel(node.client_address) as channel:
            pb_grpc.InternalStub(channel).SetFaults(
                pb.SetFaultsRequest(rules_json=rules), timeout=10
            )


def _read_all(cluster: LocalCluster) -> dict[int, bytes]:
    seen: dict[int, bytes] = {}
    with Consumer(cluster.bootstrap) as consumer:
        consumer.assign([(TOPIC, 0)])
        consumer.seek((TOPIC, 0), 0)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(seen) < RECORDS:
            for record in consumer.poll(timeout_ms=1000):
                assert record.value is not None
                seen[record.offset] = record.value
    return seen


def test_a_forward_clock_step_deletes_no_young_segment(tmp_path: Path) -> None:
    interval = f"retention_check_interval_ms={CHECK_INTERVAL_MS}"
    cluster = start_cluster(tmp_path, 3, "--chaos", "--set", interval)
    try:
        with Admin(cluster.bootstrap) as admin:
            config = {"retention.ms": "600000", "segment.bytes": "4096"}
            admin.create_topic(TOPIC, partitions=1, replication_factor=3, config=config)
            wait_until(lambda: leader_of(admin, TOPIC, 0) > 0, timeout_s=30, what="a leader")
            with Producer(cluster.bootstrap, acks="all", linger_ms=0) as producer:
                for i in range(RECORDS):
                    producer.send(TOPIC, value=b"record-%04d" % i, partition=0).result(60)
            wait_until(
                lambda: all(len(_segments(cluster, n)) > 2 for n in cluster.nodes),
                timeout_s=30,
                what="every replica to hold several segments",
            )
            before = {n: _segments(cluster, n) for n in cluster.nodes}
            _set_clock_offset(cluster, STEP_MS)
            wait_until(
                lambda: all("wall clock stepped" in _node_log(cluster, n) for n in cluster.nodes),
                timeout_s=30,
                what="every node's retention check to meet the step",
            )
            time.sleep(5 * CHECK_INTERVAL_MS / 1000)  # more checks, each held back
            for node_id, segments in before.items():
                assert _segments(cluster, node_id)[0] == segments[0], (node_id, segments)
            seen = _read_all(cluster)
            assert [seen.get(o) for o in sorted(seen)] == [
                b"record-%04d" % i for i in range(RECORDS)
            ]

            # Retention by age still deletes, measured on the held-back clock.
            admin.alter_topic_config(TOPIC, set_config={"retention.ms": "1000"})
            wait_until(
                lambda: all(_segments(cluster, n)[0] != before[n][0] for n in cluster.nodes),
                timeout_s=30,
                what="retention by age on every replica",
            )
    finally:
        cluster.stop()
