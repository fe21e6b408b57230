"""A `prometheus_client` collector that renders a `NodeSnapshot` as gauges.

The snapshot is taken on the event loop just before a scrape renders
(`NodeMetrics.render`); the collector only turns its numbers into metric families, so the
exposition format is the library's, and nothing here is kept between scrapes: a partition
moved away or a topic deleted simply stops appearing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from raftlog.metrics.snapshot import NodeSnapshot, PartitionSample

__all__ = ["SnapshotCollector"]

_PARTITION = ("topic", "partition")


class SnapshotCollector(Collector):
    """Yields the gauges of the snapshot last handed to `set_snapshot` (none before)."""

    def __init__(self) -> None:
        self._snapshot: NodeSnapshot | None = None

    def set_snapshot(self, snapshot: NodeSnapshot) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snapshot = self._snapshot
        if snapshot is None:
            return
        yield from _node_families(snapshot)
        yield from _partition_families(snapshot.partitions)
        yield from _consumer_group_families(snapshot)
        yield from _transaction_families(snapshot)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def _node_families(snapshot: NodeSnapshot) -> Iterator[Metric]:
    yield _gauge(
        "raftlog_controller", "1 on the metadata quorum's leader (the controller), else 0",
        int(snapshot.is_controller),
    )  # fmt: skip
    yield _gauge(
        "raftlog_raft_groups", "Raft groups hosted, the metadata group included",
        snapshot.raft_groups,
    )  # fmt: skip
    yield _gauge("raftlog_raft_groups_led", "Raft groups this node leads", snapshot.raft_groups_led)
    yield _gauge(
        "raftlog_raft_groups_awake", "Raft groups that tick (not quiesced)",
        snapshot.raft_groups_awake,
    )  # fmt: skip
    yield _gauge("raftlog_partitions", "Partition replicas hosted", len(snapshot.partitions))
    yield _gauge(
        "raftlog_partitions_under_replicated",
        "Partitions led here with a voter not in sync (RaftNode.is_in_sync)",
        snapshot.under_replicated,
    )
    yield _gauge(
        "raftlog_partitions_offline",
        "Partition replicas hosted here that know no leader in their current term",
        snapshot.offline,
    )


# (name, help, value): one series per hosted replica, then per partition led here.
_REPLICA_GAUGES: tuple[tuple[str, str, Callable[[PartitionSample], int]], ...] = (
    ("raftlog_partition_leader", "1 if this replica is the partition's leader",
     lambda p: int(p.is_leader)),
    ("raftlog_partition_leader_epoch", "The replica's Raft term", lambda p: p.leader_epoch),
    ("raftlog_partition_high_watermark",
     "Offset after the last committed entry, as this replica knows it",
     lambda p: p.high_watermark),
    ("raftlog_partition_log_start_offset", "First offset held", lambda p: p.log_start_offset),
    ("raftlog_partition_log_end_offset", "Offset after the last entry held",
     lambda p: p.log_end_offset),
    ("raftlog_partition_log_size_bytes", "Bytes of the replica's segments",
     lambda p: p.size_bytes),
)  # fmt: skip
_LEADER_GAUGES: tuple[tuple[str, str, Callable[[PartitionSample], int]], ...] = (
    ("raftlog_partition_replicas", "Voters of the partition (on its leader)",
     lambda p: p.replicas),
    ("raftlog_partition_in_sync_replicas", "Voters in sync, the leader included (on the leader)",
     lambda p: p.in_sync_replicas),
    ("raftlog_partition_last_stable_offset",
     "Last stable offset: read_committed reads stop before it (on the leader)",
     lambda p: p.last_stable_offset),
    ("raftlog_partition_last_stable_offset_lag_offsets",
     "High watermark minus last stable offset: held back by open transactions (on the leader)",
     lambda p: p.last_stable_offset_lag),
)  # fmt: skip


def _partition_families(partitions: tuple[PartitionSample, ...]) -> Iterator[Metric]:
    labelled = [(p, [p.topic, str(p.partition)]) for p in partitions]
    for name, documentation, value in _REPLICA_GAUGES:
        family = GaugeMetricFamily(name, documentation, labels=_PARTITION)
        for p, labels in labelled:
            family.add_metric(labels, value(p))
        yield family
    led = [(p, labels) for p, labels in labelled if p.is_leader]
    for name, documentation, value in _LEADER_GAUGES:
        family = GaugeMetricFamily(name, documentation, labels=_PARTITION)
        for p, labels in led:
            family.add_metric(labels, value(p))
        yield family
    lag = GaugeMetricFamily(
        "raftlog_partition_follower_lag_offsets",
        "Offsets the leader holds that a follower is not known to hold (on the leader)",
        labels=(*_PARTITION, "follower"),
    )
    for p, labels in led:
        for follower in p.followers:
            lag.add_metric([*labels, str(follower.follower)], follower.lag_offsets)
    yield lag


def _consumer_group_families(snapshot: NodeSnapshot) -> Iterator[Metric]:
    """On the controller only: it holds the committed offsets (metadata quorum)."""
    if not snapshot.is_controller:
        return
    labels = ("group", "topic", "partition")
    committed = GaugeMetricFamily(
        "raftlog_consumer_group_committed_offset",
        "A consumer group's committed offset (the next offset it reads)",
        labels=labels,
    )
    lag = GaugeMetricFamily(
        "raftlog_consumer_group_lag_offsets",
        "High watermark minus committed offset (partitions with a replica on the controller)",
        labels=labels,
    )
    for sample in snapshot.consumer_groups:
        values = [sample.group, sample.topic, str(sample.partition)]
        committed.add_metric(values, sample.committed_offset)
        if sample.lag_offsets is not None:
            lag.add_metric(values, sample.lag_offsets)
    yield committed
    yield lag


def _transaction_families(snapshot: NodeSnapshot) -> Iterator[Metric]:
    """On the controller only: it is every transactional id's coordinator."""
    transactions = snapshot.transactions
    if transactions is None:
        return
    open_ = GaugeMetricFamily(
        "raftlog_transactions_open",
        "Open transactions on the coordinator, by state (Ongoing, PrepareCommit, PrepareAbort)",
        labels=("state",),
    )
    for state, count in transactions.open_by_state:
        open_.add_metric([state.value], count)
    yield open_
    yield _gauge(
        "raftlog_transaction_oldest_open_age_seconds",
        "Time since the oldest open transaction began (0 when none is open)",
        transactions.oldest_open_age_ms / 1000,
    )
