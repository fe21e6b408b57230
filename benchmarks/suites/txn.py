"""Kafka transactions (docs/transactions.md) measured with confluent-kafka's transactional
producer against a 3-node cluster (real processes on loopback), 1 KiB seeded incompressible
records, acks=all, linger.ms 5 (librdkafka's default) on every producer:

- `txn_commits_s_<1,10,100>_records`: committed transactions a second from one producer,
  each transaction `n` records spread round-robin over a topic's 3 partitions, begin ->
  produce -> commit, back to back;
- `txn_produce_mb_s` / `idempotent_produce_mb_s` and `txn_vs_idempotent_produce`: the same
  bytes written by a transactional producer in transactions of 100 records and by an
  idempotent producer (the same settings, no transactional id), alternating rounds, medians
  (the issue's goal: >= 0.7);
- `txn_100ms_produce_mb_s` / `txn_100ms_vs_idempotent_produce`: the same bytes in
  transactions committed every 100 ms instead (each open 100 ms, then committed): Kafka's
  own comparison (KIP-98's measurements commit every 100 ms, Kafka Streams' exactly-once
  `commit.interval.ms` default), which sizes a transaction by time, not by records;
- `txn_4_producers_produce_mb_s` / `idempotent_4_producers_produce_mb_s` and
  `txn_vs_idempotent_produce_4_producers`: the same bytes split over 4 producers of each kind
  writing at once (threads), transactions of 100 records: what a transaction's fixed cost
  leaves when several producers overlap theirs;
- `txn_e2e_read_<committed,uncommitted>_p50_ms` / `_p99_ms` and
  `txn_e2e_read_committed_vs_uncommitted_p50`: from a record's produce call to when a
  consumer of each isolation level (both reading the same partitions at once) gets it, for
  transactions of 10 records committed at a steady pace (well under capacity);
- the coordinator placement measurement (issue 30, `docs/transactions.md`, "Where the
  coordinator lives"), 64 concurrent writers (threads; librdkafka releases the GIL):
  `txn_64_producers_commits_s`: committed transactions of one record a second from 64
  transactional producers, the built design end to end;
  `coordinator_metadata_txns_s` and `coordinator_partitions_txns_s`: the coordinator's own
  write pattern alone, per transaction the three Raft commits the built coordinator makes
  (AddToTransaction, PrepareEndTransaction, CompleteEndTransaction), one after another,
  through each candidate, from 64 writers on one plain Kafka connection each (the same
  minimal client for both): as metadata-quorum commands (an InitProducerId of the writer's
  own transactional id is one coordinator transition, InitTransaction, through the
  controller's `submit`, as the built coordinator's three are), or as acks=all appends of one
  128-byte record (about a serialized transaction state) to an ordinary
  replicated partition chosen by crc32(transactional id) among `COORDINATOR_PARTITIONS`,
  their leaders spread over the three nodes (Kafka's `__transaction_state`);
  `coordinator_partitions_vs_metadata` is their ratio.

A throughput counts from the first send to the last commit's (or flush's) return, after a
warm-up (metadata, producer id, connections).
"""

from __future__ import annotations

import datetime
import io
import pathlib
import socket
import statistics
import struct
import sys
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

SUITES_DIR = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(SUITES_DIR)]
from _harness import (  # noqa: E402 (found through the path set just above)
    KIB,
    MIB,
    Throughput,
    create_topic,
    payloads,
    percentile,
    running_cluster,
)

from raftlog.client import Admin  # noqa: E402
from raftlog.storage.records import RecordInput, encode_batch  # noqa: E402

PARTITIONS = 3
WRITERS = 64
RECORDS_PER_TXN = 100
COMMIT_INTERVAL_S = 0.1  # Kafka Streams' exactly-once commit.interval.ms default (100 ms)
PER_CHECK = 10  # records produced between looks at the clock in a timed transaction
CONCURRENT_PRODUCERS = 4
COORDINATOR_PARTITIONS = 6  # two leaders a node: the internal topic's writes spread evenly
COORDINATOR_WRITES_PER_TXN = 3  # AddToTransaction, PrepareEndTransaction, CompleteEndTransaction
COORDINATOR_RECORD_BYTES = 128  # about a serialized TransactionState of one partition
TIMEOUT_S = 60.0


def _producer_config(boot: str, transactional_id: str | None) -> dict[str, Any]:
    config: dict[str, Any] = {
        "bootstrap.servers": boot,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 5,
        "queue.buffering.max.kbytes": 32 * 1024,
    }
    if transactional_id is not None:
        config["transactional.id"] = transactional_id
        config["transaction.timeout.ms"] = 60_000
    return config


def _producer(boot: str, transactional_id: str | None) -> Any:
    import confluent_kafka

    producer = confluent_kafka.Producer(_producer_config(boot, transactional_id))
    if transactional_id is not None:
        producer.init_transactions(TIMEOUT_S)
    return producer


def _produce(producer: Any, topic: str, values: list[bytes], first: int, count: int) -> None:
    """`count` records round-robin over the topic's partitions, waiting on a full queue."""
    for i in range(first, first + count):
        while True:
            try:
                producer.produce(topic, values[i & 63], partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.001)


def _write(
    producer: Any,
    topic: str,
    *,
    count: int,
    per_txn: int | None,
    interval_s: float | None = None,
) -> Throughput:
    """`count` 1 KiB records through `producer`: in transactions of `per_txn` records, each
    committed before the next begins; with `interval_s`, in transactions committed once
    they have been open that long (Kafka's commit.interval.ms); or (both None) all at once
    and one flush."""
    values = payloads(KIB)
    started = time.perf_counter()
    if interval_s is not None:
        first = 0
        while first < count:
            producer.begin_transaction()
            ends_s = time.perf_counter() + interval_s
            while first < count and time.perf_counter() < ends_s:
                step = min(PER_CHECK, count - first)
                _produce(producer, topic, values, first, step)
                first += step
            producer.commit_transaction(TIMEOUT_S)
    elif per_txn is None:
        _produce(producer, topic, values, 0, count)
        assert producer.flush(TIMEOUT_S) == 0
    else:
        for first in range(0, count, per_txn):
            producer.begin_transaction()
            _produce(producer, topic, values, first, min(per_txn, count - first))
            producer.commit_transaction(TIMEOUT_S)
    return Throughput(count, count * KIB, time.perf_counter() - started)


def _write_concurrently(
    producers: list[Any], topic: str, *, count: int, per_txn: int | None
) -> Throughput:
    """`count` records split evenly over `producers`, each on its own thread (`_write`),
    from the first send to the last commit or flush."""
    share = count // len(producers)
    started = time.perf_counter()
    _parallel(
        [
            lambda p=p: _write(p, topic, count=share, per_txn=per_txn)  # type: ignore[misc]
            for p in producers
        ]
    )
    total = share * len(producers)
    return Throughput(total, total * KIB, time.perf_counter() - started)


def _commits_s(producer: Any, topic: str, *, per_txn: int, duration_s: float) -> float:
    """Committed transactions of `per_txn` records a second, back to back for `duration_s`."""
    values = payloads(KIB)
    started = time.perf_counter()
    commits = 0
    while (elapsed_s := time.perf_counter() - started) < duration_s:
        producer.begin_transaction()
        _produce(producer, topic, values, commits * per_txn, per_txn)
        producer.commit_transaction(TIMEOUT_S)
        commits += 1
    return commits / elapsed_s


class _Reader(threading.Thread):
    """Reads `topic` from `starts` at one isolation level, noting when each sequence number
    (a value's first 8 bytes) arrived."""

    def __init__(self, boot: str, topic: str, isolation: str, starts: dict[int, int]) -> None:
        super().__init__(daemon=True)
        import confluent_kafka

        self.seen_s: dict[int, float] = {}
        self.stop = threading.Event()
        self.consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": boot,
                "group.id": f"txn-bench-{isolation}",
                "isolation.level": isolation,
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 10,
            }
        )
        self.consumer.assign(
            [confluent_kafka.TopicPartition(topic, p, o) for p, o in starts.items()]
        )

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                for message in self.consumer.consume(100, 0.05):
                    if message.error() is None:
                        now_s = time.perf_counter()
                        self.seen_s[int.from_bytes(message.value()[:8], "big")] = now_s
        finally:
            self.consumer.close()


def _e2e_latencies_ms(
    boot: str, topic: str, *, txns_s: float, duration_s: float
) -> dict[str, list[float]]:
    """Per isolation level, the sorted latencies from produce call to arrival of every record
    of transactions of 10 records committed `txns_s` a second for `duration_s`."""
    import confluent_kafka

    producer = _producer(boot, "txn-bench-e2e")
    probe = confluent_kafka.Consumer({"bootstrap.servers": boot, "group.id": "txn-bench-probe"})
    starts = {
        p: probe.get_watermark_offsets(confluent_kafka.TopicPartition(topic, p), TIMEOUT_S)[1]
        for p in range(PARTITIONS)
    }
    probe.close()
    readers = {
        isolation: _Reader(boot, topic, isolation, starts)
        for isolation in ("read_committed", "read_uncommitted")
    }
    for reader in readers.values():
        reader.start()
    time.sleep(1.0)  # the readers' first fetches are out before the first record
    padding = bytes(KIB - 8)
    sent_s: dict[int, float] = {}
    txns = int(txns_s * duration_s)
    started = time.perf_counter()
    for txn in range(txns):
        while time.perf_counter() < started + txn / txns_s:
            time.sleep(0.001)
        producer.begin_transaction()
        for i in range(txn * 10, txn * 10 + 10):
            sent_s[i] = time.perf_counter()
            producer.produce(topic, i.to_bytes(8, "big") + padding, partition=i % PARTITIONS)
        producer.commit_transaction(TIMEOUT_S)
    deadline = time.perf_counter() + TIMEOUT_S
    while any(len(r.seen_s) < len(sent_s) for r in readers.values()):
        if time.perf_counter() > deadline:
            raise TimeoutError({k: len(r.seen_s) for k, r in readers.items()})
        time.sleep(0.05)
    for reader in readers.values():
        reader.stop.set()
        reader.join(TIMEOUT_S)
    return {
        isolation: sorted((r.seen_s[i] - sent_s[i]) * 1000 for i in sent_s)
        for isolation, r in readers.items()
    }


def _concurrently(
    writers: list[Any], step: Callable[[Any, int], None], *, duration_s: float
) -> float:
    """Steps a second: `step(writer, n)` called back to back by one thread per writer, all
    released together, for `duration_s`."""
    counts = [0] * len(writers)
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(writers) + 1)
    stop = threading.Event()

    def loop(index: int) -> None:
        barrier.wait()
        try:
            while not stop.is_set():
                step(writers[index], counts[index])
                counts[index] += 1
        except BaseException as error:  # reported below: a failed step fails the suite
            errors.append(error)

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(len(writers))]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    time.sleep(duration_s)
    stop.set()
    for thread in threads:
        thread.join(TIMEOUT_S)
    elapsed_s = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"{len(errors)} of {len(writers)} writers failed: {errors[0]!r}")
    return sum(counts) / elapsed_s


def _parallel(calls: list[Callable[[], Any]]) -> list[Any]:
    """Each call on its own thread (librdkafka's set-up is mostly waiting), in order."""
    results: list[Any] = [None] * len(calls)

    def call(index: int) -> None:
        results[index] = calls[index]()

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(r is not None for r in results), "a writer failed to start"
    return results


def _txn_step(topic: str) -> Callable[[Any, int], None]:
    value = payloads(KIB)[0]

    def step(producer: Any, n: int) -> None:
        producer.begin_transaction()
        producer.produce(topic, value, partition=n % PARTITIONS)
        producer.commit_transaction(TIMEOUT_S)

    return step


class _WireWriter:
    """One connection to one node's Kafka listener, one request at a time (kio encodes and
    decodes): both coordinator candidates are written to with this same client, so neither
    is charged for a client library's own path (a librdkafka consumer's synchronous commit
    and a producer's flush differ)."""

    def __init__(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=TIMEOUT_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.correlation_id = 0

    def call(self, request: Any) -> Any:
        from kio.index import load_response_schema
        from kio.serial import entity_reader, entity_writer

        self.correlation_id += 1
        api_key, version = int(request.__api_key__), int(request.__version__)
        body = io.BytesIO()
        entity_writer(type(request))(body, request)
        header = struct.pack(">hhih", api_key, version, self.correlation_id, 5) + b"bench"
        if request.__flexible__:
            header += b"\x00"  # no tagged fields
        payload = header + body.getvalue()
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)
        (size,) = struct.unpack(">i", self._read(4))
        data = self._read(size)
        assert struct.unpack_from(">i", data)[0] == self.correlation_id
        response_class = load_response_schema(api_key, version)
        offset = 5 if response_class.__flexible__ else 4  # the header's tagged fields
        response, _ = entity_reader(response_class)(data, offset)
        return response

    def _read(self, count: int) -> bytes:
        data = bytearray()
        while len(data) < count:
            chunk = self.sock.recv(count - len(data))
            if not chunk:
                raise ConnectionError(f"closed after {len(data)} of {count} bytes")
            data += chunk
        return bytes(data)

    def close(self) -> None:
        self.sock.close()


def _kafka_addresses(boot: str, topic: str) -> tuple[str, dict[int, str]]:
    """The controller's Kafka address (the group and transaction coordinator) and each
    partition leader's, from a Metadata request."""
    import confluent_kafka.admin

    metadata = confluent_kafka.admin.AdminClient({"bootstrap.servers": boot}).list_topics(
        topic, timeout=TIMEOUT_S
    )
    address = {b.id: f"{b.host}:{b.port}" for b in metadata.brokers.values()}
    leaders = {p.id: address[p.leader] for p in metadata.topics[topic].partitions.values()}
    return address[metadata.controller_id], leaders


def _metadata_step() -> Callable[[Any, int], None]:
    """One transaction's coordinator writes as metadata commands: three InitProducerIds of
    the writer's own transactional id, each one coordinator state transition (InitTransaction,
    the epoch bumped) committed by the metadata quorum before it is answered."""
    from kio.schema.errors import ErrorCode
    from kio.schema.init_producer_id.v3 import request as ip
    from kio.static.primitive import i16, i32Timedelta

    timeout = i32Timedelta.parse(datetime.timedelta(seconds=TIMEOUT_S))

    def step(writer: tuple[_WireWriter, str], _n: int) -> None:
        connection, transactional_id = writer
        request = ip.InitProducerIdRequest(
            transactional_id=ip.TransactionalId(transactional_id),
            transaction_timeout=timeout,
            producer_id=ip.ProducerId(-1),
            producer_epoch=i16(-1),
        )
        for _ in range(COORDINATOR_WRITES_PER_TXN):
            code = connection.call(request).error_code
            assert code is ErrorCode.none, code

    return step


def _partitions_step(topic: str) -> Callable[[Any, int], None]:
    """One transaction's coordinator writes as three acks=all appends of one record, each
    acknowledged before the next, to the partition its transactional id hashes to."""
    from kio.schema.errors import ErrorCode
    from kio.schema.produce.v9 import request as pr
    from kio.static.primitive import Records, i16, i32, i32Timedelta

    batch = encode_batch([RecordInput(None, payloads(COORDINATOR_RECORD_BYTES)[0], 0)])
    timeout = i32Timedelta.parse(datetime.timedelta(seconds=TIMEOUT_S))

    def step(writer: tuple[_WireWriter, int], _n: int) -> None:
        connection, partition = writer
        data = pr.PartitionProduceData(index=i32(partition), records=Records(batch))
        request = pr.ProduceRequest(
            transactional_id=None,
            acks=i16(-1),
            timeout=timeout,
            topic_data=(pr.TopicProduceData(name=pr.TopicName(topic), partition_data=(data,)),),
        )
        for _ in range(COORDINATOR_WRITES_PER_TXN):
            code = connection.call(request).responses[0].partition_responses[0].error_code
            assert code is ErrorCode.none, code

    return step


def _placement(boot: str, *, rounds: int, duration_s: float) -> dict[str, float]:
    producers = _parallel(
        [lambda i=i: _producer(boot, f"txn-bench-{i}") for i in range(WRITERS)]  # type: ignore[misc]
    )
    controller, _ = _kafka_addresses(boot, "txn-small")
    _, leaders = _kafka_addresses(boot, "txn-coordinator")
    metadata_writers = [(_WireWriter(controller), f"coordinator-{i}") for i in range(WRITERS)]
    partition_writers = []
    for i in range(WRITERS):
        partition = zlib.crc32(f"txn-bench-{i}".encode()) % COORDINATOR_PARTITIONS
        partition_writers.append((_WireWriter(leaders[partition]), partition))
    runs: list[tuple[str, list[Any], Callable[[Any, int], None]]] = [
        ("txn_64_producers_commits_s", producers, _txn_step("txn-small")),
        ("coordinator_metadata_txns_s", metadata_writers, _metadata_step()),
        ("coordinator_partitions_txns_s", partition_writers, _partitions_step("txn-coordinator")),
    ]
    for _name, writers, step in runs:  # warm-up: connections, coordinators, leaders
        _concurrently(writers, step, duration_s=1.0)
    figures: dict[str, list[float]] = {}
    for round_ in range(rounds):
        for name, writers, step in runs if round_ % 2 == 0 else runs[::-1]:
            rate = _concurrently(writers, step, duration_s=duration_s)
            per_txn = 1 if name.startswith("txn_") else COORDINATOR_WRITES_PER_TXN
            figures.setdefault(name, []).append(rate / per_txn)
    for connection, _ in metadata_writers + partition_writers:
        connection.close()
    for producer in producers:
        producer.flush(TIMEOUT_S)
    metrics = {name: statistics.median(values) for name, values in figures.items()}
    metrics["coordinator_partitions_vs_metadata"] = (
        metrics["coordinator_partitions_txns_s"] / metrics["coordinator_metadata_txns_s"]
    )
    return metrics


def measure(boot: str, *, quick: bool) -> dict[str, float]:
    """Every figure of the suite against a running cluster whose Kafka listener is `boot`, its
    topics already made (`TOPICS`)."""
    rounds = 1 if quick else 3
    duration_s = 3.0 if quick else 10.0
    metrics: dict[str, float] = {}
    producer = _producer(boot, "txn-bench-commits")
    _commits_s(producer, "txn", per_txn=10, duration_s=1.0)  # warm-up
    for per_txn in (1, 10, 100):
        metrics[f"txn_commits_s_{per_txn}_records"] = _commits_s(
            producer, "txn", per_txn=per_txn, duration_s=duration_s
        )
    idempotent = _producer(boot, None)
    _write(idempotent, "txn-idempotent", count=1000, per_txn=None)  # warm-up
    several = [_producer(boot, f"txn-bench-several-{i}") for i in range(CONCURRENT_PRODUCERS)]
    several_idempotent = [_producer(boot, None) for _ in range(CONCURRENT_PRODUCERS)]
    for p in several:
        _write(p, "txn", count=100, per_txn=RECORDS_PER_TXN)  # warm-up
    for p in several_idempotent:
        _write(p, "txn-idempotent", count=100, per_txn=None)  # warm-up
    count = (8 if quick else 32) * MIB // KIB
    runs: dict[str, Callable[[], Throughput]] = {
        "txn": lambda: _write(producer, "txn", count=count, per_txn=RECORDS_PER_TXN),
        "txn_100ms": lambda: _write(
            producer, "txn", count=count, per_txn=None, interval_s=COMMIT_INTERVAL_S
        ),
        "idempotent": lambda: _write(idempotent, "txn-idempotent", count=count, per_txn=None),
        f"txn_{CONCURRENT_PRODUCERS}_producers": lambda: _write_concurrently(
            several, "txn", count=count, per_txn=RECORDS_PER_TXN
        ),
        f"idempotent_{CONCURRENT_PRODUCERS}_producers": lambda: _write_concurrently(
            several_idempotent, "txn-idempotent", count=count, per_txn=None
        ),
    }
    results: dict[str, list[Throughput]] = {name: [] for name in runs}
    for round_ in range(rounds):
        for name in list(runs) if round_ % 2 == 0 else list(runs)[::-1]:
            results[name].append(runs[name]())
    mb_s = {name: statistics.median(r.mb_s for r in values) for name, values in results.items()}
    metrics["txn_produce_mb_s"] = mb_s["txn"]
    metrics["idempotent_produce_mb_s"] = mb_s["idempotent"]
    metrics["txn_vs_idempotent_produce"] = mb_s["txn"] / mb_s["idempotent"]
    metrics["txn_100ms_produce_mb_s"] = mb_s["txn_100ms"]
    metrics["txn_100ms_vs_idempotent_produce"] = mb_s["txn_100ms"] / mb_s["idempotent"]
    several_name = f"{CONCURRENT_PRODUCERS}_producers"
    metrics[f"txn_{several_name}_produce_mb_s"] = mb_s[f"txn_{several_name}"]
    metrics[f"idempotent_{several_name}_produce_mb_s"] = mb_s[f"idempotent_{several_name}"]
    metrics[f"txn_vs_idempotent_produce_{several_name}"] = (
        mb_s[f"txn_{several_name}"] / mb_s[f"idempotent_{several_name}"]
    )
    latencies = _e2e_latencies_ms(boot, "txn-e2e", txns_s=10.0, duration_s=duration_s)
    for isolation, values in latencies.items():
        metrics[f"txn_e2e_{isolation}_p50_ms"] = percentile(values, 0.50)
        metrics[f"txn_e2e_{isolation}_p99_ms"] = percentile(values, 0.99)
    metrics["txn_e2e_read_committed_vs_uncommitted_p50"] = (
        metrics["txn_e2e_read_committed_p50_ms"] / metrics["txn_e2e_read_uncommitted_p50_ms"]
    )
    metrics.update(_placement(boot, rounds=rounds, duration_s=duration_s))
    return metrics


TOPICS = {
    "txn": PARTITIONS,
    "txn-idempotent": PARTITIONS,
    "txn-e2e": PARTITIONS,
    "txn-small": PARTITIONS,
    "txn-coordinator": COORDINATOR_PARTITIONS,
}


def run(out_dir: pathlib.Path, *, quick: bool) -> dict[str, float]:
    with running_cluster(out_dir / "txn-work") as cluster:
        with Admin(cluster.bootstrap) as admin:
            for name, partitions in TOPICS.items():
                create_topic(admin, name, partitions=partitions)
        return measure(cluster.kafka_bootstrap, quick=quick)
