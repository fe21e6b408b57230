"""How a node's parts are built: one function per part, named after what it assembles.

`raftlog.node.node.Node.__init__` calls them in dependency order, so it reads as the node's
table of contents. Each takes the node built so far and reads only parts built before it;
callbacks to parts built later (the transport delivers to the host, which sends on the
transport) go through the node, so they resolve when called, not when wired.
"""

from __future__ import annotations

import asyncio
import random
from typing import TYPE_CHECKING

from raftlog.metadata import METADATA_RAFT_GROUP_ID, NodeHeartbeat, caught_up_since_start
from raftlog.metadata.consumer_group_service import ConsumerGroupService
from raftlog.node.cleaner import LogCleaner
from raftlog.node.controller_duties import ControllerDuties, controller_term_of
from raftlog.node.group_factory import RaftGroupFactory
from raftlog.node.leadership import LeadershipMoves
from raftlog.node.leases import ControllerWatch, LoopLagMeter, NodeLease
from raftlog.node.liveness import NodeLiveness
from raftlog.node.reassignment_driver import ReassignmentDriver
from raftlog.node.reconcile import Reconciler
from raftlog.node.scrubber import Scrubber
from raftlog.node.txn_markers import SUBMIT_TIMEOUT_S, TransactionMarkerDuty
from raftlog.rpc.codec import FrameKind
from raftlog.rpc.faults import FaultInjector
from raftlog.rpc.peer_calls import PeerCalls
from raftlog.rpc.peer_transport import PeerTransport
from raftlog.rpc.security import security_peer_ssl
from raftlog.rpc.txn_marker_calls import TxnMarkerCalls
from raftlog.runtime.host import RaftGroupHost
from raftlog.settings import NodeSettings
from raftlog.storage.chaos_file_system import ChaosFileSystem
from raftlog.storage.durable_mark import INLINE_MARK_SYNCER, process_mark_syncer
from raftlog.storage.file_system import DATA_DIRECTORY_MODE, FileSystem, OsFileSystem
from raftlog.storage.wall_clock import SystemWallClock, WallClock
from raftlog.types import NodeId

if TYPE_CHECKING:
    from raftlog.node.node import Node

__all__ = [
    "cleaner",
    "consumer_group_service",
    "controller_duties",
    "fault_injector",
    "file_system",
    "leadership_moves",
    "leases",
    "node_liveness",
    "peer_calls",
    "peer_transport",
    "raft_group_factory",
    "raft_group_host",
    "reassignment_driver",
    "reconciler",
    "scrubber",
    "transaction_marker_duty",
    "txn_marker_calls",
    "wall_clock",
]


def fault_injector(settings: NodeSettings, rng: random.Random) -> FaultInjector | None:
    """Only a node started with --chaos has a fault hook on its transport (chaos suite)."""
    return FaultInjector(rng=random.Random(rng.getrandbits(64))) if settings.chaos else None


def wall_clock(faults: FaultInjector | None) -> WallClock:
    """Wall-clock time (heartbeat stamps, timestamps): movable under --chaos."""
    return faults.clock if faults is not None else SystemWallClock()


def file_system(settings: NodeSettings) -> FileSystem:
    """The OS file system in an owner-only data directory (files inside are 0600: the logs
    hold client data). Under --chaos it records what was fsynced, so the chaos suite can cut
    the files back to it after a kill (raftlog.storage.chaos_file_system)."""
    settings.data_dir.mkdir(mode=DATA_DIRECTORY_MODE, parents=True, exist_ok=True)
    settings.data_dir.chmod(DATA_DIRECTORY_MODE)
    if not settings.chaos:
        return OsFileSystem()
    return ChaosFileSystem(
        OsFileSystem(), str(settings.data_dir), skip_sync=settings.chaos_skip_fsync
    )


def peer_transport(node: Node) -> PeerTransport:
    """One connection per peer node for every group's Raft messages and metadata calls;
    mutual TLS with --peer-tls (raftlog.tls)."""
    ssl_server, ssl_client = security_peer_ssl(node.settings)
    return PeerTransport(
        node_id=node.node_id,
        cluster_id=node.settings.cluster_id,
        config=node.config.transport,
        on_messages=lambda sender, items: node.host.deliver(sender, items),
        faults=node.faults,
        ssl_server=ssl_server,
        ssl_client=ssl_client,
        incarnation=node.incarnation,
        on_peer_restart=node.on_peer_restart,
        # Node liveness stands in for the heartbeats of quiesced groups.
        on_peer_liveness=lambda peer, alive: node.host.set_peer_reachable(peer, reachable=alive),
        on_call_frame=lambda sender, kind, body: on_call_frame(node, sender, kind, body),
        on_peer_disconnected=lambda peer: on_peer_disconnected(node, peer),
    )


def on_call_frame(node: Node, sender: NodeId, kind: FrameKind, body: memoryview) -> None:
    """CALL/REPLY frames are metadata calls, MARKERS/MARKERS_REPLY transaction markers."""
    if kind in (FrameKind.MARKERS, FrameKind.MARKERS_REPLY):
        node.txn_marker_calls.on_frame(sender, kind, body)
    else:
        node.peer_calls.on_frame(sender, kind, body)


def on_peer_disconnected(node: Node, peer: NodeId) -> None:
    node.peer_calls.peer_disconnected(peer)
    node.txn_marker_calls.peer_disconnected(peer)


def peer_calls(node: Node) -> PeerCalls:
    """Metadata commands for the controller travel on the transport too."""
    return PeerCalls(
        send=node.transport.send_call_frame,
        serve=lambda sender, command, timeout_s: node.metadata_calls.serve_call(
            sender, command, timeout_s
        ),
        spawn=node.spawn,
        calls_in_flight_max=node.config.transport.calls_in_flight_max,
    )


def txn_marker_calls(node: Node) -> TxnMarkerCalls:
    """Transaction markers for partition leaders travel on the transport too; a peer's are
    written here only for partitions this node leads."""
    return TxnMarkerCalls(
        send=node.transport.send_call_frame,
        serve=lambda markers, timeout_s: node.api.write_local_txn_markers(markers, timeout_s),
        spawn=node.spawn,
        calls_in_flight_max=node.config.transport.calls_in_flight_max,
    )


def raft_group_host(node: Node) -> RaftGroupHost:
    """The engine that ticks, persists, sends and applies every Raft group of the node."""
    config = node.config
    return RaftGroupHost(
        node_id=node.node_id,
        tick_interval_ms=config.tick_interval_ms,
        send=node.transport.send,
        sync_on_loop_bytes_max=config.sync_on_loop_bytes_max,
        sync_on_loop_slow_ms=config.sync_on_loop_slow_ms,
        # The metadata quorum carries every node's lease: its work goes before bulk work.
        urgent_groups=frozenset({METADATA_RAFT_GROUP_ID}),
        campaigns_per_s_max=config.campaigns_per_s_max,
        clock=node.clock,
        flush_sends=node.transport.flush_now,
        vote_requests_held_max=config.vote_requests_held_max,
        vote_request_hold_ms=config.raft.election_timeout_ticks * config.tick_interval_ms,
    )


def raft_group_factory(node: Node) -> RaftGroupFactory:
    """Opens a group's storage and builds its Raft node and group."""
    return RaftGroupFactory(
        node_id=node.node_id,
        config=node.config,
        files=node.files,
        wall_clock=node.wall_clock,
        rng=node.rng,
        mark_syncer=(
            process_mark_syncer()
            if node.config.durable_mark_sync == "deferred"
            else INLINE_MARK_SYNCER
        ),
    )


def reconciler(node: Node) -> Reconciler:
    """Makes the hosted partition groups and known peers follow the metadata state."""
    config = node.config
    reconciler = Reconciler(
        node_id=node.node_id,
        data_dir=node.settings.data_dir,
        log_config=config.log,
        bootstrap_peers=node.settings.peers,
        metadata=lambda: node.metadata.state,
        factory=node.raft_groups,
        host=node.host,
        update_peers=node.transport.update_peers,
        on_leadership_change=lambda group: node.leadership.on_leadership_change(group),
        caught_up=lambda: caught_up_since_start(
            node.metadata.state, node.node_id, node.incarnation
        ),
        creates_per_turn_max=config.replica_creates_per_turn_max,
        create_turn_ms_max=config.replica_create_turn_ms_max,
        clock=node.clock,
        call_soon=lambda callback: asyncio.get_running_loop().call_soon(callback),
        txn_verifier=node.txn_verification.verifier,
    )
    node.host.on_storage_damage = reconciler.on_read_damage
    return reconciler


def scrubber(node: Node) -> Scrubber:
    """Reads every closed segment again, paced, and starts a repair on damage."""
    config = node.config
    return Scrubber(
        bytes_per_s=config.scrub_bytes_per_s,
        chunk_bytes=config.scrub_chunk_bytes,
        targets=node.reconciler.scrub_targets,
        on_damage=node.reconciler.on_scrub_damage,
        round_pause_s=config.scrub_round_pause_ms / 1000,
    )


def cleaner(node: Node) -> LogCleaner:
    """Compacts the logs of compacted topics on its own paced thread."""
    return LogCleaner(
        bytes_per_s=node.config.cleaner_bytes_per_s,
        targets=node.reconciler.clean_targets,
        now_ms=node.retention_clock.now_ms,
        interval_s=node.config.cleaner_interval_ms / 1000,
    )


def leases(node: Node) -> tuple[LoopLagMeter, NodeLease, ControllerWatch]:
    """This node's lease and, while controller, every node's silence, in loop time."""
    loop_lag = LoopLagMeter(node.clock)
    lease = NodeLease(node.clock, lease_ms=node.config.metadata.node_lease_ms, loop_lag=loop_lag)
    return loop_lag, lease, ControllerWatch(node.clock, loop_lag=loop_lag)


def leadership_moves(node: Node) -> LeadershipMoves:
    """Leader reports, stepping down when fenced, leadership back to preferred replicas."""
    metadata = node.config.metadata
    return LeadershipMoves(
        node_id=node.node_id,
        metadata=lambda: node.metadata.state,
        replicas=node.reconciler.replicas,
        replicas_by_raft_group=node.reconciler.replicas_by_raft_group,
        rng=node.rng,
        submit=node.metadata_calls.submit,
        spawn=node.spawn,
        clock=node.clock,
        fenced_transfers_per_s_max=metadata.fenced_transfers_per_s_max,
        reports_in_flight_max=metadata.leader_reports_in_flight_max,
    )


def reassignment_driver(node: Node) -> ReassignmentDriver:
    """Steps a partition's replica move along, on its leader."""
    return ReassignmentDriver(
        node_id=node.node_id,
        metadata=lambda: node.metadata.state,
        replicas_by_raft_group=node.reconciler.replicas_by_raft_group,
        submit=node.metadata_calls.submit,
        spawn=node.spawn,
    )


def node_liveness(node: Node) -> NodeLiveness:
    """Registration, then a heartbeat every interval (pipelined), and the pass of duties."""
    return NodeLiveness(
        node_id=node.node_id,
        config=node.config.metadata,
        lease=node.lease,
        loop_lag=node.loop_lag,
        registration=node.duties.registration,
        heartbeat=lambda: NodeHeartbeat(
            node_id=node.node_id, incarnation=node.incarnation, now_ms=node.wall_clock.now_ms()
        ),
        submit=node.metadata_calls.submit_liveness,
        on_decommissioned=node.duties.on_decommissioned,
        each_pass=node.duties.liveness_pass,
    )


def controller_duties(node: Node) -> ControllerDuties:
    """Fencing, learners, decommissioning and rebalancing, while this node is controller."""
    return ControllerDuties(
        node_id=node.node_id,
        config=node.config,
        clock=node.clock,
        watch=node.watch,
        metadata_group=node.require_metadata_group,
        metadata=lambda: node.metadata.state,
        submit=node.metadata_calls.submit,
    )


def transaction_marker_duty(node: Node) -> TransactionMarkerDuty:
    """The transaction coordinator's markers and timeouts, while this node is controller."""
    return TransactionMarkerDuty(
        state=lambda: node.metadata.state,
        controller_term=lambda: controller_term_of(node.metadata_group),
        submit=lambda command: node.metadata_calls.submit(command, timeout_s=SUBMIT_TIMEOUT_S),
        write_markers=lambda markers, timeout_s: node.api.write_txn_markers(
            markers, timeout_s=timeout_s
        ),
        wall_clock_ms=node.wall_clock.now_ms,
        completions=node.api.txn_completions,
    )


def consumer_group_service(node: Node) -> ConsumerGroupService:
    """Consumer groups, coordinated by the controller (both front ends call it)."""
    return ConsumerGroupService.create(
        node.config.metadata,
        controller_term=lambda: controller_term_of(node.metadata_group),
        controller_id=lambda: (
            None if node.metadata_group is None else node.metadata_calls.controller_id
        ),
        metadata=lambda: node.metadata.state,
        submit=node.metadata_calls.submit,
    )
