"""Prometheus metrics of a real 3-node cluster: promtool accepts every node's exposition, the
figures agree with the cluster, and a real Prometheus server scraping it sees partitions
become under-replicated when a node is SIGKILLed.

promtool and prometheus come from the Debian package `prometheus` (`.ci/run` installs it);
without them those tests skip, naming the package.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from raftlog.cli import main
from raftlog.client import Admin, Consumer, Producer
from raftlog.local_cluster import LocalCluster, NodeProcess, _port_free, free_port_base
from raftlog.metrics.node import CONNECTIONS_MAX
from tests.integration.conftest import start_cluster, wait_until

TOPIC = "watched"
PARTITIONS = 6
GROUP = "watchers"

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool not found: apt-get install prometheus (Debian package; .ci/run does it)",
)
needs_prometheus = pytest.mark.skipif(
    shutil.which("prometheus") is None,
    reason="prometheus not found: apt-get install prometheus (Debian package; .ci/run does it)",
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = start_cluster(tmp_path_factory.mktemp("metrics"), 3)
    try:
        with Admin(cluster.bootstrap) as admin:
            admin.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=3)
        producer = Producer(cluster.bootstrap)
        for i in range(60):
            producer.send(TOPIC, value=b"%d" % i, partition=i % PARTITIONS)
        producer.flush()
        producer.close()
        committer = Consumer(cluster.bootstrap, group_id=GROUP)
        committer.assign([(TOPIC, 0)])
        committer.commit({(TOPIC, 0): 4})
        committer.close()
        yield cluster
    finally:
        cluster.stop()


def scrape(node: NodeProcess) -> str:
    with urllib.request.urlopen(f"http://{node.metrics_address}/metrics", timeout=10) as reply:
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("text/plain")
        return str(reply.read().decode())


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(text: str, name: str, **labels: str) -> float:
    return samples(text)[(name, tuple(sorted(labels.items())))]


def value_or_zero(text: str, name: str, **labels: str) -> float:
    """For counters with labels, which appear once something was counted."""
    return samples(text).get((name, tuple(sorted(labels.items()))), 0.0)


@needs_promtool
def test_promtool_accepts_every_node(cluster: LocalCluster) -> None:
    for node in cluster.nodes.values():
        text = scrape(node)
        checked = subprocess.run(
            ["promtool", "check", "metrics"], input=text.encode(), capture_output=True, timeout=30
        )
        problems = (checked.stdout + checked.stderr).decode()
        assert checked.returncode == 0, f"node {node.node_id}: {problems}"
        assert not problems.strip(), f"node {node.node_id}: {problems}"


def test_metrics_agree_with_the_cluster(cluster: LocalCluster) -> None:
    def settled() -> bool:
        texts = [scrape(node) for node in cluster.nodes.values()]
        leaders = sum(
            value(t, "raftlog_partition_leader", topic=TOPIC, partition=str(p))
            for t in texts
            for p in range(PARTITIONS)
        )
        return leaders == PARTITIONS and all(
            value(t, "raftlog_partitions_under_replicated") == 0
            and value(t, "raftlog_partitions_offline") == 0
            for t in texts
        )

    wait_until(
        settled, timeout_s=30, what="one leader a partition, none under-replicated or offline"
    )
    texts = {node.node_id: scrape(node) for node in cluster.nodes.values()}
    assert sum(value(t, "raftlog_controller") for t in texts.values()) == 1
    total_records = 0
    for text in texts.values():
        assert value(text, "raftlog_partitions") == PARTITIONS
        assert value(text, "raftlog_raft_groups") == PARTITIONS + 1  # and the metadata group
        assert value(text, "raftlog_partitions_offline") == 0
        for p in range(PARTITIONS):
            labels = {"topic": TOPIC, "partition": str(p)}
            if value(text, "raftlog_partition_leader", **labels) == 1:
                # 10 records a partition: high watermark 10 (Raft's no-ops take no offset).
                assert value(text, "raftlog_partition_high_watermark", **labels) == 10
                assert value(text, "raftlog_partition_in_sync_replicas", **labels) == 3
                assert value(text, "raftlog_partition_log_size_bytes", **labels) > 0
                total_records += 1
    assert total_records == PARTITIONS
    produced = sum(value(t, "raftlog_produce_bytes_total") for t in texts.values())
    assert produced > 0
    produce_ok = {"protocol": "grpc", "api": "raftlog.v1.Log/Produce", "code": "OK"}
    assert sum(value_or_zero(t, "raftlog_requests_total", **produce_ok) for t in texts.values())
    # Every acknowledged produce batch was timed stage by stage on its leader; the stages
    # of the critical path add up to the total (raftlog.runtime.produce_trace).
    stage = "raftlog_produce_stage_duration_seconds"
    batches = sum(
        value_or_zero(t, f"{stage}_count", protocol="grpc", stage="total") for t in texts.values()
    )
    assert batches > 0
    for text in texts.values():
        count = value_or_zero(text, f"{stage}_count", protocol="grpc", stage="total")
        path = ("queue", "pass_wait", "send", "write", "quorum", "apply", "respond")
        for name in (*path, "fsync", "replicate"):
            assert value_or_zero(text, f"{stage}_count", protocol="grpc", stage=name) == count
        if count:
            total_s = value(text, f"{stage}_sum", protocol="grpc", stage="total")
            path_s = sum(value(text, f"{stage}_sum", protocol="grpc", stage=n) for n in path)
            assert path_s == pytest.approx(total_s, rel=1e-6)
    won = sum(value(t, "raftlog_raft_elections_won_total") for t in texts.values())
    assert won >= PARTITIONS + 1
    controller = next(t for t in texts.values() if value(t, "raftlog_controller") == 1)
    group_labels = {"group": GROUP, "topic": TOPIC, "partition": "0"}
    assert value(controller, "raftlog_consumer_group_committed_offset", **group_labels) == 4
    assert value(controller, "raftlog_consumer_group_lag_offsets", **group_labels) == 6


def test_failed_requests_count_with_their_status(cluster: LocalCluster) -> None:
    node = cluster.nodes[1]
    with Admin(node.client_address) as admin, pytest.raises(Exception):  # noqa: B017
        admin.describe_topic("no-such-topic")
    failed = {
        labels: count
        for (name, labels), count in samples(scrape(node)).items()
        if name == "raftlog_requests_total" and dict(labels)["code"] != "OK"
    }
    assert any(dict(labels)["api"].endswith("/DescribeTopic") for labels in failed), failed


def test_the_endpoint_refuses_what_it_does_not_serve(cluster: LocalCluster) -> None:
    node = cluster.nodes[1]
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"http://{node.metrics_address}/nothing", timeout=10)
    refused.value.close()
    assert refused.value.code == 404
    request = urllib.request.Request(f"http://{node.metrics_address}/metrics", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    refused.value.close()
    assert refused.value.code == 405


def test_cluster_status_shows_replication_and_group_lag(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["cluster", "status", "--dir", str(cluster.directory)]) == 0
    out = capsys.readouterr().out
    assert "replication: 0 under-replicated partitions" in out, out
    for node_id in cluster.nodes:
        assert f"  node {node_id}: 0 under-replicated, 0 without a leader" in out, out
    # 10 records in partition 0 (high watermark 10, whatever its leaders' no-ops), committed
    # at 4.
    lag = re.search(rf"^  {GROUP} {TOPIC}-0: committed 4 lag (\d+)$", out, re.MULTILINE)
    assert lag is not None and int(lag.group(1)) == 6, out


def test_connections_at_once_are_bounded(cluster: LocalCluster) -> None:
    node = cluster.nodes[2]
    address = ("127.0.0.1", node.metrics_port)
    idle = [socket.create_connection(address, timeout=10) for _ in range(CONNECTIONS_MAX)]

    def refused() -> bool:
        try:
            scrape(node)
        except OSError:
            return True
        return False

    try:
        wait_until(refused, timeout_s=4, what=f"a scrape refused beside {CONNECTIONS_MAX} idle")
    finally:
        for connection in idle:
            connection.close()
    wait_until(lambda: not refused(), timeout_s=10, what="scrapes served again")


def test_a_taken_metrics_port_stops_the_node_naming_it(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        base = free_port_base(1)
        node = subprocess.run(
            [sys.executable, "-m", "raftlog", "serve", "--node-id", "1",
             "--data-dir", str(tmp_path / "d"), "--listen", f"127.0.0.1:{base + 1}",
             "--peers", f"1=127.0.0.1:{base + 101}", "--metrics-listen", f"127.0.0.1:{port}"],
            capture_output=True,
            timeout=60,
        )  # fmt: skip
    assert node.returncode == 2, node.stderr.decode()
    assert f"--metrics-listen 127.0.0.1:{port}:" in node.stderr.decode()


# -- a real Prometheus server ------------------------------------------------------------------


def _free_port() -> int:
    for port in range(19090, 19990, 7):
        if _port_free(port):
            return port
    raise RuntimeError("no free port for prometheus in 19090-19990")


@pytest.fixture
def prometheus(cluster: LocalCluster, tmp_path: Path) -> Iterator[str]:
    targets = [node.metrics_address for node in cluster.nodes.values()]
    config = tmp_path / "prometheus.yml"
    config.write_text(
        json.dumps(  # YAML is a superset of JSON
            {
                "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                "scrape_configs": [
                    {"job_name": "raftlog", "static_configs": [{"targets": targets}]}
                ],
            }
        )
    )
    port = _free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    server = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=5)
        log.close()


def query(base: str, promql: str) -> float | None:
    """The single value of an instant query, or None while it has no result."""
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    with urllib.request.urlopen(url, timeout=5) as reply:
        answer = json.loads(reply.read())
    assert answer["status"] == "success", answer
    result = answer["data"]["result"]
    return None if not result else float(result[0]["value"][1])


@needs_prometheus
def test_prometheus_sees_under_replicated_partitions_after_a_kill(
    cluster: LocalCluster, prometheus: str
) -> None:
    under_replicated = "sum(raftlog_partitions_under_replicated)"
    wait_until(
        lambda: (
            query(prometheus, 'count(up{job="raftlog"} == 1)') == 3
            and query(prometheus, under_replicated) == 0
        ),
        timeout_s=60,
        what="Prometheus scraping all 3 nodes, no partition under-replicated",
    )
    victim = 3
    cluster.kill_node(victim, sig=signal.SIGKILL)
    killed_at = time.monotonic()
    try:
        wait_until(
            lambda: (
                (query(prometheus, under_replicated) or 0) >= 1
                and query(prometheus, 'count(up{job="raftlog"} == 0)') == 1
            ),
            timeout_s=60,
            what="Prometheus showing under-replicated partitions and one node down",
        )
        # Every partition has a replica on the dead node: all of them are under-replicated
        # once the survivors lead them all.
        wait_until(
            lambda: query(prometheus, under_replicated) == PARTITIONS,
            timeout_s=60,
            what=f"all {PARTITIONS} partitions under-replicated",
        )
        print(f"under-replicated seen {time.monotonic() - killed_at:.1f}s after the kill")
    finally:
        cluster.start_node(victim)
    wait_until(
        lambda: query(prometheus, under_replicated) == 0,
        timeout_s=60,
        what="no partition under-replicated once the node is back",
    )
