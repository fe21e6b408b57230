"""The node's periodic duties: what runs on every liveness pass and in the node's loops.

Theory of operation. `NodeLiveness` (`raftlog.node.liveness`) heartbeats the controller and,
on every pass, calls `liveness_pass`: the controller's duties (fencing, learners,
decommissioning, rebalancing) when this node is the controller, leadership handed back to
preferred replicas, stale leader reports, a metadata snapshot when the log grew long, and
the consumer-group coordinator's term check. Two loops run beside it: `leadership_loop`
(a fenced node hands its leaderships away; a partition leader steps its replica move along)
and `retention_loop` (retention by size and age on every hosted partition).

A node is fenced when the metadata shows it fenced or its own lease lapsed
(`raftlog.node.leases`); a fenced node refuses produce and leads nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from raftlog.config import NodeConfig
from raftlog.errors import RaftlogError
from raftlog.metadata import METADATA_RAFT_GROUP_ID, RegisterNode
from raftlog.metadata.consumer_group_service import ConsumerGroupService
from raftlog.metadata.machine import MetadataMachine
from raftlog.node.controller_duties import ControllerDuties
from raftlog.node.group_factory import RaftGroupFactory
from raftlog.node.leadership import LeadershipMoves
from raftlog.node.leases import NodeLease
from raftlog.node.metadata_calls import MetadataCalls
from raftlog.node.reassignment_driver import ReassignmentDriver
from raftlog.node.reconcile import Reconciler
from raftlog.raft.membership import membership_at
from raftlog.raft.types import Snapshot, SnapshotMeta
from raftlog.runtime.clock import RetentionClock
from raftlog.runtime.group import RaftGroup
from raftlog.settings import NodeSettings
from raftlog.storage.wall_clock import WallClock
from raftlog.types import Offset

__all__ = ["NodeDuties"]

log = logging.getLogger(__name__)


class NodeDuties:
    """The duties above, over the node's parts (module docstring)."""

    def __init__(
        self,
        *,
        settings: NodeSettings,
        incarnation: int,
        metadata: MetadataMachine,
        metadata_group: Callable[[], RaftGroup | None],
        calls: MetadataCalls,
        controller: ControllerDuties,
        leadership: LeadershipMoves,
        reassignments: ReassignmentDriver,
        consumer_groups: ConsumerGroupService,
        raft_groups: RaftGroupFactory,
        reconciler: Reconciler,
        lease: NodeLease,
        wall_clock: WallClock,
        retention_clock: RetentionClock,
        fail: Callable[[BaseException], None],
    ) -> None:
        self._settings = settings
        self._node_id = settings.node_id
        self._config: NodeConfig = settings.config
        self._incarnation = incarnation
        self._metadata = metadata
        self._metadata_group = metadata_group
        self._calls = calls
        self._controller = controller
        self._leadership = leadership
        self._reassignments = reassignments
        self._consumer_groups = consumer_groups
        self._raft_groups = raft_groups
        self._reconciler = reconciler
        self._lease = lease
        self._wall_clock = wall_clock
        self._retention_clock = retention_clock
        self._fail = fail
        self._decommissioned_logged = False

    # -- liveness --------------------------------------------------------------------------

    async def liveness_pass(self) -> None:
        """What runs on every liveness interval besides the heartbeat (NodeLiveness)."""
        if self._calls.is_controller():
            await self._controller.run()
        self._leadership.move_leaders_to_preferred()
        self._leadership.report_stale_leaders()
        self._maybe_snapshot_metadata()
        # Starts the group coordinator's hold-off at the election, not at the first
        # group request (consumers resume sooner after a controller change).
        self._consumer_groups.coordinating()

    def registration(self) -> RegisterNode:
        """This start's registration: addresses, incarnation, the controller stamps the time."""
        return RegisterNode(
            node_id=self._node_id,
            client_address=self._settings.client_address,
            raft_address=self._settings.raft_address,
            incarnation=self._incarnation,
            now_ms=self._wall_clock.now_ms(),
            kafka_address=self._settings.kafka_address,
        )

    def on_decommissioned(self, message: str, *, restarted: bool) -> None:
        """The controller refused this node's registration or heartbeat: it was
        decommissioned. A running node says so once (it hosts nothing and is out of the
        metadata quorum: stop it); a restarted one stops instead of rejoining."""
        if restarted:
            log.error("node %s: refused: %s; stopping", self._node_id, message)
            self._fail(RaftlogError(f"node {self._node_id}: {message}"))
        elif not self._decommissioned_logged:
            self._decommissioned_logged = True
            log.error(
                "node %s: decommissioned (%s); it serves nothing now: stop it",
                self._node_id,
                message,
            )

    def is_fenced(self) -> bool:
        """The metadata shows this node fenced, or its own clock says its lease lapsed."""
        return self.fence_cause() is not None

    def fence_cause(self) -> str | None:
        """Why this node is fenced, in words; None while it is not."""
        info = self._metadata.state.node(self._node_id)
        if info is not None and info.fenced:
            return "the controller fenced it in the metadata"
        return self._lease.lapse_cause()

    # -- loops -----------------------------------------------------------------------------

    async def leadership_loop(self) -> None:
        """Partition-leader duties that cannot wait for the next heartbeat: a fenced node
        hands leadership away (rate-limited, stopping once unfenced); a leader steps its
        partition's move along."""
        # A few ticks: a move's steps each wait for a commit, which takes about that long.
        interval_s = 4 * self._config.tick_interval_ms / 1000
        logged_cause: str | None = None
        while True:
            await asyncio.sleep(interval_s)
            cause = self.fence_cause()
            if (cause is None) != (logged_cause is None):
                log.info(
                    "node %s: %s", self._node_id,
                    f"fenced: {cause}" if cause else "unfenced; leadership transfers stop",
                )  # fmt: skip
                logged_cause = cause
            if cause is not None:
                self._leadership.step_down_fenced(cause)
            else:
                self._reassignments.drive()

    async def retention_loop(self) -> None:
        """Retention on every hosted partition, every `retention_check_interval_ms`."""
        interval_s = self._config.retention_check_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            self._reconciler.apply_retention(self._retention_clock.now_ms())

    def _maybe_snapshot_metadata(self) -> None:
        """Keep the metadata log short: snapshot the state every `metadata_snapshot_offsets`.

        The snapshot is taken at the applied offset, which always ends an entry, and written
        before the log below it is dropped (raftlog.storage.raft_log_storage.compact).
        """
        group = self._metadata_group()
        assert group is not None
        storage = self._raft_groups.storages[METADATA_RAFT_GROUP_ID]
        applied = Offset(self._metadata.state.applied_offset)
        snapshot = storage.snapshot()
        last_snapshot = -1 if snapshot is None else snapshot.meta.offset
        if applied - last_snapshot < self._config.metadata_snapshot_offsets:
            return
        if applied > group.node.commit_offset or applied < storage.first_offset():
            return
        term = storage.term_at(applied)
        if term is None:
            return
        membership = membership_at(storage, applied, group.bootstrap_membership)
        data = self._metadata.state.snapshot()
        storage.compact(Snapshot(SnapshotMeta(applied, term, membership), data))
        log.info(
            "node %s: metadata snapshot at offset %s (%d bytes)", self._node_id, applied, len(data)
        )
