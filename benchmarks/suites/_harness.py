"""Shared helpers of the cluster benchmark suites (cluster, failover, scale); not a suite.

Theory of operation. Every cluster figure is measured against real node processes on
loopback (`raftlog.local_cluster.LocalCluster`), started fresh in a work directory under the
output directory and stopped (SIGTERM, then SIGKILL) however the measurement ends. The
benchmark process itself is the one client process: it produces through
`raftlog.client.Producer` with the same seeded random, incompressible payloads everywhere.

Measurement rules, shared so the suites agree:
- a throughput is bytes (or records) acknowledged divided by the seconds from the first
  `send` to the return of `flush()`, after a warm-up that fetched metadata and a producer id;
- a latency is the time from when a record was *due* (open-loop schedule) to when its future
  completed, so a stalled sender is charged for the records it should have sent
  (no coordinated omission);
- CPU is utime + stime of a node process from /proc/<pid>/stat, differenced over a window.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pathlib
import random
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import grpc

from raftlog.client import Admin, Producer
from raftlog.client.accumulator import RecordMetadata
from raftlog.client.admin import TopicDescription
from raftlog.client.errors import NoNodeAnsweredError, TopicAlreadyExistsError
from raftlog.cluster_cli import wait_for_controller
from raftlog.local_cluster import LocalCluster
from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.rpc.v1 import raftlog_pb2_grpc as pb_grpc
from raftlog.storage.batch import parse_header
from raftlog.storage.records import RecordInput, encode_batch

SEED = 20261122
KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
PAYLOAD_POOL_SIZE = 64
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
LEADERS_WAIT_S_MAX = 120.0
PROBE_TIMEOUT_S = 30.0
RAW_RETRIES_MAX = 20
BATCH_OVERHEAD_BYTES = 61  # RecordBatch v2 header; the rest counts as payload
GRPC_OPTIONS = [("grpc.max_send_message_length", 64 * MIB)]


def payloads(record_bytes: int, count: int = PAYLOAD_POOL_SIZE) -> list[bytes]:
    """Seeded random values: a disk or link that compresses favours no one."""
    assert record_bytes > 0 and count > 0, (record_bytes, count)
    rng = random.Random(SEED + record_bytes)
    return [rng.randbytes(record_bytes) for _ in range(count)]


@contextlib.contextmanager
def running_cluster(
    work: pathlib.Path, *, node_count: int = 3, flags: Sequence[str] = ()
) -> Iterator[LocalCluster]:
    """A fresh cluster in `work` (wiped first), stopped and wiped on exit; the node logs are
    kept in `<work>-logs`."""
    shutil.rmtree(work, ignore_errors=True)
    cluster = LocalCluster.create(work, node_count=node_count)
    cluster.start(*flags)
    try:
        wait_for_controller(cluster.bootstrap, timeout_s=30)
        yield cluster
    finally:
        cluster.stop()
        # The node logs outlive the data: they are the evidence when a figure looks wrong.
        logs = work.parent / f"{work.name}-logs"
        shutil.rmtree(logs, ignore_errors=True)
        logs.mkdir(parents=True)
        for log in work.glob("node-*.log"):
            shutil.copy(log, logs / log.name)
        shutil.rmtree(work, ignore_errors=True)


PREFERRED_WAIT_S = 10.0


def wait_leaders(
    admin: Admin, topic: str, *, timeout_s: float = LEADERS_WAIT_S_MAX
) -> TopicDescription:
    """The topic's description once every partition is led by its preferred replica (the
    first): a new partition's first leader is whoever won the election, and the nodes hand
    leadership to the preferred replica within a heartbeat interval or two. A run that
    started before that paid a leadership transfer (retries, a p99 of ~170 ms at 10% load).
    After PREFERRED_WAIT_S with leaders that are not all preferred, any leaders will do."""
    started = time.monotonic()
    deadline = started + timeout_s
    while True:
        with contextlib.suppress(Exception):
            description = admin.describe_topic(topic)
            led = all(p.leader is not None for p in description.partitions)
            preferred = all(p.leader == p.replicas[0] for p in description.partitions)
            if led and (preferred or time.monotonic() - started > PREFERRED_WAIT_S):
                return description
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"topic {topic!r}: not every partition has a leader after {timeout_s} s"
            )
        time.sleep(0.2)


def create_topic(
    admin: Admin, topic: str, *, partitions: int, replication_factor: int = 3, wait: bool = True
) -> TopicDescription | None:
    """Creates the topic (asking again while no node answers: the machine is shared and a
    node may be slow to accept its first connection), then waits for its leaders."""
    deadline = time.monotonic() + LEADERS_WAIT_S_MAX
    while True:
        try:
            admin.create_topic(topic, partitions=partitions, replication_factor=replication_factor)
            break
        except NoNodeAnsweredError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
        except TopicAlreadyExistsError:
            break  # an earlier attempt did reach the controller
    return wait_leaders(admin, topic) if wait else None


@dataclass(frozen=True, slots=True)
class Throughput:
    records: int
    value_bytes: int
    elapsed_s: float

    @property
    def mb_s(self) -> float:
        return self.value_bytes / self.elapsed_s / 1e6

    @property
    def records_s(self) -> float:
        return self.records / self.elapsed_s


def warm_up(producer: Producer, topic: str, values: list[bytes]) -> None:
    """Metadata, producer id and connections, so the timed part measures steady state."""
    futures = [producer.send(topic, value=values[i % len(values)]) for i in range(200)]
    producer.flush()
    for future in futures:
        future.result(timeout=60)
    settle_heap()


def settle_heap() -> None:
    """Freeze what the measuring process holds now (imported modules, the cluster handle,
    earlier results), as a latency-sensitive application does after its start: the timed
    part then pays full garbage collections over the producer's own objects only, not over
    the harness's. Without it a full collection of this process took 30-180 ms (gc callbacks,
    2026-11-22) and set the p99 of every paced run."""
    gc.collect()
    gc.freeze()


def produce_throughput(
    producer: Producer, topic: str, *, record_bytes: int, total_bytes: int
) -> Throughput:
    """Closed loop: send as fast as the producer's bounded buffer admits, then flush."""
    values = payloads(record_bytes)
    warm_up(producer, topic, values)
    count = total_bytes // record_bytes
    assert count > 0, (total_bytes, record_bytes)
    failures: list[BaseException] = []

    def on_done(future: Future[RecordMetadata]) -> None:
        if future.exception() is not None:
            failures.append(future.exception())  # type: ignore[arg-type]

    send = producer.send
    started = time.perf_counter()
    for i in range(count):
        send(topic, value=values[i & (PAYLOAD_POOL_SIZE - 1)]).add_done_callback(on_done)
    producer.flush()
    elapsed_s = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"{len(failures)} of {count} sends to {topic!r} failed: {failures[0]!r}")
    return Throughput(count, count * record_bytes, elapsed_s)


# The pacing loop's shortest sleep (produce_latencies_ms); an A/B knob, 0 by default.
PACING_TICK_S = float(os.environ.get("RAFTLOG_BENCH_TICK_MS", "0")) / 1e3


CALLBACKS_WAIT_S_MAX = 10.0


def produce_latencies_ms(
    producer: Producer,
    topic: str,
    *,
    record_bytes: int,
    rate_records_s: float,
    duration_s: float,
    tick_s: float = PACING_TICK_S,
) -> list[float]:
    """Open loop at `rate_records_s`: each record's ack time minus the time it was due.

    Between sends the loop sleeps until the next record is due, but at least `tick_s`
    (`RAFTLOG_BENCH_TICK_MS`, default 0: no floor). A floor sends records in small bursts, as
    Kafka's ProducerPerformance throttler does (it never sleeps under 2 ms), and each record
    is still charged from when it was due, so the tick's delay counts against the figure.
    Measured here (2026-11-25): 1 ms ticks take the measuring process from 0.52 to 0.40
    cores at 37k records/s, but latency moved within run-to-run noise."""
    assert tick_s >= 0, tick_s
    values = payloads(record_bytes)
    warm_up(producer, topic, values)
    count = int(rate_records_s * duration_s)
    assert count > 0, (rate_records_s, duration_s)
    latencies_ms: list[float] = []
    failures: list[BaseException] = []

    def completion(due_s: float) -> object:
        def on_done(future: Future[RecordMetadata]) -> None:
            if future.exception() is not None:
                failures.append(future.exception())  # type: ignore[arg-type]
            latencies_ms.append((time.perf_counter() - due_s) * 1e3)

        return on_done

    started = time.perf_counter()
    sent = 0
    while sent < count:
        now = time.perf_counter()
        due = min(count, int((now - started) * rate_records_s) + 1)
        while sent < due:
            due_s = started + sent / rate_records_s
            future = producer.send(topic, value=values[sent & (PAYLOAD_POOL_SIZE - 1)])
            future.add_done_callback(completion(due_s))  # type: ignore[arg-type]
            sent += 1
        time.sleep(max(tick_s, started + sent / rate_records_s - time.perf_counter()))
    producer.flush()
    # flush() returns once every batch is answered; the records' callbacks may still be
    # running on the producer's thread (seen here: 29,903 of 30,000 at the return).
    deadline_s = time.monotonic() + CALLBACKS_WAIT_S_MAX
    while len(latencies_ms) + len(failures) < count and time.monotonic() < deadline_s:
        time.sleep(0.001)
    if failures:
        raise RuntimeError(f"{len(failures)} of {count} paced sends failed: {failures[0]!r}")
    assert len(latencies_ms) == count, (len(latencies_ms), count)
    return sorted(latencies_ms)


# The receiving end of `loopback_mb_s`, run by a fresh interpreter: it connects, reads
# until it has the byte count it was given, then answers one byte.
_LOOPBACK_RECEIVER = """
import socket, sys
port, total = int(sys.argv[1]), int(sys.argv[2])
with socket.create_connection(("127.0.0.1", port)) as sock:
    buffer = bytearray(1 << 20)
    received = 0
    while received < total:
        n = sock.recv_into(buffer)
        if n == 0:
            raise SystemExit(f"sender closed after {received} of {total} bytes")
        received += n
    sock.sendall(b"!")
"""
LOOPBACK_CHUNK_BYTES = MIB
LOOPBACK_WAIT_S_MAX = 60.0


def loopback_mb_s(total_bytes: int) -> float:
    """A plain TCP socket pair on 127.0.0.1 between two processes, 1 MiB `sendall`s into
    1 MiB `recv_into`s, timed until the receiver says it has every byte: the network's
    limit on this machine, as `raw_append_mb_s` is the disk's."""
    assert total_bytes >= LOOPBACK_CHUNK_BYTES, total_bytes
    chunk = random.Random(SEED).randbytes(LOOPBACK_CHUNK_BYTES)
    count = total_bytes // LOOPBACK_CHUNK_BYTES
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(LOOPBACK_WAIT_S_MAX)
        port = server.getsockname()[1]
        argv = [sys.executable, "-c", _LOOPBACK_RECEIVER, str(port), str(count * len(chunk))]
        receiver = subprocess.Popen(argv)
        try:
            connection, _ = server.accept()
            with connection:
                connection.settimeout(LOOPBACK_WAIT_S_MAX)
                started = time.perf_counter()
                for _ in range(count):
                    connection.sendall(chunk)
                if connection.recv(1) != b"!":
                    raise RuntimeError("loopback receiver closed before it had every byte")
                elapsed_s = time.perf_counter() - started
        finally:
            if receiver.wait(timeout=LOOPBACK_WAIT_S_MAX) != 0:
                raise RuntimeError(f"loopback receiver exited with {receiver.returncode}")
    return count * len(chunk) / elapsed_s / 1e6


def raw_batch(record_bytes: int, records: int) -> bytes:
    """One RecordBatch v2 of `records` seeded random values, encoded once and resent: the
    server patches base offset and epoch, so a non-idempotent batch may be appended again."""
    values = payloads(record_bytes)
    now_ms = time.time_ns() // 1_000_000
    inputs = [RecordInput(None, values[i % len(values)], now_ms) for i in range(records)]
    return encode_batch(inputs)


def produce_raw_batches(
    leader_address: Callable[[], str],
    topic: str,
    batch: bytes,
    *,
    count: int,
    acks: int,
    window: int = 4,
) -> Throughput:
    """Sends `batch` until `count` copies are acknowledged by partition 0's leader, with gRPC
    alone (no client library) and `window` requests in flight: what the server sustains
    without the Python producer's per-record work. A retriable error (a leadership transfer
    right after topic creation was seen) re-resolves the leader and carries on; time spent
    so counts against the figure."""
    assert count > 0 and window > 0, (count, window)
    acked = 0
    retries_left = RAW_RETRIES_MAX
    started = time.perf_counter()
    while acked < count:
        acked_now, error = _raw_batches_once(
            leader_address(), topic, batch, count - acked, acks, window
        )
        acked += acked_now
        if error is not None:
            if not error.retriable or retries_left == 0:
                raise RuntimeError(f"produce to {topic!r} failed: {error}")
            retries_left -= 1
            time.sleep(0.2)
    elapsed_s = time.perf_counter() - started
    records = parse_header(batch).record_count
    return Throughput(acked * records, acked * (len(batch) - BATCH_OVERHEAD_BYTES), elapsed_s)


def _raw_batches_once(
    address: str, topic: str, batch: bytes, count: int, acks: int, window: int
) -> tuple[int, Any]:
    """(batches acknowledged, the first error or None) of up to `count` sends to `address`."""
    request = pb.ProduceRequest(
        topic=topic, partition=0, batches=[batch], acks=acks, timeout_ms=30_000
    )  # type: ignore[arg-type]
    acked, error = 0, None
    in_flight: list[Any] = []
    with grpc.insecure_channel(address, options=GRPC_OPTIONS) as channel:
        produce = pb_grpc.LogStub(channel).Produce
        for sent in range(count + window):
            if len(in_flight) == window or ((sent >= count or error is not None) and in_flight):
                response = in_flight.pop(0).result(timeout=60)
                if response.error.code == pb.ErrorCode.NONE:
                    acked += 1
                elif error is None:
                    error = response.error
            if sent < count and error is None:
                in_flight.append(produce.future(request, timeout=60))
    assert not in_flight and acked <= count, (len(in_flight), acked, count)
    return acked, error


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending sequence."""
    assert sorted_values and 0.0 <= fraction <= 1.0, (len(sorted_values), fraction)
    rank = min(len(sorted_values) - 1, max(0, round(fraction * len(sorted_values)) - 1))
    return sorted_values[rank]


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process so far (fields 14 and 15 of /proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(") ", 1)[1].split()
    # fields[0] is field 3 (state), so field N is fields[N - 3].
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_S


def fetch_error(
    address: str, topic: str, partition: int, *, timeout_s: float = 1.0
) -> tuple[int, int]:
    """(error code, leader epoch) of a one-byte, no-wait Fetch from offset 0 at `address`;
    code NONE means this node leads the partition and serves committed reads."""
    request = pb.FetchRequest(
        topic=topic, partition=partition, offset=0, max_bytes=1, max_wait_ms=0
    )
    with grpc.insecure_channel(address) as channel:
        response = pb_grpc.LogStub(channel).Fetch(request, timeout=timeout_s)
    return int(response.error.code), int(response.leader_epoch)


def leader_epochs(cluster: LocalCluster, topic: str, partitions: int) -> dict[int, int]:
    """Partition -> epoch (Raft term) of the node that serves it as leader, asked of every
    running node with a no-wait fetch per partition, all in flight at once (a node busy
    electing answers slowly); partitions that no node serves are left out."""
    epochs: dict[int, int] = {}
    for node_id, node in cluster.nodes.items():
        if not cluster.is_running(node_id):
            continue
        with grpc.insecure_channel(node.client_address) as channel:
            fetch = pb_grpc.LogStub(channel).Fetch
            futures = [
                fetch.future(
                    pb.FetchRequest(topic=topic, partition=p, offset=0, max_bytes=1, max_wait_ms=0),
                    timeout=PROBE_TIMEOUT_S,
                )
                for p in range(partitions)
            ]
            for partition, future in enumerate(futures):
                with contextlib.suppress(grpc.RpcError):
                    response = future.result()
                    if response.error.code == pb.ErrorCode.NONE:
                        epoch = int(response.leader_epoch)
                        epochs[partition] = max(epoch, epochs.get(partition, epoch))
    return epochs


def serving_leader(cluster: LocalCluster, topic: str, partition: int) -> int | None:
    """The node that really leads the partition now, asked of the nodes themselves (the
    metadata's leader field can lag behind an election)."""
    leaders: list[tuple[int, int]] = []
    for node_id, node in cluster.nodes.items():
        if not cluster.is_running(node_id):
            continue
        with contextlib.suppress(grpc.RpcError):
            code, epoch = fetch_error(node.client_address, topic, partition)
            if code == pb.ErrorCode.NONE:
                leaders.append((epoch, node_id))
    return max(leaders)[1] if leaders else None


def node_pids(cluster: LocalCluster) -> dict[int, int]:
    pids = {node_id: node.pid for node_id, node in cluster.nodes.items()}
    assert all(pids.values()), pids
    return pids
