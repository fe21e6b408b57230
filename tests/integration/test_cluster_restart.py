"""A stopped cluster comes back on its data, on its old ports or on new ones.

`raftlog cluster up` on a directory holding a stopped cluster restarts that cluster; a node
whose recorded ports are taken gets new ones. The voters' addresses a node starts with
(`--peers`) win over the raft addresses the replayed metadata recorded, and a voter that
moves while the others run is dialed at the address it registers. Each time every topic and
acknowledged record is there and produce works.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from raftlog.client import Admin, Consumer, Producer
from raftlog.cluster_cli import wait_for_controller
from raftlog.local_cluster import LocalCluster, NodeProcess, free_port_base
from tests.integration.conftest import wait_until

TOPIC = "kept"
PARTITIONS = 3
RECORDS_PER_PARTITION = 20
UP_TIMEOUT_S = "120"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raftlog", "cluster", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _up(directory: Path, nodes: int = 3) -> subprocess.CompletedProcess[str]:
    return _cli("up", "--nodes", str(nodes), "--dir", str(directory), "--timeout", UP_TIMEOUT_S)


def _ports(node: NodeProcess) -> list[int]:
    return [p for p in (node.client_port, node.raft_port, node.metrics_port) if p]


@contextmanager
def _holding(ports: list[int]) -> Iterator[None]:
    """Keep `ports` bound (and listening) so no node can take them."""
    with ExitStack() as stack:
        for port in ports:
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past TIME_WAIT
            sock.bind(("127.0.0.1", port))
            sock.listen()
        yield


def _produce(bootstrap: str, tag: str) -> dict[int, list[bytes]]:
    """RECORDS_PER_PARTITION acknowledged (acks=all) records per partition."""
    sent: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    with Producer(bootstrap, acks="all") as producer:
        futures = []
        for partition in range(PARTITIONS):
            for i in range(RECORDS_PER_PARTITION):
                value = f"{tag}-{partition}-{i}".encode()
                futures.append(producer.send(TOPIC, value=value, partition=partition))
                sent[partition].append(value)
        for future in futures:
            future.result(timeout=60)
    return sent


def _read_all(bootstrap: str, expected: int) -> dict[int, list[bytes]]:
    got: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    consumer = Consumer(bootstrap)
    try:
        consumer.assign([(TOPIC, p) for p in range(PARTITIONS)])
        consumer.seek_to_beginning(*[(TOPIC, p) for p in range(PARTITIONS)])

        def done() -> bool:
            for record in consumer.poll(timeout_ms=500):
                assert record.value is not None
                got[record.partition].append(record.value)
            return sum(len(v) for v in got.values()) >= expected

        wait_until(done, timeout_s=120, what=f"{expected} records read back")
    finally:
        consumer.close()
    return got


def _check_everything_there(bootstrap: str, acknowledged: dict[int, list[bytes]]) -> None:
    """The topic is listed, every acknowledged record reads back in order, produce works."""
    with Admin(bootstrap) as admin:
        wait_until(lambda: TOPIC in admin.list_topics(), timeout_s=60, what=f"{TOPIC} listed")
    more = _produce(bootstrap, f"after-{sum(len(v) for v in acknowledged.values())}")
    for partition, values in more.items():
        acknowledged[partition] = acknowledged[partition] + values
    got = _read_all(bootstrap, sum(len(v) for v in acknowledged.values()))
    assert got == acknowledged


def _start_with_data(directory: Path) -> dict[int, list[bytes]]:
    started = _up(directory)
    assert started.returncode == 0, started.stderr
    bootstrap = started.stdout.strip().splitlines()[-1]  # the last line: gRPC
    with Admin(bootstrap) as admin:
        admin.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=3)
    return _produce(bootstrap, "before")


def test_cluster_up_restarts_a_stopped_cluster_on_its_ports(tmp_path: Path) -> None:
    acknowledged = _start_with_data(tmp_path)
    before = LocalCluster.load(tmp_path)
    try:
        assert _cli("down", "--dir", str(tmp_path)).returncode == 0
        wrong = _up(tmp_path, nodes=5)
        assert wrong.returncode == 2
        assert "--nodes 5" in wrong.stderr and "3 voter nodes" in wrong.stderr, wrong.stderr
        again = _up(tmp_path)
        assert again.returncode == 0, again.stderr
        assert "restarting the stopped cluster" in again.stderr, again.stderr
        after = LocalCluster.load(tmp_path)
        assert after.bootstrap == before.bootstrap
        assert again.stdout.strip().splitlines()[-1] == before.bootstrap
        _check_everything_there(after.bootstrap, acknowledged)

        # One node dies on its own: `cluster up` starts it and leaves the others running.
        after.kill_node(2)
        running = {i: after.nodes[i].pid for i in (1, 3)}
        revived = _up(tmp_path)
        assert revived.returncode == 0, revived.stderr
        assert "restarting nodes [2]" in revived.stderr, revived.stderr
        now = LocalCluster.load(tmp_path)
        assert {i: now.nodes[i].pid for i in (1, 3)} == running
        assert now.is_running(2)
        _check_everything_there(now.bootstrap, acknowledged)
        idle = _up(tmp_path)
        assert idle.returncode == 0 and "runs already" in idle.stderr, idle.stderr
        assert LocalCluster.load(tmp_path).nodes[2].pid == now.nodes[2].pid
    finally:
        _cli("down", "--dir", str(tmp_path))


def test_cluster_up_restarts_a_stopped_cluster_on_new_ports(tmp_path: Path) -> None:
    acknowledged = _start_with_data(tmp_path)
    before = LocalCluster.load(tmp_path)
    old_ports = [p for n in before.nodes.values() for p in _ports(n)]
    try:
        assert _cli("down", "--dir", str(tmp_path)).returncode == 0
        with _holding(old_ports):
            again = _up(tmp_path)
        assert again.returncode == 0, again.stderr
        assert again.stderr.count("moved from ports") == 3, again.stderr
        after = LocalCluster.load(tmp_path)
        new_ports = [p for n in after.nodes.values() for p in _ports(n)]
        assert not set(new_ports) & set(old_ports), (old_ports, new_ports)
        assert sorted(after.nodes) == sorted(before.nodes)
        _check_everything_there(after.bootstrap, acknowledged)
    finally:
        _cli("down", "--dir", str(tmp_path))


def test_a_voter_moved_while_the_others_run_is_dialed_at_its_new_address(
    tmp_path: Path,
) -> None:
    acknowledged = _start_with_data(tmp_path)
    cluster = LocalCluster.load(tmp_path)
    try:
        cluster.kill_node(3)
        node = cluster.nodes[3]
        base = free_port_base(1, start=node.client_port + 200)
        node.client_port, node.raft_port = base + 1, base + 101
        node.metrics_port = base + 51 if node.metrics_port else 0
        cluster.save()
        cluster.start_node(3)
        # Nodes 1 and 2 still run with node 3's old address in their --peers; node 3 must
        # register its new one and be dialed there.
        wait_for_controller(cluster.bootstrap, timeout_s=120, at_bootstrap=True)
        _check_everything_there(cluster.bootstrap, acknowledged)
        # With node 1 gone, nodes 2 and 3 make every quorum: node 2 must reach node 3 at its
        # new address (and node 3 node 2) for the metadata and every partition to move on.
        cluster.kill_node(1)
        survivors = ",".join(cluster.nodes[i].client_address for i in (2, 3))
        _check_everything_there(survivors, acknowledged)
    finally:
        cluster.stop()
