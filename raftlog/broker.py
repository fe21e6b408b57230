"""A raftlog node ("broker"): every Raft group it hosts, its transports and its gRPC API.

Theory of operation. One asyncio loop runs everything:

- the `GroupHost` drives group 0 (the metadata quorum) and one group per partition replica
  assigned to this node, with group commit across groups;
- the `PeerTransport` carries the Raft traffic of all groups, one connection per peer node;
- a gRPC server answers clients (`Log`, `Admin`) and other nodes (`Internal`).

The metadata state drives the rest (`_reconcile`, run after every metadata apply): it creates
the partition groups assigned to this node (their initial voters are the assigned replicas,
written once next to the group's log; a node joining through a move starts with none and
learns the membership from the leader), removes and deletes those of deleted topics and the
copies a completed move took away, and tells the transport where peers live. A partition
leader drives a move of its partition one membership change at a time
(`raftlog.metadata.reassignment`) and reports its completion to the controller.

Leases (issue 5): the controller stamps heartbeats with its own clock and measures each
node's silence on its monotonic clock from the later of its last committed heartbeat and
its own taking office, so no two nodes' clocks are compared. A node whose heartbeat was not
renewed for `node_lease_ms` by its own monotonic clock, or that the metadata shows fenced,
hands its partition leaderships away and refuses produce with a retriable NotLeader.
Partition leaders report themselves to the controller, which records leader and epoch so any
node can route clients. The metadata leader is the controller: it registers nodes, fences
those whose lease expired and plans topic creation (`raftlog.metadata.controller`).

Observers (issue 5): a node whose id is not in `--peers` starts its metadata group with no
voters (it can never elect itself), registers through `--bootstrap` (the voters' client
addresses) while it knows no controller, and the controller adds every registered node that
is not a member to the metadata group as a learner, one membership change at a time. The
observer then replicates the metadata log (or snapshot), answers metadata requests from its
copy and hosts partition replicas; it never votes in the metadata quorum. The controller
also evens out replicas by itself (`metadata.auto_rebalance`): one move at a time, between
nodes it has heard from without interruption for `metadata.rebalance_grace_ms`.

Decommissioning (issue 8, `Admin.DecommissionNode`): only an observer can leave (metadata
voters are fixed at bootstrap). The controller marks it decommissioning, moves its replicas
off one move at a time (`controller.decommission_step`, through the ordinary reassignment),
removes it from the metadata group's learners and marks it decommissioned. Its registration
and heartbeats are refused from then on: a decommissioned node logs why, and one that is
restarted stops with that error instead of rejoining.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import random
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc

from raftlog.config import LogConfig
from raftlog.errors import (
    NotControllerError,
    NotLeaderError,
    RaftlogError,
    UnknownTopicOrPartitionError,
)
from raftlog.metadata import (
    METADATA_GROUP_ID,
    AllocateProducerIds,
    ApplyResult,
    Command,
    CompleteDecommission,
    CompleteReassignment,
    CreateTopicRequest,
    DecommissionNode,
    DeleteTopic,
    ErrorCode,
    NodeHeartbeat,
    RegisterNode,
    ReportLeader,
    auto_rebalance_step,
    caught_up_since_start,
    decommission_step,
    encode_command,
    fences_by_silence,
    plan_create_partitions,
    plan_create_topic,
    plan_decommission,
)
from raftlog.metadata.reassignment import Complete, ProposeMembership, TransferLeadership, next_step
from raftlog.partition.checkpoint import CheckpointStore
from raftlog.partition.policy import apply_retention, topic_log_config
from raftlog.partition.producer_state import PRODUCERS_MAX_DEFAULT
from raftlog.partition.replica import FetchResult, OffsetSpec, PartitionReplica, ProduceResult
from raftlog.raft.membership import membership_at
from raftlog.raft.node import RaftNode
from raftlog.raft.types import Membership, Message, Role, Snapshot, SnapshotMeta
from raftlog.rpc.faults import FaultInjector
from raftlog.rpc.group_servicer import GroupService, controller_term_of
from raftlog.rpc.peer_transport import PeerTransport
from raftlog.rpc.security import security_peer_ssl, security_server_setup  # issue 10
from raftlog.runtime.group import Commitment, RaftGroup, StateMachine
from raftlog.runtime.host import GroupHost
from raftlog.runtime.metadata_machine import MetadataMachine
from raftlog.runtime.settings import BrokerSettings, parse_address
from raftlog.storage.files import (
    DATA_DIRECTORY_MODE,  # issue 10
    ChaosFileSystem,
    Clock,
    FileSystem,
    OsFileSystem,
    SystemClock,
)
from raftlog.storage.hard_state import FileHardStateStore
from raftlog.storage.raft_log import RaftLogStorage
from raftlog.types import GroupId, NodeId, Offset, PartitionId

__all__ = ["Broker"]

log = logging.getLogger(__name__)


class Broker:
    def __init__(self, settings: BrokerSettings) -> None:
        self.settings = settings.validate()
        self.node_id = settings.node_id
        self.config = settings.config
        self.incarnation = time.time_ns()
        self.metadata = MetadataMachine(settings.cluster_id)
        # Set once this node's copy of the metadata has caught up since this start; metadata
        # reads wait for it (raftlog.metadata.catch_up).
        self._metadata_caught_up = asyncio.Event()
        self.metadata.listeners.append(self._observe_metadata_catch_up)
        self.replicas: dict[tuple[str, int], PartitionReplica] = {}
        self._replicas_by_group: dict[GroupId, PartitionReplica] = {}
        # Running tasks only: short ones (leader reports) remove themselves when done.
        self._tasks: set[asyncio.Task[None]] = set()
        self._storages: dict[GroupId, RaftLogStorage] = {}
        self._producer_ids_next = 0
        self._producer_ids_end = 0
        self._rng = random.Random()
        # Only a node started with --chaos has a fault hook on its transport (chaos suite).
        self.faults = (
            FaultInjector(rng=random.Random(self._rng.getrandbits(64))) if settings.chaos else None
        )
        # Wall-clock time (leases, heartbeats, timestamps, retention): movable under --chaos.
        self.wall_clock: Clock = self.faults.clock if self.faults is not None else SystemClock()
        # Under --chaos the file port records what was fsynced, so the chaos suite can cut the
        # files back to it after a kill (raftlog.storage.files.ChaosFileSystem).
        self.files: FileSystem = (
            ChaosFileSystem(
                OsFileSystem(), str(settings.data_dir), skip_sync=settings.chaos_skip_fsync
            )
            if settings.chaos
            else OsFileSystem()
        )
        # --- security (issue 10): an owner-only data directory (files inside are 0600)
        settings.data_dir.mkdir(mode=DATA_DIRECTORY_MODE, parents=True, exist_ok=True)
        settings.data_dir.chmod(DATA_DIRECTORY_MODE)
        # mutual TLS between nodes with --peer-tls (raftlog.tls)
        peer_ssl = security_peer_ssl(settings)
        # --- end security
        self.transport = PeerTransport(
            node_id=self.node_id,
            cluster_id=settings.cluster_id,
            config=self.config.transport,
            on_messages=self._on_messages,
            faults=self.faults,
            ssl_server=peer_ssl[0],  # issue 10
            ssl_client=peer_ssl[1],  # issue 10
            incarnation=self.incarnation,
            on_peer_restart=self._on_peer_restart,
            # Node liveness stands in for the heartbeats of quiesced groups (issue 4).
            on_peer_liveness=lambda peer, alive: self.host.set_peer_reachable(
                peer, reachable=alive
            ),
        )
        self.host = GroupHost(
            node_id=self.node_id,
            tick_interval_ms=self.config.tick_interval_ms,
            send=self.transport.send,
            sync_on_loop_bytes_max=self.config.sync_on_loop_bytes_max,
            sync_on_loop_slow_ms=self.config.sync_on_loop_slow_ms,
        )
        self.metadata_group: RaftGroup | None = None
        # Consumer groups, coordinated by the controller (raftlog.rpc.group_servicer).
        self.groups = GroupService.create(
            self.config.metadata,
            controller_term=lambda: controller_term_of(self.metadata_group),
            controller_id=lambda: None if self.metadata_group is None else self.controller_id,
            metadata=lambda: self.metadata.state,
            submit=self.submit,
        )
        self.forward: Callable[[str, Command, float], Awaitable[ApplyResult]] | None = None
        # Leases, on this node's monotonic clock (never compared with another node's):
        # when the last heartbeat that renewed our lease was sent (start: one full lease),
        self._lease_renewed_at = time.monotonic()
        # and, while controller, since when (and in which term) and each node's last
        # heartbeat it committed.
        self._controller_since: tuple[int, float] | None = None
        self._heard_at: dict[NodeId, float] = {}
        # While controller: since when each node has been alive without interruption, and in
        # which incarnation (a restart starts its grace period again).
        self._alive_since: dict[NodeId, tuple[int, float]] = {}
        self._completing: set[GroupId] = set()  # CompleteReassignment reports in flight
        self._decommissioned_logged = False
        self._grpc: grpc.aio.Server | None = None
        # Set when a task of the node fails: `raftlog serve` then exits non-zero.
        self.failed: asyncio.Future[None] | None = None
        self.bound_port = 0

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        self.failed = asyncio.get_running_loop().create_future()
        self.settings.data_dir.mkdir(parents=True, exist_ok=True)
        storage, hard_state_store = self._open_storage(self.settings.data_dir / "metadata")
        self.metadata_group = self._make_group(
            METADATA_GROUP_ID,
            storage,
            hard_state_store,
            # An observer starts with no voters: it learns the membership (itself a learner)
            # from the controller's log or snapshot, and can never elect itself.
            frozenset(self.settings.peers) if self.node_id in self.settings.peers else frozenset(),
            self.metadata,
        )
        self.metadata.listeners.append(self._reconcile)
        await self.transport.start(*self.settings.raft_listen)
        self.transport.update_peers(
            {node: addr for node, addr in self.settings.peers.items() if node != self.node_id}
        )
        self.host.add(self.metadata_group)
        self._reconcile()  # partitions this node hosted before a restart (from a snapshot)
        self._spawn(self.host.run(), "group-host")
        self.forward = self._forward
        await self._start_grpc()
        self._spawn(self._liveness_loop(), "liveness")
        self._spawn(self._leadership_loop(), "leadership")
        self._spawn(self._retention_loop(), "retention")

    async def _start_grpc(self) -> None:
        from grpc_health.v1 import health, health_pb2, health_pb2_grpc
        from grpc_reflection.v1alpha import reflection

        from raftlog.rpc.admin_servicer import AdminServicer, InternalServicer
        from raftlog.rpc.group_servicer import GroupServicer
        from raftlog.rpc.servicers import LogServicer
        from raftlog.rpc.v1 import raftlog_pb2, raftlog_pb2_grpc

        message_bytes_max = 2 * self.config.log.read_bytes_max
        # --- security (issue 10): auth, permissions and limits (raftlog.rpc.security)
        security = security_server_setup(self.settings)
        self.forward = security.forward
        # --- end security
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", message_bytes_max),
                ("grpc.max_send_message_length", message_bytes_max),
                *security.options,  # issue 10
            ],
            interceptors=[security.interceptor],  # issue 10
        )
        raftlog_pb2_grpc.add_LogServicer_to_server(LogServicer(self), server)  # type: ignore[no-untyped-call]
        raftlog_pb2_grpc.add_AdminServicer_to_server(AdminServicer(self), server)  # type: ignore[no-untyped-call]
        raftlog_pb2_grpc.add_InternalServicer_to_server(InternalServicer(self), server)  # type: ignore[no-untyped-call]
        groups = GroupServicer(self.groups, self.leader_address)
        raftlog_pb2_grpc.add_GroupsServicer_to_server(groups, server)  # type: ignore[no-untyped-call]
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        services = [
            raftlog_pb2.DESCRIPTOR.services_by_name[name].full_name
            for name in ("Log", "Admin", "Internal", "Groups")
        ]
        reflection.enable_server_reflection(
            [*services, health.SERVICE_NAME, reflection.SERVICE_NAME], server
        )
        host, port = self.settings.listen
        # --- security (issue 10): TLS on the client API with --tls-cert/--tls-key
        if security.credentials is not None:
            self.bound_port = server.add_secure_port(f"{host}:{port}", security.credentials)
        else:
            self.bound_port = server.add_insecure_port(f"{host}:{port}")
        # --- end security
        await server.start()
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        self._grpc = server

    async def _forward(self, address: str, command: Command, timeout_s: float) -> ApplyResult:
        from raftlog.rpc.admin_servicer import forward_to_controller

        if not address:
            raise NotControllerError(leader_hint=self.controller_id)
        return await forward_to_controller(address, encode_command(command), timeout_s)

    async def stop(self) -> None:
        if self._grpc is not None:
            await self._grpc.stop(grace=0.5)
        self.host.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.transport.close()
        for group in list(self.host.groups()):
            group.fail_waiters(NotLeaderError(leader_hint=None))
        for replica in self.replicas.values():
            replica.checkpoint_on_close()  # a clean stop: the next start re-applies nothing
        for storage in self._storages.values():
            storage.close()
        self._storages.clear()

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

    def _on_messages(self, sender: NodeId, items: list[tuple[GroupId, Message]]) -> None:
        self.host.deliver(sender, items)

    # -- groups ------------------------------------------------------------------------------

    def _open_storage(
        self, directory: Path, log_config: LogConfig | None = None
    ) -> tuple[RaftLogStorage, FileHardStateStore]:
        directory.mkdir(parents=True, exist_ok=True)
        storage = RaftLogStorage.open(
            directory / "log",
            config=log_config or self.config.log,
            files=self.files,
            clock=self.wall_clock,
        )
        return storage, FileHardStateStore(directory, files=self.files)

    def _make_group(
        self,
        group_id: GroupId,
        storage: RaftLogStorage,
        hard_state_store: FileHardStateStore,
        voters: frozenset[NodeId],
        machine: StateMachine,
    ) -> RaftGroup:
        # A partition restart resumes applying after the replica's checkpoint, not offset 0.
        applied_offset = (
            machine.recover(storage) if isinstance(machine, PartitionReplica) else Offset(-1)
        )
        config = self.config.raft
        if not isinstance(machine, PartitionReplica):
            # Metadata followers learn each commit at once: every node acts on what it applies
            # (creates the groups it hosts, learns leaders), and metadata writes are few.
            config = dataclasses.replace(config, commit_notice="immediate")
        node = RaftNode(
            node_id=self.node_id,
            config=config,
            storage=storage,
            hard_state=hard_state_store.load(),
            rng=random.Random(self._rng.getrandbits(64)),
            bootstrap_membership=Membership(voters=voters),
            applied_offset=applied_offset,
        )
        if node.membership.voters == frozenset({self.node_id}):
            # A sole voter wins at once: a restarted single-replica group serves without
            # waiting out an election timeout first (etcd campaigns the same way).
            node.campaign()
        bootstrap = Membership(voters=voters)
        self._storages[group_id] = storage
        snapshot = storage.snapshot()
        if snapshot is not None and snapshot.meta.offset > applied_offset:
            # The core resumes applying after the snapshot; the machine starts from it.
            machine.restore(snapshot)
        return RaftGroup(
            group_id=group_id,
            node=node,
            log=storage,
            hard_state_store=hard_state_store,
            state_machine=machine,
            config=config,
            bootstrap_membership=bootstrap,
        )

    def _partition_dir(self, topic: str, partition: int) -> Path:
        return self.settings.data_dir / "partitions" / f"{topic}-{partition}"

    def _reconcile(self) -> None:
        """Make the hosted partition groups and known peers match the metadata state."""
        state = self.metadata.state
        wanted = state.group_ids_for_node(self.node_id)
        for group_id in sorted(wanted - self._replicas_by_group.keys()):
            info = state.partition_by_group(group_id)
            assert info is not None
            # A node joining through a move starts with no voters at all: it must not vote
            # or campaign before the leader's log (or snapshot) tells it the membership.
            joining = self.node_id in info.adding
            voters: frozenset[NodeId] = frozenset() if joining else frozenset(info.replicas)
            self._create_replica(info.topic, int(info.partition), group_id, voters)
        for group_id in sorted(self._replicas_by_group.keys() - wanted):
            self._remove_replica(group_id)
        peers = {}
        for node in state.nodes():
            if node.node_id != self.node_id:
                peers[node.node_id] = parse_address(node.raft_address, setting="raft_address")
        for node_id, address in self.settings.peers.items():
            if node_id != self.node_id:
                peers.setdefault(node_id, address)
        self.transport.update_peers(peers)

    def _on_peer_restart(self, peer: NodeId) -> None:
        """A peer's HELLO shows a new process: it may have come back with an empty disk.
        Leaders here re-probe its log instead of trusting what it acknowledged before."""
        log.info("node %s: peer %s restarted; re-probing its logs", self.node_id, peer)
        for group in self.host.groups():
            group.node.forget_peer_log(peer)
        self.host.notify()

    def _create_replica(
        self, topic: str, partition: int, group_id: GroupId, voters: frozenset[NodeId]
    ) -> None:
        topic_info = self.metadata.state.topic(topic)
        log_config = topic_log_config(self.config.log, topic_info.config if topic_info else {})
        directory = self._partition_dir(topic, partition)
        storage, hard_state_store = self._open_storage(directory, log_config)
        # The group's bootstrap voters are fixed when its directory is made: after a move the
        # metadata's replicas differ from the voters the group started with.
        voters = _bootstrap_voters(directory, voters)
        checkpoint = CheckpointStore(
            storage.files, storage.directory, producers_max=PRODUCERS_MAX_DEFAULT
        )
        replica = PartitionReplica(
            topic=topic, partition=partition, log=storage, config=log_config, checkpoint=checkpoint
        )
        group = self._make_group(group_id, storage, hard_state_store, voters, replica)
        replica.attach(group)
        group.on_leadership_change = self._on_partition_leadership
        self.replicas[(topic, partition)] = replica
        self._replicas_by_group[group_id] = replica
        self.host.add(group)
        log.info("node %s: hosting %s-%s (group %s)", self.node_id, topic, partition, group_id)

    def _remove_replica(self, group_id: GroupId) -> None:
        replica = self._replicas_by_group.pop(group_id)
        self.replicas.pop((replica.topic, replica.partition), None)
        group = self.host.remove(group_id)
        if group is not None:
            group.fail_waiters(UnknownTopicOrPartitionError(replica.topic, replica.partition))
        storage = self._storages.pop(group_id, None)
        if storage is not None:
            storage.close()
        shutil.rmtree(self._partition_dir(replica.topic, replica.partition), ignore_errors=True)

    def _on_partition_leadership(self, group: RaftGroup, *, quiet: bool = False) -> None:
        replica = self._replicas_by_group.get(group.group_id)
        if replica is None:
            return
        node = group.node
        log.log(
            logging.DEBUG if quiet else logging.INFO,
            "node %s: %s-%s is now %s in term %s (leader %s)",
            self.node_id,
            replica.topic,
            replica.partition,
            node.role.value,
            node.term,
            node.leader_id,
        )
        if node.role is not Role.LEADER:
            return
        command = ReportLeader(
            topic=replica.topic,
            partition=PartitionId(replica.partition),
            group_id=group.group_id,
            leader_id=self.node_id,
            epoch=int(group.node.term),
        )
        self._spawn(self._submit_quietly(command), f"report-leader-{group.group_id}")

    async def _submit_quietly(self, command: Command) -> None:
        with contextlib.suppress(RaftlogError, TimeoutError, OSError):
            await self.submit(command, timeout_s=5.0)

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

    async def submit(self, command: Command, *, timeout_s: float) -> ApplyResult:
        """Commit `command` to the metadata quorum (forwarding to the controller if needed)."""
        group = self.metadata_group
        assert group is not None
        if not self.is_controller():
            controller = self.controller_id
            if controller is None or self.forward is None:
                raise NotControllerError(leader_hint=controller)
            return await self.forward(self.client_address_of(controller), command, timeout_s)
        if isinstance(command, DecommissionNode):
            # However it arrives (Admin or Internal.SubmitMetadata), a voter is refused.
            plan = plan_decommission(self.metadata.state, command.node_id, self._voters())
            if isinstance(plan, ApplyResult):
                return plan
        if isinstance(command, NodeHeartbeat | RegisterNode):
            # Lease times are the controller's clock, never the sender's (clock skew).
            command = dataclasses.replace(command, now_ms=self.wall_clock.now_ms())
        offset, future = group.propose(
            encode_command(command), offset_count=1, commitment=Commitment.QUORUM
        )
        await asyncio.wait_for(future, timeout_s)
        result = self.metadata.take_result(offset)
        assert result is not None, f"no apply result at offset {offset}"
        if result.ok and isinstance(command, NodeHeartbeat | RegisterNode):
            self._heard_at[command.node_id] = time.monotonic()
        return result

    def client_address_of(self, node_id: NodeId) -> str:
        info = self.metadata.state.node(node_id)
        if info is not None:
            return info.client_address
        if node_id == self.node_id:
            return self.settings.client_address
        return ""

    async def _liveness_loop(self) -> None:
        """Register this node, then heartbeat; the controller also fences expired nodes."""
        interval_s = self.config.metadata.node_heartbeat_interval_ms / 1000
        registered = False
        while True:
            now_ms = self.wall_clock.now_ms()
            command: Command
            if not registered:
                command = RegisterNode(
                    node_id=self.node_id,
                    client_address=self.settings.client_address,
                    raft_address=self.settings.raft_address,
                    incarnation=self.incarnation,
                    now_ms=now_ms,
                    kafka_address=self.settings.kafka_address,
                )
            else:
                command = NodeHeartbeat(
                    node_id=self.node_id, incarnation=self.incarnation, now_ms=now_ms
                )
            sent_at = time.monotonic()
            try:
                result = await self._submit_liveness(command, timeout_s=interval_s * 2)
                if result.code is ErrorCode.NODE_DECOMMISSIONED:
                    self._on_decommissioned(result.message, restarted=not registered)
                registered = registered or result.ok
                if result.ok:
                    self._lease_renewed_at = sent_at
            except (RaftlogError, TimeoutError, OSError) as error:
                log.debug("node %s: liveness submit failed: %s", self.node_id, error)
            if self.is_controller():
                await self._controller_duties()
            self._move_leaders_to_preferred()
            self._report_stale_leaders()
            self._maybe_snapshot_metadata()
            # Starts the group coordinator's hold-off at the election, not at the first
            # group request (consumers resume sooner after a controller change).
            self.groups.coordinating()
            await asyncio.sleep(interval_s if registered else 0.2)

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
        """`submit`, or, on an observer that knows no controller yet (before it is a learner
        of the metadata quorum, or just restarted), through its `--bootstrap` addresses: the
        one that is the controller accepts, the others answer NOT_CONTROLLER."""
        try:
            return await self.submit(command, timeout_s=timeout_s)
        except NotControllerError:
            if not self.settings.bootstrap or self.forward is None:
                raise
        error: RaftlogError = NotControllerError(leader_hint=None)
        for address in self.settings.bootstrap:
            if address == self.settings.client_address:
                continue
            try:
                return await self.forward(address, command, timeout_s)
            except NotControllerError as refused:
                error = refused
        raise error

    def _report_stale_leaders(self) -> None:
        """Re-report leadership the metadata does not show yet.

        A report made right after an election can be lost (the controller it was forwarded
        to had just died); clients route by the metadata, so a lost report would send them
        to a former leader until the next election. Each pass repairs that.
        """
        state = self.metadata.state
        for replica in self.replicas.values():
            node = replica.group.node
            info = state.partition(replica.topic, replica.partition)
            if info is None or node.role is not Role.LEADER:
                continue
            if info.leader_id == self.node_id and info.leader_epoch >= node.term:
                continue
            self._on_partition_leadership(replica.group, quiet=True)

    def _move_leaders_to_preferred(self) -> None:
        """Hand partition leadership back to the preferred replica when it is in sync.

        After a failure, leadership piles up on the survivors; each leader gives it back on
        its own (no controller round trip), as Kafka moves it back to a preferred replica
        that is in the ISR: only to a follower the leader reaches, replicates to and that
        holds every committed entry (`RaftNode.is_in_sync`). The core's transfer (Raft
        §3.10) refuses proposals until the target has caught up, or aborts after an election
        timeout; started toward a killed node that the metadata still showed alive (until
        its lease ran out), it refused every produce for ~0.5 s of each heartbeat pass
        (the failover suite's timelines, 2026-11-25). A lagging target is tried again at a
        later pass, once it has caught up.
        """
        state = self.metadata.state
        for replica in self.replicas.values():
            node = replica.group.node
            info = state.partition(replica.topic, replica.partition)
            if info is None or node.role is not Role.LEADER:
                continue
            # During a move the target's first replica is the one leadership goes back to.
            preferred = info.preferred_leader if info.target is None else info.target[0]
            target = state.node(preferred)
            if preferred == self.node_id or target is None or not target.alive:
                continue
            if preferred not in node.membership.voters or not replica.is_leader_ready():
                continue
            if not node.is_in_sync(preferred):
                continue
            with contextlib.suppress(RaftlogError):
                node.transfer_leadership(preferred)
                replica.group.wake()

    def _maybe_snapshot_metadata(self) -> None:
        """Keep the metadata log short: snapshot the state every `metadata_snapshot_offsets`.

        The snapshot is taken at the applied offset, which always ends an entry, and written
        before the log below it is dropped (raftlog.storage.raft_log.compact).
        """
        group = self.metadata_group
        assert group is not None
        storage = self._storages[METADATA_GROUP_ID]
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
            now_ms = self.wall_clock.now_ms()
            for group_id, replica in list(self._replicas_by_group.items()):
                storage = self._storages.get(group_id)
                if storage is not None:
                    bootstrap = replica.group.bootstrap_membership
                    apply_retention(replica, storage, bootstrap, now_ms)

    async def _controller_duties(self) -> None:
        group = self.metadata_group
        assert group is not None
        now = time.monotonic()
        term = int(group.node.term)
        if self._controller_since is None or self._controller_since[0] != term:
            # A new controller grants every node a full lease before fencing anyone (KRaft).
            self._controller_since = (term, now)
            self._heard_at.clear()
            self._alive_since.clear()
        since = self._controller_since[1]
        silent_ms = {
            n.node_id: int((now - max(self._heard_at.get(n.node_id, since), since)) * 1000)
            for n in self.metadata.state.nodes()
        }
        lease_ms = self.config.metadata.node_lease_ms
        for command in fences_by_silence(self.metadata.state, silent_ms, lease_ms):
            log.warning("node %s: fencing node %s (lease expired)", self.node_id, command.node_id)
            with contextlib.suppress(RaftlogError, TimeoutError):
                await self.submit(command, timeout_s=2.0)
        self._add_metadata_learners()
        await self._decommission_step(silent_ms)
        if self.config.metadata.auto_rebalance:
            await self._auto_rebalance(now, silent_ms)

    def _add_metadata_learners(self) -> None:
        """Make every registered, alive node that is not a member of the metadata group a
        learner of it (observers): one membership change at a time, once the previous one
        committed, as the core requires."""
        group = self.metadata_group
        assert group is not None
        node = group.node
        membership = node.membership
        if node.configs.last_offset > node.commit_offset:
            return
        for info in self.metadata.state.nodes():
            # A node being decommissioned is never (re)added: it is on its way out.
            if info.placeable and info.node_id not in membership.members:
                learners = membership.learners | {info.node_id}
                with contextlib.suppress(RaftlogError):
                    node.propose_membership(Membership(membership.voters, learners))
                    log.info("node %s: node %s joins the metadata quorum as a learner",
                             self.node_id, info.node_id)  # fmt: skip
                    group.wake()
                return

    async def _decommission_step(self, silent_ms: dict[NodeId, int]) -> None:
        """The next step of decommissioning nodes (controller.decommission_step): one replica
        move at a time to a node heard from recently; once a node hosts nothing, remove it
        from the metadata group's learners (one membership change, once the previous one
        committed), then mark it decommissioned."""
        recent_ms = 2 * self.config.metadata.node_heartbeat_interval_ms
        live = {n for n, silence in silent_ms.items() if silence < recent_ms}
        step = decommission_step(self.metadata.state, live)
        if step is None:
            return
        if isinstance(step, CompleteDecommission):
            group = self.metadata_group
            assert group is not None
            node = group.node
            membership = node.membership
            if step.node_id in membership.members:
                if step.node_id in membership.voters:
                    return  # never: voters are refused at the request (plan_decommission)
                if node.configs.last_offset > node.commit_offset:
                    return  # the previous membership change is not committed yet
                with contextlib.suppress(RaftlogError):
                    node.propose_membership(
                        Membership(membership.voters, membership.learners - {step.node_id})
                    )
                    log.info("node %s: node %s leaves the metadata quorum (decommissioned)",
                             self.node_id, step.node_id)  # fmt: skip
                    group.wake()
                return
            if node.configs.last_offset > node.commit_offset:
                return
            log.info("node %s: node %s is decommissioned", self.node_id, step.node_id)
        else:
            log.info("node %s: decommissioning: %s-%s -> %s", self.node_id, step.topic,
                     step.partition, list(step.replicas))  # fmt: skip
        with contextlib.suppress(RaftlogError, TimeoutError):
            await self.submit(step, timeout_s=2.0)

    async def _auto_rebalance(self, now: float, silent_ms: dict[NodeId, int]) -> None:
        """Start the next automatic replica move, if one is due (controller.auto_rebalance_step).

        A node counts as alive since the controller first saw it unfenced in its current
        incarnation: being fenced or restarting starts its grace period again. A node not
        heard from within two heartbeat intervals (it may have just died) takes part in no
        move until it is heard again; that alone does not restart its grace period, so a
        heartbeat delayed on a loaded machine costs nothing but a later move."""
        recent_ms = 2 * self.config.metadata.node_heartbeat_interval_ms
        alive_for_ms: dict[NodeId, int] = {}
        for info in self.metadata.state.nodes():
            if not info.alive:
                self._alive_since.pop(info.node_id, None)
                continue
            seen = self._alive_since.get(info.node_id)
            if seen is None or seen[0] != info.incarnation:
                seen = self._alive_since[info.node_id] = (info.incarnation, now)
            if silent_ms.get(info.node_id, recent_ms) < recent_ms:
                alive_for_ms[info.node_id] = int((now - seen[1]) * 1000)
        grace_ms = self.config.metadata.rebalance_grace_ms
        command = auto_rebalance_step(self.metadata.state, alive_for_ms, grace_ms)
        if command is None:
            return
        log.info("node %s: rebalancing: %s-%s -> %s", self.node_id, command.topic,
                 command.partition, list(command.replicas))  # fmt: skip
        with contextlib.suppress(RaftlogError, TimeoutError):
            await self.submit(command, timeout_s=2.0)

    def is_fenced(self) -> bool:
        """The metadata shows this node fenced, or its own clock says its lease lapsed."""
        info = self.metadata.state.node(self.node_id)
        if info is not None and info.fenced:
            return True
        lease_s = self.config.metadata.node_lease_ms / 1000
        return time.monotonic() - self._lease_renewed_at >= lease_s

    async def _leadership_loop(self) -> None:
        """Partition-leader duties that cannot wait for the next heartbeat: a fenced node
        hands leadership away; a leader steps its partition's move along."""
        # A few ticks: a move's steps each wait for a commit, which takes about that long.
        interval_s = 4 * self.config.tick_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            if self.is_fenced():
                self._step_down_fenced()
            else:
                self._drive_reassignments()

    def _step_down_fenced(self) -> None:
        """Transfer each partition this fenced node leads to a voter the metadata shows
        alive, one in sync if there is one (Raft §3.10; the core aborts a transfer that does
        not finish in time)."""
        state = self.metadata.state
        for replica in self.replicas.values():
            node = replica.group.node
            if node.role is not Role.LEADER or node.lead_transferee is not None:
                continue
            candidates = [
                n
                for n in sorted(node.membership.voters - {self.node_id})
                if (info := state.node(n)) is not None and info.alive
            ]
            if not candidates:
                continue
            # An in-sync voter takes over in a round trip; another only after catching up.
            in_sync = [n for n in candidates if node.is_in_sync(n)]
            to = self._rng.choice(in_sync or candidates)
            log.info(
                "node %s: fenced; handing %s-%s to node %s",
                self.node_id,
                replica.topic,
                replica.partition,
                to,
            )
            with contextlib.suppress(RaftlogError):
                node.transfer_leadership(to)
                replica.group.wake()

    def _drive_reassignments(self) -> None:
        """One membership step of each move whose partition this node leads."""
        for info in self.metadata.state.moving_partitions():
            replica = self._replicas_by_group.get(info.group_id)
            if replica is None or not replica.is_leader_ready():
                continue
            node = replica.group.node
            assert info.target is not None
            commit = node.commit_offset
            step = next_step(
                leader=self.node_id,
                membership=node.membership,
                membership_committed=node.configs.last_offset <= commit,
                target=info.target,
                caught_up=frozenset(n for n, p in node.progress.items() if p.match >= commit),
            )
            where = f"{info.topic}-{info.partition}"
            try:
                if isinstance(step, ProposeMembership):
                    node.propose_membership(step.membership)
                    log.info("node %s: %s membership -> %s", self.node_id, where, step.membership)
                elif isinstance(step, TransferLeadership):
                    if node.lead_transferee is None:
                        node.transfer_leadership(step.to)
                        log.info("node %s: %s leaves: leader -> %s", self.node_id, where, step.to)
                elif isinstance(step, Complete) and info.group_id not in self._completing:
                    self._completing.add(info.group_id)
                    complete = CompleteReassignment(
                        info.topic, info.partition, info.group_id, info.target
                    )
                    self._spawn(self._report_completion(complete), f"complete-{info.group_id}")
            except RaftlogError as error:  # retriable: not committed yet, lost leadership
                log.debug("node %s: %s move step %s: %s", self.node_id, where, step, error)
            replica.group.wake()

    async def _report_completion(self, command: CompleteReassignment) -> None:
        try:
            result = await self.submit(command, timeout_s=5.0)
            log.info(
                "node %s: move of group %s reported: %s", self.node_id, command.group_id, result
            )
        except (RaftlogError, TimeoutError, OSError) as error:
            log.info(
                "node %s: move of group %s not reported yet: %s",
                self.node_id,
                command.group_id,
                error,
            )
        finally:
            self._completing.discard(command.group_id)

    # -- the client API (rpc.servicers.BrokerApi) -------------------------------------------------

    def replica(self, topic: str, partition: int) -> PartitionReplica:
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
        replica = self.replica(topic, partition)
        if self.is_fenced():
            # Issue 5: a fenced node leads nothing; the client retries at the new leader.
            raise NotLeaderError(leader_hint=None)
        return await replica.produce(batches, commitment=commitment, timeout_s=timeout_s)

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
    ) -> FetchResult:
        return await self.replica(topic, partition).fetch(
            offset,
            bytes_max=bytes_max,
            wait_ms_max=wait_ms_max,
            bytes_min=bytes_min,
            allow_follower=allow_follower,
        )

    def list_offsets(self, topic: str, partition: int, spec: int, timestamp_ms: int) -> int:
        return self.replica(topic, partition).list_offset(OffsetSpec(spec), timestamp_ms)

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


_BOOTSTRAP_FILE = "bootstrap-voters"


def _bootstrap_voters(directory: Path, voters: frozenset[NodeId]) -> frozenset[NodeId]:
    """The voters a partition group was created with: read back, or written (durably) now."""
    path = directory / _BOOTSTRAP_FILE
    if path.exists():
        return Membership.decode(path.read_bytes()).voters
    temporary = directory / (_BOOTSTRAP_FILE + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, Membership(voters=voters).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return voters
