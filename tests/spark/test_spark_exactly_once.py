"""The sink writes every row exactly once across Spark task retries and query restarts.

First without Spark: `write_batches` run twice under one producer name (two attempts of one
task) against a real 3-node cluster must skip what the first committed. Then with Spark
(`local[2,4]`: a failed task runs again): a task fails after some of its records were
acknowledged, and a streaming query fails mid-batch and is restarted from its checkpoint.
The failure comes from a `mapInArrow` stage in front of the sink that passes half of its rows
on, then a record too large to send, so the sink fails after committing that half. (Blocking
the stage until the topic holds the half does not work: Spark forwards nothing to the writer
while the stage before it is blocked.)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from raftlog.client import Admin, Consumer, Producer
from raftlog.client.partitioner import partition_for_key
from raftlog.local_cluster import LocalCluster

PANDAS_WARNING = "ignore:PySpark does not yet fully support pandas:FutureWarning"
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.filterwarnings(PANDAS_WARNING)]
QUERY_TIMEOUT_S = 180


def create_topic(cluster: LocalCluster, name: str, partitions: int) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(name, partitions=partitions, replication_factor=3)


def committed(cluster: LocalCluster, topic: str) -> dict[int, list[bytes | None]]:
    """Every committed record value of `topic` by partition, in offset order."""
    result: dict[int, list[bytes | None]] = {}
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as consumer:
        tps = [(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        while any(consumer.position(tp) < ends[tp] for tp in ends):
            for record in consumer.poll(timeout_ms=5000):
                result.setdefault(record.partition, []).append(record.value)
    return result


def all_values(cluster: LocalCluster, topic: str) -> Counter[bytes | None]:
    return Counter(v for values in committed(cluster, topic).values() for v in values)


# -- the skip logic, without Spark --------------------------------------------------------------


def rows(values: list[bytes], keys: list[bytes | None] | None = None) -> pa.RecordBatch:
    columns: dict[str, list[Any]] = {"value": values}
    if keys is not None:
        columns["key"] = keys
    return pa.RecordBatch.from_pydict(columns)


def attempt(
    cluster: LocalCluster, topic: str, batches: list[pa.RecordBatch], *, name: str, key: bool
) -> Any:
    from raftlog.connectors.spark.options import parse_sink_options
    from raftlog.connectors.spark.sink import SinkColumns, write_batches

    options = parse_sink_options({"bootstrap": cluster.bootstrap, "topic": topic})
    columns = SinkColumns(key=key, topic=False, partition=False, headers=False)
    return write_batches(options, columns, iter(batches), producer_name=name)


def test_a_second_attempt_skips_exactly_what_the_first_committed(cluster: LocalCluster) -> None:
    topic = "resume-keyless"
    create_topic(cluster, topic, 3)
    values = [b"r%03d" % i for i in range(300)]
    # The first attempt died after 130 rows (in two Arrow batches) were acknowledged.
    first = attempt(
        cluster, topic, [rows(values[:100]), rows(values[100:130])], name="t", key=False
    )
    assert (first.records, first.skipped) == (130, 0)
    second = attempt(cluster, topic, [rows(values[:200]), rows(values[200:])], name="t", key=False)
    assert (second.records, second.skipped) == (170, 130)
    # Keyless rows go round-robin by position, so each partition holds every third row in order.
    log = committed(cluster, topic)
    assert {p: log[p] for p in range(3)} == {p: values[p::3] for p in range(3)}
    third = attempt(cluster, topic, [rows(values)], name="t", key=False)
    assert (third.records, third.skipped) == (0, 300)
    another_write = attempt(cluster, topic, [rows(values[:10])], name="u", key=False)
    assert (another_write.records, another_write.skipped) == (10, 0)
    assert sum(all_values(cluster, topic).values()) == 310


def test_keyed_rows_resume_per_partition(cluster: LocalCluster) -> None:
    topic = "resume-keyed"
    create_topic(cluster, topic, 2)
    values = [b"k%03d" % i for i in range(120)]
    keys: list[bytes | None] = [b"key-%d" % (i % 7) for i in range(120)]
    attempt(cluster, topic, [rows(values[:50], keys[:50])], name="t", key=True)
    result = attempt(cluster, topic, [rows(values, keys)], name="t", key=True)
    assert (result.records, result.skipped) == (70, 50)
    log = committed(cluster, topic)
    for partition in range(2):
        expected = [
            v for v, k in zip(values, keys, strict=True) if partition_for_key(k, 2) == partition
        ]  # type: ignore[arg-type]
        assert log.get(partition, []) == expected


def test_fewer_rows_than_committed_is_named_as_non_deterministic_input(
    cluster: LocalCluster,
) -> None:
    topic = "resume-shrunk"
    create_topic(cluster, topic, 1)
    attempt(cluster, topic, [rows([b"a", b"b", b"c"])], name="t", key=False)
    with pytest.raises(RuntimeError, match=r"resume-shrunk/0: an earlier attempt .* committed 3"):
        attempt(cluster, topic, [rows([b"a"])], name="t", key=False)
    assert all_values(cluster, topic) == Counter([b"a", b"b", b"c"])


def test_producer_name_needs_a_spark_task() -> None:
    from raftlog.connectors.spark.sink import task_producer_name

    with pytest.raises(RuntimeError, match="only inside a Spark task"):
        task_producer_name("w")


# -- with Spark: a task that fails after some of its records were committed -------------------


def poison_after_half(
    bootstrap: str, topic: str, markers: Path, poison: Callable[[int], bool]
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A mapInArrow function in front of the sink: pass the task's rows on, but when
    `poison(attempt)` put a record too large for any batch after the first half. The sink's
    send() raises on it; leaving the producer's `with` block delivers the first half, so the
    attempt fails with those records committed. Each attempt first notes (a marker file) how
    many of its rows `topic` already holds.

    A closure, so Spark pickles it by value (workers cannot import this test module)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        from raftlog.client import Consumer as WorkerConsumer

        context = TaskContext.get()
        assert context is not None
        number = context.attemptNumber()
        table = pa.Table.from_batches(list(batches))
        mine = set(table.column("value").to_pylist())
        found = 0
        with WorkerConsumer(bootstrap, auto_offset_reset="earliest") as consumer:
            tps = [(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
            consumer.assign(tps)
            ends = consumer.end_offsets(tps)
            while any(consumer.position(tp) < ends[tp] for tp in ends):
                found += sum(r.value in mine for r in consumer.poll(timeout_ms=5000))
        (markers / f"partition-{context.partitionId()}-attempt-{number}-found-{found}").touch()
        half = table.num_rows // 2
        yield from table.slice(0, half).to_batches()
        if poison(number):
            too_large = {"value": [b"x" * (512 * 1024)]}
            yield pa.RecordBatch.from_pydict(too_large, schema=table.schema)
        yield from table.slice(half).to_batches()

    return run


def test_batch_write_with_a_retried_task_writes_every_row_once(
    spark: Any, cluster: LocalCluster, tmp_path: Path
) -> None:
    master = spark.sparkContext.master
    assert master.startswith("local[") and master.count(",") == 1, master  # retries allowed
    topic = "spark-batch-retry"
    create_topic(cluster, topic, 3)
    count = 4000
    frame = spark.range(0, count, numPartitions=2).selectExpr(
        "cast(concat('row-', cast(id as string)) as binary) as value"
    )
    run = poison_after_half(cluster.bootstrap, topic, tmp_path, lambda number: number == 0)
    frame.mapInArrow(run, frame.schema).write.format("raftlog").option(
        "bootstrap", cluster.bootstrap
    ).option("topic", topic).mode("append").save()
    # Each task's first attempt committed half of its 2000 rows before failing; the retry
    # found them there, skipped them and wrote the other half.
    markers = sorted(p.name for p in tmp_path.iterdir())
    assert markers == [
        f"partition-{p}-attempt-{a}-found-{found}"
        for p in (0, 1)
        for a, found in ((0, 0), (1, 1000))
    ]
    assert all_values(cluster, topic) == Counter(b"row-%d" % i for i in range(count))


def test_stream_restarted_after_a_failed_batch_writes_every_row_once(
    spark: Any, cluster: LocalCluster, tmp_path: Path
) -> None:
    from pyspark.errors import StreamingQueryException

    source, sink = "spark-stream-in", "spark-stream-out"
    create_topic(cluster, source, 2)
    create_topic(cluster, sink, 2)
    count = 3000
    with Producer(cluster.bootstrap) as producer:
        for i in range(count):
            producer.send(source, value=b"s-%d" % i, partition=i % 2)
        producer.flush()
    failing = tmp_path / "fail"
    failing.touch()
    markers = tmp_path / "markers"
    markers.mkdir()
    run = poison_after_half(cluster.bootstrap, sink, markers, lambda number: failing.exists())

    def start() -> Any:
        frame = (
            spark.readStream.format("raftlog")
            .option("bootstrap", cluster.bootstrap)
            .option("subscribe", source)
            .option("startingOffsets", "earliest")
            .load()
            .selectExpr("value")
        )
        return (
            frame.mapInArrow(run, frame.schema)
            .writeStream.format("raftlog")
            .option("bootstrap", cluster.bootstrap)
            .option("topic", sink)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )

    query = start()
    with pytest.raises(StreamingQueryException, match="batch_bytes_max"):
        query.awaitTermination(QUERY_TIMEOUT_S)
    # Four attempts of each task failed; the first half of each was written once in all.
    written = all_values(cluster, sink)
    assert sum(written.values()) == count // 2 and set(written.values()) == {1}
    failing.unlink()
    query = start()  # the same query id and micro-batch 0 again: the same producers
    assert query.awaitTermination(QUERY_TIMEOUT_S), "the restarted query did not finish"
    assert query.exception() is None, query.exception()
    assert all_values(cluster, sink) == Counter(b"s-%d" % i for i in range(count))
    # Each task's first attempt found nothing; every later attempt (the retries, until one
    # task ran out of its four and the stage was aborted, and the restarted query's) found
    # exactly the half the first attempt committed.
    names = {p.name for p in markers.iterdir()}
    first = {f"partition-{p}-attempt-0-found-0" for p in (0, 1)}
    restarted = {f"partition-{p}-attempt-0-found-750" for p in (0, 1)}
    assert first | restarted <= names
    assert all(name.endswith("-found-750") for name in names - first), names
    assert any(name.startswith(f"partition-{p}-attempt-3-") for p in (0, 1) for name in names)
