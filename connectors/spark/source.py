"""The PySpark data source `raftlog`: batch and streaming reads of committed records.

Theory of operation. Spark runs a Python data source in three kinds of process. The
*planner* (on the driver) builds `RaftlogDataSource`, asks its schema, then the reader's
partitions: that is where options are validated and offsets resolved (`ClusterView`).
For streaming, a long-lived driver-side process keeps one `RaftlogStreamReader` per query and
calls `initialOffset`, `latestOffset`, `partitions` and `commit` on it for each micro-batch.
The *workers* receive the reader and one `RangePartition` pickled, and call `read`, which
fetches exactly that offset range (`read_range`) and yields Arrow batches. So the reader's
pickled state is plain data only (its `SourceOptions`); connections are opened where used.

Exactly once. Spark writes a micro-batch's end offsets to the checkpoint before running it and
replays `[start, end)` after a restart. Every end offset here is at most a high watermark that
a leader reported, and offsets below a high watermark are committed (on a majority, never
rewritten, Raft §5.4), so a replay reads byte-identical records. An end offset is also never
behind its start: a new leader may briefly report a lower high watermark than its predecessor
did, and the reader then keeps the start instead of moving backwards.

Admission control (Spark 4.2+ `latestOffset(start, limit)`): `getDefaultReadLimit` reports
`maxOffsetsPerTrigger` as `ReadMaxRows`, or `minOffsetsPerTrigger` as `ReadMinRows`; Spark
passes it back (or `ReadAllAvailable` for triggers that must ignore limits). With
`minOffsetsPerTrigger` a batch waits until that many offsets are available or
`maxTriggerDelay` has passed since the last batch. `Trigger.AvailableNow` is supported
(`prepareForTriggerAvailableNow` fixes the target offsets; batches respect the rate limit
and stop at the target; the minimum is not waited for).

New partitions of a subscribed topic enter the position at their log start in the first
micro-batch that sees them (reading nothing from them in it), so the next batch reads them from
their first record and none is skipped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from raftlog.client._connection import TopicPartition
from raftlog.connectors.spark.access import ClusterView, DataLossError, log, read_range
from raftlog.connectors.spark.options import (
    EARLIEST,
    LATEST,
    SourceOptions,
    parse_sink_options,
    parse_source_options,
)
from raftlog.connectors.spark.planning import (
    OffsetRange,
    Position,
    from_json_offsets,
    limit_offsets,
    plan_ranges,
    split_ranges,
    to_json_offsets,
)
from raftlog.errors import ConfigError

__all__ = [
    "RaftlogBatchReader",
    "RaftlogDataSource",
    "RaftlogStreamReader",
    "RangePartition",
    "source_schema",
]


def source_schema(*, include_headers: bool) -> StructType:
    """Spark's Kafka source schema (headers only with includeHeaders)."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    return StructType(fields)


class RangePartition(InputPartition):
    """One Spark task's share: an offset range of one partition (plain, picklable data)."""

    def __init__(self, offset_range: OffsetRange) -> None:
        super().__init__(offset_range)
        self.offset_range = offset_range


class RaftlogDataSource(DataSource):
    """`spark.read.format("raftlog")`, `readStream`, `write` and `writeStream`."""

    @classmethod
    def name(cls) -> str:
        return "raftlog"

    def schema(self) -> StructType:
        # Runs at load(): every option that does not depend on batch vs stream is checked here.
        options = parse_source_options(self.options, streaming=None)
        return source_schema(include_headers=options.include_headers)

    def reader(self, schema: StructType) -> DataSourceReader:
        return RaftlogBatchReader(parse_source_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return RaftlogStreamReader(parse_source_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from raftlog.connectors.spark.sink import RaftlogWriter

        return RaftlogWriter(parse_sink_options(self.options), schema, overwrite=overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from raftlog.connectors.spark.sink import RaftlogStreamWriter

        return RaftlogStreamWriter(parse_sink_options(self.options), schema, overwrite=overwrite)


def resolve_position(
    view: ClusterView, tps: list[TopicPartition], options: SourceOptions, *, starting: bool
) -> Position:
    """Starting (or, for a batch read, ending) offsets per the options, for `tps`."""
    if starting and options.starting_timestamp_ms is not None:
        return view.offsets_for_timestamp(tps, options.starting_timestamp_ms)
    spec = options.starting_offsets if starting else options.ending_offsets
    name = "startingOffsets" if starting else "endingOffsets"
    if isinstance(spec, str):
        return view.offsets(tps, EARLIEST if spec == "earliest" else LATEST)
    wanted = {TopicPartition(t, p): o for t, parts in spec.items() for p, o in parts.items()}
    unknown = sorted(set(wanted) - set(tps))
    if unknown:
        raise ConfigError(f"{name}: names partitions the query does not read: {unknown}")
    default = EARLIEST if starting else LATEST
    sentinels = {
        s: view.offsets([tp for tp in tps if wanted.get(tp, default) == s], s)
        for s in (EARLIEST, LATEST)
    }
    position: Position = {}
    for tp in tps:
        offset = wanted.get(tp, default)
        position[tp] = sentinels[offset][tp] if offset < 0 else offset
    assert set(position) == set(tps)
    return position


def check_data_loss(view: ClusterView, start: Position, options: SourceOptions) -> Position:
    """`start`, with offsets already removed by retention reported (or failed on)."""
    earliest = view.offsets(sorted(start), EARLIEST)
    lost = {tp: (start[tp], earliest[tp]) for tp in start if start[tp] < earliest[tp]}
    if lost and options.fail_on_data_loss:
        raise DataLossError(
            f"offsets removed before they were read (start, log start): {lost}; set "
            "failOnDataLoss=false to skip them"
        )
    if lost:
        log.warning("skipping offsets removed by retention (start, log start): %s", lost)
    return {tp: max(offset, earliest[tp]) for tp, offset in start.items()}


class RaftlogBatchReader(DataSourceReader):
    """`spark.read`: one snapshot of offsets, planned once on the driver."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        view = ClusterView(self.options)
        try:
            tps = view.partitions(self.options.subscription)
            start = check_data_loss(
                view, resolve_position(view, tps, self.options, starting=True), self.options
            )
            end = resolve_position(view, tps, self.options, starting=False)
            # A JSON ending offset may not lie above the high watermark (uncommitted data).
            high_watermarks = view.offsets(tps, LATEST)
        finally:
            view.close()
        for tp in tps:
            if end[tp] > high_watermarks[tp]:
                raise ConfigError(
                    f"endingOffsets: {tp.topic}/{tp.partition} ends at {end[tp]}, above its high "
                    f"watermark {high_watermarks[tp]} (only committed offsets can be read)"
                )
            if end[tp] < start[tp]:
                raise ConfigError(
                    f"endingOffsets: {tp.topic}/{tp.partition} ends at {end[tp]}, before its "
                    f"starting offset {start[tp]}"
                )
        ranges = split_ranges(plan_ranges(start, end), self.options.min_partitions)
        return [RangePartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition), type(partition)
        return read_range(self.options, partition.offset_range)


class RaftlogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """`spark.readStream`: micro-batches of offset ranges (see the module docstring)."""

    def __init__(
        self, options: SourceOptions, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.options = options
        self._clock = clock
        self._view: ClusterView | None = None
        self._target: Position | None = None  # set by Trigger.AvailableNow
        self._latest: Position | None = None
        self._last_batch_s = clock()

    def __getstate__(self) -> dict[str, object]:
        # Workers need only the options: connections and driver state stay on the driver.
        return {"options": self.options}

    def __setstate__(self, state: Mapping[str, object]) -> None:
        options = state["options"]
        assert isinstance(options, SourceOptions)
        self.__init__(options)  # type: ignore[misc]

    def view(self) -> ClusterView:
        if self._view is None:
            self._view = ClusterView(self.options)
        return self._view

    def initialOffset(self) -> dict[str, dict[str, int]]:
        view = self.view()
        tps = view.partitions(self.options.subscription)
        return to_json_offsets(resolve_position(view, tps, self.options, starting=True))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        if self.options.min_offsets_per_trigger is not None:
            return ReadMinRows(self.options.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        view = self.view()
        self._target = view.offsets(view.partitions(self.options.subscription), LATEST)

    def latestOffset(
        self, start: dict[str, dict[str, int]], limit: ReadLimit
    ) -> dict[str, dict[str, int]]:
        view = self.view()
        begin = from_json_offsets(start, what="start offset")
        tps = view.partitions(self.options.subscription)
        if self._target is not None:
            tps = [tp for tp in tps if tp in self._target or tp in begin]
        new = [tp for tp in tps if tp not in begin]
        latest = {**begin, **view.offsets([tp for tp in tps if tp in begin], LATEST)}
        if self._target is not None:
            latest = {tp: min(o, self._target.get(tp, o)) for tp, o in latest.items()}
        # Never move backwards (a new leader's high watermark may lag its predecessor's).
        latest = {tp: max(o, begin[tp]) for tp, o in latest.items()}
        self._latest = latest
        end = self.admit(begin, latest, limit)
        end.update(view.offsets(new, EARLIEST))  # new partitions: enter at their log start
        if end != begin:
            self._last_batch_s = self._clock()
        assert all(end[tp] >= begin[tp] for tp in begin)
        return to_json_offsets(end)

    def admit(self, begin: Position, latest: Position, limit: ReadLimit) -> Position:
        """How far this micro-batch may go under the read limit (module docstring)."""
        if isinstance(limit, ReadAllAvailable):
            return dict(latest)
        backlog = sum(latest[tp] - begin[tp] for tp in latest)
        minimum = self.options.min_offsets_per_trigger
        waited_ms = (self._clock() - self._last_batch_s) * 1000
        too_few = minimum is not None and self._target is None and backlog < minimum
        if too_few and waited_ms < self.options.max_trigger_delay_ms:
            return dict(begin)
        maximum = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        maximum = maximum or self.options.max_offsets_per_trigger
        return limit_offsets(begin, latest, maximum) if maximum and backlog else dict(latest)

    def reportLatestOffset(self) -> dict[str, dict[str, int]] | None:
        return None if self._latest is None else to_json_offsets(self._latest)

    def partitions(
        self, start: dict[str, dict[str, int]], end: dict[str, dict[str, int]]
    ) -> list[InputPartition]:
        begin = from_json_offsets(start, what="start offset")
        finish = from_json_offsets(end, what="end offset")
        # Offsets removed by retention meanwhile are found by the workers (read_range).
        ranges = split_ranges(plan_ranges(begin, finish), self.options.min_partitions)
        return [RangePartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition), type(partition)
        return read_range(self.options, partition.offset_range)

    def commit(self, end: dict[str, dict[str, int]]) -> None:
        """Nothing to do: the position lives in Spark's checkpoint, not in the cluster."""

    def stop(self) -> None:
        if self._view is not None:
            self._view.close()
            self._view = None
