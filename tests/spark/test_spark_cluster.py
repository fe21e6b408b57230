"""The Spark connector against a real 3-node cluster and a real local SparkSession.

Streaming tests write with `foreachBatch` into a dict keyed by batch id: Spark replays a batch
after a restart under the same id, so a dict models an idempotent sink (exactly-once output),
and a replayed batch must hold exactly the rows it held the first time. Waiting is Spark's own
`processAllAvailable` / `awaitTermination` (with timeouts), never a sleep.
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import grpc
import pytest

from raftlog.client import Admin, Consumer, Producer, RecordMetadata
from raftlog.client.errors import ClientError
from raftlog.local_cluster import LocalCluster
from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.rpc.v1 import raftlog_pb2_grpc as pb_grpc

# PySpark 4.x warns that it does not fully support pandas 3 (which these tests do not use).
PANDAS_WARNING = "ignore:PySpark does not yet fully support pandas:FutureWarning"
# Spark start-up alone takes 20-60 s on this 2-core machine: the module is `slow` too.
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.filterwarnings(PANDAS_WARNING)]
QUERY_TIMEOUT_S = 120


def _topic(request: pytest.FixtureRequest) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "-", request.node.name)[:60]


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    return _topic(request)


def wait_all_alive(cluster: LocalCluster, *, timeout_s: float = 60) -> None:
    """After a node restarts or a partition heals: wait until every node holds its lease
    again (the controller refuses replication factor 3 before that)."""
    deadline = time.monotonic() + timeout_s
    with Admin(cluster.bootstrap) as admin:
        while time.monotonic() < deadline:
            try:
                nodes = admin.describe_cluster().nodes
                if len(nodes) == len(cluster.nodes) and all(n.alive for n in nodes):
                    return
            except ClientError:
                pass  # an election is under way: ask again
            threading.Event().wait(0.2)
    raise TimeoutError(f"not every node alive within {timeout_s} s")


def create_topic(cluster: LocalCluster, name: str, partitions: int) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(name, partitions=partitions, replication_factor=3)


def produce(
    cluster: LocalCluster, topic: str, values: list[bytes], **send: Any
) -> list[RecordMetadata]:
    with Producer(cluster.bootstrap, acks="all") as producer:
        futures = [producer.send(topic, value=value, **send) for value in values]
        producer.flush()
        return [future.result(timeout=60) for future in futures]


def _partitions_of(consumer: Consumer, topic: str, *, timeout_s: float = 30.0) -> set[int]:
    """Metadata comes from the first node that answers, from its own copy: a node restarted
    by an earlier test in this module may still be catching up (seen once: UNKNOWN_TOPIC
    from a node restarted 4 s before). The error is retriable; retry it like a client."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return set(consumer.partitions_for_topic(topic))
        except ClientError as error:
            if not error.retriable or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def committed(cluster: LocalCluster, topic: str) -> dict[tuple[int, int], bytes | None]:
    """Every committed record of `topic`, by (partition, offset), read with the Consumer."""
    result: dict[tuple[int, int], bytes | None] = {}
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as consumer:
        tps = [(topic, p) for p in sorted(_partitions_of(consumer, topic))]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        while any(consumer.position(tp) < ends[tp] for tp in ends):
            for record in consumer.poll(timeout_ms=5000):
                result[(record.partition, record.offset)] = record.value
    return result


def stream(spark: Any, cluster: LocalCluster, **options: str) -> Any:
    reader = spark.readStream.format("raftlog").option("bootstrap", cluster.bootstrap)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


class Batches:
    """A foreachBatch sink keyed by batch id; a replay must equal the first run."""

    def __init__(self) -> None:
        self.rows: dict[int, list[tuple[int, int, bytes]]] = {}
        self.lock = threading.Lock()

    def __call__(self, frame: Any, batch_id: int) -> None:
        rows = sorted((r.partition, r.offset, bytes(r.value)) for r in frame.collect())
        with self.lock:
            if batch_id in self.rows:
                assert self.rows[batch_id] == rows, f"batch {batch_id} replayed differently"
            self.rows[batch_id] = rows

    def values(self) -> list[bytes]:
        with self.lock:
            return [value for batch_id in sorted(self.rows) for _, _, value in self.rows[batch_id]]


def run_available_now(frame: Any, sink: Batches, checkpoint: Path) -> None:
    query = (
        frame.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(QUERY_TIMEOUT_S), "availableNow query did not finish"
    assert query.exception() is None, query.exception()


# -- batch reads --------------------------------------------------------------------------------


def test_batch_read_equals_what_was_produced(spark: Any, cluster: LocalCluster, topic: str) -> None:
    create_topic(cluster, topic, 3)
    values = [b"value-%04d" % i for i in range(600)]
    with Producer(cluster.bootstrap, acks="all") as producer:
        futures = [
            producer.send(
                topic,
                value=value,
                key=None if i % 4 == 0 else b"key-%d" % (i % 7),
                headers=[("n", b"%d" % i), ("none", None)] if i % 5 == 0 else None,
            )
            for i, value in enumerate(values)
        ]
        producer.flush()
        metadata = [future.result(timeout=60) for future in futures]
    frame = (
        spark.read.format("raftlog")
        .option("bootstrap", cluster.bootstrap)
        .option("subscribe", topic)
        .option("includeHeaders", "true")
        .option("minPartitions", "5")
        .load()
    )
    assert frame.rdd.getNumPartitions() >= 5
    rows = {(r.partition, r.offset): r for r in frame.collect()}
    assert len(rows) == len(values)
    for i, meta in enumerate(metadata):
        row = rows[(meta.partition, meta.offset)]
        assert (row.topic, bytes(row.value)) == (topic, values[i])
        assert row.key == (None if i % 4 == 0 else b"key-%d" % (i % 7))
        headers = [(h.key, h.value) for h in row.headers] if row.headers else None
        assert headers == ([("n", b"%d" % i), ("none", None)] if i % 5 == 0 else None)
        assert round(row.timestamp.timestamp() * 1000) == meta.timestamp_ms
        assert row.timestampType == 0


def test_batch_read_equals_what_a_kafka_client_wrote(
    spark: Any, cluster: LocalCluster, topic: str
) -> None:
    # confluent-kafka (librdkafka) on the Kafka listener, snappy batches; the source reads the
    # same offsets, keys, values, headers and timestamps the delivery reports named.
    kafka = pytest.importorskip("confluent_kafka")
    create_topic(cluster, topic, 3)
    producer = kafka.Producer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all",
         "enable.idempotence": True, "compression.codec": "snappy", "linger.ms": 5}
    )  # fmt: skip
    delivered: dict[bytes, tuple[int, int, int]] = {}

    def on_delivery(error: Any, message: Any) -> None:
        assert error is None, error
        timestamp_type, timestamp_ms = message.timestamp()
        assert timestamp_type == kafka.TIMESTAMP_CREATE_TIME
        delivered[message.value()] = (message.partition(), message.offset(), timestamp_ms)

    values = [b"kafka-%04d" % i for i in range(300)]
    for i, value in enumerate(values):
        key = None if i % 4 == 0 else b"key-%d" % (i % 7)
        headers = [("n", b"%d" % i)] if i % 5 == 0 else None
        producer.produce(topic, value=value, key=key, headers=headers, on_delivery=on_delivery)
    assert producer.flush(60) == 0
    frame = (
        spark.read.format("raftlog")
        .option("bootstrap", cluster.bootstrap)
        .option("subscribe", topic)
        .option("includeHeaders", "true")
        .load()
    )
    rows = {(r.partition, r.offset): r for r in frame.collect()}
    assert len(rows) == len(values) == len(delivered)
    for i, value in enumerate(values):
        partition, offset, timestamp_ms = delivered[value]
        row = rows[(partition, offset)]
        assert bytes(row.value) == value
        assert row.key == (None if i % 4 == 0 else b"key-%d" % (i % 7))
        headers = [(h.key, h.value) for h in row.headers] if row.headers else None
        assert headers == ([("n", b"%d" % i)] if i % 5 == 0 else None)
        assert round(row.timestamp.timestamp() * 1000) == timestamp_ms


def test_batch_read_returns_committed_transactions_only(
    spark: Any, cluster: LocalCluster, topic: str
) -> None:
    """A confluent-kafka transactional producer (Kafka listener) commits a transaction, aborts
    one, commits another, and leaves a fourth open: the batch read (read_committed, the
    default) returns exactly the committed records at the offsets their delivery reports
    named (the others were written: their delivery reports name offsets), no marker and
    nothing of the aborted or open ones."""
    kafka = pytest.importorskip("confluent_kafka")
    create_topic(cluster, topic, 2)
    producer = kafka.Producer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "transactional.id": f"spark-{topic}",
         "transaction.timeout.ms": 60_000}
    )  # fmt: skip
    producer.init_transactions(30)
    delivered: dict[bytes, tuple[int, int]] = {}

    def on_delivery(error: Any, message: Any) -> None:
        assert error is None, error
        delivered[message.value()] = (message.partition(), message.offset())

    outcomes = {"committed-1": True, "aborted": False, "committed-2": True, "open": None}
    for tag, commit in outcomes.items():
        producer.begin_transaction()
        for i in range(6):
            producer.produce(topic, value=b"%s-%d" % (tag.encode(), i), partition=i % 2,
                             on_delivery=on_delivery)  # fmt: skip
        assert producer.flush(30) == 0  # every record written (an abort would purge them)
        if commit is True:
            producer.commit_transaction(30)
        elif commit is False:
            producer.abort_transaction(30)
    reader = spark.read.format("raftlog").option("bootstrap", cluster.bootstrap)
    rows = reader.option("subscribe", topic).load().collect()
    committed = {v: at for v, at in delivered.items() if v.startswith(b"committed-")}
    assert (len(committed), len(delivered)) == (12, 24)
    assert {bytes(r.value): (r.partition, r.offset) for r in rows} == committed
    assert len(rows) == len(committed)


def test_batch_read_with_ending_offsets_reads_exactly_the_range(
    spark: Any, cluster: LocalCluster, topic: str
) -> None:
    create_topic(cluster, topic, 1)
    metadata = produce(cluster, topic, [b"%d" % i for i in range(50)], partition=0)
    first, last = metadata[10].offset, metadata[30].offset
    frame = (
        spark.read.format("raftlog")
        .option("bootstrap", cluster.bootstrap)
        .option("assign", json.dumps({topic: [0]}))
        .option("startingOffsets", json.dumps({topic: {"0": first}}))
        .option("endingOffsets", json.dumps({topic: {"0": last}}))
        .load()
    )
    assert sorted(int(r.value) for r in frame.collect()) == list(range(10, 30))


def test_starting_timestamp_and_subscribe_pattern(
    spark: Any, cluster: LocalCluster, topic: str
) -> None:
    create_topic(cluster, topic, 1)
    with Producer(cluster.bootstrap, acks="all") as producer:
        for i in range(20):
            producer.send(topic, value=b"%d" % i, timestamp_ms=1_000_000 + 1000 * i)
        producer.flush()
    frame = (
        spark.read.format("raftlog")
        .option("bootstrap", cluster.bootstrap)
        .option("subscribePattern", re.escape(topic[:-3]) + ".*")
        .option("startingTimestamp", str(1_000_000 + 1000 * 12 - 1))
        .load()
    )
    rows = [r for r in frame.collect() if r.topic == topic]
    assert sorted(int(r.value) for r in rows) == list(range(12, 20))


def test_options_that_are_wrong_fail_naming_the_option(spark: Any, cluster: LocalCluster) -> None:
    from pyspark.errors import PySparkException

    def load(**options: str) -> Any:
        reader = spark.read.format("raftlog").option("bootstrap", cluster.bootstrap)
        for name, value in options.items():
            reader = reader.option(name, value)
        return reader.load()

    with pytest.raises(PySparkException, match=r"kafka\.bootstrap\.servers: unknown option"):
        load(**{"subscribe": "t", "kafka.bootstrap.servers": "x:1"})
    with pytest.raises(PySparkException, match="assign: exactly one of subscribe"):
        load(subscribe="t", assign='{"t": [0]}')
    with pytest.raises(PySparkException, match="startingOffsets: not JSON"):
        load(subscribe="t", startingOffsets="{oops")
    with pytest.raises(PySparkException, match=r"startingOffsets: 'latest' is not allowed"):
        load(subscribe="t", startingOffsets="latest").collect()


def test_mode_specific_options_fail_as_early_as_pyspark_allows(
    spark: Any, cluster: LocalCluster
) -> None:
    """At load() PySpark calls only `DataSource.schema()`, which is not told whether the read
    is a batch or a stream (pyspark.sql.datasource 4.x has no such hook), so an option valid
    for one mode only can be refused no earlier than when Spark asks for that mode's reader:
    the first action of a batch read, the start of a streaming query. Both name the option."""
    from pyspark.errors import PySparkException, StreamingQueryException

    batch = (
        spark.read.format("raftlog")
        .option("bootstrap", cluster.bootstrap)
        .option("subscribe", "t")
        .option("maxOffsetsPerTrigger", "5")
        .load()
    )
    assert not batch.isStreaming  # load() accepted it: nothing told the source the mode
    with pytest.raises(PySparkException, match="maxOffsetsPerTrigger: only for streaming reads"):
        batch.collect()

    streaming = (
        spark.readStream.format("raftlog")
        .option("bootstrap", cluster.bootstrap)
        .option("subscribe", "t")
        .option("endingOffsets", "latest")
        .load()
    )
    assert streaming.isStreaming
    query = streaming.writeStream.format("noop").start()  # start() returns: planning is async
    with pytest.raises(StreamingQueryException, match="endingOffsets: only for batch reads"):
        query.awaitTermination(QUERY_TIMEOUT_S)


# -- streaming ----------------------------------------------------------------------------------


def test_streaming_restart_from_checkpoint_sees_every_record_once(
    spark: Any, cluster: LocalCluster, topic: str, tmp_path: Path
) -> None:
    create_topic(cluster, topic, 2)
    sink = Batches()
    checkpoint = tmp_path / "checkpoint"
    options = {"subscribe": topic, "startingOffsets": "earliest", "maxOffsetsPerTrigger": "70"}
    produce(cluster, topic, [b"a%d" % i for i in range(300)])
    run_available_now(stream(spark, cluster, **options), sink, checkpoint)
    # The rate limit held and the query stopped at the target (availableNow respects limits).
    assert len(sink.rows) >= 300 // 70 and all(len(rows) <= 70 for rows in sink.rows.values())
    assert sorted(sink.values()) == sorted(b"a%d" % i for i in range(300))

    # A continuous query, stopped while records keep arriving, then resumed from the checkpoint;
    # a partition added meanwhile is picked up from its first record.
    query = (
        stream(spark, cluster, **options)
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        produce(cluster, topic, [b"b%d" % i for i in range(200)])
        query.processAllAvailable()
    finally:
        query.stop()
    with Admin(cluster.bootstrap) as admin:
        admin.create_partitions(topic, 3)
    produce(cluster, topic, [b"c%d" % i for i in range(200)])
    produce(cluster, topic, [b"d%d" % i for i in range(30)], partition=2)
    run_available_now(stream(spark, cluster, **options), sink, checkpoint)
    expected = [
        b"%s%d" % (p, i) for p, n in ((b"a", 300), (b"b", 200), (b"c", 200)) for i in range(n)
    ]
    expected += [b"d%d" % i for i in range(30)]
    assert sorted(sink.values()) == sorted(expected)
    assert len(sink.values()) == len(set(sink.values()))


def _leader(cluster: LocalCluster, topic: str, partition: int, *, timeout_s: float = 30) -> int:
    """The partition's leader; the node asked may not have applied a new topic yet (or an
    election may be under way), so ask again until one is named."""
    deadline = time.monotonic() + timeout_s
    with Admin(cluster.bootstrap) as admin:
        while time.monotonic() < deadline:
            try:
                leader = admin.describe_topic(topic).partitions[partition].leader
            except ClientError:
                leader = None
            if leader is not None:
                return leader
            threading.Event().wait(0.2)
    raise TimeoutError(f"no leader of {topic}/{partition} within {timeout_s} s")


def test_leader_killed_during_a_streaming_query_loses_and_duplicates_nothing(
    spark: Any, cluster: LocalCluster, topic: str, tmp_path: Path
) -> None:
    create_topic(cluster, topic, 1)
    sink = Batches()
    query = (
        stream(spark, cluster, subscribe=topic, startingOffsets="earliest")
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    sent = [b"r%d" % i for i in range(1500)]
    futures: list[Future[RecordMetadata]] = []
    victim = None
    try:
        with Producer(cluster.bootstrap, acks="all", linger_ms=2) as producer:
            for i, value in enumerate(sent):
                futures.append(producer.send(topic, value=value, partition=0))
                if i == 500:
                    futures[-1].result(timeout=60)
                    query.processAllAvailable()  # the query is reading from this leader ...
                    victim = _leader(cluster, topic, 0)
                    cluster.kill_node(victim, sig=signal.SIGKILL)  # ... when it dies
            producer.flush()
        acknowledged = {sent[i] for i, f in enumerate(futures) if f.exception() is None}
        query.processAllAvailable()
        assert query.exception() is None
    finally:
        query.stop()
        if victim is not None:
            cluster.start_node(victim, "--chaos")
            wait_all_alive(cluster)
    seen = sink.values()
    assert len(seen) == len(set(seen)), "a record was read twice"
    assert acknowledged <= set(seen), f"lost {len(acknowledged - set(seen))} acknowledged records"
    assert set(seen) <= set(sent)
    assert len(acknowledged) > 500


def _set_faults(cluster: LocalCluster, node_id: int, rules: dict[str, Any]) -> None:
    with grpc.insecure_channel(cluster.nodes[node_id].client_address) as channel:
        stub: Any = pb_grpc.InternalStub(channel)  # type: ignore[no-untyped-call]
        stub.SetFaults(pb.SetFaultsRequest(rules_json=json.dumps(rules)), timeout=10)


def test_records_above_the_high_watermark_are_never_read(
    spark: Any, cluster: LocalCluster, topic: str, tmp_path: Path
) -> None:
    """Records a cut-off leader appended but could not commit (acks=1) must not be read: a
    later leader may overwrite them. Whatever Spark read must match the final committed log."""
    create_topic(cluster, topic, 1)
    produce(cluster, topic, [b"committed-%d" % i for i in range(20)], partition=0)
    leader = _leader(cluster, topic, 0)
    others = [n for n in cluster.nodes if n != leader]
    _set_faults(cluster, leader, {"block": others, "direction": "both"})
    try:
        with Producer(
            cluster.bootstrap,
            acks=1,
            enable_idempotence=False,
            retries=0,
            request_timeout_ms=2000,
            delivery_timeout_ms=3000,
        ) as producer:
            pending = [
                producer.send(topic, value=b"uncommitted-%d" % i, partition=0) for i in range(5)
            ]
            producer.flush()
        assert any(f.exception() is None for f in pending), "the cut-off leader took no write"
        frame = (
            spark.read.format("raftlog")
            .option("bootstrap", cluster.bootstrap)
            .option("assign", json.dumps({topic: [0]}))
            .load()
        )
        read = {(r.partition, r.offset): bytes(r.value) for r in frame.collect()}
    finally:
        _set_faults(cluster, leader, {"heal": True})
        wait_all_alive(cluster)
    assert not any(v.startswith(b"uncommitted") for v in read.values()), read
    final = committed(cluster, topic)
    assert all(final.get(key) == value for key, value in read.items())


# -- the sink -----------------------------------------------------------------------------------


def test_sink_writes_each_row_once_with_acks_all(
    spark: Any, cluster: LocalCluster, topic: str, tmp_path: Path
) -> None:
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        StringType,
        StructField,
        StructType,
    )

    create_topic(cluster, topic, 2)
    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    schema = StructType(
        [
            StructField("key", StringType()),
            StructField("value", BinaryType()),
            StructField("partition", IntegerType()),
            StructField("headers", ArrayType(header)),
        ]
    )
    rows = [
        (f"k{i}" if i % 3 else None, b"w%d" % i, i % 2, [("h", b"%d" % i)] if i % 4 == 0 else None)
        for i in range(400)
    ]
    frame = spark.createDataFrame(rows, schema).repartition(3)
    frame.write.format("raftlog").option("bootstrap", cluster.bootstrap).option(
        "topic", topic
    ).mode("append").save()
    log = committed(cluster, topic)
    assert sorted(v for v in log.values() if v) == sorted(b"w%d" % i for i in range(400))
    assert all(int(value[1:]) % 2 == partition for (partition, _), value in log.items() if value)

    with pytest.raises(Exception, match="extra: not a column the raftlog sink writes"):
        spark.createDataFrame([(b"v", 1)], "value binary, extra int").write.format(
            "raftlog"
        ).option("bootstrap", cluster.bootstrap).option("topic", topic).mode("append").save()

    # Stream to stream: copy the topic into another with the streaming sink.
    copy = topic + "-copy"
    create_topic(cluster, copy, 1)
    query = (
        stream(spark, cluster, subscribe=topic, startingOffsets="earliest")
        .selectExpr("key", "value")
        .writeStream.format("raftlog")
        .option("bootstrap", cluster.bootstrap)
        .option("topic", copy)
        .option("checkpointLocation", str(tmp_path / "copy-checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(QUERY_TIMEOUT_S)
    assert query.exception() is None
    copied = committed(cluster, copy)
    assert sorted(v for v in copied.values() if v) == sorted(b"w%d" % i for i in range(400))
