"""The docker backend: one container per node on a private Docker network, driven by the CLI.

Theory of operation. `DockerBackend.start` creates a bridge network with a fixed subnet
(`172.28.<k>.0/24`, k from the run directory's name) and one container per node from the
image (default `raftlog:local`, built by `make image`) running
`raftlog serve --chaos`, with a fixed address `172.28.<k>.<10+N>`: client API on 9092, Raft on
9093. On Linux the host routes to a bridge network, so the runner's clients use those
addresses directly and every node advertises the same ones (no port mapping whose host side
would differ from what nodes tell each other).

Faults go through the engine: crash = `docker kill --signal KILL` (restart = `docker start`,
same volume-less container filesystem, so the node's data survives), pause = `docker pause`
(the cgroup freezer, like SIGSTOP), and a node cut off entirely = `docker network
disconnect` when the nemesis isolates every link of one node; other partitions and flaky
links use the same `Internal.SetFaults` hook as the local backend. Every `docker` call has a
timeout and reports failure as False. `unavailable_reason()` says why the backend cannot run
(no docker CLI, no engine, no image) so callers skip cleanly.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import tempfile
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from raftlog.chaos.clients import LogClients
from raftlog.chaos.consumer_groups import RaftlogGroupClients
from raftlog.chaos.corrupt import damage_node_files
from raftlog.chaos.local_backend import (
    lookup_controller,
    lookup_leader,
    lookup_replicas,
    reassign,
    send_fault_rules,
)
from raftlog.cluster_cli import wait_for_controller

__all__ = ["DockerBackend", "unavailable_reason"]

CLIENT_PORT = 9092
RAFT_PORT = 9093


def _docker(*args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout_s, check=False
    )


def unavailable_reason(image: str) -> str | None:
    """None when the docker backend can run with `image`, else why not (for a clean skip)."""
    if shutil.which("docker") is None:
        return "no docker CLI on PATH"
    try:
        info = _docker("info", "--format", "{{.ServerVersion}}", timeout_s=10)
        if info.returncode != 0:
            return f"no docker engine ({info.stderr.strip()[:200]})"
        found = _docker("image", "inspect", image, timeout_s=10)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"docker did not answer: {error}"
    if found.returncode != 0:
        return f"no image {image!r} (`make image` builds it)"
    return None


class DockerBackend:
    """`ClusterControl` over containers; `start` returns the clients for them."""

    def __init__(
        self,
        directory: Path,
        *,
        node_count: int,
        topic: str,
        image: str = "raftlog:local",
        control_timeout_s: float = 2.0,
    ) -> None:
        assert node_count in (1, 3, 5), node_count
        subnet_byte = 16 + zlib.crc32(str(directory.resolve()).encode()) % 200
        self._prefix = f"172.28.{subnet_byte}"
        self._name = f"raftlog-chaos-{subnet_byte}"
        self.node_ids: Sequence[int] = list(range(1, node_count + 1))
        self.topic = topic
        self._image = image
        self._timeout_s = control_timeout_s
        self._disconnected: set[int] = set()
        self._log_dir = directory

    def _ip(self, node: int) -> str:
        return f"{self._prefix}.{10 + node}"

    def _container(self, node: int) -> str:
        return f"{self._name}-n{node}"

    @property
    def _bootstrap(self) -> list[str]:
        return [f"{self._ip(n)}:{CLIENT_PORT}" for n in self.node_ids]

    @property
    def log_paths(self) -> list[str]:
        """Where `stop` writes each container's log, in the run directory."""
        return [str(self._log_dir / f"{self._container(n)}.log") for n in self.node_ids]

    def _serve_command(self, node: int) -> list[str]:
        peers = ",".join(f"{n}={self._ip(n)}:{RAFT_PORT}" for n in self.node_ids)
        return [
            "serve", "--node-id", str(node), "--data-dir", "/data",
            "--listen", f"0.0.0.0:{CLIENT_PORT}", "--advertise", f"{self._ip(node)}:{CLIENT_PORT}",
            "--raft-listen", f"0.0.0.0:{RAFT_PORT}",
            "--raft-advertise", f"{self._ip(node)}:{RAFT_PORT}",
            "--peers", peers, "--cluster-id", self._name, "--chaos",
        ]  # fmt: skip

    def start(self, *, timeout_s: float = 60.0) -> LogClients:
        """Create the network and one container per node, wait for a controller and return the
        clients; raises RuntimeError when docker, its engine or the image is missing or a
        container will not start, TimeoutError without a controller in `timeout_s`."""
        reason = unavailable_reason(self._image)
        if reason is not None:
            raise RuntimeError(f"docker backend: {reason}")
        self.stop()  # leftovers of an earlier run with the same name
        made = _docker("network", "create", "--subnet", f"{self._prefix}.0/24", self._name)
        if made.returncode != 0:
            raise RuntimeError(f"docker network create {self._name}: {made.stderr.strip()}")
        for node in self.node_ids:
            run = _docker(
                "run", "-d", "--name", self._container(node), "--network", self._name,
                "--ip", self._ip(node), self._image, *self._serve_command(node),
            )  # fmt: skip
            if run.returncode != 0:
                self.stop()
                raise RuntimeError(f"docker run node {node}: {run.stderr.strip()}")
        wait_for_controller(",".join(self._bootstrap), timeout_s=timeout_s)
        return RaftlogGroupClients(",".join(self._bootstrap))

    def stop(self) -> None:
        """Save every container's log to `log_paths`, then remove the containers and the network;
        also clears leftovers of an earlier run."""
        for node in self.node_ids:
            logs = _docker("logs", self._container(node))
            if logs.returncode == 0:
                Path(self.log_paths[node - 1]).write_text(logs.stdout + logs.stderr)
            _docker("rm", "-f", self._container(node))
        _docker("network", "rm", self._name)

    def kill(self, node: int) -> bool:
        """`docker kill --signal KILL` the node's container; False if docker failed."""
        return _docker("kill", "--signal", "KILL", self._container(node)).returncode == 0

    def restart(self, node: int) -> bool:
        """`docker start` the node's container, its data kept; False if docker failed."""
        return _docker("start", self._container(node)).returncode == 0

    def pause(self, node: int) -> bool:
        """`docker pause` (the cgroup freezer) the node's container; False if docker failed."""
        return _docker("pause", self._container(node)).returncode == 0

    def resume(self, node: int) -> bool:
        """`docker unpause` the node's container; False if docker failed."""
        return _docker("unpause", self._container(node)).returncode == 0

    def set_faults(self, node: int, rules: dict[str, Any]) -> bool:
        """Apply `rules` to the node: cutting every outgoing link disconnects its container from the
        network, heal reconnects it, anything else goes to its Internal.SetFaults hook. False if the
        hook did not answer."""
        if rules.get("heal") and node in self._disconnected:
            self._disconnected.discard(node)
            _docker("network", "connect", "--ip", self._ip(node), self._name, self._container(node))
        others = set(self.node_ids) - {node}
        cut_off = set(rules.get("block", [])) == others and rules.get("direction") == "outgoing"
        # Every link of this node cut: the engine can do that itself.
        if (
            cut_off
            and _docker("network", "disconnect", self._name, self._container(node)).returncode == 0
        ):
            self._disconnected.add(node)
            return True
        if node in self._disconnected:
            return True  # already cut off entirely: the hook cannot be reached and need not be
        return send_fault_rules(f"{self._ip(node)}:{CLIENT_PORT}", rules, self._timeout_s)

    def corrupt(self, node: int, rng: random.Random) -> dict[str, Any] | None:
        """Copy the stopped container's data out, damage one file, copy it back. A stopped
        container's file cannot be removed from outside, so only flips and truncations."""
        container = self._container(node)
        with tempfile.TemporaryDirectory(prefix="raftlog-corrupt-") as scratch:
            if _docker("cp", f"{container}:/data", scratch, timeout_s=120).returncode != 0:
                return None
            local = os.path.join(scratch, "data")
            report = damage_node_files(local, rng, kinds=("flip", "truncate"))
            if report is None:
                return None
            target = f"{container}:/data/{report['file']}"
            source = os.path.join(local, report["file"])
            if _docker("cp", source, target, timeout_s=120).returncode != 0:
                return None
            return report

    def lose_unsynced(self, node: int) -> dict[str, Any] | None:
        """Always None: cutting files inside a stopped container is not supported, so the kill
        stands alone."""
        # The data lives in the stopped container's own file system: cutting it would need the
        # cut run inside a helper container sharing it. Not done: the kill stands alone.
        return None

    def reassign(self, partition: int, replicas: Sequence[int]) -> str | None:
        """Ask the controller to move `partition` to `replicas`; None once taken, else why not."""
        return reassign(",".join(self._bootstrap), self.topic, partition, replicas)

    def add_node(self) -> int | str:
        """Always refused: containers are fixed at start; the reason."""
        return "docker: containers are fixed at start (add-node needs --backend local)"

    def remove_node(self, node: int, timeout_s: float) -> str | None:
        """Always refused (remove-node needs the local backend); the reason."""
        return "docker: remove-node needs --backend local"

    def observers(self) -> tuple[int, ...]:
        """Always empty: every container is a metadata voter."""
        return ()

    def partition_replicas(self, partition: int) -> tuple[int, ...] | None:
        """The partition's replicas, preferred leader first; None without an answer."""
        return lookup_replicas(self._bootstrap, self.topic, partition, self._timeout_s)

    def partition_leader(self, partition: int) -> int | None:
        """The partition's leader as the nodes report it; None without an answer."""
        leader = lookup_leader(self._bootstrap, self.topic, partition, self._timeout_s)
        return leader if leader in self.node_ids else None

    def controller(self) -> int | None:
        """The controller as the nodes report it; None without an answer."""
        controller = lookup_controller(self._bootstrap, self._timeout_s)
        return controller if controller in self.node_ids else None
