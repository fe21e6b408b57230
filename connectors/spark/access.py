"""How the connector talks to the cluster: the driver's view and a worker's range read.

Theory of operation. Both sides use the client library's `Cluster` (metadata cache, leader
routing, gRPC channel pool) and call the raw Log RPCs, because the connector needs what the
Consumer hides: the high watermark of each answer, exact offset ranges and Fetch bytes left
undecoded for `raftlog.connectors.spark.arrow`.

Driver (`ClusterView`): lists the partitions a subscription covers (Metadata), and resolves
offsets with ListOffsets at each partition's leader: EARLIEST (the log start), LATEST (the high
watermark: every offset below it is committed on a majority; with read_committed, the default,
the last stable offset, below which every transaction is decided) or TIMESTAMP. Planning only ever
uses offsets it was told, so a micro-batch never names an offset above a high watermark.

Worker (`read_range`): fetches `[offset_from, offset_to)` of one partition from its leader,
`fetch_bytes_max` at a time, and yields one Arrow batch per answer. With read_committed the
Fetch stops at the last stable offset and lists the aborted transactions among its batches;
their records and every control batch (COMMIT/ABORT markers) are left out, so a range below
the last stable offset reads the same records every time. It survives leader changes:
NOT_LEADER follows the hint; an unreachable node, a timeout or an election marks the
metadata stale and retries after a backoff; a new leader whose high watermark has not yet
caught up with `offset_to` answers with fewer records (or OFFSET_OUT_OF_RANGE) and is
long-polled until it has. Nothing is skipped and nothing read twice, because the position
only moves past batches the worker has yielded. It gives up when `retry_window_ms` passes
without progress. Offsets below the log start (removed by retention or DeleteRecords) are
data loss: with `failOnDataLoss` the read fails with `DataLossError`, otherwise it logs a
warning and resumes at the log start.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from raftlog.client._connection import Cluster, TopicPartition
from raftlog.client.config import ConnectionConfig
from raftlog.client.errors import (
    ClientError,
    NotLeaderForPartitionError,
    OffsetOutOfRangeError,
    UnknownTopicOrPartitionError,
    server_error,
)
from raftlog.connectors.spark.arrow import decode_fetch
from raftlog.connectors.spark.options import EARLIEST, LATEST, SourceOptions, Subscription
from raftlog.connectors.spark.planning import OffsetRange, Position
from raftlog.rpc.v1 import raftlog_pb2 as pb

__all__ = ["ClusterView", "DataLossError", "read_range"]

log = logging.getLogger("raftlog.connectors.spark")
Clock = Callable[[], float]
Sleep = Callable[[float], None]
_BACKOFF_S = 0.1


class DataLossError(ClientError):
    """Offsets a query still had to read are gone (retention removed them)."""


class _NotCaughtUpError(ClientError):
    """A new leader's high watermark is still below an offset its predecessor committed."""

    retriable = True


def _connection(options: SourceOptions) -> ConnectionConfig:
    # A single request may wait fetch_wait_ms on the server; give it room beyond that.
    timeout_ms = max(10_000, options.fetch_wait_ms * 4)
    return ConnectionConfig(request_timeout_ms=timeout_ms, retry_backoff_ms=100).validate()


def call_leader(
    cluster: Cluster,
    tp: TopicPartition,
    rpc: str,
    request: Any,
    *,
    window_s: float,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
) -> Any:
    """`rpc` at `tp`'s leader, retrying retriable errors for `window_s` seconds."""
    deadline = clock() + window_s
    while True:
        try:
            address = cluster.leader_address(tp)
            response = cluster.call(address, rpc, request)
            if response.error.code == pb.NONE:
                return response
            raise server_error(response.error, concerning=f"{rpc} {tp.topic}/{tp.partition}")
        except ClientError as error:
            if not error.retriable or clock() >= deadline:
                raise
            _after_retriable(cluster, tp, error)
            sleep(_BACKOFF_S)


def _after_retriable(cluster: Cluster, tp: TopicPartition, error: ClientError) -> None:
    if isinstance(error, NotLeaderForPartitionError) and error.leader_id is not None:
        cluster.apply_leader_hint(tp, error.leader_id, error.leader_address)
    else:
        cluster.mark_stale(tp.topic)


class ClusterView:
    """The driver's questions to the cluster (not picklable: created where it is used)."""

    def __init__(self, options: SourceOptions, *, clock: Clock = time.monotonic) -> None:
        self._options = options
        self._cluster = Cluster(options.bootstrap, _connection(options), clock=clock)
        self._window_s = options.retry_window_ms / 1000
        self._clock = clock

    def close(self) -> None:
        self._cluster.close()

    def partitions(self, subscription: Subscription) -> list[TopicPartition]:
        """The partitions `subscription` covers now, sorted (new partitions appear here)."""
        if subscription.kind == "assign":
            return [TopicPartition(t, p) for t, p in subscription.partitions]
        if subscription.kind == "subscribe":
            metadata = self._cluster.refresh_metadata(list(subscription.topics))
            missing = [t for t in subscription.topics if t not in metadata.topics]
            if missing:
                raise UnknownTopicOrPartitionError(
                    "UNKNOWN_TOPIC_OR_PARTITION",
                    "no such topic in the cluster",
                    concerning=f"subscribe topics {missing}",
                )
            topics = {t: metadata.topics[t] for t in subscription.topics}
        else:
            pattern = re.compile(subscription.pattern)
            metadata = self._cluster.refresh_metadata([])
            topics = {t: p for t, p in metadata.topics.items() if pattern.fullmatch(t)}
        result = sorted(
            TopicPartition(t, p.partition) for t, parts in topics.items() for p in parts
        )
        assert len(set(result)) == len(result)
        return result

    def offsets(self, tps: Sequence[TopicPartition], spec: int) -> Position:
        """EARLIEST (log start) or LATEST (high watermark) of each partition, from its leader."""
        assert spec in (EARLIEST, LATEST), spec
        kind = pb.EARLIEST if spec == EARLIEST else pb.LATEST
        return {tp: self._list_offset(tp, kind, 0) for tp in tps}

    def offsets_for_timestamp(self, tps: Sequence[TopicPartition], timestamp_ms: int) -> Position:
        """The first offset with a timestamp >= `timestamp_ms`, or the high watermark if none."""
        result: Position = {}
        for tp in tps:
            offset = self._list_offset(tp, pb.TIMESTAMP, timestamp_ms)
            if offset < 0:
                result[tp] = self._list_offset(tp, pb.LATEST, 0)
            else:
                result[tp] = self._first_record_at_or_after(tp, offset, timestamp_ms)
        return result

    def _first_record_at_or_after(self, tp: TopicPartition, offset: int, timestamp_ms: int) -> int:
        """ListOffsets answers at batch granularity (the broker never decodes records): the
        batch at `offset` has some record at or after `timestamp_ms`; find the first one, as
        Kafka's ListOffsets would."""
        request = pb.FetchRequest(
            topic=tp.topic, partition=tp.partition, offset=offset, max_bytes=1024 * 1024
        )
        response = call_leader(self._cluster, tp, "Log.Fetch", request, window_s=self._window_s)
        decoded = decode_fetch(
            response.batches,
            topic=tp.topic,
            partition=tp.partition,
            offset_from=offset,
            offset_to=response.high_watermark,
            high_watermark=response.high_watermark,
            include_headers=False,
        )
        if decoded.batch is None:
            return offset
        micros = np.asarray(decoded.batch.column("timestamp").cast(pa.int64()))
        later = np.flatnonzero(micros >= timestamp_ms * 1000)
        offsets = decoded.batch.column("offset")
        return int(offsets[int(later[0])].as_py()) if len(later) else offset

    def _list_offset(self, tp: TopicPartition, spec: Any, timestamp_ms: int) -> int:
        request = pb.ListOffsetsRequest(
            topic=tp.topic,
            partition=tp.partition,
            spec=spec,
            timestamp_ms=timestamp_ms,
            isolation_level=int(self._options.read_committed),
        )
        response = call_leader(
            self._cluster, tp, "Log.ListOffsets", request, window_s=self._window_s
        )
        offset = int(response.offset)
        assert offset >= -1, offset
        return offset


def read_range(
    options: SourceOptions,
    offset_range: OffsetRange,
    *,
    cluster: Cluster | None = None,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
) -> Iterator[pa.RecordBatch]:
    """Arrow batches of every record of `offset_range`, in offset order, exactly once.

    `cluster` (tests pass a simulated one) defaults to this worker process's shared one."""
    chosen = _worker_cluster(options) if cluster is None else cluster
    yield from _read(chosen, options, offset_range, clock, sleep)


_worker_clusters: dict[tuple[str, int], Cluster] = {}
_worker_clusters_lock = threading.Lock()


def _worker_cluster(options: SourceOptions) -> Cluster:
    """One `Cluster` per bootstrap list in a worker process, kept between tasks: Spark reuses
    its Python workers, and a warm channel and metadata cache save a connection set-up and a
    Metadata round trip per task (a large share of a small micro-batch). Stale routing is
    corrected by the usual NOT_LEADER / retry path."""
    key = (options.bootstrap, options.fetch_wait_ms)
    with _worker_clusters_lock:
        cluster = _worker_clusters.get(key)
        if cluster is None:
            cluster = Cluster(options.bootstrap, _connection(options))
            _worker_clusters[key] = cluster
            assert len(_worker_clusters) <= 64, "one entry per bootstrap list in use"
        return cluster


def _read(
    cluster: Cluster, options: SourceOptions, piece: OffsetRange, clock: Clock, sleep: Sleep
) -> Iterator[pa.RecordBatch]:
    tp = TopicPartition(piece.topic, piece.partition)
    position = piece.offset_from
    deadline = clock() + options.retry_window_ms / 1000
    while position < piece.offset_to:
        try:
            response = _fetch(cluster, tp, position, options)
        except ClientError as error:
            if not error.retriable or clock() >= deadline:
                raise
            _after_retriable(cluster, tp, error)
            sleep(_BACKOFF_S)
            continue
        if response is None:  # position below the log start: data loss, handled
            position = _on_data_loss(cluster, tp, position, piece, options)
            continue
        decoded = decode_fetch(
            response.batches,
            topic=tp.topic,
            partition=tp.partition,
            offset_from=position,
            offset_to=piece.offset_to,
            high_watermark=response.high_watermark,
            include_headers=options.include_headers,
            aborted=((a.producer_id, a.first_offset) for a in response.aborted_transactions),
        )
        if decoded.batch is not None:
            yield decoded.batch
        if decoded.next_offset > position:
            position = decoded.next_offset
            deadline = clock() + options.retry_window_ms / 1000
        elif clock() >= deadline:
            raise ClientError(
                f"read {tp.topic}/{tp.partition}: no progress at offset {position} for "
                f"{options.retry_window_ms} ms (high watermark {response.high_watermark}, "
                f"need {piece.offset_to})"
            )
    assert position >= piece.offset_to


def _fetch(
    cluster: Cluster, tp: TopicPartition, position: int, options: SourceOptions
) -> Any | None:
    """One Fetch at the leader; None when `position` is below the log start."""
    address = cluster.leader_address(tp)
    request = pb.FetchRequest(
        topic=tp.topic,
        partition=tp.partition,
        offset=position,
        max_bytes=options.fetch_bytes_max,
        max_wait_ms=options.fetch_wait_ms,
        min_bytes=1,
        isolation_level=int(options.read_committed),
    )
    response = cluster.call(address, "Log.Fetch", request)
    code = response.error.code
    if code == pb.NONE:
        return response
    error = server_error(response.error, concerning=f"fetch {tp.topic}/{tp.partition} at {address}")
    if isinstance(error, OffsetOutOfRangeError):
        earliest = call_leader(
            cluster,
            tp,
            "Log.ListOffsets",
            pb.ListOffsetsRequest(topic=tp.topic, partition=tp.partition, spec=pb.EARLIEST),
            window_s=options.retry_window_ms / 1000,
        ).offset
        if position < earliest:
            return None
        # Above this node's high watermark: a new leader not yet caught up. Retry.
        raise _NotCaughtUpError(f"{error} (offset {position} is past this leader's high watermark)")
    raise error


def _on_data_loss(
    cluster: Cluster, tp: TopicPartition, position: int, piece: OffsetRange, options: SourceOptions
) -> int:
    request = pb.ListOffsetsRequest(topic=tp.topic, partition=tp.partition, spec=pb.EARLIEST)
    window_s = options.retry_window_ms / 1000
    earliest = int(call_leader(cluster, tp, "Log.ListOffsets", request, window_s=window_s).offset)
    message = (
        f"{tp.topic}/{tp.partition}: offsets {position}..{min(earliest, piece.offset_to) - 1} "
        f"were removed (log start is now {earliest}) before the query read them"
    )
    if options.fail_on_data_loss:
        raise DataLossError(message + "; set failOnDataLoss=false to skip them")
    log.warning("%s; skipping them (failOnDataLoss=false)", message)
    assert earliest > position
    return earliest
