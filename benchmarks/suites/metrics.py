"""Benchmark: the cost of Prometheus metrics with 1,000 partitions on every node.

Theory of operation. A single node (replication factor 1: it leads all 1,000 partitions, and
they settle at once), then 3 nodes with replication factor 3 (every node hosts 1,000 replicas
and leads about a third), metrics on as `cluster up` starts them, one topic of 1,000
partitions, no traffic. Once the leaders settled (the nodes' own metrics show every partition led
and at most `AWAKE_GROUPS_SETTLED_MAX` groups still ticking, i.e. quiesced; at most
`SETTLE_WAIT_S_MAX`), the suite
scrapes every node `SCRAPES` times back to back and reports the exposition's size, its
series count and the scrape's wall time (HTTP round trip on loopback: snapshot on the node's
loop, render on a worker thread, transfer). Then idle CPU per node, from /proc/<pid>/stat as
in the scale suite, over two windows: one unscraped, one scraped every `SCRAPE_INTERVAL_S`
like a Prometheus server would (the goal: at most 0.05 core per node while scraped). The
difference divided by the scrapes in the window is the CPU one scrape costs a node.

In-process, without a cluster: the exposition of a synthetic snapshot of the same shape (1,000
replicas, a third led with 2 followers each, 100 committed consumer-group partitions) is
rendered `RENDERS` times: the render time alone (`prometheus_client.generate_latest`), with
no loop, network or other process competing, so it compares across machines and loads.
"""

from __future__ import annotations

import json
import pathlib
import statistics
import sys
import time
import urllib.request

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from raftlog.client import Admin
from raftlog.local_cluster import LocalCluster
from raftlog.metrics.collector import SnapshotCollector
from raftlog.metrics.snapshot import (
    ConsumerGroupSample,
    FollowerSample,
    NodeSnapshot,
    PartitionSample,
)
from raftlog.types import NodeId

SUITES_DIR = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(SUITES_DIR)]
from _harness import cpu_seconds, create_topic, node_pids, running_cluster  # noqa: E402
from scale import PARTITIONS, SETTLE_S, leader_epochs  # noqa: E402

SCRAPES = 10
RENDERS = 20
SETTLE_WAIT_S_MAX = 240.0
AWAKE_GROUPS_SETTLED_MAX = 10
SCRAPE_INTERVAL_S = 15.0
# The goal is stated over 60 s of scraping (4 scrapes a node); quick runs measure the
# unscraped baseline over 30 s only.
SCRAPED_WINDOW_S = 60.0
UNSCRAPED_WINDOW_S = {True: 30.0, False: 60.0}


def synthetic_snapshot(partitions: int) -> NodeSnapshot:
    samples = tuple(
        PartitionSample(
            topic=f"topic-{p % 10}",
            partition=p,
            is_leader=p % 3 == 0,
            has_leader=True,
            leader_epoch=3,
            high_watermark=1_000_000 + p,
            log_start_offset=500_000,
            log_end_offset=1_000_001 + p,
            size_bytes=1 << 30,
            followers=(FollowerSample(NodeId(2), 0), FollowerSample(NodeId(3), 12))
            if p % 3 == 0
            else (),
            replicas=3 if p % 3 == 0 else 0,
            in_sync_replicas=3 if p % 3 == 0 else 0,
        )
        for p in range(partitions)
    )
    groups = tuple(ConsumerGroupSample(f"g{g}", "topic-0", p, 999_000, 1_000)
                   for g in range(10) for p in range(10))  # fmt: skip
    return NodeSnapshot(NodeId(1), True, partitions + 1, partitions // 3, 0, samples, groups)


def render_figures() -> dict[str, float]:
    registry = CollectorRegistry(auto_describe=False)
    collector = SnapshotCollector()
    registry.register(collector)
    collector.set_snapshot(synthetic_snapshot(PARTITIONS))
    seconds = []
    for _ in range(RENDERS):
        started = time.perf_counter()
        body = generate_latest(registry)
        seconds.append(time.perf_counter() - started)
    print(f"   render of a synthetic 1,000-partition snapshot: {len(body)} bytes", flush=True)
    return {
        "metrics_render_s_p50_synthetic_1000_partitions": statistics.median(seconds),
        "metrics_render_bytes_synthetic_1000_partitions": float(len(body)),
    }


def scrape(cluster: LocalCluster, node_id: int) -> tuple[bytes, float]:
    node = cluster.nodes[node_id]
    started = time.perf_counter()
    with urllib.request.urlopen(f"http://{node.metrics_address}/metrics", timeout=30) as reply:
        body: bytes = reply.read()
    return body, time.perf_counter() - started


def sample_value(body: bytes, name: str) -> float:
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise KeyError(name)


def scrape_figures(cluster: LocalCluster) -> dict[str, float]:
    sizes, seconds, series, captures = [], [], [], []
    for node_id in cluster.nodes:
        scrape(cluster, node_id)  # the first one also imports the parser's code paths
        for _ in range(SCRAPES):
            body, took_s = scrape(cluster, node_id)
            sizes.append(len(body))
            seconds.append(took_s)
            captures.append(sample_value(body, "raftlog_metrics_capture_seconds"))
        families = text_string_to_metric_families(body.decode())
        series.append(sum(len(family.samples) for family in families))
    print(f"   scrape bytes {sizes[::SCRAPES]}, series {series}", flush=True)
    return {
        "metrics_scrape_bytes_1000_partitions": statistics.mean(sizes),
        "metrics_scrape_series_1000_partitions": statistics.mean(series),
        "metrics_scrape_s_p50_1000_partitions": statistics.median(seconds),
        "metrics_scrape_s_max_1000_partitions": max(seconds),
        # How long each scrape held the node's event loop (the node's own gauge).
        "metrics_capture_s_p50_1000_partitions": statistics.median(captures),
        "metrics_capture_s_max_1000_partitions": max(captures),
    }


def cluster_sums(cluster: LocalCluster, *names: str) -> dict[str, float]:
    """Each metric summed over every sample of every node."""
    sums = dict.fromkeys(names, 0.0)
    for node_id in cluster.nodes:
        body, _ = scrape(cluster, node_id)
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                if sample.name in sums:
                    sums[sample.name] += sample.value
    return sums


def wait_settled(cluster: LocalCluster) -> float:
    """Seconds until every partition has a leader and the groups quiesced (or the limit)."""
    started = time.monotonic()
    while time.monotonic() - started < SETTLE_WAIT_S_MAX:
        sums = cluster_sums(cluster, "raftlog_partition_leader", "raftlog_raft_groups_awake")
        led, awake = sums["raftlog_partition_leader"], sums["raftlog_raft_groups_awake"]
        if led == PARTITIONS and awake <= AWAKE_GROUPS_SETTLED_MAX:
            break
        time.sleep(5.0)
    print(f"   {led:.0f} partitions led, {awake:.0f} groups awake", flush=True)
    return time.monotonic() - started


def idle_cores(cluster: LocalCluster, window_s: float, *, scrape_every_s: float | None) -> float:
    """Mean CPU cores per node over `window_s`, scraping every node every `scrape_every_s`."""
    pids = node_pids(cluster)
    before = {node: cpu_seconds(pid) for node, pid in pids.items()}
    started = time.monotonic()
    next_scrape = started
    while (now := time.monotonic()) < started + window_s:
        if scrape_every_s is not None and now >= next_scrape:
            for node_id in pids:
                scrape(cluster, node_id)
            next_scrape += scrape_every_s
        time.sleep(max(0.0, min(next_scrape, started + window_s) - time.monotonic()))
    elapsed_s = time.monotonic() - started
    cores = {node: (cpu_seconds(pid) - before[node]) / elapsed_s for node, pid in pids.items()}
    print(f"   idle CPU cores per node (scraped every {scrape_every_s} s): {cores}", flush=True)
    return sum(cores.values()) / len(cores)


def cluster_figures(out_dir: pathlib.Path, *, node_count: int, quick: bool) -> dict[str, float]:
    """The cluster figures with `node_count` nodes, replication factor `node_count`."""
    work = out_dir / f"metrics-work-{node_count}"
    with running_cluster(work, node_count=node_count) as cluster, Admin(cluster.bootstrap) as admin:
        create_topic(
            admin, "scraped", partitions=PARTITIONS, replication_factor=node_count, wait=False
        )
        settled_s = wait_settled(cluster)
        time.sleep(SETTLE_S)
        figures = scrape_figures(cluster)
        elections = "raftlog_raft_elections_started_total"
        before = cluster_sums(cluster, elections)[elections]
        unscraped = idle_cores(cluster, UNSCRAPED_WINDOW_S[quick], scrape_every_s=None)
        scraped = idle_cores(cluster, SCRAPED_WINDOW_S, scrape_every_s=SCRAPE_INTERVAL_S)
        elections_in_windows = cluster_sums(cluster, elections)[elections] - before
        served = len(leader_epochs(cluster, "scraped", PARTITIONS))
        print(f"   {served} partitions served by a leader (fetch probes)", flush=True)
    scrapes_per_node = SCRAPED_WINDOW_S / SCRAPE_INTERVAL_S
    figures.update(
        {
            "metrics_leaders_settled_s_1000_partitions": settled_s,
            "metrics_elections_in_idle_windows_1000_partitions": elections_in_windows,
            "idle_cpu_cores_per_node_unscraped_1000_partitions": unscraped,
            "idle_cpu_cores_per_node_scraped_15s_1000_partitions": scraped,
            "metrics_scrape_cpu_s_per_node_1000_partitions": max(0.0, scraped - unscraped)
            * SCRAPED_WINDOW_S
            / scrapes_per_node,
        }
    )
    suffix = "" if node_count == 3 else f"_{node_count}_node"
    return {name + suffix: value for name, value in figures.items()}


def run(
    out_dir: pathlib.Path, *, quick: bool, node_counts: tuple[int, ...] = (1, 3)
) -> dict[str, float]:
    """A single node (replication factor 1: it leads all 1,000, which settle at once) and
    3 nodes (replication factor 3: whose 1,000 elections may not settle on a loaded host)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = render_figures()
    for node_count in node_counts:
        figures.update(cluster_figures(out_dir, node_count=node_count, quick=quick))
    (out_dir / "metrics.json").write_text(json.dumps(figures, indent=2, sort_keys=True))
    return figures


if __name__ == "__main__":
    nodes = sys.argv[sys.argv.index("--nodes") + 1] if "--nodes" in sys.argv else "1,3"
    result = run(
        pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "bench-out"),
        quick="--full" not in sys.argv,
        node_counts=tuple(int(n) for n in nodes.split(",")),
    )
    print(json.dumps(result, indent=2, sort_keys=True))
