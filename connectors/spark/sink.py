"""The `raftlog` sink: `df.write.format("raftlog")` and `writeStream.format("raftlog")`.

Theory of operation. Each Spark task gets Arrow batches of its rows and sends them with one
`Producer` (acks=all, idempotent): a record is acknowledged only once a Raft majority has it,
and the producer's internal retries (a lost answer, a leader change) are deduplicated by the
partition leader from the producer id and sequence numbers, so they never write a record
twice. The task flushes, waits for every acknowledgement and fails if any record failed, so a
task that reports success has every one of its records committed. Columns, as in Spark's
Kafka sink: `value` (binary or string, required), `key` (binary or string), `topic` (string;
else the `topic` option), `partition` (int; else murmur2 of the key as Kafka's partitioner,
or round-robin by row position within the task when keyless), `headers`
(array<struct<key: string, value: binary>>).

Exactly once across task retries, for deterministic input. Every attempt of one task is the
*same producer*: its id is derived (`derived_producer_id`, a range the controller never
allocates) from the write id, the micro-batch id and the Spark partition id. The write id is
the streaming query's id (local property `sql.streaming.queryId`, kept in the checkpoint, so
a query restarted after a failure reuses it) or, for `df.write`, an id made on the driver
when the writer is created (pickled into every task); the micro-batch id is the local
property `streaming.sql.batchId` (none for batch writes). Records are numbered per partition
in the task's row order, and a row's partition depends only on the row and its position, so
an attempt sends the same records under the same sequence numbers. Before its first record
to a partition, a task asks that partition's leader for the producer's last *committed*
sequence (`Producer.resume`, Log.DescribeProducers) and skips that many of its records
there, then continues the sequence. An earlier attempt still running (a zombie) cannot add a
duplicate: the leader's strict sequence check refuses whichever of the two comes second.

The condition: a retried task (or a replayed micro-batch) must see the same rows in the same
order in each Spark partition. That holds for narrow transformations of a deterministic
source (this connector's own source replays a micro-batch from the same offsets); it does not
hold after a shuffle without a sort, or with non-deterministic expressions (rand(), current
time, a UDF that is not a function of its input). Not covered either: a producer id the
partition has forgotten (each partition remembers its `producers_max` most recently active
producers) is written from the start again.

Validation happens in `writer()` on the driver: unknown columns, columns of the wrong type,
no topic at all, or an overwrite save mode fail there, naming the column or option.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    StringType,
    StructType,
)

from raftlog.client import Producer, RecordMetadata
from raftlog.client.partitioner import partition_for_key
from raftlog.client.producer import derived_producer_id
from raftlog.connectors.spark.options import SinkOptions
from raftlog.errors import ConfigError

__all__ = [
    "BATCH_ID_PROPERTY",
    "QUERY_ID_PROPERTY",
    "RaftlogCommitMessage",
    "RaftlogStreamWriter",
    "RaftlogWriter",
    "SinkColumns",
    "task_producer_name",
    "write_batches",
]

_TEXT_OR_BYTES = (BinaryType, StringType)
# Spark's local properties on a streaming query's tasks (StreamExecution.QUERY_ID_KEY and
# MicroBatchExecution.BATCH_ID_KEY in spark-sql 4.x).
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


@dataclass(frozen=True, slots=True)
class SinkColumns:
    """Which optional columns the written DataFrame has (checked once, on the driver)."""

    key: bool
    topic: bool
    partition: bool
    headers: bool


@dataclass(frozen=True)
class RaftlogCommitMessage(WriterCommitMessage):
    records: int  # sent by this attempt
    skipped: int  # committed by an earlier attempt of the same task


def _is(data_type: DataType, *types: type[DataType]) -> bool:
    return isinstance(data_type, types)


def _headers_type_ok(data_type: DataType) -> bool:
    if not isinstance(data_type, ArrayType) or not isinstance(data_type.elementType, StructType):
        return False
    fields = {f.name: f.dataType for f in data_type.elementType.fields}
    return (
        set(fields) == {"key", "value"}
        and _is(fields["key"], StringType)
        and _is(fields["value"], *_TEXT_OR_BYTES)
    )


def check_columns(schema: StructType, options: SinkOptions) -> SinkColumns:
    """The sink's columns, or a `ConfigError` naming the column that is wrong."""
    types = {f.name: f.dataType for f in schema.fields}
    unknown = sorted(set(types) - {"key", "value", "topic", "partition", "headers"})
    if unknown:
        raise ConfigError(
            f"{unknown[0]}: not a column the raftlog sink writes (columns: {unknown})"
        )
    if "value" not in types:
        raise ConfigError("value: the raftlog sink needs a value column (binary or string)")
    checks = {
        "value": _is(types["value"], *_TEXT_OR_BYTES),
        "key": "key" not in types or _is(types["key"], *_TEXT_OR_BYTES),
        "topic": "topic" not in types or _is(types["topic"], StringType),
        "partition": "partition" not in types or _is(types["partition"], IntegerType),
        "headers": "headers" not in types or _headers_type_ok(types["headers"]),
    }
    for column, ok in checks.items():
        if not ok:
            raise ConfigError(f"{column}: column has type {types[column].simpleString()}")
    if "topic" not in types and options.topic is None:
        raise ConfigError("topic: give a topic option or a topic column")
    return SinkColumns("key" in types, "topic" in types, "partition" in types, "headers" in types)


def _as_bytes(value: object) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise TypeError(f"expected bytes or str, got {type(value).__name__}")


class _Delivery:
    """Counts acknowledgements and keeps the first failure (callbacks run on the sender)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.acknowledged = 0
        self.failure: BaseException | None = None

    def done(self, future: Future[RecordMetadata]) -> None:
        error = future.exception()
        with self._lock:
            if error is None:
                self.acknowledged += 1
            elif self.failure is None:
                self.failure = error


def task_producer_name(write_id: str | None) -> str:
    """The name every attempt of the running Spark task derives its producer id from.

    `write_id` None: a streaming write, identified by the query's persistent id and the
    micro-batch id (local properties Spark sets on the query's jobs).
    """
    context = TaskContext.get()
    if context is None:
        raise RuntimeError("the raftlog sink's write() runs only inside a Spark task")
    partition_id = context.partitionId()
    if write_id is not None:
        return f"raftlog-sink/{write_id}/{partition_id}"
    query_id = context.getLocalProperty(QUERY_ID_PROPERTY)
    batch_id = context.getLocalProperty(BATCH_ID_PROPERTY)
    if not query_id or batch_id is None:
        raise RuntimeError(
            f"a streaming write task without the local properties {QUERY_ID_PROPERTY} and "
            f"{BATCH_ID_PROPERTY} (got {query_id!r}, {batch_id!r}): only micro-batch "
            "streaming is supported"
        )
    return f"raftlog-sink/{query_id}/{batch_id}/{partition_id}"


class _Resumer:
    """Per topic-partition: how many of this task's records to skip, and how many were seen."""

    def __init__(self, producer: Producer) -> None:
        self._producer = producer
        self._partition_counts: dict[str, int] = {}
        self._round_robin: dict[str, int] = {}
        self._skip: dict[tuple[str, int], int] = {}
        self._seen: dict[tuple[str, int], int] = {}
        self.skipped = 0

    def partition(self, topic: str, key: bytes | None, explicit: int | None) -> int:
        """A row's partition, from the row and its position only (never random)."""
        if explicit is not None:
            return explicit
        count = self._partition_counts.get(topic)
        if count is None:
            count = self._partition_counts[topic] = len(self._producer.partitions_for(topic))
        if key is not None:
            return partition_for_key(key, count)
        position = self._round_robin.get(topic, 0)
        self._round_robin[topic] = position + 1
        return position % count

    def already_written(self, topic: str, partition: int) -> bool:
        """Whether the next record for `topic`/`partition` was committed by an earlier attempt."""
        tp = (topic, partition)
        skip = self._skip.get(tp)
        if skip is None:
            skip = self._skip[tp] = self._producer.resume(topic, partition)
        seen = self._seen.get(tp, 0)
        self._seen[tp] = seen + 1
        if seen < skip:
            self.skipped += 1
            return True
        return False

    def check_complete(self) -> None:
        """An earlier attempt cannot have written more records than this one has: if the
        partition holds more, the input was not deterministic and records may be lost."""
        for tp, skip in self._skip.items():
            if skip > self._seen.get(tp, 0):
                raise RuntimeError(
                    f"{tp[0]}/{tp[1]}: an earlier attempt of this task committed {skip} records "
                    f"but this attempt has only {self._seen.get(tp, 0)}; the sink's input is "
                    "not deterministic (see the raftlog sink's docstring)"
                )


def write_batches(
    options: SinkOptions,
    columns: SinkColumns,
    batches: Iterator[pa.RecordBatch],
    *,
    producer_name: str,
) -> RaftlogCommitMessage:
    """Send every row of `batches` that an earlier attempt with the same `producer_name` did
    not commit; return only once all are committed (acks=all)."""
    delivery = _Delivery()
    sent = 0
    with Producer(
        options.bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=options.linger_ms,
        buffer_bytes_max=options.buffer_bytes_max,
        compression=options.compression,
        delivery_timeout_ms=options.delivery_timeout_ms,
        producer_id=derived_producer_id(producer_name),
    ) as producer:
        resumer = _Resumer(producer)
        for batch in batches:
            sent += _send_batch(producer, resumer, options, columns, batch, delivery)
            if delivery.failure is not None:
                break
        producer.flush()
    if delivery.failure is not None:
        raise delivery.failure
    resumer.check_complete()
    assert delivery.acknowledged == sent, (delivery.acknowledged, sent)
    return RaftlogCommitMessage(records=sent, skipped=resumer.skipped)


def _send_batch(
    producer: Producer,
    resumer: _Resumer,
    options: SinkOptions,
    columns: SinkColumns,
    batch: pa.RecordBatch,
    delivery: _Delivery,
) -> int:
    """Send the rows of `batch` not written before; return how many were sent."""
    data = batch.to_pydict()
    count = int(batch.num_rows)
    nothing: list[None] = [None] * count
    values = data["value"]
    keys = data["key"] if columns.key else nothing
    topics = data["topic"] if columns.topic else nothing
    partitions = data["partition"] if columns.partition else nothing
    headers = data["headers"] if columns.headers else nothing
    sent = 0
    for row in range(count):
        topic = topics[row] or options.topic
        if topic is None:
            raise ConfigError(f"topic: row {row} has a null topic and no topic option is set")
        key = _as_bytes(keys[row])
        partition = resumer.partition(topic, key, partitions[row])
        if resumer.already_written(topic, partition):
            continue
        row_headers = [(h["key"], _as_bytes(h["value"])) for h in headers[row] or ()]
        future = producer.send(
            topic,
            value=_as_bytes(values[row]),
            key=key,
            partition=partition,
            headers=row_headers or None,
        )
        future.add_done_callback(delivery.done)
        sent += 1
    return sent


class RaftlogWriter(DataSourceArrowWriter):
    """`df.write.format("raftlog")` (save mode append)."""

    def __init__(self, options: SinkOptions, schema: StructType, *, overwrite: bool) -> None:
        if overwrite:
            raise ConfigError("mode: a log cannot be overwritten; use mode('append')")
        self.options = options
        self.columns = check_columns(schema, options)
        # Made once on the driver and pickled into every task: the attempts of one task
        # share it, so they are one producer (see the module docstring).
        self.write_id = uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> RaftlogCommitMessage:
        name = task_producer_name(self.write_id)
        return write_batches(self.options, self.columns, iterator, producer_name=name)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to do: each task's records were committed before the task finished."""


class RaftlogStreamWriter(DataSourceStreamArrowWriter):
    """`writeStream.format("raftlog")`: each micro-batch's tasks write as `RaftlogWriter`."""

    def __init__(self, options: SinkOptions, schema: StructType, *, overwrite: bool) -> None:
        if overwrite:
            raise ConfigError("outputMode: only append is supported by the raftlog sink")
        self.options = options
        self.columns = check_columns(schema, options)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> RaftlogCommitMessage:
        name = task_producer_name(None)
        return write_batches(self.options, self.columns, iterator, producer_name=name)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do: each task's records were committed before the task finished."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing can be undone: records already committed stay; the batch's rerun (same
        query id and batch id, so the same producers) skips them (see the module docstring)."""
