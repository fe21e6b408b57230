"""Kafka clients against raftlog's Kafka listener, side by side with raftlog's gRPC client.

One 3-node cluster (real processes on loopback), one topic of 3 partitions, replication 3.
In the same run, alternating, with the same seeded incompressible payloads:

- `kafka_produce_acks_all_1kib_mb_s` (confluent-kafka, acks=all, idempotent) and
  `grpc_produce_acks_all_1kib_mb_s` (raftlog.client.Producer), and their ratio
  `kafka_vs_grpc_produce_1kib` (goal >= 1.0);
- `kafka_produce_acks_all_100b_records_s` / `grpc_produce_acks_all_100b_records_s` and
  `kafka_vs_grpc_produce_100b` (goal >= 1.5);
- `kafka_consume_mb_s` (confluent-kafka reading back what was written, assigned partitions)
  and `grpc_consume_mb_s` (raftlog.client.Consumer), `kafka_vs_grpc_consume`.

- `kafka_produce_latency_p50_ms` / `_p99_ms` with linger 0 and 5 ms (`..._linger5_...`):
  confluent-kafka, acks=all, idempotent, 1 KiB records offered open-loop at 30% of the
  measured 1 KiB throughput; a latency runs from when a record was due to its delivery
  report (so a stalled producer is charged for what it should have sent).

- `kafka_node_cpu_s_per_mb_1kib` / `grpc_node_cpu_s_per_mb_1kib` (and `_100b`): CPU seconds
  (user + system) of all three node processes per MB of values acknowledged during each
  produce run, and `kafka_vs_grpc_node_cpu_per_mb_<size>` (< 1: the Kafka path costs the
  nodes less per MB). The primary figure on a shared machine: it does not depend on how
  much CPU the neighbours left.

A throughput is bytes (or records) acknowledged over the seconds from the first send to the
flush's return, after a warm-up (metadata, producer id, connections); consuming, bytes of
values read over the seconds from the assignment to the last record (a client's closing is
not counted: librdkafka's takes longer). Each figure is the median of the rounds. Both
paths write 2 MiB unmeasured first, so the cluster's settling after start is charged to
neither.
"""

from __future__ import annotations

import functools
import pathlib
import statistics
import sys
import time
from collections.abc import Callable

SUITES_DIR = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(SUITES_DIR)]
from _harness import (  # noqa: E402 (found through the path set just above)
    KIB,
    MIB,
    Throughput,
    cpu_seconds,
    create_topic,
    payloads,
    percentile,
    produce_throughput,
    running_cluster,
)

from raftlog.client import Admin, Consumer, Producer  # noqa: E402
from raftlog.local_cluster import LocalCluster  # noqa: E402

PARTITIONS = 3


def _kafka_produce(boot: str, topic: str, *, record_bytes: int, total_bytes: int) -> Throughput:
    import confluent_kafka

    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": boot,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "queue.buffering.max.kbytes": 32 * 1024,
        }
    )
    values = payloads(record_bytes)
    for i in range(200):  # warm-up: metadata, producer id, connections
        producer.produce(topic, values[i % len(values)])
    assert producer.flush(60) == 0
    failures: list[str] = []

    def on_delivery(error: object, _message: object) -> None:
        if error is not None:
            failures.append(str(error))

    count = total_bytes // record_bytes
    produce, poll = producer.produce, producer.poll
    started = time.perf_counter()
    for i in range(count):
        while True:
            try:
                produce(topic, values[i & 63], on_delivery=on_delivery)
                break
            except BufferError:
                poll(0.001)
    assert producer.flush(120) == 0
    elapsed_s = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"{len(failures)} of {count} records failed: {failures[0]}")
    return Throughput(count, count * record_bytes, elapsed_s)


def _kafka_latencies_ms(
    boot: str, topic: str, *, records_s: float, duration_s: float, linger_ms: int
) -> list[float]:
    import confluent_kafka

    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": boot,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": linger_ms,
        }
    )
    values = payloads(KIB)
    for i in range(100):  # warm-up
        producer.produce(topic, values[i % len(values)])
    assert producer.flush(60) == 0
    latencies: list[float] = []
    count = int(records_s * duration_s)
    started = time.perf_counter()
    for i in range(count):
        due = started + i / records_s
        while (now := time.perf_counter()) < due:
            producer.poll(min(due - now, 0.001))

        def done(error: object, _message: object, due: float = due) -> None:
            if error is None:
                latencies.append((time.perf_counter() - due) * 1000)

        producer.produce(topic, values[i & 63], on_delivery=done)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert len(latencies) == count, f"{count - len(latencies)} records failed"
    return sorted(latencies)


def _kafka_consume(boot: str, topic: str, total_records: int) -> Throughput:
    import confluent_kafka

    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": boot, "group.id": "bench", "enable.auto.commit": False}
    )
    consumer.assign(
        [
            confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
            for p in range(PARTITIONS)
        ]
    )
    count = value_bytes = 0
    started_s = time.perf_counter()
    deadline = started_s + 120
    ended_s = started_s
    try:
        while count < total_records:
            for message in consumer.consume(1000, 0.1):
                if message.error() is None:
                    count += 1
                    value_bytes += len(message.value())
            if time.perf_counter() > deadline:
                raise TimeoutError(f"read {count} of {total_records} records in 120 s")
        ended_s = time.perf_counter()
    finally:
        consumer.close()
    return Throughput(count, value_bytes, ended_s - started_s)


def _grpc_consume(bootstrap: str, topic: str, total_records: int) -> Throughput:
    consumer = Consumer(bootstrap, auto_offset_reset="earliest", max_poll_records=10_000)
    consumer.assign([(topic, p) for p in range(PARTITIONS)])
    count = value_bytes = 0
    started_s = time.perf_counter()
    deadline = started_s + 120
    ended_s = started_s
    try:
        while count < total_records:
            for record in consumer.poll(1000):
                count += 1
                value_bytes += len(record.value or b"")
            if time.perf_counter() > deadline:
                raise TimeoutError(f"read {count} of {total_records} records in 120 s")
        ended_s = time.perf_counter()
    finally:
        consumer.close()
    return Throughput(count, value_bytes, ended_s - started_s)


def _nodes_cpu_s(cluster: LocalCluster) -> float:
    return sum(cpu_seconds(node.pid) for node in cluster.nodes.values() if node.pid)


def _with_node_cpu(
    cluster: LocalCluster, measure: Callable[[], Throughput], cpu: list[float]
) -> Throughput:
    """Run `measure`, appending the nodes' CPU seconds per MB of values it moved to `cpu`."""
    before_s = _nodes_cpu_s(cluster)
    result = measure()
    cpu.append((_nodes_cpu_s(cluster) - before_s) / (result.value_bytes / 1e6))
    return result


def _median(rounds: list[Throughput], figure: Callable[[Throughput], float]) -> float:
    return statistics.median(figure(r) for r in rounds)


def run(out_dir: pathlib.Path, *, quick: bool) -> dict[str, float]:
    rounds = 1 if quick else 3
    total_1kib = (16 if quick else 64) * MIB
    total_100b = (2 if quick else 8) * MIB
    results: dict[str, list[Throughput]] = {}
    with running_cluster(out_dir / "kafka-work") as cluster:
        boot, bootstrap = cluster.kafka_bootstrap, cluster.bootstrap
        with Admin(bootstrap) as admin:
            for name in ("k1k", "g1k", "k100", "g100"):
                create_topic(admin, name, partitions=PARTITIONS)
        # Unmeasured first writes on both paths: the cluster's settling after start (leaders
        # handed to preferred replicas, first segments) is charged to neither.
        _kafka_produce(boot, "k1k", record_bytes=KIB, total_bytes=2 * MIB)
        with Producer(bootstrap, acks="all") as warm:
            produce_throughput(warm, "g1k", record_bytes=KIB, total_bytes=2 * MIB)
        cpu: dict[str, list[float]] = {}
        for _ in range(rounds):
            producer = Producer(bootstrap, acks="all")
            runs: list[tuple[str, Callable[[], Throughput]]] = [
                ("kafka_1kib", lambda: _kafka_produce(
                    boot, "k1k", record_bytes=KIB, total_bytes=total_1kib)),
                ("grpc_1kib", functools.partial(produce_throughput,
                    producer, "g1k", record_bytes=KIB, total_bytes=total_1kib)),
                ("grpc_100b", functools.partial(produce_throughput,
                    producer, "g100", record_bytes=100, total_bytes=total_100b)),
                ("kafka_100b", lambda: _kafka_produce(
                    boot, "k100", record_bytes=100, total_bytes=total_100b)),
            ]  # fmt: skip
            try:
                for name, measure in runs:
                    result = _with_node_cpu(cluster, measure, cpu.setdefault(name, []))
                    results.setdefault(name, []).append(result)
            finally:
                producer.close()
        offered_s = 0.3 * _median(results["kafka_1kib"], lambda r: r.records_s)
        latencies = {
            linger: _kafka_latencies_ms(
                boot, "k1k", records_s=offered_s, duration_s=3 if quick else 10, linger_ms=linger
            )
            for linger in (0, 5)
        }
        written = total_1kib // KIB * rounds
        # Alternating rounds, medians: one read of each is a second or two, and this
        # machine's speed swings more than that within a minute.
        for _ in range(rounds):
            results.setdefault("kafka_consume", []).append(_kafka_consume(boot, "k1k", written))
            results.setdefault("grpc_consume", []).append(_grpc_consume(bootstrap, "g1k", written))

    def mb_s(r: Throughput) -> float:
        return r.mb_s

    def records_s(r: Throughput) -> float:
        return r.records_s

    metrics = {
        "kafka_produce_acks_all_1kib_mb_s": _median(results["kafka_1kib"], mb_s),
        "grpc_produce_acks_all_1kib_mb_s": _median(results["grpc_1kib"], mb_s),
        "kafka_produce_acks_all_100b_records_s": _median(results["kafka_100b"], records_s),
        "grpc_produce_acks_all_100b_records_s": _median(results["grpc_100b"], records_s),
        "kafka_consume_mb_s": _median(results["kafka_consume"], mb_s),
        "grpc_consume_mb_s": _median(results["grpc_consume"], mb_s),
    }
    metrics["kafka_vs_grpc_produce_1kib"] = (
        metrics["kafka_produce_acks_all_1kib_mb_s"] / metrics["grpc_produce_acks_all_1kib_mb_s"]
    )
    metrics["kafka_vs_grpc_produce_100b"] = (
        metrics["kafka_produce_acks_all_100b_records_s"]
        / metrics["grpc_produce_acks_all_100b_records_s"]
    )
    metrics["kafka_vs_grpc_consume"] = metrics["kafka_consume_mb_s"] / metrics["grpc_consume_mb_s"]
    for size in ("1kib", "100b"):
        kafka_cpu = statistics.median(cpu[f"kafka_{size}"])
        grpc_cpu = statistics.median(cpu[f"grpc_{size}"])
        metrics[f"kafka_node_cpu_s_per_mb_{size}"] = kafka_cpu
        metrics[f"grpc_node_cpu_s_per_mb_{size}"] = grpc_cpu
        metrics[f"kafka_vs_grpc_node_cpu_per_mb_{size}"] = kafka_cpu / grpc_cpu
    for linger, name in ((0, ""), (5, "linger5_")):
        metrics[f"kafka_produce_latency_{name}p50_ms"] = percentile(latencies[linger], 0.50)
        metrics[f"kafka_produce_latency_{name}p99_ms"] = percentile(latencies[linger], 0.99)
    return metrics
