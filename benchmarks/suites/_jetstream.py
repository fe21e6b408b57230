"""The JetStream side of the peers suite: publish, paced latency, consume and failover.

Theory of operation. One topic partition is one JetStream stream (`<topic>-<p>` on subject
`<topic>.<p>`, file storage, 3 replicas): each stream is its own Raft group, as each raftlog
partition is, and its sequence is the partition's offset. Publishing uses nats-py's
asynchronous publish with a bounded window (`WINDOW_MAX` acknowledgements outstanding, the
client's default) over the streams in turn; every figure here counts acknowledged records
only. The event loop runs in the calling thread (`asyncio.run` per measurement).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import nats
from _harness import PAYLOAD_POOL_SIZE, Throughput, cpu_seconds, payloads, percentile
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext

from raftlog.chaos.jetstream_cluster import (
    JetStreamCluster,
    create_stream,
    quiet_client_error,
    stream_name,
    subject_name,
)

WINDOW_MAX = 4000  # nats-py's publish_async_max_pending default
PUBLISH_TIMEOUT_S = 5.0
WARM_UP_RECORDS = 200
FETCH_BATCH = 1000
FAILOVER_RECORDS_S = 2000  # the failover suite's open-loop rate
FAILOVER_WAIT_S_MAX = 30.0
CATCH_UP_S = 5.0


async def connect(cluster: JetStreamCluster) -> tuple[Client, JetStreamContext]:
    return await connect_urls(cluster.urls)


async def connect_urls(urls: list[str]) -> tuple[Client, JetStreamContext]:
    client = await nats.connect(
        servers=urls,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.1,
        error_cb=quiet_client_error,
    )
    return client, client.jetstream(timeout=PUBLISH_TIMEOUT_S, publish_async_max_pending=WINDOW_MAX)


async def create_topic(js: JetStreamContext, topic: str, partitions: int) -> None:
    for p in range(partitions):
        await create_stream(js, stream_name(topic, p), subject_name(topic, p), replicas=3)


def server_cpu_s(cluster: JetStreamCluster) -> float:
    pids = [cluster.server_pid(n) for n in cluster.nodes]
    assert all(pids), f"a server is down: {pids}"
    return sum(cpu_seconds(pid) for pid in pids if pid is not None)


async def publish_all(js: JetStreamContext, subjects: Sequence[str], values: list[bytes],
                       *, count: int, duration_s: float = float("inf")) -> int:  # fmt: skip
    """Publish `count` records, or fewer if `duration_s` runs out first, through the window;
    waits for every acknowledgement and returns how many records were published."""
    futures = []
    turn = itertools.cycle(subjects)
    deadline = time.perf_counter() + duration_s
    for i in range(count):
        if i % 256 == 0 and time.perf_counter() > deadline:
            break
        value = values[i & (PAYLOAD_POOL_SIZE - 1)]
        futures.append(await js.publish_async(next(turn), value))
    await asyncio.wait_for(asyncio.gather(*futures), timeout=120.0)
    return len(futures)


def publish_processes(
    cluster: JetStreamCluster, topic: str, partitions: int, *, processes: int,
    record_bytes: int, total_bytes: int, duration_s_max: float,
) -> tuple[float, float]:  # fmt: skip
    """`processes` publishers at once (`_jetstream_worker.py`), `total_bytes` each; (MB/s of
    all of them together, server CPU seconds per MB)."""
    argv = [sys.executable, str(Path(__file__).resolve().parent / "_jetstream_worker.py"),
            ",".join(cluster.urls), topic, str(partitions), str(record_bytes), str(total_bytes),
            str(duration_s_max)]  # fmt: skip
    cpu_before_s = server_cpu_s(cluster)
    results = run_workers(argv, processes, timeout_s=duration_s_max + 180)
    cpu_s = server_cpu_s(cluster) - cpu_before_s
    value_bytes = sum(r["value_bytes"] for r in results)
    return value_bytes / max(r["elapsed_s"] for r in results) / 1e6, cpu_s / (value_bytes / 1e6)


def run_workers(argv: list[str], processes: int, *, timeout_s: float) -> list[dict[str, float]]:
    """`processes` copies of a worker started at once; the JSON line each prints last."""
    workers = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) for _ in range(processes)]
    results = []
    for worker in workers:
        out, _ = worker.communicate(timeout=timeout_s)
        if worker.returncode != 0:
            raise RuntimeError(f"{argv[1]} exited {worker.returncode}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


async def publish_throughput(
    cluster: JetStreamCluster, topic: str, partitions: int, *, record_bytes: int,
    total_bytes: int, duration_s_max: float,
) -> tuple[Throughput, float, float]:  # fmt: skip
    """Closed loop through the bounded window, `total_bytes` or `duration_s_max`, whichever
    ends first; (throughput, CPU seconds per MB of the servers, and of this client)."""
    client, js = await connect(cluster)
    try:
        subjects = [subject_name(topic, p) for p in range(partitions)]
        values = payloads(record_bytes)
        await publish_all(js, subjects, values, count=WARM_UP_RECORDS)
        cpu_before_s, client_before_s = server_cpu_s(cluster), time.process_time()
        started = time.perf_counter()
        count = await publish_all(
            js, subjects, values, count=total_bytes // record_bytes, duration_s=duration_s_max
        )
        elapsed_s = time.perf_counter() - started
        cpu_s = server_cpu_s(cluster) - cpu_before_s
        client_s = time.process_time() - client_before_s
    finally:
        await client.close()
    throughput = Throughput(count, count * record_bytes, elapsed_s)
    mb = throughput.value_bytes / 1e6
    return throughput, cpu_s / mb, client_s / mb


async def latency_point(
    cluster: JetStreamCluster, topic: str, partitions: int, *, rate_records_s: float,
    duration_s: float, record_bytes: int,
) -> dict[str, float]:  # fmt: skip
    """Open loop at `rate_records_s`: each record's ack time minus the time it was due (as
    `_harness.produce_latencies_ms` charges raftlog's)."""
    client, js = await connect(cluster)
    subjects = [subject_name(topic, p) for p in range(partitions)]
    values = payloads(record_bytes)
    latencies_ms: list[float] = []
    try:
        await publish_all(js, subjects, values, count=WARM_UP_RECORDS)
        count = int(rate_records_s * duration_s)
        assert count > 0, (rate_records_s, duration_s)
        turn = itertools.cycle(subjects)
        futures = []
        started = time.perf_counter()
        sent = 0
        while sent < count:
            due = min(count, int((time.perf_counter() - started) * rate_records_s) + 1)
            while sent < due:
                due_s = started + sent / rate_records_s
                future = await js.publish_async(next(turn), values[sent & (PAYLOAD_POOL_SIZE - 1)])
                future.add_done_callback(
                    lambda _, due_s=due_s: latencies_ms.append((time.perf_counter() - due_s) * 1e3)
                )
                futures.append(future)
                sent += 1
            await asyncio.sleep(max(0.0, started + sent / rate_records_s - time.perf_counter()))
        await asyncio.wait_for(asyncio.gather(*futures), timeout=60.0)
        elapsed_s = time.perf_counter() - started
    finally:
        await client.close()
    latencies_ms.sort()
    return {
        "offered_mb_s": rate_records_s * record_bytes / 1e6,
        "achieved_mb_s": len(latencies_ms) * record_bytes / elapsed_s / 1e6,
        "p50_ms": percentile(latencies_ms, 0.50),
        "p99_ms": percentile(latencies_ms, 0.99),
        "p999_ms": percentile(latencies_ms, 0.999),
    }


async def consume_mb_s(cluster: JetStreamCluster, topic: str, partitions: int) -> float:
    """Every message of every stream from sequence 1 through a fresh pull consumer each (no
    acks); payload bytes per second."""
    client, js = await connect(cluster)
    value_bytes = 0
    try:
        started = time.perf_counter()
        for p in range(partitions):
            info = await js.stream_info(stream_name(topic, p))
            config = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL)
            sub = await js.pull_subscribe(
                subject_name(topic, p), stream=stream_name(topic, p), config=config
            )
            seen = 0
            while seen < info.state.last_seq:
                for msg in await sub.fetch(FETCH_BATCH, timeout=5.0):
                    value_bytes += len(msg.data)
                    seen = msg.metadata.sequence.stream
            await sub.unsubscribe()
        elapsed_s = time.perf_counter() - started
    finally:
        await client.close()
    assert value_bytes > 0, f"nothing consumed from {topic!r}"
    return value_bytes / elapsed_s / 1e6


class _FailoverLoad:
    """Open-loop 1 KiB publishes to one stream, each with its own timeout, recording
    (sent_s, acked_s) of every acknowledged record."""

    def __init__(self, js: JetStreamContext, subject_name: str) -> None:
        self._js, self._subject = js, subject_name
        self.acked: list[tuple[float, float]] = []
        self.failures = 0
        self._value = payloads(1024, count=1)[0]
        self._tasks: set[asyncio.Task[None]] = set()

    async def _one(self, sent_s: float) -> None:
        try:
            await self._js.publish(self._subject, self._value, timeout=2.0)
            self.acked.append((sent_s, time.perf_counter()))
        except (TimeoutError, nats.errors.Error):
            self.failures += 1

    async def run(self, stop: asyncio.Event) -> None:
        started, sent = time.perf_counter(), 0
        while not stop.is_set():
            due = int((time.perf_counter() - started) * FAILOVER_RECORDS_S) + 1
            while sent < due and len(self._tasks) < WINDOW_MAX:
                task = asyncio.create_task(self._one(time.perf_counter()))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                sent += 1
            await asyncio.sleep(0.001)
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def first_ack_sent_after(self, moment_s: float) -> float | None:
        return next((acked for sent, acked in self.acked if sent > moment_s), None)


async def _trial(cluster: JetStreamCluster, js: JetStreamContext, name: str,
                 load: _FailoverLoad) -> float:  # fmt: skip
    info = await js.stream_info(name)
    leader = cluster.node_by_name(info.cluster.leader if info.cluster else None)
    assert leader is not None, f"stream {name}: no leader to kill"
    killed_s = time.perf_counter()
    cluster.kill(leader)
    deadline = killed_s + FAILOVER_WAIT_S_MAX
    while (acked_s := load.first_ack_sent_after(killed_s)) is None:
        if time.perf_counter() > deadline:
            acked_s = deadline
            break
        await asyncio.sleep(0.005)
    cluster.start_node(leader)
    await asyncio.sleep(CATCH_UP_S)
    return acked_s - killed_s


async def failover_s(cluster: JetStreamCluster, *, trials: int) -> tuple[list[float], int]:
    """Unavailability after SIGKILL of the stream leader (its ack of the first record sent
    after the kill), `trials` times; (gaps, failed publishes)."""
    client, js = await connect(cluster)
    await create_stream(js, "failover", "failover.0", replicas=3)
    load = _FailoverLoad(js, "failover.0")
    stop = asyncio.Event()
    runner = asyncio.create_task(load.run(stop))
    gaps = []
    try:
        await asyncio.sleep(2.0)
        for index in range(trials):
            gaps.append(await _trial(cluster, js, "failover", load))
            print(f"   jetstream failover trial {index}: {gaps[-1]:.3f} s", flush=True)
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await runner
        await client.close()
    return gaps, load.failures


def running(directory: Path, *, sync_interval: str | None) -> JetStreamCluster:
    cluster = JetStreamCluster.create(directory, sync_interval=sync_interval)
    cluster.start()
    return cluster
