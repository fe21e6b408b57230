"""Reconciliation: the partition groups this node hosts follow the metadata state.

`Reconciler.reconcile` runs after every metadata apply (and once at start, for what a
snapshot restored). It creates the partition groups assigned to this node (their initial
voters are the assigned replicas, written once next to the group's log; a node joining
through a move starts with none and learns the membership from the leader), removes and
deletes those of deleted topics and the copies a completed move took away, and tells the
transport where peers live.

Peer addresses. The voters' addresses this node was started with (`--peers`) are
authoritative for the metadata quorum, as KRaft's `controller.quorum.voters`: the replayed
metadata records where each node was at its last registration, which after a restart on new
addresses (a container or pod recreated, a local cluster restarted on other ports) is stale,
and dialing it the voters would never reach one another. A registration committed after this
node caught up (applied its own registration of this start) is newer than `--peers`,
though: a voter that moved while this node ran announces itself so, and is dialed there with
no manual step.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

from raftlog.config import LogConfig
from raftlog.errors import (
    CorruptBatchError,
    NotLeaderError,
    StorageError,
    UnknownTopicOrPartitionError,
)
from raftlog.metadata import MetadataState
from raftlog.node.cleaner import CleanTarget
from raftlog.node.group_factory import RaftGroupFactory
from raftlog.node.scrubber import ScrubTarget
from raftlog.partition.checkpoint import CheckpointStore
from raftlog.partition.cleaning import CompactionSettings, compaction_settings
from raftlog.partition.policy import apply_retention, topic_compression, topic_log_config
from raftlog.partition.producer_state import PRODUCERS_MAX_DEFAULT
from raftlog.partition.replica import PartitionReplica, TxnVerifier
from raftlog.runtime.clock import MonotonicClock
from raftlog.runtime.group import RaftGroup
from raftlog.runtime.host import RaftGroupHost
from raftlog.settings import parse_address
from raftlog.storage.bootstrap_voters import (
    BOOTSTRAP_VOTERS_FILE_NAME,
    load_or_write_bootstrap_voters,
)
from raftlog.storage.log import LogDamage, SegmentedLog
from raftlog.storage.raft_log_storage import RaftLogStorage
from raftlog.storage.scrub import SegmentProblem
from raftlog.storage.segment import LOG_SUFFIX, parse_segment_name
from raftlog.storage.txn_index import TransactionIndex
from raftlog.types import NodeId, RaftGroupId

__all__ = ["Reconciler"]

log = logging.getLogger(__name__)


class Reconciler:
    def __init__(
        self,
        *,
        node_id: NodeId,
        data_dir: Path,
        log_config: LogConfig,
        bootstrap_peers: Mapping[NodeId, tuple[str, int]],
        metadata: Callable[[], MetadataState],
        factory: RaftGroupFactory,
        host: RaftGroupHost,
        update_peers: Callable[[dict[NodeId, tuple[str, int]]], None],
        on_leadership_change: Callable[[RaftGroup], None],
        caught_up: Callable[[], bool],
        creates_per_turn_max: int,
        create_turn_ms_max: float,
        clock: MonotonicClock,
        call_soon: Callable[[Callable[[], None]], object],
        txn_verifier: Callable[[str, int], TxnVerifier | None] = lambda topic, partition: None,
    ) -> None:
        assert creates_per_turn_max > 0 and create_turn_ms_max > 0, (
            creates_per_turn_max,
            create_turn_ms_max,
        )
        self._node_id = node_id
        self._data_dir = data_dir
        self._log_config = log_config
        self._bootstrap_peers = bootstrap_peers
        self._metadata = metadata
        self._factory = factory
        self._host = host
        self._update_peers = update_peers
        self._on_leadership_change = on_leadership_change
        self._caught_up = caught_up
        self._creates_per_turn_max = creates_per_turn_max
        self._create_turn_s_max = create_turn_ms_max / 1000
        self._clock = clock
        self._call_soon = call_soon
        # Each replica's KIP-890 check (raftlog.node.txn_verification).
        self._txn_verifier = txn_verifier
        self._more_scheduled = False
        # Each node's (incarnation, raft address) when this node caught up: a registration
        # differing from it was committed since, so it is newer than --peers.
        self._registered_at_catch_up: dict[NodeId, tuple[int, str]] | None = None
        # Each topic's settings parsed from its config, reparsed only when the config
        # changes: the produce path and the retention and cleaner rounds (1,000 partitions
        # of one topic) ask for them per record batch and per replica.
        self._topic_settings: dict[str, tuple[dict[str, str], LogConfig, CompactionSettings]] = {}
        self.replicas: dict[tuple[str, int], PartitionReplica] = {}
        self.replicas_by_raft_group: dict[RaftGroupId, PartitionReplica] = {}

    def reconcile(self) -> None:
        """Make the hosted partition groups and known peers match the metadata state.

        New groups are created for at most `create_turn_ms_max` of loop time and at most
        `creates_per_turn_max` of them (at least one) now, the rest on later turns of the
        loop: opening a group's storage costs fsyncs, whose time a slow or busy disk
        multiplies, and a turn that creates groups for seconds delays every heartbeat and
        vote of the groups already running by as much (leases expire, leaders are fenced).
        A time budget holds the turn short whatever one creation costs."""
        state = self._metadata()
        wanted = state.raft_group_ids_for_node(self._node_id)
        missing = (
            [] if self._more_scheduled else sorted(wanted - self.replicas_by_raft_group.keys())
        )
        # While a follow-up is scheduled, this turn made its share; the follow-up makes more.
        started_s = self._clock.monotonic()
        for created, raft_group_id in enumerate(missing):
            turn_over = self._clock.monotonic() - started_s >= self._create_turn_s_max
            if created == self._creates_per_turn_max or (created > 0 and turn_over):
                self._more_scheduled = True
                self._call_soon(self._reconcile_more)
                break
            info = state.partition_by_raft_group(raft_group_id)
            assert info is not None
            # A node joining through a move starts with no voters at all: it must not vote
            # or campaign before the leader's log (or snapshot) tells it the membership.
            joining = self._node_id in info.adding
            voters: frozenset[NodeId] = frozenset() if joining else frozenset(info.replicas)
            preferred = info.preferred_leader == self._node_id and info.target is None
            self._create_replica(
                info.topic, int(info.partition), raft_group_id, voters, preferred=preferred
            )
        for raft_group_id in sorted(self.replicas_by_raft_group.keys() - wanted):
            self._remove_replica(raft_group_id)
        for topic in [t for t in self._topic_settings if state.topic(t) is None]:
            del self._topic_settings[topic]
        self._update_peers(self._peer_addresses(state))

    def _peer_addresses(self, state: MetadataState) -> dict[NodeId, tuple[str, int]]:
        """Every other node's raft address: registrations, overridden for the voters by
        --peers unless the voter registered again since this node caught up."""
        registered = {node.node_id: (node.incarnation, node.raft_address) for node in state.nodes()}
        if self._registered_at_catch_up is None and self._caught_up():
            self._registered_at_catch_up = dict(registered)
        baseline = self._registered_at_catch_up
        peers = {
            node_id: parse_address(raft_address, setting="raft_address")
            for node_id, (_, raft_address) in registered.items()
            if node_id != self._node_id
        }
        for node_id, address in self._bootstrap_peers.items():
            moved_since = (
                baseline is not None
                and node_id in registered
                and registered[node_id] != baseline.get(node_id)
            )
            if node_id != self._node_id and not moved_since:
                peers[node_id] = address
        assert self._node_id not in peers, peers
        return peers

    def _reconcile_more(self) -> None:
        self._more_scheduled = False
        self.reconcile()

    def _log_start_floor(self, topic: str, partition: int, raft_group_id: RaftGroupId) -> int:
        """Where DeleteRecords moved the partition's log start (0: never), if the metadata's
        partition is still this replica's group (not a deleted topic's namesake)."""
        info = self._metadata().partition(topic, partition)
        return 0 if info is None or info.raft_group_id != raft_group_id else info.log_start_floor

    def compaction_settings(self, topic: str) -> CompactionSettings:
        """The topic's cleanup settings as the metadata holds them now."""
        return self._settings(topic)[2]

    def _settings(self, topic: str) -> tuple[dict[str, str], LogConfig, CompactionSettings]:
        """The topic's config, its log settings (retention) and its cleanup settings."""
        info = self._metadata().topic(topic)
        config = info.config if info is not None else {}
        cached = self._topic_settings.get(topic)
        if cached is None or cached[0] != config:
            live = topic_log_config(self._log_config, config)
            cached = (dict(config), live, compaction_settings(config))
            self._topic_settings[topic] = cached
        return cached

    def clean_targets(self) -> list[CleanTarget]:
        """The hosted logs of compacted topics, for the cleaner: each may be cleaned below
        both its high watermark and what its replica applied."""
        storages = self._factory.storages
        targets = []
        for raft_group_id, replica in sorted(self.replicas_by_raft_group.items()):
            settings = self.compaction_settings(replica.topic)
            if settings.compact and raft_group_id in storages:
                # The LSO is at most min(high watermark, applied offset + 1): below it, no
                # open transaction's batch (partition/cleaning.py).
                clean_below = replica.raft_last_stable_offset
                log = storages[raft_group_id].log
                aborted = replica.aborted_transactions_below(clean_below)
                targets.append(CleanTarget(raft_group_id, log, settings, clean_below, aborted))
        return targets

    def apply_retention(self, now_ms: int) -> None:
        """Drop what each hosted partition's retention settings let go (`policy.py`)."""
        for raft_group_id, replica in list(self.replicas_by_raft_group.items()):
            storage = self._factory.storages.get(raft_group_id)
            if storage is not None:
                self._refresh_retention(replica.topic, storage.log)
                bootstrap = replica.group.bootstrap_membership
                deleting = self.compaction_settings(replica.topic).delete
                apply_retention(replica, storage, bootstrap, now_ms, keys_deleted=deleting)

    def _refresh_retention(self, topic: str, log: SegmentedLog) -> None:
        """retention.ms and retention.bytes as the topic has them now: an alter takes effect
        at the next retention check (the other log settings at the replica's next start)."""
        live = self._settings(topic)[1]
        if (log.config.retention_bytes, log.config.retention_ms) != (
            live.retention_bytes,
            live.retention_ms,
        ):
            log.config = dataclasses.replace(
                log.config, retention_bytes=live.retention_bytes, retention_ms=live.retention_ms
            )

    # -- storage damage found while running (docs/storage-faults.md) ------------------------

    def scrub_targets(self) -> list[ScrubTarget]:
        """The hosted partition logs, for the scrubber."""
        storages = self._factory.storages
        return [
            ScrubTarget(
                raft_group_id,
                storages[raft_group_id].files,
                storages[raft_group_id].log.closed_segments,
            )
            for raft_group_id in sorted(self.replicas_by_raft_group)
            if raft_group_id in storages
        ]

    def on_read_damage(self, group: RaftGroup, error: CorruptBatchError) -> None:
        """The host met damage while stepping `group` (it already took the group off)."""
        self.reopen_for_repair(group.raft_group_id, error.path, str(error), offset=None)

    def on_scrub_damage(self, raft_group_id: RaftGroupId, problem: SegmentProblem) -> None:
        self.reopen_for_repair(raft_group_id, problem.path, problem.cause, offset=problem.offset)

    def reopen_for_repair(
        self, raft_group_id: RaftGroupId, path: str | None, cause: str, *, offset: int | None
    ) -> None:
        """Synced data of a hosted partition turned out damaged: drop the log from the
        damage on (durably marked as a repair) and reopen the group, which then abstains
        until a leader the other replicas elected has refilled it."""
        replica = self.replicas_by_raft_group.get(raft_group_id)
        group = self._host.remove(raft_group_id)
        if group is not None:
            group.fail_waiters(NotLeaderError(leader_hint=None))
        storage = self._factory.storages.pop(raft_group_id)
        damage = _start_repair(storage, path, cause, offset=offset)
        log.error(
            "group %s: storage damage found while running: %s", raft_group_id, damage.describe()
        )
        storage.close()
        if replica is None:
            # The metadata state machine cannot be rebuilt under the running broker; the
            # repair mark is durable, so the restart opens the log repairing, replays what
            # is left and abstains in the metadata quorum until the controller refilled it.
            raise StorageError(
                f"metadata log damaged ({cause}); marked for repair from offset "
                f"{damage.first_offset}: restart the node to repair it from the metadata quorum"
            )
        del self.replicas_by_raft_group[raft_group_id]
        self.replicas.pop((replica.topic, replica.partition), None)
        info = self._metadata().partition_by_raft_group(raft_group_id)
        voters = frozenset(info.replicas) if info is not None else frozenset({self._node_id})
        self._create_replica(replica.topic, replica.partition, raft_group_id, voters)

    def _partition_dir(self, topic: str, partition: int) -> Path:
        return self._data_dir / "partitions" / f"{topic}-{partition}"

    def _create_replica(
        self,
        topic: str,
        partition: int,
        raft_group_id: RaftGroupId,
        voters: frozenset[NodeId],
        *,
        preferred: bool = False,
    ) -> None:
        """Open (or make) the group's storage and host it. A brand-new group (term 0, empty
        log) campaigns at once on its preferred replica: the other replicas' timers start at
        their own creation and run a randomized election timeout, and a replica that has not
        created the group yet holds the vote request until it has (raftlog.runtime.host), so
        the preferred one wins the first election. Otherwise all replicas of a new topic's groups
        time out together, split their votes, elect whichever wins, and then hand
        leadership to the preferred replica: two or three elections (each a hard-state save
        on every replica) per partition instead of one, which on a slow node is the load
        that expires its lease."""
        topic_info = self._metadata().topic(topic)
        log_config = topic_log_config(self._log_config, topic_info.config if topic_info else {})
        directory = self._partition_dir(topic, partition)
        storage, hard_state_store = self._factory.open_storage(directory, log_config)
        # The group's bootstrap voters are fixed when its directory is made: after a move the
        # metadata's replicas differ from the voters the group started with.
        bootstrap = load_or_write_bootstrap_voters(storage.files, os.fspath(directory), voters)
        if bootstrap.damage is not None:
            path = os.path.join(directory, BOOTSTRAP_VOTERS_FILE_NAME)
            storage.log.start_repair(storage.log.log_end_offset, bootstrap.damage, path=path)
        voters = bootstrap.voters
        checkpoint = CheckpointStore(
            storage.files, storage.directory, producers_max=PRODUCERS_MAX_DEFAULT
        )
        replica = PartitionReplica(
            topic=topic,
            partition=partition,
            log=storage,
            config=log_config,
            checkpoint=checkpoint,
            keys_required=lambda: self.compaction_settings(topic).compact,
            txn_verifier=self._txn_verifier(topic, partition),
            txn_index=TransactionIndex(
                storage.log, cached_entries_max=log_config.txn_index_cached_entries_max
            ),
            log_start_floor=lambda: self._log_start_floor(topic, partition, raft_group_id),
            compression=lambda: topic_compression(self._settings(topic)[0]),
        )
        info = self._metadata().partition(topic, partition)
        first_term = 0 if info is None else info.first_term
        group = self._factory.make_group(
            raft_group_id,
            storage,
            hard_state_store,
            voters,
            replica,
            first_term=first_term,
        )
        replica.attach(group)
        group.on_leadership_change = self._on_leadership_change
        self.replicas[(topic, partition)] = replica
        self.replicas_by_raft_group[raft_group_id] = replica
        self._host.add(group)
        log.info(
            "node %s: hosting %s-%s (group %s)", self._node_id, topic, partition, raft_group_id
        )
        # A new topic's groups start at the cluster's highest leader epoch, not at term 0
        # (`PartitionInfo.first_term`): no election has been held while the term is that one.
        brand_new = group.node.term == first_term and storage.last_offset() < 0
        if preferred and brand_new and len(voters) > 1:
            group.node.campaign()

    def _remove_replica(self, raft_group_id: RaftGroupId) -> None:
        replica = self.replicas_by_raft_group.pop(raft_group_id)
        self.replicas.pop((replica.topic, replica.partition), None)
        group = self._host.remove(raft_group_id)
        if group is not None:
            group.fail_waiters(UnknownTopicOrPartitionError(replica.topic, replica.partition))
        self._factory.close(raft_group_id)
        shutil.rmtree(self._partition_dir(replica.topic, replica.partition), ignore_errors=True)


def _start_repair(
    storage: RaftLogStorage, path: str | None, cause: str, *, offset: int | None
) -> LogDamage:
    """Drop `storage`'s log from the damage on, durably marked as a repair. Without a known
    offset (a read's CRC failure names only the file) the cut is the damaged segment's base."""
    segment_base = parse_segment_name(os.path.basename(path or ""), LOG_SUFFIX)
    cut = offset if offset is not None else segment_base
    start, end = storage.log.log_start_offset, storage.log.log_end_offset
    cut = min(max(start if cut is None else cut, start), end)
    return storage.log.start_repair(cut, cause, path=path or storage.log.directory)
