"""Benchmark: the log cleaner (docs/compaction.md).

Metrics (one run):
- `cleaner_mb_s`, `cleaner_cpu_s_per_mb`: one unpaced cleaning pass (`plan_cleaning` +
  `run_cleaning` + `finish_cleaning`, as the node's cleaner runs it) over a log of
  100-byte keyed records in 16-record batches, 10,000 keys, every key rewritten many times:
  MB of dirty log cleaned per second of wall time, and CPU seconds (the cleaning thread's
  own) per MB. `cleaner_size_ratio`: the log's size after the pass over before.
- `cleaner_cpu_fraction_at_default`: the share of one core the cleaner costs when it runs at
  the default `cleaner_bytes_per_s` without pause (the budget counts bytes read, and a pass
  reads each dirty byte twice, so CPU per MB cleaned is spread over two MB of budget).
- `produce_<p50,p99>_ms_<cleaning,idle>` and `produce_<p50,p99>_cleaning_vs_idle`: open-loop
  keyed produce latency (acks=all, 3 nodes) on a compacted topic while every node's cleaner
  is kept busy at its default budget (a second compacted topic of dirty data, cleaned again
  on every pass by a dirty ratio of 0.01), against the same cluster with the cleaner idle
  (both topics switched to cleanup.policy=delete): the phases alternate in pairs, the same
  run, the same cluster. The issue's goal: within 10% (ratio <= 1.1).
"""

from __future__ import annotations

import pathlib
import random
import shutil
import statistics
import sys
import time

from raftlog.client import Admin, Producer
from raftlog.config import KIB, MIB, LogConfig, NodeConfig
from raftlog.partition.cleaning import (
    CleanerState,
    CompactionSettings,
    finish_cleaning,
    plan_cleaning,
    run_cleaning,
)
from raftlog.storage.log import SegmentedLog
from raftlog.storage.records import RecordInput, encode_batch

sys.path[:0] = [str(pathlib.Path(__file__).resolve().parent)]
import _harness  # noqa: E402 (found through the path set just above)

SEED = 20261126
KEYS = 10_000
VALUE_BYTES = 100
RECORDS_PER_BATCH = 16
COMPACT = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01",
           "segment.bytes": str(1 * MIB)}  # fmt: skip


def _fill(log: SegmentedLog, total_bytes: int, rng: random.Random) -> None:
    while log.size_bytes < total_bytes:
        records = [
            RecordInput(b"key-%05d" % rng.randrange(KEYS), rng.randbytes(VALUE_BYTES), 1_000)
            for _ in range(RECORDS_PER_BATCH)
        ]
        log.append(encode_batch(records), leader_epoch=1)
    log.roll()
    log.flush()


def _cleaner_pass(work: pathlib.Path, *, total_bytes: int) -> dict[str, float]:
    shutil.rmtree(work, ignore_errors=True)
    config = LogConfig(segment_bytes_max=8 * MIB)
    log = SegmentedLog.open(work, config=config)
    try:
        _fill(log, total_bytes, random.Random(SEED))
        before = log.size_bytes
        settings = CompactionSettings(compact=True, min_cleanable_dirty_ratio=0.0)
        state = CleanerState()
        plan = plan_cleaning(log, settings, state, clean_below=log.log_end_offset, now_ms=2_000)
        assert plan is not None
        dirty_bytes = sum(size for _, _, end, size, _ in log.closed_segment_stats())
        wall, cpu = time.perf_counter(), time.thread_time()
        finish_cleaning(log, plan, run_cleaning(plan, lambda _: None), state)
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        mb = dirty_bytes / MIB
        cpu_s_per_mb = cpu / mb
        return {
            "cleaner_mb_s": mb / wall,
            "cleaner_cpu_s_per_mb": cpu_s_per_mb,
            "cleaner_size_ratio": log.size_bytes / before,
            "cleaner_cpu_fraction_at_default": cpu_s_per_mb
            * NodeConfig().cleaner_bytes_per_s
            / MIB
            / 2,
        }
    finally:
        log.close()
        shutil.rmtree(work, ignore_errors=True)


def _latencies(
    producer: Producer, topic: str, *, rate_records_s: float, duration_s: float
) -> list[float]:
    rng = random.Random(SEED)
    values = _harness.payloads(VALUE_BYTES)
    latencies_ms: list[float] = []
    count = int(rate_records_s * duration_s)
    started = time.perf_counter()
    for sent in range(count):
        due_s = started + sent / rate_records_s
        time.sleep(max(0.0, due_s - time.perf_counter()))
        future = producer.send(
            topic, key=b"key-%05d" % rng.randrange(KEYS), value=values[sent % len(values)]
        )
        future.add_done_callback(
            lambda _, due=due_s: latencies_ms.append((time.perf_counter() - due) * 1e3)
        )
    producer.flush()
    return sorted(latencies_ms)


def _background(cluster_bootstrap: str, topic: str, total_bytes: int) -> None:
    """Dirty data for the cleaners: keyed 1 KiB records, written once."""
    rng = random.Random(SEED + 1)
    values = _harness.payloads(KIB)
    with Producer(cluster_bootstrap, acks="all", batch_bytes_max=256 * KIB) as producer:
        for i in range(total_bytes // KIB):
            producer.send(topic, key=b"bg-%05d" % rng.randrange(KEYS), value=values[i % 64])
        producer.flush()


def _produce_latency(work: pathlib.Path, *, quick: bool) -> dict[str, float]:
    phase_s, pairs = (8.0, 2) if quick else (20.0, 3)
    rate = 1500.0
    # Passes start every half second, so the cleaners stay busy through a phase.
    flags = ("--set", "cleaner_interval_ms=500")
    with _harness.running_cluster(work, flags=flags) as cluster:
        admin = Admin(cluster.bootstrap)
        for topic in ("bench", "background"):
            admin.create_topic(topic, partitions=1, replication_factor=3, config=COMPACT)
            _harness.wait_leaders(admin, topic)
        _background(cluster.bootstrap, "background", (24 if quick else 64) * MIB)
        phases: dict[str, list[list[float]]] = {"cleaning": [], "idle": []}
        with Producer(cluster.bootstrap, acks="all", linger_ms=1) as producer:
            _latencies(producer, "bench", rate_records_s=rate, duration_s=2.0)  # warm up
            for _ in range(pairs):
                for phase, policy in (("cleaning", "compact"), ("idle", "delete")):
                    for topic in ("bench", "background"):
                        admin.alter_topic_config(topic, set_config={"cleanup.policy": policy})
                    time.sleep(1.0)  # a cleaner pass starts within its interval
                    phases[phase].append(
                        _latencies(producer, "bench", rate_records_s=rate, duration_s=phase_s)
                    )
        admin.close()
    out: dict[str, float] = {}
    for name, fraction in (("p50", 0.5), ("p99", 0.99)):
        for phase, runs in phases.items():
            out[f"produce_{name}_ms_{phase}"] = statistics.median(
                _harness.percentile(run, fraction) for run in runs
            )
        out[f"produce_{name}_cleaning_vs_idle"] = statistics.median(
            _harness.percentile(c, fraction) / _harness.percentile(i, fraction)
            for c, i in zip(phases["cleaning"], phases["idle"], strict=True)
        )
    return out


def run(out_dir: pathlib.Path, *, quick: bool) -> dict[str, float]:
    results = _cleaner_pass(out_dir / "compaction-work", total_bytes=(32 if quick else 256) * MIB)
    return {**results, **_produce_latency(out_dir / "compaction-cluster", quick=quick)}
