"""`make demo`: the main job on an embedded local cluster.

Starts three node processes on loopback, creates a replicated topic, produces records with
acks=all while the partition leader is SIGKILLed and restarted, reads everything back (and,
with `--spark`, streams it into a local Spark session), checks that every acknowledged record
arrived exactly once and in order, prints a summary and stops the cluster.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path

from raftlog.client import Admin, Consumer, Producer, RecordMetadata
from raftlog.cluster_cli import wait_for_controller
from raftlog.local_cluster import LocalCluster

TOPIC = "demo-events"


def say(message: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


def leader_of(admin: Admin, partition: int) -> int:
    for p in admin.describe_topic(TOPIC).partitions:
        if p.id == partition and p.leader is not None:
            return p.leader
    raise RuntimeError(f"no partition {partition}")


def wait_for_new_leader(admin: Admin, victim: int, killed_at: float) -> tuple[int, float]:
    """The node that leads partition 0 once the killed leader is replaced, and how long
    that took as the metadata reports it."""
    deadline = killed_at + 30
    while time.monotonic() < deadline:
        try:
            leader = leader_of(admin, 0)
        except Exception:  # no leader known while the election runs
            leader = victim
        if leader != victim:
            return leader, time.monotonic() - killed_at
        time.sleep(0.05)
    raise RuntimeError(f"no new leader for partition 0 within 30 s of killing node {victim}")


def produce(
    bootstrap: str, count: int, on_progress: threading.Event
) -> dict[tuple[int, int], bytes]:
    """Send `count` records with acks=all; returns {(partition, offset): value} of the acked."""
    futures: list[tuple[bytes, Future[RecordMetadata]]] = []
    with Producer(bootstrap, acks="all", linger_ms=2, delivery_timeout_ms=60_000) as producer:
        for i in range(count):
            value = b"event-%07d" % i
            futures.append((value, producer.send(TOPIC, value=value, key=b"user-%d" % (i % 97))))
            if i == count // 3:
                on_progress.set()
            if i % 200 == 0:
                time.sleep(0.01)  # a steady stream, so the failover lands mid-flight
            if i and i % 25_000 == 0:
                say(f"  ... {i} records sent")
        producer.flush()
    acked: dict[tuple[int, int], bytes] = {}
    failed = 0
    for value, future in futures:
        try:
            meta = future.result(timeout=60)
        except Exception:
            failed += 1
            continue
        acked[(meta.partition, meta.offset)] = value
    say(f"produced {count} records: {len(acked)} acknowledged, {failed} failed")
    return acked


def read_back(bootstrap: str, partitions: list[int], expected: int) -> list[tuple[int, int, bytes]]:
    consumer = Consumer(bootstrap)
    try:
        consumer.assign([(TOPIC, p) for p in partitions])
        consumer.seek_to_beginning(*[(TOPIC, p) for p in partitions])
        records: list[tuple[int, int, bytes]] = []
        deadline = time.monotonic() + 60
        while len(records) < expected and time.monotonic() < deadline:
            for r in consumer.poll(timeout_ms=500):
                records.append((r.partition, r.offset, r.value or b""))
        return records
    finally:
        consumer.close()


def verify(acked: dict[tuple[int, int], bytes], records: list[tuple[int, int, bytes]]) -> list[str]:
    problems = []
    seen: dict[bytes, tuple[int, int]] = {}
    last: dict[int, int] = {}
    for partition, offset, value in records:
        if value in seen:
            problems.append(f"duplicate {value!r} at {seen[value]} and {(partition, offset)}")
        seen[value] = (partition, offset)
        if offset <= last.get(partition, -1):
            problems.append(f"partition {partition}: offset {offset} after {last[partition]}")
        last[partition] = offset
    for where, value in acked.items():
        if seen.get(value) != where:
            problems.append(f"acknowledged {value!r} at {where}, read at {seen.get(value)}")
    return problems


def run(directory: Path, records_count: int, with_spark: bool) -> int:
    started = time.monotonic()
    cluster = LocalCluster.create(directory, node_count=3)
    say(f"starting a 3-node cluster in {directory} (logs: node-N.log)")
    cluster.start()
    try:
        controller = wait_for_controller(cluster.bootstrap, timeout_s=60)
        say(f"cluster up at {cluster.bootstrap}; controller is node {controller}")
        admin = Admin(cluster.bootstrap)
        admin.create_topic(TOPIC, partitions=3, replication_factor=3)
        victim = leader_of(admin, 0)
        say(f"topic {TOPIC}: 3 partitions x 3 replicas; partition 0 is led by node {victim}")
        halfway = threading.Event()
        result: dict[tuple[int, int], bytes] = {}
        writer = threading.Thread(
            target=lambda: result.update(produce(cluster.bootstrap, records_count, halfway))
        )
        writer.start()
        halfway.wait(timeout=60)
        victim = leader_of(admin, 0)  # leadership may have moved to the preferred replica
        say(f"SIGKILL node {victim} (leader of partition 0) while producing")
        killed_at = time.monotonic()
        cluster.kill_node(victim, sig=signal.SIGKILL)
        new_leader, failover_s = wait_for_new_leader(admin, victim, killed_at)
        say(f"node {new_leader} took over partition 0 after {failover_s:.2f}s")
        time.sleep(max(0.0, 2 - (time.monotonic() - killed_at)))
        say(f"restarting node {victim}")
        cluster.start_node(victim)
        writer.join()
        records = read_back(cluster.bootstrap, [0, 1, 2], len(result))
        say(f"read back {len(records)} committed records")
        problems = verify(result, records)
        if with_spark:
            problems += spark_check(cluster.bootstrap, len(records))
        elapsed = time.monotonic() - started
        print()
        print("summary")
        print(f"  records sent            {records_count}")
        print(f"  acknowledged (acks=all) {len(result)}")
        print(f"  read back               {len(records)}")
        print(f"  lost or duplicated      {len(problems)}")
        took_over = f"node {new_leader} led after {failover_s:.2f}s"
        print(f"  leader killed           node {victim}; {took_over}")
        print(f"  elapsed                 {elapsed:.1f}s")
        if problems:
            for problem in problems[:10]:
                print(f"  PROBLEM: {problem}")
            return 1
        print("  every acknowledged record arrived exactly once, in order")
        return 0
    finally:
        say("stopping the cluster")
        cluster.stop()


def spark_check(bootstrap: str, expected: int) -> list[str]:
    try:
        from pyspark.sql import SparkSession

        from raftlog.connectors.spark import RaftlogDataSource
    except ImportError as error:
        say(f"skipping Spark: {error}")
        return []
    say("reading the topic with Spark (local[2]) ...")
    # Spark's Python workers must run this interpreter (it has raftlog and pyarrow).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("raftlog-demo")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        spark.dataSource.register(RaftlogDataSource)
        frame = (
            spark.read.format("raftlog")
            .option("bootstrap", bootstrap)
            .option("subscribe", TOPIC)
            .option("startingOffsets", "earliest")
            .load()
        )
        count = frame.count()
        distinct = frame.select("value").distinct().count()
        say(f"Spark read {count} rows ({distinct} distinct values)")
        if count != expected or distinct != expected:
            return [f"Spark read {count} rows, {distinct} distinct, expected {expected}"]
        return []
    finally:
        spark.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m raftlog.demo", description=__doc__)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--dir", type=Path, help="cluster directory (default: a temp dir)")
    parser.add_argument("--spark", action="store_true", help="also read the topic with Spark")
    args = parser.parse_args(argv)
    if args.dir is not None:
        return run(args.dir, args.records, args.spark)
    directory = Path(tempfile.mkdtemp(prefix="raftlog-demo-"))
    try:
        return run(directory, args.records, args.spark)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
