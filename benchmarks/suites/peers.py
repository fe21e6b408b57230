"""Benchmark: raftlog side by side with NATS JetStream, a production Raft-replicated log.

Theory of operation. One run, one machine, three systems measured one after another, each on
a fresh 3-node cluster on loopback with 3 replicas:

    raftlog                 acks=all (fsync before the acknowledgement), 3 partitions
    jetstream_default       JetStream's default sync_interval (an fsync every 2 minutes;
                            acknowledged at once): not comparable on durability
    jetstream_sync_always   sync_interval: always (an fsync before every acknowledgement):
                            the setting comparable with acks=all

A raftlog partition is a JetStream stream here (one Raft group each; sequence - 1 is the
offset; `_jetstream`). For each system: closed-loop throughput at 1 KiB and 100-byte records
(raftlog through the cluster suite's producer; JetStream through nats-py's asynchronous
publish with a bounded window of 4000 acknowledgements), the CPU seconds of every server
process per MB acknowledged during the 1 KiB run, open-loop latency p50/p99/p99.9 at the
cluster suite's offered loads (fractions of raftlog's measured 1 KiB maximum, the same
absolute rates for every system, so a system that cannot keep up shows it in its latency and
`achieved_mb_s`), consume throughput (every 1 KiB record from the start), and failover
unavailability: SIGKILL of a partition's (stream's) leader under an open-loop 2000 records/s
load, until the first acknowledgement of a record sent after the kill.

Ratios `raftlog_vs_jetstream_*` divide raftlog's figure by JetStream's with sync always
(throughput: above 1 means raftlog is faster; p99 and CPU per MB: below 1 means raftlog is
lower, i.e. better). Both clients are Python, so on this 2-core machine both throughput figures
are partly the client's; the CPU per MB counts the servers only. Plot: peers.png.
"""

from __future__ import annotations

import asyncio
import functools
import json
import pathlib
import shutil
import statistics
import sys
import time
from collections.abc import Callable

SUITES_DIR = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(SUITES_DIR), str(SUITES_DIR.parent)]
import _jetstream as js_bench  # noqa: E402 (found through the path set just above)
import cluster as cluster_suite  # noqa: E402
import failover as failover_suite  # noqa: E402
import plots  # noqa: E402
from _harness import KIB, MIB, cpu_seconds, create_topic, node_pids, running_cluster  # noqa: E402

from raftlog.client import Admin  # noqa: E402

PARTITIONS = 3
LATENCY_FRACTIONS = (0.1, cluster_suite.LATENCY_FRACTION, 0.6)
CLIENTS = 2  # publisher processes at once for the `_2_clients` figures
JETSTREAM_SETTINGS = {"jetstream_default": None, "jetstream_sync_always": "always"}


class _Sizes:
    def __init__(self, *, quick: bool) -> None:
        self.total_1kib_bytes = (16 if quick else 32) * MIB
        self.total_100b_bytes = (2 if quick else 4) * MIB
        self.duration_s_max = 8.0 if quick else 15.0
        self.latency_s = 3.0 if quick else 4.0
        self.failover_trials = 2 if quick else 3


def _cpu_s(pids: dict[int, int]) -> float:
    return sum(cpu_seconds(pid) for pid in pids.values())


def measure_raftlog(work: pathlib.Path, sizes: _Sizes) -> dict[str, float]:
    metrics: dict[str, float] = {}
    with running_cluster(work) as cluster, Admin(cluster.bootstrap) as admin:
        bootstrap = cluster.bootstrap
        create_topic(admin, "t1k", partitions=PARTITIONS)
        pids = node_pids(cluster)
        cpu_before_s, client_before_s = _cpu_s(pids), time.process_time()
        big = cluster_suite.produce(
            bootstrap, "t1k", "all", record_bytes=KIB, total_bytes=sizes.total_1kib_bytes
        )
        mb = big.value_bytes / 1e6
        metrics["1kib_mb_s"] = big.mb_s
        metrics["cpu_s_per_mb"] = (_cpu_s(pids) - cpu_before_s) / mb
        metrics["client_cpu_s_per_mb"] = (time.process_time() - client_before_s) / mb
        create_topic(admin, "t1k2", partitions=PARTITIONS)
        argv = [sys.executable, str(SUITES_DIR / "_client_worker.py"), "-", bootstrap, "t1k2",
                str(KIB), str(sizes.total_1kib_bytes // CLIENTS)]  # fmt: skip
        cpu_before_s = _cpu_s(pids)
        runs = js_bench.run_workers(argv, CLIENTS, timeout_s=600)
        value_bytes = sum(r["value_bytes"] for r in runs)
        metrics[f"1kib_mb_s_{CLIENTS}_clients"] = (
            value_bytes / max(r["elapsed_s"] for r in runs) / 1e6
        )
        metrics[f"cpu_s_per_mb_{CLIENTS}_clients"] = (_cpu_s(pids) - cpu_before_s) / (
            value_bytes / 1e6
        )
        create_topic(admin, "t100", partitions=PARTITIONS)
        small = cluster_suite.produce(
            bootstrap, "t100", "all", record_bytes=100, total_bytes=sizes.total_100b_bytes
        )
        metrics["100b_records_s"] = small.records_s
        metrics["consume_mb_s"] = cluster_suite.consume_mb_s(bootstrap, "t1k", PARTITIONS)
        create_topic(admin, "latency", partitions=PARTITIONS)
        for fraction in LATENCY_FRACTIONS:
            rate = fraction * metrics["1kib_mb_s"] * 1e6 / KIB
            point = cluster_suite.latency_point(
                bootstrap, "latency", rate_records_s=rate, duration_s=sizes.latency_s
            )
            metrics.update(_latency_metrics(fraction, point))
        create_topic(admin, failover_suite.TOPIC, partitions=1)
        load = failover_suite.Load(bootstrap)
        load.start()
        try:
            trials = failover_suite.run_trials(sizes.failover_trials, admin, cluster, load)
        finally:
            load.close()
        gaps = [float(t["unavailability_s"]) for t in trials]  # type: ignore[arg-type]
        metrics.update(_failover_metrics(gaps, load.failures))
    return metrics


def _latency_metrics(fraction: float, point: dict[str, float]) -> dict[str, float]:
    print(f"   offered {fraction:.0%}: {point}", flush=True)
    tag = f"at_{round(fraction * 100)}pct"
    return {f"latency_{key}_{tag}": value for key, value in point.items()}


def _failover_metrics(gaps: list[float], failures: int) -> dict[str, float]:
    assert gaps, "failover: no trial could start"
    return {
        "failover_unavailability_s_p50": statistics.median(gaps),
        "failover_unavailability_s_max": max(gaps),
        "failover_trials": float(len(gaps)),
        "failover_failed_sends": float(failures),
    }


def measure_jetstream(
    work: pathlib.Path, sync_interval: str | None, sizes: _Sizes, raftlog_1kib_mb_s: float
) -> dict[str, float]:
    shutil.rmtree(work, ignore_errors=True)
    cluster = js_bench.running(work, sync_interval=sync_interval)
    try:
        return asyncio.run(_jetstream_figures(cluster, sizes, raftlog_1kib_mb_s))
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


async def _jetstream_figures(
    cluster: js_bench.JetStreamCluster, sizes: _Sizes, raftlog_1kib_mb_s: float
) -> dict[str, float]:
    client, js = await js_bench.connect(cluster)
    for topic in ("t1k", "t1k2", "t100", "latency"):
        await js_bench.create_topic(js, topic, PARTITIONS)
    await client.close()
    metrics: dict[str, float] = {}
    big, cpu_s_per_mb, client_cpu_s_per_mb = await js_bench.publish_throughput(
        cluster, "t1k", PARTITIONS, record_bytes=KIB, total_bytes=sizes.total_1kib_bytes,
        duration_s_max=sizes.duration_s_max,
    )  # fmt: skip
    metrics["1kib_mb_s"], metrics["cpu_s_per_mb"] = big.mb_s, cpu_s_per_mb
    metrics["client_cpu_s_per_mb"] = client_cpu_s_per_mb
    metrics[f"1kib_mb_s_{CLIENTS}_clients"], metrics[f"cpu_s_per_mb_{CLIENTS}_clients"] = (
        js_bench.publish_processes(
            cluster, "t1k2", PARTITIONS, processes=CLIENTS, record_bytes=KIB,
            total_bytes=sizes.total_1kib_bytes // CLIENTS, duration_s_max=sizes.duration_s_max,
        )
    )  # fmt: skip
    small, _, _ = await js_bench.publish_throughput(
        cluster, "t100", PARTITIONS, record_bytes=100, total_bytes=sizes.total_100b_bytes,
        duration_s_max=sizes.duration_s_max,
    )  # fmt: skip
    metrics["100b_records_s"] = small.records_s
    metrics["consume_mb_s"] = await js_bench.consume_mb_s(cluster, "t1k", PARTITIONS)
    for fraction in LATENCY_FRACTIONS:
        point = await js_bench.latency_point(
            cluster, "latency", PARTITIONS, record_bytes=KIB, duration_s=sizes.latency_s,
            rate_records_s=fraction * raftlog_1kib_mb_s * 1e6 / KIB,
        )  # fmt: skip
        metrics.update(_latency_metrics(fraction, point))
    gaps, failures = await js_bench.failover_s(cluster, trials=sizes.failover_trials)
    metrics.update(_failover_metrics(gaps, failures))
    return metrics


def _timed(name: str, measure: Callable[[], dict[str, float]]) -> dict[str, float]:
    print(f"-- {name}", flush=True)
    started = time.perf_counter()
    figures = measure()
    print(f"-- {name}: {time.perf_counter() - started:.0f} s {figures}", flush=True)
    return figures


def ratios(systems: dict[str, dict[str, float]]) -> dict[str, float]:
    ours, peer = systems["raftlog"], systems["jetstream_sync_always"]
    at_30 = f"at_{round(cluster_suite.LATENCY_FRACTION * 100)}pct"
    # At 10% both keep up; at 30% (the cluster suite's headline) JetStream through nats-py
    # may not, and its p99 is then a queue's.
    return {
        "raftlog_vs_jetstream_p99_ms_at_10pct": ours["latency_p99_ms_at_10pct"]
        / peer["latency_p99_ms_at_10pct"],
        "raftlog_vs_jetstream_1kib_mb_s": ours["1kib_mb_s"] / peer["1kib_mb_s"],
        f"raftlog_vs_jetstream_1kib_mb_s_{CLIENTS}_clients": ours[f"1kib_mb_s_{CLIENTS}_clients"]
        / peer[f"1kib_mb_s_{CLIENTS}_clients"],
        "raftlog_vs_jetstream_100b_records_s": ours["100b_records_s"] / peer["100b_records_s"],
        "raftlog_vs_jetstream_p99_ms": ours[f"latency_p99_ms_{at_30}"]
        / peer[f"latency_p99_ms_{at_30}"],
        "raftlog_vs_jetstream_cpu_s_per_mb": ours["cpu_s_per_mb"] / peer["cpu_s_per_mb"],
        "raftlog_vs_jetstream_consume_mb_s": ours["consume_mb_s"] / peer["consume_mb_s"],
    }


def run(out_dir: pathlib.Path, *, quick: bool) -> dict[str, float]:
    out_dir.mkdir(parents=True, exist_ok=True)
    sizes = _Sizes(quick=quick)
    systems = {
        "raftlog": _timed("raftlog", lambda: measure_raftlog(out_dir / "peers-raftlog", sizes))
    }
    for name, sync_interval in JETSTREAM_SETTINGS.items():
        work = out_dir / f"peers-{name}"
        systems[name] = _timed(
            name,
            functools.partial(
                measure_jetstream, work, sync_interval, sizes, systems["raftlog"]["1kib_mb_s"]
            ),
        )
    metrics = {f"{system}_{key}": value for system, figures in systems.items()
               for key, value in figures.items()}  # fmt: skip
    metrics.update(ratios(systems))
    (out_dir / "peers.json").write_text(json.dumps(metrics, indent=2, sort_keys=True))
    plots.throughput_bars(
        {f"{system} 1 KiB": figures["1kib_mb_s"] for system, figures in systems.items()}
        | {f"{system} consume": figures["consume_mb_s"] for system, figures in systems.items()},
        out_dir / "peers.png",
    )
    return metrics


if __name__ == "__main__":
    result = run(
        pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "bench-out"),
        quick="--full" not in sys.argv,
    )
    print(json.dumps(result, indent=2, sort_keys=True))
