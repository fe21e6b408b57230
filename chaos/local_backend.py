"""The local backend: real node processes on loopback, faults by signals and the chaos hook.

Theory of operation. `LocalBackend.start` creates a `LocalCluster` under `DIR/cluster`, starts
every node with `--chaos` (which gives its node-to-node transport a fault injector) and waits
for a controller; its clients are raftlog's own (`client="grpc"`) or confluent-kafka on every
node's Kafka listener (`client="kafka"`). Crashes are SIGKILL (restart: start the process again
on the same data directory), pauses are SIGSTOP/SIGCONT, and network faults are rules sent to
each node's `Internal.SetFaults`, which also moves a node's wall clock. Loss of unsynced
writes: after a SIGKILL, `lose_unsynced` cuts the node's files back to what it fsynced, from
the manifest its --chaos file port keeps (`raftlog.storage.chaos_file_system.cut_to_durable`).
`unsafe_skip_fsync` starts every node with --chaos-skip-fsync (the deliberately unsafe node).
Membership: `observers` nodes outside the metadata quorum's voters start with the cluster,
`add_node` starts one more under load, `remove_node` decommissions one
(Admin.DecommissionNode), waits for it and stops it for good; `node_ids` is always the nodes
the run still has. No root and no Docker are needed. Every control call is bounded by
`control_timeout_s` and reports failure as False instead of raising: a nemesis acting on a node
that is down (or paused, so its gRPC server cannot answer) must not stop the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from raftlog.chaos.clients import LogClients
from raftlog.chaos.consumer_groups import RaftlogGroupClients
from raftlog.chaos.corrupt import damage_node_files
from raftlog.chaos.kafka_proxy import KafkaDelayProxy
from raftlog.chaos.nemesis import OBSERVERS_MAX
from raftlog.client import Admin
from raftlog.client.errors import ClientError
from raftlog.cluster_cli import reassign_partition, wait_for_controller
from raftlog.local_cluster import LocalCluster
from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.rpc.v1 import raftlog_pb2_grpc as pb_grpc
from raftlog.storage.chaos_file_system import cut_to_durable
from raftlog.storage.file_system import OsFileSystem

__all__ = [
    "LocalBackend",
    "lookup_controller",
    "lookup_leader",
    "lookup_replicas",
    "reassign",
    "send_fault_rules",
]


class LocalBackend:
    """`ClusterControl` over a `LocalCluster`; `start` returns the clients for it."""

    def __init__(
        self,
        directory: Path,
        *,
        node_count: int,
        topic: str,
        base_port: int | None = None,
        control_timeout_s: float = 2.0,
        unsafe_skip_fsync: bool = False,
        observers: int = 0,
        rebalance_grace_ms: int | None = None,
        scrub_round_pause_ms: int | None = None,
        client: str = "grpc",
        group_session_timeout_ms: int | None = None,
        cleaner_interval_ms: int | None = None,
        kafka_proxy: bool = False,
    ) -> None:
        assert node_count in (1, 3, 5), node_count
        assert client in ("grpc", "kafka"), client
        self._client = client
        assert 0 <= observers <= OBSERVERS_MAX, observers
        self._cluster = LocalCluster.create(
            directory / "cluster", node_count=node_count, base_port=base_port
        )
        for _ in range(observers):
            self._cluster.add_observer()
        self._removed: set[int] = set()  # decommissioned and stopped for good
        self.node_ids: Sequence[int] = sorted(self._cluster.nodes)
        self.topic = topic
        self._timeout_s = control_timeout_s
        self._paused: set[int] = set()
        self._serve_flags: tuple[str, ...] = (
            ("--chaos", "--chaos-skip-fsync") if unsafe_skip_fsync else ("--chaos",)
        )
        if rebalance_grace_ms is not None:
            # add-node: the new node gets replicas within a run, not after the 30 s default.
            self._serve_flags += ("--set", f"metadata.rebalance_grace_ms={rebalance_grace_ms}")
        if group_session_timeout_ms is not None:
            # Consumer groups: a new controller grants partitions only a session timeout
            # after it took over, so the default 10 s would leave a short run's members idle;
            # for the same reason classic groups (Kafka clients) skip Kafka's 3 s initial
            # rebalance delay, which each new controller would start over.
            self._serve_flags += (
                "--set", f"metadata.group_session_timeout_ms={group_session_timeout_ms}",
                "--set", f"metadata.group_heartbeat_interval_ms={group_session_timeout_ms // 6}",
                "--set", "kafka.group_initial_rebalance_delay_ms=0",
            )  # fmt: skip
        if scrub_round_pause_ms is not None:
            # corrupt: a damaged closed segment is found by the scrubber within the run, not
            # a minute later.
            self._serve_flags += ("--set", f"scrub_round_pause_ms={scrub_round_pause_ms}")
        if cleaner_interval_ms is not None:
            # The keyed workload: compacted partitions are cleaned many times within a run.
            self._serve_flags += ("--set", f"cleaner_interval_ms={cleaner_interval_ms}")
        self.extra_serve_flags: tuple[str, ...] = ()  # a workload's own settings
        # The transactional workload: every node advertises its proxy's port, so every Kafka
        # connection crosses one (raftlog.chaos.kafka_proxy, the txn-delay nemesis).
        self._proxy_ports: dict[int, int] = {}
        self.kafka_proxy: KafkaDelayProxy | None = None
        if kafka_proxy:
            self._proxy_ports = {n: _free_port() for n in self.node_ids}
            routes = {self._proxy_ports[n]: node.kafka_port
                      for n, node in self._cluster.nodes.items()}  # fmt: skip
            self.kafka_proxy = KafkaDelayProxy(routes)

    @property
    def log_paths(self) -> list[str]:
        """Every node's log file, read after the run for elections and repairs."""
        return [node.log_file for node in self._cluster.nodes.values()]

    def start(self, *, timeout_s: float = 60.0) -> LogClients:
        """Start every node with the run's flags and wait for a controller and every observer;
        returns the clients the backend was made for. Raises TimeoutError after `timeout_s`, with
        the cluster stopped."""
        if self.kafka_proxy is not None:
            self.kafka_proxy.start()
        for node in self._cluster.nodes:
            if not self._cluster.is_running(node):
                self._cluster.start_node(node, *self._flags(node))
        try:
            wait_for_controller(self._cluster.bootstrap, timeout_s=timeout_s)
            self._wait_for_observers(timeout_s)
        except TimeoutError:
            self.stop()
            raise
        if self._client == "kafka":
            from raftlog.chaos.kafka_clients import KafkaClients  # needs confluent-kafka

            return KafkaClients(self.kafka_bootstrap, self._cluster.bootstrap)
        return RaftlogGroupClients(self._cluster.bootstrap)

    def _wait_for_observers(self, timeout_s: float) -> None:
        """Until every observer registered, so the run's topic places replicas on it too."""
        wanted = set(self.observers())
        deadline = time.monotonic() + timeout_s
        with Admin(self._cluster.bootstrap, request_timeout_ms=5000) as admin:
            while wanted:
                with contextlib.suppress(ClientError):
                    alive = {n.node_id for n in admin.describe_cluster().nodes if n.alive}
                    if wanted <= alive:
                        return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"observers {sorted(wanted)} not registered in time")
                time.sleep(0.2)

    def stop(self) -> None:
        """Resume paused nodes, then stop every node."""
        for node in list(self._paused):
            self.resume(node)
        self._cluster.stop()
        if self.kafka_proxy is not None:
            self.kafka_proxy.stop()

    # -- process faults ---------------------------------------------------------------------

    def kill(self, node: int) -> bool:
        """SIGKILL `node`; always True."""
        self._paused.discard(node)
        self._cluster.kill_node(node, sig=signal.SIGKILL)
        return True

    def restart(self, node: int) -> bool:
        """Start `node` again on its data directory unless it runs; False for a decommissioned node,
        which would refuse to rejoin."""
        if node in self._removed:
            return False  # decommissioned: it would refuse to rejoin
        if self._cluster.is_running(node):
            return True
        self._cluster.start_node(node, *self._flags(node))
        return True

    def _flags(self, node: int) -> tuple[str, ...]:
        port = self._proxy_ports.get(node)
        advertise = ("--kafka-advertise", f"127.0.0.1:{port}") if port else ()
        return (*self._serve_flags, *self.extra_serve_flags, *advertise)

    @property
    def kafka_bootstrap(self) -> str:
        """Every node's Kafka address as clients are told it (its proxy's, with one)."""
        if self._proxy_ports:
            return ",".join(f"127.0.0.1:{port}" for port in self._proxy_ports.values())
        return self._cluster.kafka_bootstrap

    def lose_unsynced(self, node: int) -> dict[str, Any] | None:
        """Cut the dead `node`'s files back to what it fsynced; the cut's report, or None while it
        still runs (the kill may have failed)."""
        if self._cluster.is_running(node):
            return None  # only a dead node's files may be cut (the kill may have failed)
        report = cut_to_durable(OsFileSystem(), self._cluster.nodes[node].data_dir)
        return report.describe()

    def corrupt(self, node: int, rng: random.Random) -> dict[str, Any] | None:
        """Damage one data file of the dead `node` (`damage_node_files`); what was done, or None
        while it still runs or has no file to damage."""
        if self._cluster.is_running(node):
            return None  # only a dead node's files may be damaged (the kill may have failed)
        return damage_node_files(self._cluster.nodes[node].data_dir, rng)

    def _signal(self, node: int, sig: int) -> bool:
        pid = self._cluster.nodes[node].pid
        if not pid or not self._cluster.is_running(node):
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
            return True
        return False

    def pause(self, node: int) -> bool:
        """SIGSTOP `node`; False if it is not running."""
        self._paused.add(node)
        return self._signal(node, signal.SIGSTOP)

    def resume(self, node: int) -> bool:
        """SIGCONT `node`; False if it is not running."""
        self._paused.discard(node)
        return self._signal(node, signal.SIGCONT)

    # -- network faults and lookups ---------------------------------------------------------

    def set_faults(self, node: int, rules: dict[str, Any]) -> bool:
        """Send `rules` to the node's Internal.SetFaults; False if it is paused, down or did not
        answer within `control_timeout_s`."""
        if node in self._paused or not self._cluster.is_running(node):
            return False
        return send_fault_rules(self._cluster.nodes[node].client_address, rules, self._timeout_s)

    def _answering(self) -> list[str]:
        running = [
            n.client_address
            for n in self._cluster.nodes.values()
            if n.node_id not in self._paused
            and n.node_id not in self._removed
            and self._cluster.is_running(n.node_id)
        ]
        return running or self._cluster.bootstrap.split(",")

    def reassign(self, partition: int, replicas: Sequence[int]) -> str | None:
        """Ask the controller, through the nodes that answer, to move `partition` to `replicas`;
        None once taken, else why not."""
        return reassign(",".join(self._answering()), self.topic, partition, replicas)

    # -- membership -------------------------------------------------------------------------

    def add_node(self) -> int | str:
        """Create and start a new observer node; its id, or why it could not be created (its ports
        are taken)."""
        try:
            node = self._cluster.add_observer()
        except RuntimeError as error:  # its ports are taken (by another program)
            return str(error)
        self._cluster.start_node(node.node_id, *self._serve_flags)
        self.node_ids = sorted(n for n in self._cluster.nodes if n not in self._removed)
        return node.node_id

    def observers(self) -> tuple[int, ...]:
        """The observer nodes not decommissioned by `remove_node`."""
        return tuple(
            n.node_id
            for n in self._cluster.nodes.values()
            if n.observer and n.node_id not in self._removed
        )

    def remove_node(self, node: int, timeout_s: float) -> str | None:
        """Decommission observer `node`, wait up to `timeout_s` until it is, then SIGTERM it for
        good and drop it from `node_ids`; None when done, else why not (the node then keeps
        running)."""
        if node not in self.observers():
            return f"node {node} is not an observer (metadata voters cannot be decommissioned)"
        deadline = time.monotonic() + timeout_s
        try:
            with Admin(self._answering(), request_timeout_ms=10_000) as admin:
                admin.decommission_node(node)
                while time.monotonic() < deadline:
                    with contextlib.suppress(ClientError):
                        described = admin.describe_cluster().nodes
                        if any(
                            n.node_id == node and n.state == "decommissioned" for n in described
                        ):
                            break
                    time.sleep(0.5)
                else:
                    return f"node {node} not decommissioned within {timeout_s:.0f}s"
        except ClientError as error:
            return f"decommission of node {node} refused: {error}"
        self.resume(node)
        self._cluster.kill_node(node, sig=signal.SIGTERM)
        self._removed.add(node)
        self.node_ids = sorted(n for n in self._cluster.nodes if n not in self._removed)
        return None

    def partition_replicas(self, partition: int) -> tuple[int, ...] | None:
        """The partition's replicas, preferred leader first, as the nodes that answer report them;
        None without an answer."""
        return lookup_replicas(self._answering(), self.topic, partition, self._timeout_s)

    def partition_leader(self, partition: int) -> int | None:
        """The partition's leader as the nodes that answer report it; None without an answer or for
        a node this run no longer has."""
        leader = lookup_leader(self._answering(), self.topic, partition, self._timeout_s)
        return leader if leader in self.node_ids else None

    def controller(self) -> int | None:
        """The controller as the nodes that answer report it; None without an answer or for a node
        this run no longer has."""
        controller = lookup_controller(self._answering(), self._timeout_s)
        return controller if controller in self.node_ids else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def send_fault_rules(address: str, rules: dict[str, Any], timeout_s: float) -> bool:
    """Internal.SetFaults at one node (started with --chaos); False if it did not answer."""
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.InternalStub(channel)  # type: ignore[no-untyped-call]
        try:
            stub.SetFaults(pb.SetFaultsRequest(rules_json=json.dumps(rules)), timeout=timeout_s)
        except grpc.RpcError:
            return False
    return True


def lookup_leader(addresses: list[str], topic: str, partition: int, timeout_s: float) -> int | None:
    """The partition's leader as the cluster reports it; None when no answer came in time."""
    try:
        with Admin(addresses, request_timeout_ms=int(timeout_s * 1000)) as admin:
            return admin.describe_topic(topic).partitions[partition].leader
    except Exception:  # a lookup during a fault may fail: the nemesis then picks at random
        return None


def lookup_replicas(
    addresses: list[str], topic: str, partition: int, timeout_s: float
) -> tuple[int, ...] | None:
    """The partition's replicas (the preferred leader first); None when no answer came."""
    try:
        with Admin(addresses, request_timeout_ms=int(timeout_s * 1000)) as admin:
            return tuple(admin.describe_topic(topic).partitions[partition].replicas)
    except Exception:  # a lookup during a fault may fail: the move is then skipped
        return None


# How long a move may wait for a controller to take it (an election may be under way).
REASSIGN_TIMEOUT_S = 10.0


def reassign(bootstrap: str, topic: str, partition: int, replicas: Sequence[int]) -> str | None:
    """Start a move (`raftlog cluster reassign`); None when taken, else the reason."""
    try:
        reassign_partition(
            bootstrap, topic, partition, list(replicas), timeout_s=REASSIGN_TIMEOUT_S
        )
    except (ValueError, TimeoutError) as error:
        return str(error)
    return None


def lookup_controller(addresses: list[str], timeout_s: float) -> int | None:
    """The controller's node id as the nodes at `addresses` report it; None when none answered
    within `timeout_s` (never raises)."""
    try:
        with Admin(addresses, request_timeout_ms=int(timeout_s * 1000)) as admin:
            return admin.describe_cluster().controller_id
    except Exception:
        return None
