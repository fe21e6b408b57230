"""Moving partition replicas by Raft membership change, and fencing, on real node processes
(issue 5): a move keeps every acknowledged record, survives the death of the controller or
the partition leader, deletes the removed copy only once it completed; a node whose lease
expired stops leading."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import grpc
import pytest

from raftlog.client import Admin, Consumer, Producer, RecordMetadata
from raftlog.cluster_cli import reassign_partition
from raftlog.config import MetadataConfig
from raftlog.local_cluster import LocalCluster
from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.rpc.v1 import raftlog_pb2_grpc as pb_grpc
from raftlog.storage.batch import iter_batches
from tests.integration.conftest import leader_of, start_cluster, wait_until

TOPIC_TIMEOUT_S = 60


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = start_cluster(tmp_path, 3)
    yield cluster
    cluster.stop()


def reassign(
    cluster: LocalCluster,
    topic: str,
    partition: int,
    replicas: list[int],
    *,
    paused: int | None = None,
) -> None:
    """Start the move through `raftlog cluster reassign`'s function, at the running nodes
    (a `paused` one would hold each attempt until its timeout)."""
    running = [
        n.client_address
        for n in cluster.nodes.values()
        if cluster.is_running(n.node_id) and n.node_id != paused
    ]
    reassign_partition(",".join(running), topic, partition, replicas, timeout_s=60)


def replicas_of(admin: Admin, topic: str, partition: int) -> tuple[int, ...]:
    for p in admin.describe_topic(topic).partitions:
        if p.id == partition:
            return tuple(p.replicas)
    raise AssertionError(f"no partition {topic}-{partition}")


def _replicas_now(admin: Admin, topic: str) -> tuple[int, ...] | None:
    """The replicas some node describes now; None while the answering node (one just
    restarted) has not caught up with the metadata yet."""
    try:
        return replicas_of(admin, topic, 0)
    except Exception:  # an unknown topic on a node still replaying its metadata log
        return None


def partition_dir(cluster: LocalCluster, node_id: int, topic: str, partition: int) -> Path:
    return Path(cluster.nodes[node_id].data_dir) / "partitions" / f"{topic}-{partition}"


class Writer:
    """Produces numbered records with acks=all on a thread and remembers what was acked."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.acked: list[bytes] = []
        self.failed: list[BaseException] = []
        self._stop = threading.Event()
        self._producer = Producer(bootstrap, acks="all", linger_ms=2)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        i = 0
        pending: list[tuple[bytes, Future[RecordMetadata]]] = []
        while not self._stop.is_set():
            value = b"r-%06d" % i
            i += 1
            pending.append((value, self._producer.send(self.topic, value=value, partition=0)))
            if len(pending) >= 20:
                self._settle(pending)
                pending = []
        self._settle(pending)

    def _settle(self, pending: list[tuple[bytes, Future[RecordMetadata]]]) -> None:
        for value, future in pending:
            try:
                future.result(timeout=120)
                self.acked.append(value)
            except Exception as error:  # an unacknowledged record may or may not exist
                self.failed.append(error)

    def wait_for(self, count: int) -> None:
        wait_until(lambda: len(self.acked) >= count, timeout_s=60, what=f"{count} acked records")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=180)
        self._producer.close()


def check_log(
    cluster: LocalCluster, topic: str, replicas: tuple[int, ...], acked: list[bytes]
) -> None:
    """Every acknowledged record is there exactly once, and every replica holds the same log."""
    consumer = Consumer(cluster.bootstrap, auto_offset_reset="earliest")
    try:
        consumer.assign([(topic, 0)])
        consumer.seek_to_beginning((topic, 0))
        values: list[bytes] = []
        end = consumer.end_offsets([(topic, 0)])
        end_offset = next(iter(end.values()))
        deadline = time.monotonic() + 60
        while consumer.position((topic, 0)) < end_offset and time.monotonic() < deadline:
            values += [r.value or b"" for r in consumer.poll(timeout_ms=1000)]
    finally:
        consumer.close()
    counts = Counter(values)
    assert not [v for v, n in counts.items() if n > 1], "a record was written twice"
    missing = set(acked) - set(counts)
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {sorted(missing)[:3]}"
    logs = {n: _replica_log(cluster, n, topic, end_offset) for n in replicas}
    assert len(set(logs.values())) == 1, "the replicas hold different logs"


def _replica_log(
    cluster: LocalCluster, node_id: int, topic: str, end_offset: int
) -> tuple[tuple[int, int, bytes], ...]:
    """The committed batches of one replica below `end_offset` (waiting until it has them):
    offsets of every batch, and the bytes of data batches (control batches, the no-ops and
    membership changes, are written by each node itself and differ in timestamps)."""
    with grpc.insecure_channel(cluster.nodes[node_id].client_address) as channel:
        stub = pb_grpc.LogStub(channel)
        deadline = time.monotonic() + 30
        while True:
            request = pb.FetchRequest(
                topic=topic, partition=0, offset=0, max_bytes=64 << 20, read_from_follower=True
            )
            response = stub.Fetch(request)
            if response.error.code == pb.NONE and response.high_watermark >= end_offset:
                data = bytes(response.batches)
                return tuple(
                    (
                        header.base_offset,
                        header.last_offset,
                        b"" if header.is_control else data[at : at + header.size_bytes],
                    )
                    for at, header in iter_batches(data)
                    if header.last_offset < end_offset
                )
            assert time.monotonic() < deadline, f"node {node_id} did not catch up: {response}"
            time.sleep(0.2)


def _setup(cluster: LocalCluster, topic: str) -> tuple[Admin, tuple[int, ...], int]:
    admin = Admin(cluster.bootstrap)
    admin.create_topic(topic, partitions=1, replication_factor=2)
    wait_until(
        lambda: leader_of(admin, topic, 0) is not None, timeout_s=TOPIC_TIMEOUT_S, what="a leader"
    )
    replicas = replicas_of(admin, topic, 0)
    spare = next(n for n in cluster.nodes if n not in replicas)
    return admin, replicas, spare


def _assert_deleted_after_the_move(
    cluster: LocalCluster, leaving: int, topic: str, target: tuple[int, ...]
) -> None:
    """The leaving node removed its copy: its own metadata must hold the completed move. (The
    node `admin` asked may apply the same commit later: it is not the one that deleted.)"""
    own = Admin(cluster.nodes[leaving].client_address)
    try:
        wait_until(
            lambda: _replicas_now(own, topic) is not None,
            timeout_s=30,
            what=f"node {leaving} to describe {topic}",
        )
        assert _replicas_now(own, topic) == target, "deleted before the end"
    finally:
        own.close()


def _move_while_writing(
    cluster: LocalCluster, topic: str, *, leaving_leader: bool, kill: str | None = None
) -> None:
    admin, replicas, spare = _setup(cluster, topic)
    wait_until(
        lambda: leader_of(admin, topic, 0) == replicas[0], timeout_s=60, what="preferred leader"
    )
    leader = leader_of(admin, topic, 0)
    leaving = leader if leaving_leader else next(n for n in replicas if n != leader)
    staying = next(n for n in replicas if n != leaving)
    target = (spare, staying) if leaving_leader else (staying, spare)
    writer = Writer(cluster.bootstrap, topic)
    try:
        writer.wait_for(200)
        if kill is not None:
            # The joining node is paused, so its learner cannot catch up: the move cannot
            # complete before the kill, which then surely lands mid-move.
            os.kill(cluster.nodes[spare].pid, signal.SIGSTOP)
        reassign(cluster, topic, 0, list(target), paused=spare if kill is not None else None)
        if kill is not None:
            # Ask the other nodes: the paused one would hold each request until its timeout.
            others = Admin(
                ",".join(n.client_address for i, n in cluster.nodes.items() if i != spare)
            )
            victim = others.describe_cluster().controller_id if kill == "controller" else leader
            assert victim is not None
            assert replicas_of(others, topic, 0) == replicas, "completed while paused"
            others.close()
            cluster.kill_node(victim, sig=signal.SIGKILL)
            cluster.start_node(victim)
            os.kill(cluster.nodes[spare].pid, signal.SIGCONT)
        # The leaving copy stays until the move completed.
        deadline = time.monotonic() + 120
        while _replicas_now(admin, topic) != target:
            if not partition_dir(cluster, leaving, topic, 0).exists():
                _assert_deleted_after_the_move(cluster, leaving, topic, target)
                break
            assert time.monotonic() < deadline, f"the move to {target} did not complete"
            time.sleep(0.05)
        count = len(writer.acked)
        writer.wait_for(count + 200)  # still writable after the move
    finally:
        writer.stop()
    wait_until(
        lambda: not partition_dir(cluster, leaving, topic, 0).exists(),
        timeout_s=30,
        what=f"node {leaving} to delete its copy",
    )
    assert partition_dir(cluster, spare, topic, 0).exists()
    check_log(cluster, topic, target, writer.acked)


def test_move_a_follower_replica_while_producing(cluster: LocalCluster) -> None:
    _move_while_writing(cluster, "move-follower", leaving_leader=False)
    # Then back again while idle: the node that left joins anew from an empty directory.
    admin = Admin(cluster.bootstrap)
    moved = replicas_of(admin, "move-follower", 0)
    back = (moved[0], next(n for n in cluster.nodes if n not in moved))
    # Through the command line this time: `raftlog cluster reassign ... --wait`.
    replicas_flag = ",".join(str(n) for n in back)
    command = [sys.executable, "-m", "raftlog", "cluster", "reassign"]
    command += ["--bootstrap", cluster.bootstrap, "--topic", "move-follower", "--partition", "0"]
    completed = subprocess.run(
        [*command, "--replicas", replicas_flag, "--wait", "120"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert "move completed" in completed.stderr
    assert replicas_of(admin, "move-follower", 0) == back
    refused = subprocess.run(
        [*command, "--replicas", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 1 and "INVALID_REPLICATION_FACTOR" in refused.stderr
    wait_until(
        lambda: not partition_dir(cluster, moved[1], "move-follower", 0).exists(),
        timeout_s=30,
        what=f"node {moved[1]} to delete its copy",
    )
    with Producer(cluster.bootstrap, acks="all") as producer:
        producer.send("move-follower", value=b"after both moves", partition=0).result(timeout=60)
    check_log(cluster, "move-follower", back, [b"after both moves"])


def test_move_the_leaders_own_replica(cluster: LocalCluster) -> None:
    _move_while_writing(cluster, "move-leader", leaving_leader=True)


def test_a_move_survives_the_controller_dying(cluster: LocalCluster) -> None:
    _move_while_writing(cluster, "move-controller-dies", leaving_leader=False, kill="controller")


def test_a_move_survives_the_partition_leader_dying(cluster: LocalCluster) -> None:
    _move_while_writing(cluster, "move-leader-dies", leaving_leader=False, kill="leader")


def test_a_fenced_node_stops_leading(cluster: LocalCluster) -> None:
    admin = Admin(cluster.bootstrap)
    admin.create_topic("fenced", partitions=3, replication_factor=3)
    wait_until(
        lambda: all(p.leader == p.replicas[0] for p in admin.describe_topic("fenced").partitions),
        timeout_s=60,
        what="preferred leaders",
    )
    victim = next(p.leader for p in admin.describe_topic("fenced").partitions)
    assert victim is not None
    others = Admin(",".join(n.client_address for i, n in cluster.nodes.items() if i != victim))
    pid = cluster.nodes[victim].pid
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_until(
            lambda: (
                not next(n for n in others.describe_cluster().nodes if n.node_id == victim).alive
            ),
            timeout_s=60,
            what=f"node {victim} fenced",
        )
        wait_until(
            lambda: all(p.leader != victim for p in others.describe_topic("fenced").partitions),
            timeout_s=60,
            what=f"partitions of node {victim} led elsewhere",
        )
    finally:
        os.kill(pid, signal.SIGCONT)
    # Back, it is unfenced by its heartbeat, and no partition is led by it while fenced:
    # it can lead again only once alive (preferred leadership moves back).
    wait_until(
        lambda: next(n for n in admin.describe_cluster().nodes if n.node_id == victim).alive,
        timeout_s=60,
        what=f"node {victim} unfenced",
    )
    with Producer(cluster.bootstrap, acks="all") as producer:
        for p in range(3):
            producer.send("fenced", value=b"after", partition=p).result(timeout=60)


def test_clock_skew_fences_nobody(tmp_path: Path) -> None:
    """Leases never compare two nodes' wall clocks: a controller whose clock jumps a minute
    ahead, and nodes whose clocks run a minute behind, fence nobody."""
    cluster = start_cluster(tmp_path, 3, "--chaos")
    try:
        admin = Admin(cluster.bootstrap)
        controller = admin.describe_cluster().controller_id
        assert controller is not None
        for node_id, node in cluster.nodes.items():
            offset_ms = 60_000 if node_id == controller else -60_000
            rules = json.dumps({"clock": {"offset_ms": offset_ms}})
            with grpc.insecure_channel(node.client_address) as channel:
                pb_grpc.InternalStub(channel).SetFaults(
                    pb.SetFaultsRequest(rules_json=rules), timeout=10
                )
        # Past one and a half leases (node_lease_ms is 6 s) of heartbeats under skew.
        deadline = time.monotonic() + 1.5 * MetadataConfig().node_lease_ms / 1000
        while time.monotonic() < deadline:
            nodes = admin.describe_cluster().nodes
            assert all(n.alive for n in nodes), f"a node was fenced under clock skew: {nodes}"
            time.sleep(0.5)
        assert admin.describe_cluster().controller_id == controller, "the test lost its point"
    finally:
        cluster.stop()
