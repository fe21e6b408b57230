"""Decommissioning a node on real node processes (issues 5 and 8).

Three voters and one observer: the observer is decommissioned while a producer writes with
acks=all. Its replicas move to the voters one move at a time, nothing acknowledged is lost,
it ends decommissioned and out of the metadata quorum, and, restarted, it stops with an
error instead of rejoining. Decommissioning a voter is refused and says why.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from raftlog.client import Admin, Consumer, Producer
from raftlog.client.errors import ClientError
from raftlog.local_cluster import LocalCluster
from tests.integration.conftest import start_cluster, wait_until

# Placement alone decides where replicas go here (the observer gets its share at creation).
FLAGS = ("--set", "metadata.auto_rebalance=false")
TOPIC = "load"
PARTITIONS = 4


def _voters(cluster: LocalCluster) -> str:
    return ",".join(n.client_address for n in cluster.nodes.values() if not n.observer)


class Load:
    """A producer writing acks=all across every partition until stopped; keeps what was
    acknowledged, per partition."""

    def __init__(self, bootstrap: str) -> None:
        self.acked: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
        self.failures = 0
        self._stop = threading.Event()
        self._bootstrap = bootstrap
        self._thread = threading.Thread(target=self._run, name="load", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with Producer(self._bootstrap, acks="all") as producer:
            i = 0
            while not self._stop.is_set():
                partition = i % PARTITIONS
                value = f"record-{i}".encode()
                try:
                    producer.send(TOPIC, value=value, partition=partition).result(timeout=60)
                    self.acked[partition].append(value)
                except ClientError:
                    self.failures += 1  # not acknowledged: may or may not be in the log
                i += 1

    def count(self) -> int:
        return sum(len(v) for v in self.acked.values())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=120)
        assert not self._thread.is_alive(), "the producer did not stop"


def _consume_all(bootstrap: str, partition: int) -> list[bytes]:
    consumer = Consumer(bootstrap, auto_offset_reset="earliest")
    try:
        tp = (TOPIC, partition)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        end_offset = next(iter(consumer.end_offsets([tp]).values()))
        values: list[bytes] = []
        deadline = time.monotonic() + 60
        while consumer.position(tp) < end_offset and time.monotonic() < deadline:
            values += [r.value or b"" for r in consumer.poll(timeout_ms=1000)]
        return values
    finally:
        consumer.close()


def test_an_observer_is_decommissioned_under_load(tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path, 3, *FLAGS)
    try:
        admin = Admin(_voters(cluster))
        observer = cluster.add_observer()
        cluster.start_node(observer.node_id, *FLAGS)
        wait_until(
            lambda: any(
                n.node_id == 4 and n.alive and n.metadata_role == "learner"
                for n in admin.describe_cluster().nodes
            ),
            timeout_s=60,
            what="the observer registered and a learner of the metadata quorum",
        )
        roles = {n.node_id: n.metadata_role for n in admin.describe_cluster().nodes}
        assert roles == {1: "voter", 2: "voter", 3: "voter", 4: "learner"}
        admin.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=3)
        on_observer = [p.id for p in admin.describe_topic(TOPIC).partitions if 4 in p.replicas]
        assert on_observer, "placement put replicas on the observer"
        directories = [Path(observer.data_dir) / "partitions" / f"{TOPIC}-{p}" for p in on_observer]

        # A voter is refused, and the refusal says why (through the API and the command line).
        with pytest.raises(ClientError, match="voter"):
            admin.decommission_node(2)
        command = [sys.executable, "-m", "raftlog", "cluster", "decommission"]
        command += ["--bootstrap", _voters(cluster)]
        refused = subprocess.run(
            [*command, "3"], capture_output=True, text=True, timeout=60, check=False
        )
        assert refused.returncode == 1, refused.stderr
        assert "voter of the metadata quorum" in refused.stderr

        load = Load(_voters(cluster))
        wait_until(lambda: load.count() >= 50, timeout_s=60, what="the load running")
        # `raftlog cluster decommission 4 --wait` under the load.
        decommission = subprocess.Popen(
            [*command, "4", "--wait", "240"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        seen_moving = False

        def decommissioned() -> bool:
            nonlocal seen_moving
            partitions = admin.describe_topic(TOPIC).partitions
            seen_moving |= any(p.adding_replicas or p.removing_replicas for p in partitions)
            node = next(n for n in admin.describe_cluster().nodes if n.node_id == 4)
            return node.state == "decommissioned" and node.metadata_role == "none"

        wait_until(decommissioned, timeout_s=240, what="node 4 decommissioned")
        _, stderr = decommission.communicate(timeout=60)
        assert decommission.returncode == 0, stderr
        assert "node 4 is decommissioned" in stderr
        acked_during = load.count()
        wait_until(lambda: load.count() >= acked_during + 20, timeout_s=60, what="load after")
        load.stop()

        # Every replica now lives on the voters, three per partition.
        for p in admin.describe_topic(TOPIC).partitions:
            assert sorted(p.replicas) == [1, 2, 3], p
            assert not p.adding_replicas and not p.removing_replicas
        wait_until(
            lambda: not any(d.exists() for d in directories),
            timeout_s=30,
            what="the observer's copies deleted",
        )
        # The decommission went through moves the describe calls could observe (a move is a
        # few membership changes under load: long enough to be seen at least once).
        assert seen_moving, "no move in progress was ever described"
        moves = [
            line
            for n in (1, 2, 3)
            for line in Path(cluster.nodes[n].log_file).read_text().splitlines()
            if "decommissioning: load-" in line
        ]
        assert len(moves) >= len(on_observer), moves

        # Nothing acknowledged is lost, in order.
        for partition, acked in load.acked.items():
            stored = _consume_all(_voters(cluster), partition)
            position = 0
            for value in acked:
                position = stored.index(value, position) + 1

        # Restarted, the decommissioned node is told so and stops instead of rejoining.
        cluster.kill_node(4)
        cluster.start_node(4, *FLAGS)
        wait_until(
            lambda: not cluster.is_running(4), timeout_s=60, what="the restarted node 4 stopping"
        )
        assert "may not rejoin" in Path(observer.log_file).read_text()
        node = next(n for n in admin.describe_cluster().nodes if n.node_id == 4)
        assert node.state == "decommissioned" and not node.alive
    finally:
        cluster.stop()
