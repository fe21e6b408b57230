"""One fresh-cluster latency run for `benchmarks/latency_ab.py`, in its own process; not a suite.

    python _latency_worker.py TREE WORK RATES DURATION_S SEQUENTIAL KAFKA_SEQUENTIAL \
        THROUGHPUT_MIB [KEY=VALUE ...]

TREE is a folder holding a `raftlog` namespace (a view of another commit) or "-" for the
installed one. It goes first on PYTHONPATH, so the node processes this run starts run the
same code as its producer. The run starts a fresh 3-node cluster in WORK, creates a topic of
3 partitions (RF 3, leaders on their preferred replicas), times SEQUENTIAL single 1 KiB
records one after another (`send().result()`: the idle round trip), the same for
KAFKA_SEQUENTIAL records through confluent-kafka on the Kafka listener (each flushed; 0
skips it), then the acks=all throughput of THROUGHPUT_MIB of 1 KiB records through the
cluster suite's producer (`cluster.produce`, linger 20 ms; 0 skips it), then for each rate in
RATES (records/s, comma separated) runs the cluster suite's open-loop acks=all latency
measurement at linger 0 (`cluster.latency_point`) for DURATION_S, reading each node's CPU
(the mean per node) and this process's CPU (the producer and its pacing loop) over it. Last
the fetch half: every record produced read back from offset 0 (`cluster.consume_mb_s`), with
the nodes' CPU per MB of values read. It prints one line of JSON. Each KEY=VALUE is a node
setting passed to every node as `raftlog serve --set KEY=VALUE`.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time


def main(argv: list[str]) -> None:
    tree, work, rates, duration_s, sequential, kafka_sequential, throughput_mib, *node_sets = argv
    if tree != "-":
        sys.path.insert(0, tree)
        os.environ["PYTHONPATH"] = os.pathsep.join([tree, os.environ.get("PYTHONPATH", "")])
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import cluster  # found through the path set just above
    import latency
    from _harness import (
        KIB,
        cpu_seconds,
        create_topic,
        node_pids,
        payloads,
        percentile,
        running_cluster,
        warm_up,
    )

    import raftlog
    from raftlog.client import Admin

    assert tree == "-" or raftlog.__file__.startswith(tree), (tree, raftlog.__file__)
    result: dict[str, float] = {}
    flags = [flag for setting in node_sets for flag in ("--set", setting)]
    with (
        running_cluster(pathlib.Path(work), flags=flags) as running,
        Admin(running.bootstrap) as admin,
    ):
        create_topic(admin, "latency", partitions=cluster.PARTITIONS)
        with cluster.producer(running.bootstrap, "all", linger_ms=0) as client:
            values = payloads(KIB)
            warm_up(client, "latency", values)
            one_by_one = []
            for index in range(int(sequential)):
                started = time.perf_counter()
                client.send("latency", value=values[index % len(values)]).result(timeout=60)
                one_by_one.append((time.perf_counter() - started) * 1e3)
            one_by_one.sort()
            if one_by_one:
                result["sequential_p50_ms"] = percentile(one_by_one, 0.5)
                result["sequential_p90_ms"] = percentile(one_by_one, 0.9)
        if int(kafka_sequential) > 0:
            run = latency.kafka_one_in_flight(running.kafka_bootstrap, int(kafka_sequential))
            kafka_one = sorted(run(lambda: None))
            result["kafka_sequential_p50_ms"] = percentile(kafka_one, 0.5)
            result["kafka_sequential_p90_ms"] = percentile(kafka_one, 0.9)
        if int(throughput_mib) > 0:
            total_bytes = int(throughput_mib) * KIB * KIB
            top = cluster.produce(
                running.bootstrap, "latency", "all", record_bytes=KIB, total_bytes=total_bytes
            )
            result["produce_acks_all_1kib_mb_s"] = top.mb_s
        pids = node_pids(running)
        for rate in (float(r) for r in rates.split(",")):
            cpu_before = {n: cpu_seconds(pid) for n, pid in pids.items()}
            client_cpu_before_s = time.process_time()
            started = time.perf_counter()
            point = cluster.latency_point(
                running.bootstrap, "latency", rate_records_s=rate, duration_s=float(duration_s)
            )
            elapsed_s = time.perf_counter() - started
            client_cpu_s = time.process_time() - client_cpu_before_s
            cpu = sum(cpu_seconds(pid) - cpu_before[n] for n, pid in pids.items())
            tag = f"{rate / 1000:.0f}k"
            for key in ("p50_ms", "p99_ms", "p999_ms"):
                result[f"{key}_{tag}"] = point[key]
            result[f"node_cores_{tag}"] = cpu / elapsed_s / len(pids)
            result[f"client_cores_{tag}"] = client_cpu_s / elapsed_s
        # The fetch half: everything produced above read back from offset 0, with the nodes'
        # CPU per MB of values (the leaders serve it; followers idle but are counted).
        cpu_before = {n: cpu_seconds(pid) for n, pid in pids.items()}
        started = time.perf_counter()
        result["fetch_mb_s"] = cluster.consume_mb_s(
            running.bootstrap, "latency", cluster.PARTITIONS
        )
        elapsed_s = time.perf_counter() - started
        cpu = sum(cpu_seconds(pid) - cpu_before[n] for n, pid in pids.items())
        result["fetch_node_cpu_ms_per_mb"] = cpu * 1e3 / (result["fetch_mb_s"] * elapsed_s)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
