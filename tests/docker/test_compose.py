"""The compose clusters, end to end: image, health checks, volumes and a produce/consume trip.

Theory of operation. The test builds raftlog:local with `make image` when it is missing (253 s
measured from nothing here: the debootstrap base, wheels, the docker build; later runs reuse the
image and take about 30 s; `.ci/run` builds it beside `make install`, before the suite), starts
deploy/compose-3.yml under a project name of its own, waits until every container's health check
passes and the metadata quorum has a controller, then produces keyed records with acks=all from the
host through the published client ports and reads every partition back: each acknowledged record
must come back exactly once, at its acknowledged offset, in offset order. Then `down` removes the
containers and the network (the volumes stay) and `up` recreates them, one node at a time in the
reverse order so that they come back on other addresses, as containers, pods and moved VMs do: the
topic and every acknowledged record must be there and produce must work. `down -v` removes the
containers, the network and the volumes even when the test fails.

So that it can run while someone else's compose cluster or local cluster is up, the test picks
the published ports (9091-9093 when free) and the private subnet (one not used by any docker
network) and passes them through the compose files' RAFTLOG_* variables. Only a missing docker
engine skips; a missing compose tool or a failed image build fails.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from raftlog.client import Admin, Consumer, Producer, RecordMetadata
from raftlog.cluster_cli import wait_for_controller

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
IMAGE = "raftlog:local"
NODE_COUNT = 3
RECORD_COUNT = 200
HEALTHY_TIMEOUT_S = 120.0


def _run(argv: list[str], *, timeout_s: float, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=REPO, check=False
    )
    assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr}"
    return done.stdout


def _docker_engine_missing() -> str | None:
    if shutil.which("docker") is None:
        return "no docker CLI on PATH"
    try:
        info = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"docker info did not answer: {error}"
    if info.returncode != 0:
        return f"no docker engine: {info.stderr.strip()[:200]}"
    return None


def _compose_command() -> list[str]:
    # Compose v2 is a docker CLI plugin; v1 is the standalone docker-compose (this machine's).
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        probe = subprocess.run(
            ["docker", "compose", "version"], capture_output=True, timeout=20, check=False
        )
        if probe.returncode == 0:
            return ["docker", "compose"]
    standalone = shutil.which("docker-compose")
    assert standalone is not None, (
        "a docker engine is present but neither `docker compose` nor docker-compose is installed"
    )
    return [standalone]


def _ensure_image() -> None:
    found = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True, check=False)
    if found.returncode == 0:
        return
    started = time.monotonic()
    _run(["make", "image"], timeout_s=1500)
    print(f"make image built {IMAGE} in {time.monotonic() - started:.0f} s")


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _free_ports(count: int, *, first: int = 9091) -> list[int]:
    preferred = [first + n for n in range(count)]
    if all(_port_free(port) for port in preferred):
        return preferred
    ports: list[int] = []
    with contextlib.ExitStack() as stack:
        for _ in range(count):
            holder = stack.enter_context(socket.socket())
            holder.bind(("0.0.0.0", 0))
            ports.append(holder.getsockname()[1])
    assert len(set(ports)) == count, ports
    return ports


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 172.29.0.0/16 that no docker network overlaps (the chaos backend uses 172.28)."""
    names = _run(["docker", "network", "ls", "--quiet"], timeout_s=30).split()
    taken: list[ipaddress.IPv4Network] = []
    if names:
        for network in json.loads(_run(["docker", "network", "inspect", *names], timeout_s=30)):
            for config in (network.get("IPAM") or {}).get("Config") or []:
                with contextlib.suppress(ValueError, KeyError):
                    taken.append(ipaddress.IPv4Network(config["Subnet"]))
    start = 64 + os.getpid() % 128
    for third in [*range(start, 250), *range(64, start)]:
        candidate = ipaddress.IPv4Network(f"172.29.{third}.0/24")
        if not any(candidate.overlaps(other) for other in taken):
            return candidate
    raise AssertionError(f"no free /24 in 172.29.64.0-172.29.249.0 (taken: {taken})")


@dataclass(frozen=True, slots=True)
class ComposeCluster:
    command: list[str]
    env: dict[str, str]
    ports: list[int]

    def compose(self, *args: str, timeout_s: float = 180) -> str:
        return _run([*self.command, *args], timeout_s=timeout_s, env=self.env)

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def container_ids(self) -> list[str]:
        return self.compose("ps", "--quiet").split()

    def addresses(self) -> dict[str, ipaddress.IPv4Address]:
        """Each service's container's address on the private network."""
        found: dict[str, ipaddress.IPv4Address] = {}
        for container in self.inspect():
            settings, config = container["NetworkSettings"], container["Config"]
            assert isinstance(settings, dict) and isinstance(config, dict)
            (network,) = settings["Networks"].values()
            service = config["Labels"]["com.docker.compose.service"]
            found[service] = ipaddress.IPv4Address(network["IPAddress"])
        return found

    def inspect(self) -> list[dict[str, object]]:
        found: list[dict[str, object]] = json.loads(
            _run(["docker", "inspect", *self.container_ids()], timeout_s=30)
        )
        return found


def _health(container: dict[str, object]) -> str:
    state = container["State"]
    assert isinstance(state, dict), state
    return str((state.get("Health") or {}).get("Status", "none"))


def _wait_healthy(cluster: ComposeCluster) -> float:
    """Seconds until every container's health check passed (a bounded poll of docker)."""
    started = time.monotonic()
    statuses: list[str] = []
    while time.monotonic() - started < HEALTHY_TIMEOUT_S:
        statuses = [_health(c) for c in cluster.inspect()]
        if len(statuses) == NODE_COUNT and set(statuses) == {"healthy"}:
            return time.monotonic() - started
        assert "unhealthy" not in statuses, statuses
        time.sleep(1)  # docker runs the checks every 5 s; nothing to wait on but the clock
    raise AssertionError(f"not healthy within {HEALTHY_TIMEOUT_S:.0f} s: {statuses}")


@pytest.fixture
def compose_cluster() -> Iterator[ComposeCluster]:
    reason = _docker_engine_missing()
    if reason is not None:
        pytest.skip(f"docker compose test needs a docker engine: {reason}")
    command = _compose_command()
    _ensure_image()
    subnet = _free_subnet()
    gateway = str(next(subnet.hosts()))
    ports = _free_ports(NODE_COUNT)
    env = dict(os.environ)
    env.update(
        {
            "RAFTLOG_IMAGE": IMAGE,
            "RAFTLOG_SUBNET": str(subnet),
            "RAFTLOG_GATEWAY": gateway,
            "RAFTLOG_ADVERTISE_HOST": gateway,
            **{f"RAFTLOG_NODE{n + 1}_PORT": str(port) for n, port in enumerate(ports)},
            # The Kafka listeners' host ports (compose default 1909N) must be free too.
            **{
                f"RAFTLOG_NODE{n + 1}_KAFKA_PORT": str(port)
                for n, port in enumerate(_free_ports(NODE_COUNT, first=19091))
            },
        }
    )
    project = f"raftlog-test-{os.getpid()}"
    cluster = ComposeCluster([*command, "-f", "deploy/compose-3.yml", "-p", project], env, ports)
    try:
        started = time.monotonic()
        cluster.compose("up", "-d")
        print(f"compose up -d: {time.monotonic() - started:.1f} s")
        yield cluster
    finally:
        # Logs first (they go with the containers), but never at the cost of the teardown.
        logs = subprocess.run(
            [*cluster.command, "logs", "--no-color", "--tail", "20"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            cwd=REPO,
            check=False,
        ).stdout
        started = time.monotonic()
        cluster.compose("down", "-v", "--remove-orphans")
        print(f"compose down -v: {time.monotonic() - started:.1f} s\nlast logs:\n{logs}")
        volumes = _run(["docker", "volume", "ls", "--quiet"], timeout_s=30).split()
        assert not [v for v in volumes if v.startswith(f"{project}_")], volumes


def _produce(bootstrap: str, topic: str) -> dict[tuple[int, int], bytes]:
    acknowledged: dict[tuple[int, int], bytes] = {}
    with Producer(bootstrap, acks="all") as producer:
        futures = [
            (value, producer.send(topic, value=value, key=value[:6]))
            for value in (f"key{n % 10:03d}-{n:05d}".encode() for n in range(RECORD_COUNT))
        ]
        producer.flush()
        for value, future in futures:
            meta: RecordMetadata = future.result(timeout=30)
            assert (meta.partition, meta.offset) not in acknowledged, meta
            acknowledged[(meta.partition, meta.offset)] = value
    return acknowledged


def _read_partition(
    bootstrap: str, topic: str, partition: int, count: int
) -> list[tuple[int, bytes]]:
    with Consumer(bootstrap) as consumer:
        consumer.assign([(topic, partition)])
        consumer.seek_to_beginning((topic, partition))
        read: list[tuple[int, bytes]] = []
        for _ in range(60):  # at most 60 one-second polls; each returns as soon as data arrives
            read += [(r.offset, r.value or b"") for r in consumer.poll(timeout_ms=1000)]
            if len(read) >= count:
                break
        return read


def test_a_three_node_compose_cluster_serves_a_produce_consume_round_trip(
    compose_cluster: ComposeCluster,
) -> None:
    cluster = compose_cluster
    healthy_s = _wait_healthy(cluster)
    started = time.monotonic()
    controller = wait_for_controller(cluster.bootstrap, timeout_s=60)
    print(
        f"healthy after {healthy_s:.1f} s, controller {controller} after a further "
        f"{time.monotonic() - started:.1f} s"
    )
    for container in cluster.inspect():
        host_config = container["HostConfig"]
        assert isinstance(host_config, dict)
        assert host_config["RestartPolicy"]["Name"] == "unless-stopped", host_config
        mounts = container["Mounts"]
        assert isinstance(mounts, list)
        assert [(m["Type"], m["Destination"]) for m in mounts] == [("volume", "/data")], mounts

    topic = "compose-round-trip"
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=3, replication_factor=3)
    started = time.monotonic()
    acknowledged = _produce(cluster.bootstrap, topic)
    produced_s = time.monotonic() - started
    assert len(acknowledged) == RECORD_COUNT

    started = time.monotonic()
    for partition in range(3):
        expected = sorted((o, v) for (p, o), v in acknowledged.items() if p == partition)
        read = _read_partition(cluster.bootstrap, topic, partition, len(expected))
        assert read == expected, f"partition {partition}: read {read[:5]}..., want {expected[:5]}"
    print(
        f"{RECORD_COUNT} records: produced (acks=all) in {produced_s:.2f} s, "
        f"read back in {time.monotonic() - started:.2f} s"
    )
    _recreate_and_check(cluster, topic, acknowledged)


def _recreate_and_check(
    cluster: ComposeCluster, topic: str, acknowledged: dict[tuple[int, int], bytes]
) -> None:
    """`down` (containers and network removed, volumes kept), then `up` one node at a time:
    new containers on other addresses; nothing acknowledged may be lost."""
    before_ids, before_addresses = set(cluster.container_ids()), cluster.addresses()
    started = time.monotonic()
    cluster.compose("down")
    assert not cluster.container_ids(), "down removes the containers"
    # Docker hands a new network's addresses out in start order: starting the nodes in
    # their old address order shifted by one gives every node another's old address.
    by_address = sorted(before_addresses, key=lambda service: before_addresses[service])
    for service in [*by_address[1:], by_address[0]]:
        cluster.compose("up", "-d", service)
    _wait_healthy(cluster)
    wait_for_controller(cluster.bootstrap, timeout_s=60)
    after_addresses = cluster.addresses()
    print(
        f"down and up again: {time.monotonic() - started:.1f} s; addresses "
        f"{before_addresses} -> {after_addresses}"
    )
    assert not before_ids & set(cluster.container_ids()), "up created new containers"
    moved = [s for s in after_addresses if after_addresses[s] != before_addresses[s]]
    assert moved, "the nodes came back on other addresses"
    with Admin(cluster.bootstrap) as admin:
        assert topic in admin.list_topics()
    for partition in range(3):
        expected = sorted((o, v) for (p, o), v in acknowledged.items() if p == partition)
        read = _read_partition(cluster.bootstrap, topic, partition, len(expected))
        assert read[: len(expected)] == expected, f"partition {partition} after recreation"
    again = _produce(cluster.bootstrap, topic)
    assert len(again) == RECORD_COUNT and not again.keys() & acknowledged.keys()


def test_the_five_node_compose_file_has_a_volume_and_health_check_per_node() -> None:
    reason = _docker_engine_missing()
    if reason is not None:
        pytest.skip(f"docker compose test needs a docker engine: {reason}")
    compose = [*_compose_command(), "-f", "deploy/compose-5.yml", "config"]
    nodes = [f"node{n}" for n in range(1, 6)]
    assert _run([*compose, "--services"], timeout_s=60).split() == nodes
    assert _run([*compose, "--volumes"], timeout_s=60).split() == [f"{n}-data" for n in nodes]
    config = _run(compose, timeout_s=60)
    peers = ",".join(f"{n + 1}={node}:9191" for n, node in enumerate(nodes))
    assert config.count(f"--peers={peers}") == 5, config
    assert config.count("healthcheck:") == 5 and config.count("unless-stopped") == 5, config
