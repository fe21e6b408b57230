"""Benchmark: the Spark connector on `local[2]` against a real 3-node cluster on loopback.

Metrics (one run, one cluster, one SparkSession; Spark start-up is not timed):
- `spark_batch_rows_s`: `spark.read.format("raftlog")` of 100-byte records into Spark's
  `noop` sink (every row is produced and handed to the JVM, nothing stored), the median of
  three reads after a first one; goal >= 500,000. `spark_batch_cold_rows_s` is that first
  read, which also pays for starting the Python workers and their first-use costs.
- `spark_stream_rows_s`: the same records through `readStream` with `Trigger.AvailableNow`
  into a `noop` stream sink. Goal >= 200,000.
- `spark_latency_p50_s` (and `_p90_s`): one record produced (acks=all) every 50 ms while a
  query with the default trigger (as fast as possible) runs; latency is from just before the
  send to the record's arrival in `foreachBatch` on the driver. Goal < 0.5 s.
- `arrow_decode_rows_s`: `decode_fetch` alone, in this process, on the same kind of Fetch
  answer (4 MiB of 100-byte records): the connector's own ceiling per Python worker.
- `spark_batch_vs_decode`: spark_batch_rows_s / arrow_decode_rows_s (two workers could reach 2).

The records are written with raw Produce RPCs of pre-encoded batches (acks=all), since a
Python producer would take longer than the reads being measured. The topic has two
partitions, one per core (one Spark task each).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import statistics
import tempfile
import threading
import time
from typing import Any

from raftlog.client import Admin, Producer
from raftlog.client._connection import Cluster, TopicPartition
from raftlog.client.config import ConnectionConfig
from raftlog.cluster_cli import wait_for_controller
from raftlog.connectors.spark.session import local_session
from raftlog.local_cluster import LocalCluster
from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.storage.records import RecordInput, encode_batch

RECORD_BYTES = 100
RECORDS_PER_BATCH = 5000
PARTITIONS = 2
TOPIC = "bench-spark"


def _fill(bootstrap: str, records_total: int) -> int:
    """Write `records_total` 100-byte records (acks=all) in pre-encoded batches; return count."""
    now_ms = time.time_ns() // 1_000_000
    batch = encode_batch(
        [RecordInput(None, os.urandom(RECORD_BYTES), now_ms) for _ in range(RECORDS_PER_BATCH)]
    )
    cluster = Cluster(bootstrap, ConnectionConfig(request_timeout_ms=60_000))
    written = 0
    requests = 0
    try:
        while written < records_total:
            tp = TopicPartition(TOPIC, requests % PARTITIONS)
            request = pb.ProduceRequest(
                topic=tp.topic, partition=tp.partition, batches=[batch] * 4, acks=pb.ACKS_ALL
            )
            response = cluster.call(cluster.leader_address(tp), "Log.Produce", request)
            if response.error.code != pb.NONE:
                # An election or a leadership transfer (rebalancing after start): ask again.
                assert response.error.retriable, response.error
                cluster.mark_stale(TOPIC)
                threading.Event().wait(0.1)
                continue
            written += 4 * RECORDS_PER_BATCH
            requests += 1
    finally:
        cluster.close()
    return written


def _decode_rows_s() -> float:
    from raftlog.connectors.spark.arrow import decode_fetch

    records = [RecordInput(None, os.urandom(RECORD_BYTES), 1_700_000_000_000)] * RECORDS_PER_BATCH
    batches = [encode_batch(records, base_offset=i * RECORDS_PER_BATCH) for i in range(7)]
    data = b"".join(batches)  # about 4 MiB, as one Fetch of fetchBytesMax

    def decode() -> float:
        started = time.perf_counter()
        decoded = decode_fetch(
            data,
            topic=TOPIC,
            partition=0,
            offset_from=0,
            offset_to=2**62,
            high_watermark=2**62,
            include_headers=False,
        )
        elapsed = time.perf_counter() - started
        assert decoded.batch is not None and decoded.batch.num_rows == 7 * RECORDS_PER_BATCH
        return 7 * RECORDS_PER_BATCH / elapsed

    decode()  # the first call in a process imports pandas (through pyarrow) and faults pages
    return statistics.median(decode() for _ in range(20))


def _batch_rows_s(spark: Any, bootstrap: str, records: int) -> tuple[float, float]:
    """(first read, median of three more): the first pays for starting Python workers and
    their first-use costs (imports, page faults); the others are the steady state."""

    def timed_read() -> float:
        frame = spark.read.format("raftlog").option("bootstrap", bootstrap)
        frame = frame.option("subscribe", TOPIC).load()
        started = time.perf_counter()
        frame.write.format("noop").mode("overwrite").save()
        return records / (time.perf_counter() - started)

    cold = timed_read()
    return cold, statistics.median(timed_read() for _ in range(3))


def _stream_rows_s(spark: Any, bootstrap: str, records: int, checkpoint: pathlib.Path) -> float:
    frame = (
        spark.readStream.format("raftlog")
        .option("bootstrap", bootstrap)
        .option("subscribe", TOPIC)
        .option("startingOffsets", "earliest")
        .load()
    )
    started = time.perf_counter()
    query = (
        frame.writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(600), "availableNow query did not finish"
    return records / (time.perf_counter() - started)


def _latencies_s(spark: Any, bootstrap: str, samples: int, checkpoint: pathlib.Path) -> list[float]:
    topic = TOPIC + "-latency"
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=1, replication_factor=3)
    latencies: list[float] = []
    lock = threading.Lock()

    def on_batch(frame: Any, batch_id: int) -> None:
        arrived = time.time()
        with lock:
            latencies.extend(arrived - float(row.value) for row in frame.collect())

    frame = (
        spark.readStream.format("raftlog")
        .option("bootstrap", bootstrap)
        .option("subscribe", topic)
        .option("fetchWaitMs", "50")
        .load()
    )
    query = (
        frame.writeStream.foreachBatch(on_batch)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    try:
        query.processAllAvailable()
        with Producer(bootstrap, acks="all", linger_ms=0) as producer:
            for _ in range(samples):
                producer.send(topic, value=repr(time.time()).encode()).result(timeout=30)
                threading.Event().wait(0.05)  # a steady trickle, one record per 50 ms
        query.processAllAvailable()
    finally:
        query.stop()
    assert len(latencies) == samples, (len(latencies), samples)
    return latencies


def run(out_dir: pathlib.Path, *, quick: bool) -> dict[str, float]:
    records = 300_000 if quick else 1_000_000
    work = pathlib.Path(tempfile.mkdtemp(prefix="spark-bench-", dir=out_dir))
    local = LocalCluster.create(work / "cluster", node_count=3)
    local.start()
    try:
        wait_for_controller(local.bootstrap, timeout_s=60)
        with Admin(local.bootstrap) as admin:
            admin.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=3)
        written = _fill(local.bootstrap, records)
        decode_rows_s = _decode_rows_s()
        spark = local_session(app_name="raftlog-bench")
        try:
            batch_cold_rows_s, batch_rows_s = _batch_rows_s(spark, local.bootstrap, written)
            stream_rows_s = _stream_rows_s(spark, local.bootstrap, written, work / "stream-ckpt")
            latencies = _latencies_s(spark, local.bootstrap, 40 if quick else 100, work / "lat")
        finally:
            spark.stop()
    finally:
        local.stop()
        shutil.rmtree(work, ignore_errors=True)
    quantiles = statistics.quantiles(latencies, n=10)
    return {
        "spark_batch_rows_s": batch_rows_s,
        "spark_batch_cold_rows_s": batch_cold_rows_s,
        "spark_stream_rows_s": stream_rows_s,
        "spark_latency_p50_s": statistics.median(latencies),
        "spark_latency_p90_s": quantiles[8],
        "arrow_decode_rows_s": decode_rows_s,
        "spark_batch_vs_decode": batch_rows_s / decode_rows_s,
        "spark_bench_records": float(written),
    }
