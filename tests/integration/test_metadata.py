"""The metadata quorum on real node processes (issue 5): any node answers, the controller
fails over, metadata survives restarts, leadership moves away from a dead node and back.

Metadata reads are served from the answering node's own copy, which may lag the controller's
by a few entries: a test that reads through several nodes waits until each one it asks shows
what it expects (`tests.integration._wait`)."""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import grpc
import pytest

from raftlog.client import Admin, Producer
from raftlog.client.admin import TopicDescription
from raftlog.local_cluster import LocalCluster
from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.rpc.v1 import raftlog_pb2_grpc as pb_grpc
from raftlog.storage.records import RecordInput, encode_batch
from tests.integration._wait import ask_every_node, wait_every_node_shows, wait_listed
from tests.integration.conftest import start_cluster, wait_until


def _assignment(description: TopicDescription) -> list[tuple[int, tuple[int, ...]]]:
    return [(p.id, tuple(p.replicas)) for p in description.partitions]


def _describe_everywhere(cluster: LocalCluster, topic: str) -> list[TopicDescription]:
    return list(ask_every_node(cluster, lambda node: node.describe_topic(topic)))


@pytest.mark.parametrize("node_count", [3, 5])
def test_any_node_describes_topics_and_the_controller_fails_over(
    tmp_path: Path, node_count: int
) -> None:
    cluster = start_cluster(tmp_path, node_count)
    try:
        admin = Admin(cluster.bootstrap)
        admin.create_topic("orders", partitions=6, replication_factor=3)
        wait_until(
            lambda: (
                len({tuple(_assignment(d)) for d in _describe_everywhere(cluster, "orders")}) == 1
            ),
            timeout_s=10,
            what="every node to describe the same assignment",
        )
        for description in _describe_everywhere(cluster, "orders"):
            assert len(description.partitions) == 6
            assert all(len(set(p.replicas)) == 3 for p in description.partitions)

        controller = admin.describe_cluster().controller_id
        assert controller is not None
        cluster.kill_node(controller, sig=signal.SIGKILL)
        survivors = ",".join(
            n.client_address for n in cluster.nodes.values() if n.node_id != controller
        )
        started = time.monotonic()
        admin = Admin(survivors)
        admin.create_topic("after-failover", partitions=2, replication_factor=3)
        elapsed = time.monotonic() - started
        assert elapsed < 15, f"creating a topic after the controller died took {elapsed:.1f}s"
        wait_until(
            lambda: admin.describe_cluster().controller_id not in (controller, None),
            timeout_s=30,
            what="a survivor to name the new controller",
        )
        # The controller answered the create; the survivor asked next may apply it a moment later.
        wait_listed(admin, "after-failover", timeout_s=30, what="the new topic listed")
    finally:
        cluster.stop()


def test_metadata_survives_a_restart_of_every_node(tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path, 3)
    try:
        admin = Admin(cluster.bootstrap)
        for i in range(3):
            admin.create_topic(f"keep-{i}", partitions=3, replication_factor=3)
        before = {f"keep-{i}": _assignment(admin.describe_topic(f"keep-{i}")) for i in range(3)}
        admin.close()
        cluster.stop()
        cluster.start()
        # Every node replays the metadata at its own pace: wait until each one, asked alone,
        # lists and describes every topic as before the restart.
        wait_every_node_shows(
            cluster,
            lambda node: (
                set(node.list_topics()) >= set(before)
                and all(_assignment(node.describe_topic(n)) == a for n, a in before.items())
            ),
            timeout_s=60,
            what="every node to list and describe the topics as before the restart",
        )
        with Producer(cluster.bootstrap, acks="all") as producer:
            producer.send("keep-0", value=b"still writable", partition=0).result(timeout=30)
    finally:
        cluster.stop()


def _wait_preferred_leaders(admin: Admin, topic: str, *, timeout_s: float) -> None:
    wait_until(
        lambda: all(p.leader == p.replicas[0] for p in admin.describe_topic(topic).partitions),
        timeout_s=timeout_s,
        what=f"every partition of {topic!r} led by its preferred replica",
    )


def test_leadership_leaves_a_dead_node_and_returns_when_it_comes_back(tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path, 3)
    try:
        admin = Admin(cluster.bootstrap)
        admin.create_topic("balanced", partitions=6, replication_factor=3)
        _wait_preferred_leaders(admin, "balanced", timeout_s=30)
        led = [p.id for p in admin.describe_topic("balanced").partitions if p.leader == 1]
        assert led, "node 1 leads some partitions"
        cluster.kill_node(1, sig=signal.SIGKILL)
        survivors = Admin(",".join(cluster.nodes[i].client_address for i in (2, 3)))
        wait_until(
            lambda: all(
                p.leader in (2, 3) for p in survivors.describe_topic("balanced").partitions
            ),
            timeout_s=30,
            what="partitions of node 1 led elsewhere",
        )
        cluster.start_node(1)
        _wait_preferred_leaders(admin, "balanced", timeout_s=60)  # node 1 came back
    finally:
        cluster.stop()


def test_leadership_is_not_handed_to_a_dead_preferred_replica(tmp_path: Path) -> None:
    """A SIGKILLed node stays alive in the metadata until its lease runs out
    (`metadata.node_lease_ms`, 6 s), and the survivors' heartbeat passes (every 1.5 s) hand
    leadership back to preferred replicas. Started toward the dead node, a transfer refused
    every produce with NOT_ENOUGH_REPLICAS until it aborted an election timeout later, once
    a pass: the leader must only hand leadership to a replica that is in sync."""
    cluster = start_cluster(tmp_path, 3)
    try:
        admin = Admin(cluster.bootstrap)
        admin.create_topic("steady", partitions=1, replication_factor=3)
        _wait_preferred_leaders(admin, "steady", timeout_s=30)
        preferred = admin.describe_topic("steady").partitions[0].replicas[0]
        cluster.kill_node(preferred, sig=signal.SIGKILL)
        others = [i for i in cluster.nodes if i != preferred]
        survivors = Admin(",".join(cluster.nodes[i].client_address for i in others))
        wait_until(
            lambda: survivors.describe_topic("steady").partitions[0].leader in others,
            timeout_s=30,
            what="a survivor leading the partition",
        )
        leader = survivors.describe_topic("steady").partitions[0].leader
        assert leader is not None
        batch = encode_batch([RecordInput(key=None, value=b"steady", timestamp_ms=1)])
        request = pb.ProduceRequest(topic="steady", partition=0, batches=[batch], acks=pb.ACKS_ALL)
        answers: Counter[str] = Counter()
        with grpc.insecure_channel(cluster.nodes[leader].client_address) as channel:
            produce = pb_grpc.LogStub(channel).Produce
            until = time.monotonic() + 3.5  # two heartbeat passes, inside the dead node's lease
            while time.monotonic() < until:
                answers[pb.ErrorCode.Name(produce(request, timeout=10).error.code)] += 1
                time.sleep(0.01)
        assert answers["NONE"] > 0, answers
        assert "NOT_ENOUGH_REPLICAS" not in answers, answers
    finally:
        cluster.stop()


def test_deleting_a_topic_removes_its_files(cluster3: LocalCluster) -> None:
    admin = Admin(cluster3.bootstrap)
    admin.create_topic("doomed", partitions=2, replication_factor=3)
    with Producer(cluster3.bootstrap, acks="all") as producer:
        producer.send("doomed", value=b"bye", partition=0).result(timeout=30)
    directories = [
        Path(node.data_dir) / "partitions" / f"doomed-{p}"
        for node in cluster3.nodes.values()
        for p in range(2)
    ]
    assert all(d.exists() for d in directories)
    admin.delete_topic("doomed")
    wait_until(
        lambda: not any(d.exists() for d in directories),
        timeout_s=20,
        what="partition directories removed on every node",
    )
    assert "doomed" not in admin.list_topics()
