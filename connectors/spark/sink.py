"""The `raftlog` sink: `df.write.format("raftlog")` and `writeStream.format("raftlog")`.

Theory of operation. Each Spark task gets Arrow batches of its rows and sends them with one
`Producer` (acks=all, idempotent): a record is acknowledged only once a Raft majority has it,
and the producer's internal retries (a lost answer, a leader change) are deduplicated by the
partition leader from the producer id and sequence numbers, so they never write a record
twice. The task flushes, waits for every acknowledgement and fails if any record failed, so a
task that reports success has every one of its records committed. Columns, as in Spark's
Kafka sink: `value` (binary or string, required), `key` (binary or string), `topic` (string;
else the `topic` option), `partition` (int; else the producer's partitioner: murmur2 of the
key, sticky when keyless), `headers` (array<struct<key: string, value: binary>>).

What idempotence does not cover: a Spark task that fails after some sends and is re-run starts
a new producer (a new producer id), so records the first attempt committed are written again.
Like Spark's Kafka sink, the sink is at-least-once across task retries; exactly-once needs
transactions, which raftlog does not have yet.

Validation happens in `writer()` on the driver: unknown columns, columns of the wrong type,
no topic at all, or an overwrite save mode fail there, naming the column or option.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass

import pyarrow as pa
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
from raftlog.connectors.spark.options import SinkOptions
from raftlog.errors import ConfigError

__all__ = ["RaftlogCommitMessage", "RaftlogStreamWriter", "RaftlogWriter", "SinkColumns"]

_TEXT_OR_BYTES = (BinaryType, StringType)


@dataclass(frozen=True, slots=True)
class SinkColumns:
    """Which optional columns the written DataFrame has (checked once, on the driver)."""

    key: bool
    topic: bool
    partition: bool
    headers: bool


@dataclass(frozen=True)
class RaftlogCommitMessage(WriterCommitMessage):
    records: int


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


def write_batches(
    options: SinkOptions, columns: SinkColumns, batches: Iterator[pa.RecordBatch]
) -> RaftlogCommitMessage:
    """Send every row of `batches`; return only once all are committed (acks=all)."""
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
    ) as producer:
        for batch in batches:
            sent += _send_batch(producer, options, columns, batch, delivery)
            if delivery.failure is not None:
                break
        producer.flush()
    if delivery.failure is not None:
        raise delivery.failure
    assert delivery.acknowledged == sent, (delivery.acknowledged, sent)
    return RaftlogCommitMessage(records=sent)


def _send_batch(
    producer: Producer,
    options: SinkOptions,
    columns: SinkColumns,
    batch: pa.RecordBatch,
    delivery: _Delivery,
) -> int:
    data = batch.to_pydict()
    count = int(batch.num_rows)
    nothing: list[None] = [None] * count
    values = data["value"]
    keys = data["key"] if columns.key else nothing
    topics = data["topic"] if columns.topic else nothing
    partitions = data["partition"] if columns.partition else nothing
    headers = data["headers"] if columns.headers else nothing
    for row in range(count):
        topic = topics[row] or options.topic
        if topic is None:
            raise ConfigError(f"topic: row {row} has a null topic and no topic option is set")
        row_headers = [(h["key"], _as_bytes(h["value"])) for h in headers[row] or ()]
        future = producer.send(
            topic,
            value=_as_bytes(values[row]),
            key=_as_bytes(keys[row]),
            partition=partitions[row],
            headers=row_headers or None,
        )
        future.add_done_callback(delivery.done)
    return count


class RaftlogWriter(DataSourceArrowWriter):
    """`df.write.format("raftlog")` (save mode append)."""

    def __init__(self, options: SinkOptions, schema: StructType, *, overwrite: bool) -> None:
        if overwrite:
            raise ConfigError("mode: a log cannot be overwritten; use mode('append')")
        self.options = options
        self.columns = check_columns(schema, options)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> RaftlogCommitMessage:
        return write_batches(self.options, self.columns, iterator)

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
        return write_batches(self.options, self.columns, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do: each task's records were committed before the task finished."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing can be undone: records already committed stay (at-least-once, see above)."""
