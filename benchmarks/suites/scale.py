"""Benchmark: idle cost of 1,000 partitions, and a restart with a large log.

Theory of operation.

Idle (`idle_cpu_cores_per_node_1000_partitions`, `spurious_elections_1000_partitions`): 3 nodes,
one topic of 1,000 partitions with replication factor 3, no traffic. After creating the topic
the suite waits until every partition is served by a leader, or the served set stopped growing
for 20 s (quick) / 60 s (full), or 60 s / 300 s passed; lets it settle 10 s, then reads each
node's CPU time from /proc/<pid>/stat at both ends of a 60 s window (quick mode too: the
goal is defined over 60 s) and divides by the window. Elections are counted from the nodes
themselves, outside the window: for every partition, the epoch (Raft term) of the node that
serves it as leader, from a no-wait fetch, before and after; each term step is an election no
one asked for. (The metadata's leader epochs would do too, but were seen to lag behind: see
benchmarks/README.md.) Probes go out at most 200 at a time per node, under its per-client
request limit. `leaders_all_elected_s` is the time from creating the topic until every
partition was served (NaN if some never were).

Restart (`restart_to_serving_s`): a single node (replication factor 1, so the restarted node is
the one that must serve) is filled with `restart_log_gib` of 1 KiB records sent as ready-made
1 MiB batches over gRPC (acks=leader, so filling is quick), SIGKILLed, its files dropped from
the page cache (posix_fadvise DONTNEED), and started again; the figure is from the spawn to
the first fetch at offset 0 that succeeds. The same restart with an empty log
(`restart_to_serving_empty_log_s`) shows how much of it is the process start alone. Quick
mode fills the same 2 GiB the goal names (about 15 s of filling here).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import sys
import time

import grpc

from raftlog.client import Admin
from raftlog.local_cluster import LocalCluster

SUITES_DIR = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(SUITES_DIR)]
from _harness import (  # noqa: E402
    GIB,
    KIB,
    PROBE_TIMEOUT_S,
    cpu_seconds,
    create_topic,
    fetch_error,
    node_pids,
    produce_raw_batches,
    raw_batch,
    running_cluster,
)

from raftlog.rpc.v1 import raftlog_pb2 as pb  # noqa: E402
from raftlog.rpc.v1 import raftlog_pb2_grpc as pb_grpc  # noqa: E402

PARTITIONS = 1000
# No new leader for this long: the cluster has settled (elections here were seen to trickle
# in for minutes, so the full run waits longer before it gives up on the rest).
LEADERS_STABLE_S = {True: 20.0, False: 60.0}
SETTLE_S = 10.0
IDLE_WINDOW_S = 60.0  # the goal is the average over 60 s, in quick runs too
RESTART_LOG_BYTES = 2 * GIB  # the goal names a node with 2 GiB of log
RESTART_WAIT_S_MAX = 120.0


# Probes in flight per node: below the node's per-client request limit
# (NodeConfig.client_requests_in_flight_max, 256), which refuses the excess at once and made
# partitions look unserved at random when all 1,000 probes went out together.
PROBES_IN_FLIGHT_MAX = 200


def leader_epochs(cluster: LocalCluster, topic: str, partitions: int) -> dict[int, int]:
    """Partition -> epoch (Raft term) of the node that serves it as leader, from no-wait
    fetches asked of every running node, PROBES_IN_FLIGHT_MAX at a time."""
    epochs: dict[int, int] = {}
    for node_id, node in cluster.nodes.items():
        if not cluster.is_running(node_id):
            continue
        with grpc.insecure_channel(node.client_address) as channel:
            fetch = pb_grpc.LogStub(channel).Fetch
            for start in range(0, partitions, PROBES_IN_FLIGHT_MAX):
                chunk = range(start, min(partitions, start + PROBES_IN_FLIGHT_MAX))
                futures = [
                    fetch.future(
                        pb.FetchRequest(
                            topic=topic, partition=p, offset=0, max_bytes=1, max_wait_ms=0
                        ),
                        timeout=PROBE_TIMEOUT_S,
                    )
                    for p in chunk
                ]
                for partition, future in zip(chunk, futures, strict=True):
                    with contextlib.suppress(grpc.RpcError):
                        response = future.result()
                        if response.error.code == pb.ErrorCode.NONE:
                            epoch = int(response.leader_epoch)
                            epochs[partition] = max(epoch, epochs.get(partition, epoch))
    return epochs


def wait_leaders_settled(
    cluster: LocalCluster, topic: str, *, quick: bool, partitions: int = PARTITIONS
) -> dict[int, int]:
    """Leader epochs once every partition is served or the served set stopped growing."""
    deadline = time.monotonic() + (60.0 if quick else 300.0)
    epochs = leader_epochs(cluster, topic, partitions)
    last_growth = time.monotonic()
    while len(epochs) < partitions and time.monotonic() < deadline:
        if time.monotonic() - last_growth > LEADERS_STABLE_S[quick]:
            break
        time.sleep(2.0)
        now = leader_epochs(cluster, topic, partitions)
        if len(now) > len(epochs):
            last_growth = time.monotonic()
        epochs = now
    print(f"   {len(epochs)} of {partitions} partitions served by a leader", flush=True)
    return epochs


def idle_metrics(
    out_dir: pathlib.Path,
    *,
    quick: bool,
    partitions: int = PARTITIONS,
    work_name: str = "idle-work",
    window_s: float = IDLE_WINDOW_S,
) -> dict[str, float]:
    """The idle figures of one fresh cluster with one topic of `partitions` (named with
    that count); its node logs are kept in `out_dir/<work_name>-logs`."""
    # One topic holds them all: above the default per-topic cap the cluster must allow it.
    flags = (
        ("--set", f"metadata.partitions_per_topic_max={partitions}") if partitions > 1000 else ()
    )
    with (
        running_cluster(out_dir / work_name, flags=flags) as cluster,
        Admin(cluster.bootstrap) as admin,
    ):
        started = time.monotonic()
        create_topic(admin, "idle", partitions=partitions, wait=False)
        before = wait_leaders_settled(cluster, "idle", quick=quick, partitions=partitions)
        settled_s = time.monotonic() - started
        all_elected_s = settled_s if len(before) == partitions else float("nan")
        time.sleep(SETTLE_S)
        pids = node_pids(cluster)
        cpu_before = {node: cpu_seconds(pid) for node, pid in pids.items()}
        window_started = time.monotonic()
        time.sleep(window_s)
        elapsed_s = time.monotonic() - window_started
        cpu_after = {node: cpu_seconds(pid) for node, pid in pids.items()}
        after = leader_epochs(cluster, "idle", partitions)
        alive = sum(cluster.is_running(node) for node in pids)
    cores = {node: (cpu_after[node] - cpu_before[node]) / elapsed_s for node in pids}
    print(f"   idle CPU cores per node: {cores}", flush=True)
    # A term step of a partition led at both ends is an election no one asked for; a
    # partition first led inside the window means elections had not settled.
    elections = sum(after.get(p, epoch) - epoch for p, epoch in before.items())
    newly_led = len(set(after) - set(before))
    figures = {
        "idle_cpu_cores_per_node": sum(cores.values()) / len(cores),
        "idle_cpu_cores_max_node": max(cores.values()),
        "spurious_elections": float(elections),
        "partitions_led": float(len(after)),
        "partitions_newly_led_in_window": float(newly_led),
        "leaders_settled_s": settled_s,
        # Until every partition was served (NaN: some never were before the suite gave up).
        "leaders_all_elected_s": all_elected_s,
        "nodes_alive_after_idle": float(alive),
    }
    return {f"{name}_{partitions}_partitions": value for name, value in figures.items()}


def drop_page_cache(directory: pathlib.Path) -> None:
    for path in directory.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def restart_to_serving_s(cluster: LocalCluster, topic: str) -> float:
    """SIGKILL node 1, drop its files from the page cache, start it, time the first fetch."""
    node = cluster.nodes[1]
    cluster.kill_node(1)
    drop_page_cache(pathlib.Path(node.data_dir))
    started = time.perf_counter()
    cluster.start_node(1)
    while time.perf_counter() - started < RESTART_WAIT_S_MAX:
        try:
            code, _ = fetch_error(node.client_address, topic, 0, timeout_s=1.0)
        except Exception:  # not listening yet
            code = -1
        if code == pb.ErrorCode.NONE:
            return time.perf_counter() - started
        time.sleep(0.01)
    raise TimeoutError(f"node 1 did not serve {topic}-0 within {RESTART_WAIT_S_MAX} s")


def restart_metrics(out_dir: pathlib.Path) -> dict[str, float]:
    with running_cluster(out_dir / "restart-work", node_count=1) as cluster:
        with Admin(cluster.bootstrap) as admin:
            create_topic(admin, "restart", partitions=1, replication_factor=1)
        empty_s = restart_to_serving_s(cluster, "restart")
        batch = raw_batch(KIB, 1000)  # just under the 1 MiB batch_bytes_max
        address = cluster.nodes[1].client_address
        fill = produce_raw_batches(
            lambda: address,
            "restart",
            batch,
            count=RESTART_LOG_BYTES // len(batch),
            acks=pb.ACKS_LEADER,
        )
        print(f"   filled {fill.value_bytes / GIB:.2f} GiB at {fill.mb_s:.0f} MB/s", flush=True)
        full_s = restart_to_serving_s(cluster, "restart")
        on_disk = sum(
            p.stat().st_size
            for p in pathlib.Path(cluster.nodes[1].data_dir).rglob("*")
            if p.is_file()
        )
    return {
        "restart_to_serving_s": full_s,
        "restart_to_serving_empty_log_s": empty_s,
        "restart_log_gib": on_disk / GIB,
        "fill_raw_batches_acks_leader_mb_s": fill.mb_s,
    }


def run(out_dir: pathlib.Path, *, quick: bool) -> dict[str, float]:
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics = restart_metrics(out_dir)
    metrics.update(idle_metrics(out_dir, quick=quick))
    (out_dir / "scale.json").write_text(json.dumps(metrics, indent=2, sort_keys=True))
    return metrics


if __name__ == "__main__":
    result = run(
        pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "bench-out"),
        quick="--full" not in sys.argv,
    )
    print(json.dumps(result, indent=2, sort_keys=True))
