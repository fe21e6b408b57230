"""What a scrape reads from a node: a plain, immutable copy of its state at one instant.

`capture` runs on the event loop, so it sees the groups, replicas and metadata between two
steps of the loop and never races them (it copies the partitions a bounded number at a time,
handing the loop back between); it only reads attributes and asks the Raft core's
read-only questions (`is_in_sync`), allocating a few small tuples per partition. The
exposition (`raftlog.metrics.collector`) then renders the copy off the loop.

Cardinality: the per-partition figures are one series per hosted replica, the follower lag
one per follower of a partition this node leads (at most replicas - 1 each), the consumer
group figures one per committed (group, partition) on the controller only, which the
metadata state bounds (`CONSUMER_GROUPS_MAX`), and the coordinator's open transactions a
fixed few series (a count per open state and the oldest one's age), on the controller only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from raftlog.metadata.state import MetadataState
from raftlog.metadata.transactions import TxnState
from raftlog.partition.replica import PartitionReplica
from raftlog.raft.types import Role
from raftlog.runtime.group import RaftGroup
from raftlog.storage.raft_log_storage import RaftLogStorage
from raftlog.storage.wall_clock import WallClock
from raftlog.types import NodeId

__all__ = [
    "ConsumerGroupSample",
    "FollowerSample",
    "NodeSnapshot",
    "NodeView",
    "PartitionSample",
    "TransactionsSample",
    "capture",
    "transactions_sample",
]


# Partitions copied per step of a scrape's copy (between two, the loop serves other work):
# about 2 ms of loop time each on an idle 2-core machine.
CAPTURE_STEP_PARTITIONS = 100


class GroupsView(Protocol):
    def groups(self) -> Iterable[RaftGroup]: ...

    def awake_count(self) -> int: ...


class MetadataView(Protocol):
    @property
    def state(self) -> MetadataState: ...


class NodeView(Protocol):
    """What a scrape reads from a node (the broker provides it)."""

    node_id: NodeId

    @property
    def host(self) -> GroupsView: ...

    @property
    def replicas(self) -> Mapping[tuple[str, int], PartitionReplica]: ...

    @property
    def metadata(self) -> MetadataView: ...

    @property
    def wall_clock(self) -> WallClock: ...

    def is_controller(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class FollowerSample:
    follower: NodeId
    lag_offsets: int  # entries the leader holds that the follower is not known to hold


@dataclass(frozen=True, slots=True)
class PartitionSample:
    topic: str
    partition: int
    is_leader: bool
    has_leader: bool  # this replica knows a leader (of the current term)
    leader_epoch: int  # the Raft term
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    size_bytes: int
    # On the leader only (empty, 0 elsewhere): its followers, and the voters in sync.
    followers: tuple[FollowerSample, ...] = ()
    replicas: int = 0
    in_sync_replicas: int = 0
    # The LSO (Kafka offset: read_committed reads stop before it), on the leader only.
    last_stable_offset: int = 0

    @property
    def last_stable_offset_lag(self) -> int:
        """Offsets committed but not yet stable: held back by an open transaction."""
        return max(0, self.high_watermark - self.last_stable_offset)

    @property
    def under_replicated(self) -> bool:
        return self.is_leader and self.in_sync_replicas < self.replicas


@dataclass(frozen=True, slots=True)
class ConsumerGroupSample:
    group: str
    topic: str
    partition: int
    committed_offset: int
    lag_offsets: int | None  # None when this node hosts no replica of the partition


# The states of an open transaction (decided or not): the ones the gauges count.
OPEN_TXN_STATES = (TxnState.ONGOING, TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)


@dataclass(frozen=True, slots=True)
class TransactionsSample:
    """The transaction coordinator's open transactions (the controller's copy of the state)."""

    open_by_state: tuple[tuple[TxnState, int], ...]  # one per OPEN_TXN_STATES, in order
    oldest_open_age_ms: int  # since the oldest open transaction began; 0 when none is open

    def __post_init__(self) -> None:
        assert tuple(state for state, _ in self.open_by_state) == OPEN_TXN_STATES, self
        assert self.oldest_open_age_ms >= 0, self


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    node_id: NodeId
    is_controller: bool
    raft_groups: int  # hosted, the metadata group included
    raft_groups_led: int
    raft_groups_awake: int  # not quiesced
    partitions: tuple[PartitionSample, ...]
    consumer_groups: tuple[ConsumerGroupSample, ...]
    transactions: TransactionsSample | None = None  # on the controller only

    @property
    def under_replicated(self) -> int:
        return sum(1 for p in self.partitions if p.under_replicated)

    @property
    def offline(self) -> int:
        return sum(1 for p in self.partitions if not p.has_leader)


async def capture(view: NodeView) -> tuple[NodeSnapshot, float]:
    """A copy of `view`'s state (on the event loop: see the module docstring) and the
    longest time, in seconds, one step of the copy held the loop.

    The partitions are copied `CAPTURE_STEP_PARTITIONS` at a time, the loop free between
    steps, so a node with thousands of partitions keeps serving while it is scraped; each
    partition's figures are consistent with one another, not with other partitions' (as in
    any scrape of a live system). A replica removed between two steps is left out."""
    replicas = list(view.replicas.values())
    partitions: list[PartitionSample] = []
    step_s_max = 0.0
    for start in range(0, len(replicas), CAPTURE_STEP_PARTITIONS):
        if start:
            await asyncio.sleep(0)
        started = time.perf_counter()
        partitions.extend(
            _partition_sample(replica)
            for replica in replicas[start : start + CAPTURE_STEP_PARTITIONS]
            if view.replicas.get((replica.topic, replica.partition)) is replica
        )
        step_s_max = max(step_s_max, time.perf_counter() - started)
    started = time.perf_counter()
    snapshot = _node_snapshot(view, tuple(partitions))
    return snapshot, max(step_s_max, time.perf_counter() - started)


def _node_snapshot(view: NodeView, partitions: tuple[PartitionSample, ...]) -> NodeSnapshot:
    groups = tuple(view.host.groups())
    is_controller = view.is_controller()
    state = view.metadata.state
    consumer_groups = _consumer_groups(state, partitions) if is_controller else ()
    transactions = transactions_sample(state, view.wall_clock.now_ms()) if is_controller else None
    snapshot = NodeSnapshot(
        node_id=view.node_id,
        is_controller=is_controller,
        raft_groups=len(groups),
        raft_groups_led=sum(1 for g in groups if g.node.role is Role.LEADER),
        raft_groups_awake=view.host.awake_count(),
        partitions=partitions,
        consumer_groups=consumer_groups,
        transactions=transactions,
    )
    assert snapshot.raft_groups_led <= snapshot.raft_groups
    return snapshot


def _partition_sample(replica: PartitionReplica) -> PartitionSample:
    group = replica.group
    node = group.node
    storage = group.log
    size_bytes = storage.log.size_bytes if isinstance(storage, RaftLogStorage) else 0
    log_end_offset = int(node.last_offset) + 1
    is_leader = node.role is Role.LEADER
    followers: tuple[FollowerSample, ...] = ()
    replicas = in_sync = last_stable_offset = 0
    if is_leader:
        last_stable_offset = replica.last_stable_offset
        followers = tuple(
            FollowerSample(peer, max(0, log_end_offset - 1 - int(progress.match)))
            for peer, progress in sorted(node.progress.items())
            if peer != node.node_id
        )
        voters = node.membership.voters
        replicas = len(voters)
        in_sync = sum(1 for peer in voters if peer == node.node_id or node.is_in_sync(peer))
    return PartitionSample(
        topic=replica.topic,
        partition=replica.partition,
        is_leader=is_leader,
        has_leader=node.leader_id is not None,
        leader_epoch=int(node.term),
        high_watermark=replica.high_watermark,
        log_start_offset=replica.log_start_offset,
        log_end_offset=replica.log_end_offset,
        size_bytes=size_bytes,
        followers=followers,
        replicas=replicas,
        in_sync_replicas=in_sync,
        last_stable_offset=last_stable_offset,
    )


def _consumer_groups(
    state: MetadataState, partitions: tuple[PartitionSample, ...]
) -> tuple[ConsumerGroupSample, ...]:
    """Committed offsets of every consumer group, and their lag where a local replica shows
    the high watermark (its commit offset trails the leader's by at most a heartbeat)."""
    high_watermarks = {(p.topic, p.partition): p.high_watermark for p in partitions}
    samples = []
    for group in state.consumer_group_ids():
        for (topic, partition), committed in state.committed_offsets(group).items():
            high_watermark = high_watermarks.get((topic, partition))
            lag = None if high_watermark is None else max(0, high_watermark - committed)
            samples.append(ConsumerGroupSample(group, topic, partition, committed, lag))
    return tuple(samples)


def transactions_sample(state: MetadataState, now_ms: int) -> TransactionsSample:
    """Open transactions by state, and how long ago the oldest began (by the coordinator's
    clock: `started_ms` was stamped by the controller that opened it)."""
    counts = dict.fromkeys(OPEN_TXN_STATES, 0)
    started_ms_min: int | None = None
    for txn in state.transactions():
        if txn.state in counts:
            counts[txn.state] += 1
            if started_ms_min is None or txn.started_ms < started_ms_min:
                started_ms_min = txn.started_ms
    age_ms = 0 if started_ms_min is None else max(0, now_ms - started_ms_min)
    return TransactionsSample(tuple(counts.items()), age_ms)
