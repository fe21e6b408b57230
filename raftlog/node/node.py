"""A raftlog node ("broker"): wires every Raft group it hosts, its transports and its API
servers, and exposes the data and admin facade (`raftlog.rpc.port.NodePort`) the API front
ends call.

Theory of operation. One asyncio loop runs everything:

- the `RaftGroupHost` drives group 0 (the metadata quorum) and one group per partition replica
  assigned to this node, with group commit across groups;
- the `PeerTransport` carries the Raft traffic of all groups, one connection per peer node;
- a gRPC server (`raftlog.rpc.server`) answers clients (`Log`, `Admin`, `Groups`) and other
  nodes (`Internal`).

Each concern has its own module; this one only wires them and runs their loops:

- `raftlog.node.reconcile`: after every metadata apply, the hosted partition groups and
  known peers follow the metadata state (groups built by `raftlog.node.group_factory`).
- `raftlog.node.leases`: this node's lease and, while controller, each node's silence, on
  an injected monotonic clock (`raftlog.runtime.clock`). A node whose heartbeat was not
  renewed for `node_lease_ms`, or that the metadata shows fenced, hands its partition
  leaderships away and refuses produce with a retriable NotLeader.
- `raftlog.node.controller_duties`: the metadata leader fences expired nodes, makes
  observers learners of the metadata group, decommissions nodes and rebalances replicas.
- `raftlog.node.leadership`: leader reports, stepping down when fenced, handing
  leadership back to the preferred replica.
- `raftlog.node.reassignment_driver`: a partition leader steps its partition's move along.

An observer (a node not in `--peers`) starts its metadata group with no voters and registers
through `--bootstrap` (the voters' client addresses) while it knows no controller; a
decommissioned node's registration and heartbeats are refused, and one that is restarted
stops with that error instead of rejoining.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from raftlog.errors import (
    CorruptBatchError,
    NotControllerError,
    NotLeaderError,
    RaftlogError,
    UnknownTopicOrPartitionError,
)
from raftlog.metadata import (
    METADATA_RAFT_GROUP_ID,
    AllocateProducerIds,
    ApplyResult,
    Command,
    CreateTopicRequest,
    DecommissionNode,
    DeleteTopic,
    ErrorCode,
    MetadataState,
    NodeHeartbeat,
    RegisterNode,
    caught_up_since_start,
    encode_command,
    plan_create_partitions,
    plan_create_topic,
    plan_decommission,
)
from raftlog.metadata.commands import reject
from raftlog.metadata.consumer_group_service import ConsumerGroupService
from raftlog.metadata.machine import MetadataMachine
from raftlog.node.cleaner import LogCleaner
from raftlog.node.controller_duties import ControllerDuties, controller_term_of
from raftlog.node.group_factory import RaftGroupFactory
from raftlog.node.leadership import LeadershipMoves
from raftlog.node.leases import ControllerWatch, LoopLagMeter, NodeLease
from raftlog.node.liveness import NodeLiveness
from raftlog.node.reassignment_driver import ReassignmentDriver
from raftlog.node.reconcile import Reconciler
from raftlog.node.scrubber import Scrubber
from raftlog.partition.replica import FetchResult, OffsetSpec, PartitionReplica, ProduceResult
from raftlog.raft.membership import membership_at
from raftlog.raft.types import Message, Role, Snapshot, SnapshotMeta
from raftlog.rpc.faults import FaultInjector
from raftlog.rpc.forwarding import ControllerForwarder, Lane
from raftlog.rpc.peer_calls import PeerCalls
from raftlog.rpc.peer_transport import PeerTransport
from raftlog.rpc.security import security_peer_ssl
from raftlog.rpc.server import ApiServer, start_api_server
from raftlog.runtime import recorder as metrics
from raftlog.runtime.clock import MonotonicClock, RetentionClock, SystemMonotonicClock
from raftlog.runtime.group import Commitment, RaftGroup
from raftlog.runtime.host import RaftGroupHost
from raftlog.settings import NodeSettings
from raftlog.storage.chaos_file_system import ChaosFileSystem
from raftlog.storage.file_system import DATA_DIRECTORY_MODE, FileSystem, OsFileSystem
from raftlog.storage.wall_clock import SystemWallClock, WallClock
from raftlog.types import NodeId, Offset, RaftGroupId

__all__ = ["Node"]

# A stop cancels the node's tasks up to this many times, this long apart (_cancel_all).
_CANCEL_ROUNDS_MAX = 50
_CANCEL_ROUND_S = 0.1

log = logging.getLogger(__name__)


class Node:
    def __init__(self, settings: NodeSettings, *, clock: MonotonicClock | None = None) -> None:
        self.settings = settings.validate()
        self.node_id = settings.node_id
        self.config = settings.config
        self.incarnation = time.time_ns()
        self.metadata = MetadataMachine(settings.cluster_id)
        # Set once this node's copy of the metadata has caught up since this start; metadata
        # reads wait for it (raftlog.metadata.catch_up).
        self._metadata_caught_up = asyncio.Event()
        self.metadata.listeners.append(self._observe_metadata_catch_up)
        # Running tasks only: short ones (leader reports) remove themselves when done.
        self._tasks: set[asyncio.Task[None]] = set()
        self._producer_ids_next = 0
        self._producer_ids_end = 0
        self._rng = random.Random()
        # Only a node started with --chaos has a fault hook on its transport (chaos suite).
        self.faults = (
            FaultInjector(rng=random.Random(self._rng.getrandbits(64))) if settings.chaos else None
        )
        # Wall-clock time (heartbeat stamps, timestamps): movable under --chaos. Deleting by
        # age reads it through retention_clock, which holds back its forward steps.
        self.wall_clock: WallClock = (
            self.faults.clock if self.faults is not None else SystemWallClock()
        )
        # Durations (leases, silence, grace periods): never compared with another node's.
        self.clock: MonotonicClock = clock if clock is not None else SystemMonotonicClock()
        self.retention_clock = RetentionClock(
            self.wall_clock, self.clock, slack_ms=self.config.retention_clock_slack_ms
        )
        # Under --chaos the file port records what was fsynced, so the chaos suite can cut the
        # files back to it after a kill (raftlog.storage.chaos_file_system.ChaosFileSystem).
        self.files: FileSystem = (
            ChaosFileSystem(
                OsFileSystem(), str(settings.data_dir), skip_sync=settings.chaos_skip_fsync
            )
            if settings.chaos
            else OsFileSystem()
        )
        # An owner-only data directory (files inside are 0600): the logs hold client data.
        settings.data_dir.mkdir(mode=DATA_DIRECTORY_MODE, parents=True, exist_ok=True)
        settings.data_dir.chmod(DATA_DIRECTORY_MODE)
        # Mutual TLS between nodes with --peer-tls (raftlog.tls).
        peer_ssl_server, peer_ssl_client = security_peer_ssl(settings)
        self.transport = PeerTransport(
            node_id=self.node_id,
            cluster_id=settings.cluster_id,
            config=self.config.transport,
            on_messages=self._on_messages,
            faults=self.faults,
            ssl_server=peer_ssl_server,
            ssl_client=peer_ssl_client,
            incarnation=self.incarnation,
            on_peer_restart=self._on_peer_restart,
            # Node liveness stands in for the heartbeats of quiesced groups.
            on_peer_liveness=lambda peer, alive: self.host.set_peer_reachable(
                peer, reachable=alive
            ),
            on_call_frame=lambda sender, kind, body: self.peer_calls.on_frame(sender, kind, body),
            on_peer_disconnected=lambda peer: self.peer_calls.peer_disconnected(peer),
        )
        # Metadata commands for the controller travel on the transport too.
        self.peer_calls = PeerCalls(
            send=self.transport.send_call_frame,
            serve=self._serve_call,
            spawn=self._spawn,
            calls_in_flight_max=self.config.transport.calls_in_flight_max,
        )
        self.host = RaftGroupHost(
            node_id=self.node_id,
            tick_interval_ms=self.config.tick_interval_ms,
            send=self.transport.send,
            sync_on_loop_bytes_max=self.config.sync_on_loop_bytes_max,
            sync_on_loop_slow_ms=self.config.sync_on_loop_slow_ms,
            # The metadata quorum carries every node's lease: its work goes before bulk work.
            urgent_groups=frozenset({METADATA_RAFT_GROUP_ID}),
            campaigns_per_s_max=self.config.campaigns_per_s_max,
            clock=self.clock,
        )
        self.metadata_group: RaftGroup | None = None
        self._groups = RaftGroupFactory(
            node_id=self.node_id,
            config=self.config,
            files=self.files,
            wall_clock=self.wall_clock,
            rng=self._rng,
        )
        self._reconciler = Reconciler(
            node_id=self.node_id,
            data_dir=settings.data_dir,
            log_config=self.config.log,
            bootstrap_peers=settings.peers,
            metadata=self._metadata_state,
            factory=self._groups,
            host=self.host,
            update_peers=self.transport.update_peers,
            on_leadership_change=lambda group: self._leadership.on_leadership_change(group),
            caught_up=lambda: caught_up_since_start(
                self.metadata.state, self.node_id, self.incarnation
            ),
            creates_per_turn_max=self.config.replica_creates_per_turn_max,
            create_turn_ms_max=self.config.replica_create_turn_ms_max,
            clock=self.clock,
            call_soon=lambda callback: asyncio.get_running_loop().call_soon(callback),
        )
        self.replicas = self._reconciler.replicas
        self.host.on_storage_damage = self._reconciler.on_read_damage
        self.scrubber = Scrubber(
            bytes_per_s=self.config.scrub_bytes_per_s,
            chunk_bytes=self.config.scrub_chunk_bytes,
            targets=self._reconciler.scrub_targets,
            on_damage=self._reconciler.on_scrub_damage,
            round_pause_s=self.config.scrub_round_pause_ms / 1000,
        )
        self.cleaner = LogCleaner(
            bytes_per_s=self.config.cleaner_bytes_per_s,
            targets=self._reconciler.clean_targets,
            now_ms=self.retention_clock.now_ms,
            interval_s=self.config.cleaner_interval_ms / 1000,
        )
        self._leadership = LeadershipMoves(
            node_id=self.node_id,
            metadata=self._metadata_state,
            replicas=self._reconciler.replicas,
            replicas_by_raft_group=self._reconciler.replicas_by_raft_group,
            rng=self._rng,
            submit=self.submit,
            spawn=self._spawn,
            clock=self.clock,
            fenced_transfers_per_s_max=self.config.metadata.fenced_transfers_per_s_max,
            reports_in_flight_max=self.config.metadata.leader_reports_in_flight_max,
        )
        self._reassignments = ReassignmentDriver(
            node_id=self.node_id,
            metadata=self._metadata_state,
            replicas_by_raft_group=self._reconciler.replicas_by_raft_group,
            submit=self.submit,
            spawn=self._spawn,
        )
        self._loop_lag = LoopLagMeter(self.clock)
        self._lease = NodeLease(
            self.clock, lease_ms=self.config.metadata.node_lease_ms, loop_lag=self._loop_lag
        )
        self._watch = ControllerWatch(self.clock, loop_lag=self._loop_lag)
        self._liveness = NodeLiveness(
            node_id=self.node_id,
            config=self.config.metadata,
            lease=self._lease,
            loop_lag=self._loop_lag,
            registration=self._registration,
            heartbeat=lambda: NodeHeartbeat(
                node_id=self.node_id, incarnation=self.incarnation, now_ms=self.wall_clock.now_ms()
            ),
            submit=self._submit_liveness,
            on_decommissioned=self._on_decommissioned,
            each_pass=self._liveness_pass,
        )
        self._controller = ControllerDuties(
            node_id=self.node_id,
            config=self.config,
            clock=self.clock,
            watch=self._watch,
            metadata_group=self._metadata_group,
            metadata=self._metadata_state,
            submit=self.submit,
        )
        # Consumer groups, coordinated by the controller (raftlog.rpc.consumer_group_servicer).
        self.consumer_groups = ConsumerGroupService.create(
            self.config.metadata,
            controller_term=lambda: controller_term_of(self.metadata_group),
            controller_id=lambda: None if self.metadata_group is None else self.controller_id,
            metadata=self._metadata_state,
            submit=self.submit,
        )
        self.forward: ControllerForwarder | None = None
        self._decommissioned_logged = False
        self._server: ApiServer | None = None
        # Set when a task of the node fails: `raftlog serve` then exits non-zero.
        self.failed: asyncio.Future[None] | None = None
        self.bound_port = 0

    def _on_controller_change(self, group: RaftGroup) -> None:
        node = group.node
        log.info(
            "node %s: metadata quorum: now %s in term %s (controller %s); cause: %s",
            self.node_id, node.role.value, node.term, node.leader_id, node.role_cause,
        )  # fmt: skip

    def _metadata_state(self) -> MetadataState:
        return self.metadata.state

    def _metadata_group(self) -> RaftGroup:
        assert self.metadata_group is not None, "the metadata group starts with the node"
        return self.metadata_group

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, *, start_front_ends: Callable[[], Awaitable[None]] | None = None) -> None:
        """Open the node's state, answer clients, then run its Raft groups.

        The client listeners (gRPC, then `start_front_ends`: the Kafka listener) are bound
        before any group runs: a group that runs can win an election, and the metadata then
        names this node its leader, so clients must find it answering (or refusing with a
        retriable error while it catches up) from that moment, never a refused connection.
        """
        loop = asyncio.get_running_loop()
        self.failed = loop.create_future()
        loop.set_exception_handler(self._on_loop_exception)
        self.settings.data_dir.mkdir(parents=True, exist_ok=True)
        directory = self.settings.data_dir / "metadata"
        storage, hard_state_store = self._groups.open_storage(directory)
        self.metadata_group = self._groups.make_group(
            METADATA_RAFT_GROUP_ID,
            storage,
            hard_state_store,
            # An observer starts with no voters: it learns the membership (itself a learner)
            # from the controller's log or snapshot, and can never elect itself.
            frozenset(self.settings.peers) if self.node_id in self.settings.peers else frozenset(),
            self.metadata,
        )
        self.metadata.listeners.append(self._reconciler.reconcile)
        self.metadata_group.on_leadership_change = self._on_controller_change
        self._server = await start_api_server(self, self.consumer_groups, self.settings)
        self.forward = self._server.forward
        self.bound_port = self._server.bound_port
        if start_front_ends is not None:
            await start_front_ends()
        log.info("node %s: client listeners bound; starting its Raft groups", self.node_id)
        await self.transport.start(*self.settings.raft_listen)
        self.transport.update_peers(
            {node: addr for node, addr in self.settings.peers.items() if node != self.node_id}
        )
        self.host.add(self.metadata_group)
        # Partitions this node hosted before a restart (from a snapshot).
        self._reconciler.reconcile()
        self._spawn(self.host.run(), "group-host")
        self._spawn(self._liveness.run(), "liveness")
        self._spawn(self._liveness.measure_loop_lag(), "loop-lag")
        self._spawn(self._leadership_loop(), "leadership")
        self._spawn(self._retention_loop(), "retention")
        self._spawn(self.scrubber.run(), "scrubber")
        self._spawn(self.cleaner.run(), "cleaner")

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop()
        self.scrubber.stop()
        self.cleaner.stop()
        self.host.close()
        await _cancel_all(set(self._tasks))
        self.peer_calls.close()
        await self.transport.close()
        for group in list(self.host.groups()):
            group.fail_waiters(NotLeaderError(leader_hint=None))
        for replica in self.replicas.values():
            replica.checkpoint_on_close()  # a clean stop: the next start re-applies nothing
        self._groups.close_all()

    def _on_loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """An exception outside the node's tasks reaches the loop's handler: a transport
        callback steps Raft groups, and asyncio answers a callback that raised by closing
        its connection and logging. A failed assertion there also stops the node, which
        must never limp on past a broken invariant (STYLE)."""
        loop.default_exception_handler(context)
        error = context.get("exception")
        if isinstance(error, AssertionError) and self.failed is not None and not self.failed.done():
            log.error("node %s: an invariant failed in a callback; stopping the node", self.node_id)
            self.failed.set_exception(error)

    def _spawn(self, coroutine: Awaitable[None], name: str) -> None:
        async def guarded() -> None:
            try:
                await coroutine
            except asyncio.CancelledError:
                raise
            except Exception as error:
                # A failed assertion or bug stops the node: it must never limp on with a
                # dead Raft loop (STYLE: assertions are never swallowed).
                log.exception("node %s: task %s failed; stopping the node", self.node_id, name)
                if self.failed is not None and not self.failed.done():
                    self.failed.set_exception(error)
                raise

        task = asyncio.create_task(guarded(), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_messages(self, sender: NodeId, items: list[tuple[RaftGroupId, Message]]) -> None:
        self.host.deliver(sender, items)

    def _on_peer_restart(self, peer: NodeId) -> None:
        """A peer's HELLO shows a new process: it may have come back with an empty disk.
        Leaders here re-probe its log instead of trusting what it acknowledged before."""
        log.info("node %s: peer %s restarted; re-probing its logs", self.node_id, peer)
        for group in self.host.groups():
            group.node.forget_peer_log(peer)
        self.host.notify()

    # -- metadata reads ------------------------------------------------------------------------

    def _observe_metadata_catch_up(self) -> None:
        """Latch, after an apply or restore, once this node's copy shows its own registration
        of this start: it then holds everything committed before the node started."""
        if self._metadata_caught_up.is_set():
            return
        if caught_up_since_start(self.metadata.state, self.node_id, self.incarnation):
            log.info(
                "node %s: metadata caught up at offset %s; serving metadata reads",
                self.node_id,
                self.metadata.state.applied_offset,
            )
            self._metadata_caught_up.set()

    async def wait_metadata_caught_up(self) -> bool:
        """Wait up to `metadata.catch_up_wait_ms` until this node's copy of the metadata has
        caught up once since start (KRaft brokers serve only then); False if it has not, and
        the caller refuses the read, retriably, so the client asks another node."""
        if self._metadata_caught_up.is_set():
            return True
        wait_s = self.config.metadata.catch_up_wait_ms / 1000
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._metadata_caught_up.wait(), wait_s)
        return self._metadata_caught_up.is_set()

    # -- metadata commands ---------------------------------------------------------------------

    @property
    def controller_id(self) -> NodeId | None:
        assert self.metadata_group is not None
        return self.metadata_group.node.leader_id

    def is_controller(self) -> bool:
        assert self.metadata_group is not None
        return self.metadata_group.node.role is Role.LEADER

    async def submit(
        self, command: Command, *, timeout_s: float, lane: Lane = "other"
    ) -> ApplyResult:
        """Commit `command` to the metadata quorum, on the controller: a call over the peer
        transport (raftlog.rpc.peer_calls) when connected to it, else forwarded by gRPC on
        the connection of `lane` (raftlog.rpc.forwarding)."""
        group = self.metadata_group
        assert group is not None
        if not self.is_controller():
            controller = self.controller_id
            if controller is None:
                raise NotControllerError(leader_hint=None)
            if self.transport.is_connected(controller) and self.peer_calls.has_room():
                return await self.peer_calls.call(controller, command, timeout_s)
            if self.forward is None:
                raise NotControllerError(leader_hint=controller)
            address = self.client_address_of(controller)
            return await self.forward(address, command, timeout_s, lane=lane)
        if isinstance(command, DecommissionNode):
            # However it arrives (Admin or Internal.SubmitMetadata), a voter is refused.
            plan = plan_decommission(self.metadata.state, command.node_id, self._voters())
            if isinstance(plan, ApplyResult):
                return plan
        if isinstance(command, NodeHeartbeat | RegisterNode):
            # Lease times are the controller's clock, never the sender's (clock skew).
            command = dataclasses.replace(command, now_ms=self.wall_clock.now_ms())
            # The sender is alive now, however long the metadata group takes to commit.
            self._watch.heard(command.node_id)
        offset, future = group.propose(
            encode_command(command), offset_count=1, commitment=Commitment.QUORUM
        )
        await asyncio.wait_for(future, timeout_s)
        result = self.metadata.take_result(offset)
        assert result is not None, f"no apply result at offset {offset}"
        return result

    async def _serve_call(self, sender: NodeId, command: Command, timeout_s: float) -> ApplyResult:
        """A metadata call from node `sender` (raftlog.rpc.peer_calls)."""
        if isinstance(command, NodeHeartbeat | RegisterNode) and command.node_id != sender:
            return reject(
                ErrorCode.INVALID_REQUEST,
                f"node {sender} sent the liveness of node {command.node_id}",
            )
        if not self.is_controller():
            raise NotControllerError(leader_hint=self.controller_id)
        return await self.submit(command, timeout_s=timeout_s)

    def client_address_of(self, node_id: NodeId) -> str:
        info = self.metadata.state.node(node_id)
        if info is not None:
            return info.client_address
        if node_id == self.node_id:
            return self.settings.client_address
        return ""

    # -- liveness ------------------------------------------------------------------------------

    async def _liveness_pass(self) -> None:
        """What runs on every liveness interval besides the heartbeat (NodeLiveness)."""
        if self.is_controller():
            await self._controller.run()
        self._leadership.move_leaders_to_preferred()
        self._leadership.report_stale_leaders()
        self._maybe_snapshot_metadata()
        # Starts the group coordinator's hold-off at the election, not at the first
        # group request (consumers resume sooner after a controller change).
        self.consumer_groups.coordinating()

    def _registration(self) -> RegisterNode:
        return RegisterNode(
            node_id=self.node_id,
            client_address=self.settings.client_address,
            raft_address=self.settings.raft_address,
            incarnation=self.incarnation,
            now_ms=self.wall_clock.now_ms(),
            kafka_address=self.settings.kafka_address,
        )

    def _on_decommissioned(self, message: str, *, restarted: bool) -> None:
        """The controller refused this node's registration or heartbeat: it was
        decommissioned. A running node says so once (it hosts nothing and is out of the
        metadata quorum: stop it); a restarted one stops instead of rejoining."""
        if restarted:
            log.error("node %s: refused: %s; stopping", self.node_id, message)
            if self.failed is not None and not self.failed.done():
                self.failed.set_exception(RaftlogError(f"node {self.node_id}: {message}"))
        elif not self._decommissioned_logged:
            self._decommissioned_logged = True
            log.error(
                "node %s: decommissioned (%s); it serves nothing now: stop it",
                self.node_id,
                message,
            )

    async def _submit_liveness(self, command: Command, *, timeout_s: float) -> ApplyResult:
        """`submit`, or, on a node that knows no controller yet (an observer before it is a
        learner of the metadata quorum, or just restarted) or whose controller's recorded
        client address no longer answers (it restarted elsewhere and has not registered
        again), through its `--bootstrap` addresses: the one that is the controller
        accepts, the others answer NOT_CONTROLLER."""
        try:
            return await self.submit(command, timeout_s=timeout_s, lane="liveness")
        except NotControllerError:
            if not self.settings.bootstrap or self.forward is None:
                raise
        error: RaftlogError = NotControllerError(leader_hint=None)
        for address in self.settings.bootstrap:
            if address == self.settings.client_address:
                continue
            try:
                return await self.forward(address, command, timeout_s, lane="liveness")
            except NotControllerError as refused:
                error = refused
        raise error

    def is_fenced(self) -> bool:
        """The metadata shows this node fenced, or its own clock says its lease lapsed."""
        return self.fence_cause() is not None

    def fence_cause(self) -> str | None:
        """Why this node is fenced, in words; None while it is not."""
        info = self.metadata.state.node(self.node_id)
        if info is not None and info.fenced:
            return "the controller fenced it in the metadata"
        return self._lease.lapse_cause()

    async def _leadership_loop(self) -> None:
        """Partition-leader duties that cannot wait for the next heartbeat: a fenced node
        hands leadership away (rate-limited, stopping once unfenced); a leader steps its
        partition's move along."""
        # A few ticks: a move's steps each wait for a commit, which takes about that long.
        interval_s = 4 * self.config.tick_interval_ms / 1000
        logged_cause: str | None = None
        while True:
            await asyncio.sleep(interval_s)
            cause = self.fence_cause()
            if (cause is None) != (logged_cause is None):
                log.info(
                    "node %s: %s", self.node_id,
                    f"fenced: {cause}" if cause else "unfenced; leadership transfers stop",
                )  # fmt: skip
                logged_cause = cause
            if cause is not None:
                self._leadership.step_down_fenced(cause)
            else:
                self._reassignments.drive()

    # -- housekeeping --------------------------------------------------------------------------

    def _maybe_snapshot_metadata(self) -> None:
        """Keep the metadata log short: snapshot the state every `metadata_snapshot_offsets`.

        The snapshot is taken at the applied offset, which always ends an entry, and written
        before the log below it is dropped (raftlog.storage.raft_log_storage.compact).
        """
        group = self.metadata_group
        assert group is not None
        storage = self._groups.storages[METADATA_RAFT_GROUP_ID]
        applied = Offset(self.metadata.state.applied_offset)
        snapshot = storage.snapshot()
        last_snapshot = -1 if snapshot is None else snapshot.meta.offset
        if applied - last_snapshot < self.config.metadata_snapshot_offsets:
            return
        if applied > group.node.commit_offset or applied < storage.first_offset():
            return
        term = storage.term_at(applied)
        if term is None:
            return
        membership = membership_at(storage, applied, group.bootstrap_membership)
        data = self.metadata.state.snapshot()
        storage.compact(Snapshot(SnapshotMeta(applied, term, membership), data))
        log.info(
            "node %s: metadata snapshot at offset %s (%d bytes)", self.node_id, applied, len(data)
        )

    async def _retention_loop(self) -> None:
        interval_s = self.config.retention_check_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            self._reconciler.apply_retention(self.retention_clock.now_ms())

    # -- the client API (raftlog.rpc.port.NodePort) ------------------------------------------

    def describe_producer(
        self, topic: str, partition: int, producer_id: int
    ) -> tuple[int, int, int] | None:
        return self._replica(topic, partition).describe_producer(producer_id)

    def end_offset_for_epoch(self, topic: str, partition: int, epoch: int) -> tuple[int, int]:
        return self._replica(topic, partition).end_offset_for_epoch(epoch)

    def _replica(self, topic: str, partition: int) -> PartitionReplica:
        replica = self.replicas.get((topic, partition))
        if replica is None:
            raise UnknownTopicOrPartitionError(topic, partition)
        return replica

    async def produce(
        self,
        topic: str,
        partition: int,
        batches: list[bytes],
        *,
        commitment: Commitment,
        timeout_s: float,
    ) -> ProduceResult:
        replica = self._replica(topic, partition)
        if self.is_fenced():
            # A fenced node leads nothing; the client retries at the new leader.
            raise NotLeaderError(leader_hint=None)
        result = await replica.produce(batches, commitment=commitment, timeout_s=timeout_s)
        metrics.recorder().on_produce(sum(map(len, batches)))
        return result

    async def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        bytes_max: int,
        wait_ms_max: int,
        bytes_min: int,
        allow_follower: bool = False,
        skip_emptied: bool = False,
    ) -> FetchResult:
        replica = self._replica(topic, partition)
        try:
            result = await replica.fetch(
                offset,
                bytes_max=bytes_max,
                wait_ms_max=wait_ms_max,
                bytes_min=bytes_min,
                allow_follower=allow_follower,
                skip_emptied=skip_emptied,
            )
        except CorruptBatchError as error:
            # No damaged byte is served: the replica is reopened for a repair and the client
            # retries (retriable), against the leader the other replicas elect meanwhile.
            raft_group_id = replica.group.raft_group_id
            if self._reconciler.replicas_by_raft_group.get(raft_group_id) is replica:
                self._reconciler.reopen_for_repair(
                    raft_group_id, error.path, str(error), offset=None
                )
            raise NotLeaderError(leader_hint=None) from error
        metrics.recorder().on_fetch(len(result.batches))
        return result

    def list_offsets(self, topic: str, partition: int, spec: int, timestamp_ms: int) -> int:
        return self._replica(topic, partition).list_offset(OffsetSpec(spec), timestamp_ms)

    def leader_address(self, leader_id: int | None) -> str:
        return "" if leader_id is None else self.client_address_of(NodeId(leader_id))

    # -- the admin API --------------------------------------------------------------------------

    async def create_topic(self, request: CreateTopicRequest, *, timeout_s: float) -> ApplyResult:
        """Plan on the controller, commit, then wait (within the timeout) for leaders."""
        if not self.is_controller():
            raise NotControllerError(leader_hint=self.controller_id)
        plan = plan_create_topic(
            self.metadata.state, request, self.wall_clock.now_ms(), config=self.config.metadata
        )
        if isinstance(plan, ApplyResult):
            return plan
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        result = await self.submit(plan, timeout_s=timeout_s)
        if result.ok:
            await self._wait_for_leaders(request.name, deadline)
        return result

    async def create_partitions(self, name: str, total: int, *, timeout_s: float) -> ApplyResult:
        if not self.is_controller():
            raise NotControllerError(leader_hint=self.controller_id)
        plan = plan_create_partitions(
            self.metadata.state, name, total, self.wall_clock.now_ms(), config=self.config.metadata
        )
        if isinstance(plan, ApplyResult):
            return plan
        deadline = asyncio.get_running_loop().time() + timeout_s
        result = await self.submit(plan, timeout_s=timeout_s)
        if result.ok:
            await self._wait_for_leaders(name, deadline)
        return result

    async def delete_topic(self, name: str, *, timeout_s: float) -> ApplyResult:
        if not self.is_controller():
            raise NotControllerError(leader_hint=self.controller_id)
        return await self.submit(DeleteTopic(name=name), timeout_s=timeout_s)

    async def decommission_node(self, node_id: NodeId, *, timeout_s: float) -> ApplyResult:
        """Start decommissioning `node_id` (refused for a metadata voter); the controller's
        duties then carry it out."""
        if not self.is_controller():
            raise NotControllerError(leader_hint=self.controller_id)
        plan = plan_decommission(self.metadata.state, node_id, self._voters())
        if isinstance(plan, ApplyResult):
            return plan
        return await self.submit(plan, timeout_s=timeout_s)

    def _voters(self) -> frozenset[NodeId]:
        """The metadata quorum's voters: the bootstrap --peers and the group's membership."""
        assert self.metadata_group is not None
        return self.metadata_group.node.membership.voters | frozenset(self.settings.peers)

    def metadata_role(self, node_id: NodeId) -> str:
        """`node_id` in the metadata quorum as this node's copy of its membership shows it."""
        assert self.metadata_group is not None
        membership = self.metadata_group.node.membership
        if node_id in membership.voters:
            return "voter"
        return "learner" if node_id in membership.learners else "none"

    async def _wait_for_leaders(self, topic: str, deadline: float) -> None:
        """Best effort: return once every partition of `topic` reported a leader."""
        loop = asyncio.get_running_loop()
        while loop.time() < deadline:
            partitions = self.metadata.state.partitions(topic)
            if partitions and all(p.leader_id is not None for p in partitions):
                return
            await asyncio.sleep(0.05)

    async def allocate_producer_id(self, *, timeout_s: float) -> int:
        """One producer id, handed out from a block this node got from the quorum."""
        if self._producer_ids_next >= self._producer_ids_end:
            block = self.config.metadata.producer_id_block_size
            result = await self.submit(AllocateProducerIds(count=block), timeout_s=timeout_s)
            if not result.ok or result.producer_id_first is None:
                raise NotControllerError(leader_hint=self.controller_id)
            self._producer_ids_next = result.producer_id_first
            self._producer_ids_end = result.producer_id_first + block
        producer_id = self._producer_ids_next
        self._producer_ids_next += 1
        return producer_id

    def partition_high_watermark(self, topic: str, partition: int) -> int:
        replica = self.replicas.get((topic, partition))
        if replica is None or replica.group.node.role is not Role.LEADER:
            return -1
        return replica.high_watermark


async def _cancel_all(tasks: set[asyncio.Task[None]]) -> None:
    """Cancel `tasks` and wait until each has ended, cancelling again those still running.

    Once is not enough on Python 3.11: `asyncio.wait_for` returns its result instead of
    raising when the future it waits for completes in the same turn as the cancellation
    (CPython gh-86296), so a loop like the liveness loop can swallow one cancellation and
    run on, and a stop that awaited it once would wait forever (seen: a node stopped right
    after its start, while its registration committed, never exited)."""
    pending = tasks
    for _ in range(_CANCEL_ROUNDS_MAX):
        if not pending:
            break
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=_CANCEL_ROUND_S)
    for task in tasks - pending:
        if not task.cancelled():
            task.exception()  # retrieved: a failure was logged where it happened
    if not pending:
        return
    names = sorted(task.get_name() for task in pending)
    log.error(
        "tasks %s did not end after %s cancellations; stopping anyway", names, _CANCEL_ROUNDS_MAX
    )
