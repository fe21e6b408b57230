"""Local clusters of real node processes on loopback (the embedded default: no Docker).

Used by `raftlog cluster up|down|status`, `make demo`, the integration tests and the chaos
suite's local backend. Each node is a `python -m raftlog serve` process with its own data
directory under `DIR/node-N`, its client port `base_port + N`, its node-to-node port
`base_port + 100 + N`, its Prometheus metrics port `base_port + 50 + N` (`metrics_port`; 0
when started without metrics) and its Kafka port `base_port + 150 + N` (`kafka_port`).
`DIR/cluster.json` records what a later command needs: the nodes, their pids and ports, a
`bootstrap` string of client addresses, `kafka_bootstrap` (the same for Kafka clients), and
`node_flags`, the flags
every node starts with (TLS and auth options: file paths only, never a secret), so a node
restarted by a later command or the chaos suite comes back with the same security.
`add_observer` adds a node outside the metadata quorum's voters (`--peers`); every node starts
with `--bootstrap` set to the voters' client addresses (an observer registers through them; a
voter falls back to them when the controller's recorded address no longer answers).
`restart_stopped` brings a stopped cluster of `DIR` back: the same node ids and data, each
node on its recorded ports where they are free, on new ones otherwise.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["CLUSTER_FILE", "LocalCluster", "NodeProcess", "free_port_base"]

CLUSTER_FILE = "cluster.json"
RAFT_PORT_OFFSET = 100
METRICS_PORT_OFFSET = 50
KAFKA_PORT_OFFSET = 150


@dataclass
class NodeProcess:
    node_id: int
    client_port: int
    raft_port: int
    data_dir: str
    log_file: str
    pid: int = 0
    # Not a voter of the metadata quorum: left out of --peers, registers via --bootstrap.
    observer: bool = False
    # Prometheus metrics on http://127.0.0.1:PORT/metrics; 0: none (--metrics-listen unset).
    metrics_port: int = 0
    # The Kafka listener's port (--kafka-listen); 0: none (a cluster.json from before it).
    kafka_port: int = 0

    @property
    def client_address(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def metrics_address(self) -> str:
        return f"127.0.0.1:{self.metrics_port}"


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ephemeral_port_low(default: int = 32768) -> int:
    """The first port the kernel hands to outgoing connections (Linux: ip_local_port_range)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as handle:
            return int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return default


def free_port_base(count: int, *, start: int = 10000, stop: int | None = None) -> int:
    """A base port such that base+1..base+count and their +100 and +50 twins are all free.

    Blocks stay below the ephemeral range: a port free now but inside it may be taken by any
    outgoing connection (ours included) before the node binds it. The search starts at a
    pid-dependent block, so parallel test processes rarely probe the same ports."""
    stop = min(stop or 65536, _ephemeral_port_low())
    span = count + RAFT_PORT_OFFSET + 1
    bases = list(range(start, stop - span, 200))
    if not bases:
        raise RuntimeError(f"no room for {count} port pairs in [{start}, {stop})")
    first = os.getpid() % len(bases)
    for base in bases[first:] + bases[:first]:
        ports = [base + i for i in range(1, count + 1)]
        if all(
            _port_free(p)
            and _port_free(p + RAFT_PORT_OFFSET)
            and _port_free(p + METRICS_PORT_OFFSET)
            and _port_free(p + KAFKA_PORT_OFFSET)
            for p in ports
        ):
            return base
    raise RuntimeError(f"no free block of {count} port pairs in [{start}, {stop})")


class LocalCluster:
    def __init__(
        self,
        directory: Path,
        nodes: list[NodeProcess],
        *,
        cluster_id: str,
        node_flags: tuple[str, ...] = (),
    ) -> None:
        self.directory = directory
        self.nodes = {n.node_id: n for n in nodes}
        self.cluster_id = cluster_id
        self.node_flags = node_flags
        # Popen objects of the nodes this object started, kept so they are reaped with wait()
        # (a process started by an earlier command is only known by its pid).
        self._processes: dict[int, subprocess.Popen[bytes]] = {}

    @classmethod
    def create(
        cls,
        directory: Path,
        *,
        node_count: int,
        base_port: int | None = None,
        cluster_id: str = "raftlog-local",
        node_flags: tuple[str, ...] = (),
        metrics: bool = True,
    ) -> LocalCluster:
        if node_count not in (1, 3, 5):
            raise ValueError(f"--nodes: 1, 3 or 5, got {node_count}")
        directory.mkdir(parents=True, exist_ok=True)
        base = base_port if base_port is not None else free_port_base(node_count)
        nodes = [
            NodeProcess(
                node_id=i,
                client_port=base + i,
                raft_port=base + RAFT_PORT_OFFSET + i,
                data_dir=str(directory / f"node-{i}"),
                log_file=str(directory / f"node-{i}.log"),
                metrics_port=base + METRICS_PORT_OFFSET + i if metrics else 0,
                kafka_port=base + KAFKA_PORT_OFFSET + i,
            )
            for i in range(1, node_count + 1)
        ]
        return cls(directory, nodes, cluster_id=cluster_id, node_flags=node_flags)

    @classmethod
    def load(cls, directory: Path) -> LocalCluster:
        path = directory / CLUSTER_FILE
        try:
            raw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise FileNotFoundError(f"no readable {path}: {error}") from error
        nodes = [NodeProcess(**n) for n in raw["nodes"]]
        flags = tuple(raw.get("node_flags", ()))
        return cls(directory, nodes, cluster_id=raw["cluster_id"], node_flags=flags)

    @property
    def bootstrap(self) -> str:
        return ",".join(n.client_address for n in self.nodes.values())

    @property
    def kafka_bootstrap(self) -> str:
        """HOST:PORT,... of the nodes' Kafka listeners ("" if none has one)."""
        return ",".join(f"127.0.0.1:{n.kafka_port}" for n in self.nodes.values() if n.kafka_port)

    @property
    def peers(self) -> str:
        return ",".join(
            f"{n.node_id}=127.0.0.1:{n.raft_port}" for n in self.nodes.values() if not n.observer
        )

    def add_observer(self) -> NodeProcess:
        """A new node (not started) with the next id, outside the metadata quorum's voters;
        its ports follow the others' (client base+N, node-to-node base+100+N)."""
        node_id = max(self.nodes) + 1
        first = min(self.nodes.values(), key=lambda n: n.node_id)
        client_port = first.client_port - first.node_id + node_id
        metrics_port = client_port + METRICS_PORT_OFFSET if first.metrics_port else 0
        kafka_port = client_port + KAFKA_PORT_OFFSET if first.kafka_port else 0
        for port in (client_port, client_port + RAFT_PORT_OFFSET, metrics_port, kafka_port):
            if port and not _port_free(port):
                raise RuntimeError(f"port {port} for observer node {node_id} is taken")
        node = NodeProcess(
            node_id=node_id,
            client_port=client_port,
            raft_port=client_port + RAFT_PORT_OFFSET,
            data_dir=str(self.directory / f"node-{node_id}"),
            log_file=str(self.directory / f"node-{node_id}.log"),
            observer=True,
            metrics_port=metrics_port,
            kafka_port=kafka_port,
        )
        self.nodes[node_id] = node
        self.save()
        return node

    @classmethod
    def restart_stopped(cls, directory: Path, *, node_count: int) -> tuple[LocalCluster, list[str]]:
        """The stopped cluster recorded in `directory`, each node on its recorded ports where
        all are free, else on new free ones (its node then registers its new addresses and
        the others dial them); with what moved, in words. Nodes that still run are left as
        they are (`start` skips them), so this also restarts the nodes of a cluster that
        stopped or crashed on their own. Raises ValueError when `node_count` is not its voter
        count."""
        cluster = cls.load(directory)
        voters = [n for n in cluster.nodes.values() if not n.observer]
        if len(voters) != node_count:
            raise ValueError(
                f"--nodes {node_count}: {directory} holds a cluster of {len(voters)} voter "
                f"nodes ({sorted(n.node_id for n in voters)}); start it with --nodes "
                f"{len(voters)}, or use another --dir"
            )
        moved = []
        taken = {p for n in cluster.nodes.values() for p in _ports(n)}
        for node in cluster.nodes.values():
            if cluster.is_running(node.node_id) or all(_port_free(port) for port in _ports(node)):
                continue
            old = "/".join(str(port) for port in _ports(node))
            base = _free_port_base_outside(taken)
            node.client_port, node.raft_port = base + 1, base + 1 + RAFT_PORT_OFFSET
            node.metrics_port = base + 1 + METRICS_PORT_OFFSET if node.metrics_port else 0
            taken |= set(_ports(node))
            new = "/".join(str(port) for port in _ports(node))
            moved.append(f"node {node.node_id} moved from ports {old} (taken) to {new}")
        cluster.save()
        return cluster, moved

    def save(self) -> None:
        data = {
            "cluster_id": self.cluster_id,
            "bootstrap": self.bootstrap,
            "kafka_bootstrap": self.kafka_bootstrap,
            "nodes": [asdict(n) for n in self.nodes.values()],
            "node_flags": list(self.node_flags),
        }
        tmp = self.directory / (CLUSTER_FILE + ".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        tmp.replace(self.directory / CLUSTER_FILE)

    def command(self, node: NodeProcess, *extra: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "raftlog",
            "serve",
            "--node-id",
            str(node.node_id),
            "--data-dir",
            node.data_dir,
            "--listen",
            node.client_address,
            "--raft-listen",
            f"127.0.0.1:{node.raft_port}",
            "--peers",
            self.peers,
            "--cluster-id",
            self.cluster_id,
            *self.node_flags,
            *("--bootstrap", self._voter_addresses()),
            *(("--metrics-listen", node.metrics_address) if node.metrics_port else ()),
            *(("--kafka-listen", f"127.0.0.1:{node.kafka_port}") if node.kafka_port else ()),
            *extra,
        ]

    def _voter_addresses(self) -> str:
        return ",".join(n.client_address for n in self.nodes.values() if not n.observer)

    def start_node(self, node_id: int, *extra: str) -> NodeProcess:
        node = self.nodes[node_id]
        if node.pid and _alive(node.pid):
            return node
        ended = self._processes.pop(node_id, None)
        if ended is not None:
            ended.wait()  # it exited on its own: collect it before starting its successor
        log = open(node.log_file, "ab")  # noqa: SIM115 (handed to the child)
        process = subprocess.Popen(
            self.command(node, *extra),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        self._processes[node_id] = process
        node.pid = process.pid
        self.save()
        return node

    def start(self, *extra: str) -> None:
        """Start every node that does not run already."""
        for node_id in self.nodes:
            if not self.is_running(node_id):
                self.start_node(node_id, *extra)

    def kill_node(self, node_id: int, *, sig: int = signal.SIGKILL) -> None:
        node = self.nodes[node_id]
        if node.pid and _alive(node.pid):
            os.kill(node.pid, sig)
            self._reap(node_id, timeout_s=10.0)
        node.pid = 0
        self.save()

    def _reap(self, node_id: int, *, timeout_s: float) -> None:
        process = self._processes.pop(node_id, None)
        pid = self.nodes[node_id].pid
        if process is None:
            _reap(pid, timeout_s=timeout_s)
            return
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)

    def stop(self) -> None:
        for node in self.nodes.values():
            if node.pid and _alive(node.pid):
                os.kill(node.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for node in self.nodes.values():
            if node.pid:
                self._reap(node.node_id, timeout_s=max(0.1, deadline - time.monotonic()))
                if _alive(node.pid):
                    os.kill(node.pid, signal.SIGKILL)
                    _reap(node.pid, timeout_s=5)
            node.pid = 0
        self.save()

    def is_running(self, node_id: int) -> bool:
        pid = self.nodes[node_id].pid
        return bool(pid) and _alive(pid)


def _ports(node: NodeProcess) -> tuple[int, ...]:
    """The ports `node` listens on: client, raft, and metrics when it serves them."""
    return (node.client_port, node.raft_port) + ((node.metrics_port,) if node.metrics_port else ())


def _free_port_base_outside(excluded: set[int]) -> int:
    """A base for one node (client base+1, raft and metrics twins) free now and outside
    `excluded` (ports of stopped nodes of the same cluster, free now but theirs)."""
    offsets = (0, RAFT_PORT_OFFSET, METRICS_PORT_OFFSET, KAFKA_PORT_OFFSET)
    for start in range(10000, _ephemeral_port_low(), 200):
        try:
            base = free_port_base(1, start=start)
        except RuntimeError:
            break  # no block left above `start`
        if not excluded & {base + 1 + offset for offset in offsets}:
            return base
    raise RuntimeError(f"no free ports for a node outside {sorted(excluded)}")


def _alive(pid: int) -> bool:
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
        if waited == pid:
            return False
    except ChildProcessError:
        pass  # not our child (started by an earlier command): fall back to a signal probe
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return False


def _reap(pid: int, *, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return
        time.sleep(0.02)
