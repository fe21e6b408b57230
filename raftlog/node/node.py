"""A raftlog node (Kafka calls it a broker): the composition root of one `raftlog serve`.

Theory of operation. One asyncio loop runs everything:

- the `RaftGroupHost` drives group 0 (the metadata quorum) and one group per partition replica
  assigned to this node, with group commit across groups;
- the `PeerTransport` carries the Raft traffic of all groups, one connection per peer node;
- a gRPC server (`raftlog.rpc.server`) answers clients (`Log`, `Admin`, `Groups`) and other
  nodes (`Internal`).

The constructor reads as the node's table of contents: each part is built by a function of
`raftlog.node.assembly` named after it, in dependency order. `start` opens the metadata group,
binds the client listeners, then runs the Raft groups and the node's duties
(`raftlog.node.duties`); `stop` undoes it. Front ends reach the node only through `api`
(`raftlog.node.api.NodeApi`, the `raftlog.rpc.port.NodePort`). The parts:

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
- `raftlog.node.metadata_calls`: committing metadata commands wherever the controller is,
  and the catch-up latch metadata reads wait for.

An observer (a node not in `--peers`) starts its metadata group with no voters and registers
through `--bootstrap` (the voters' client addresses) while it knows no controller; a
decommissioned node's registration and heartbeats are refused, and one that is restarted
stops with that error instead of rejoining.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable
from typing import Any

from raftlog.errors import NotLeaderError
from raftlog.metadata import METADATA_RAFT_GROUP_ID
from raftlog.metadata.machine import MetadataMachine
from raftlog.node import assembly, front_ends
from raftlog.node.api import NodeApi
from raftlog.node.duties import NodeDuties
from raftlog.node.metadata_calls import MetadataCalls, MetadataCatchUp
from raftlog.node.txn_verification import TxnVerification
from raftlog.rpc.forwarding import ControllerForwarder
from raftlog.rpc.server import ApiServer, start_api_server
from raftlog.runtime.clock import MonotonicClock, RetentionClock, SystemMonotonicClock
from raftlog.runtime.group import RaftGroup
from raftlog.settings import NodeSettings
from raftlog.types import NodeId

__all__ = ["Node"]

# A stop cancels the node's tasks up to this many times, this long apart (_cancel_all).
_CANCEL_ROUNDS_MAX = 50
_CANCEL_ROUND_S = 0.1

log = logging.getLogger(__name__)


class Node:
    """One raftlog node: its parts, built in order (module docstring), started, stopped."""

    def __init__(self, settings: NodeSettings, *, clock: MonotonicClock | None = None) -> None:
        self.settings = settings.validate()
        self.node_id = settings.node_id
        self.config = settings.config
        self.incarnation = time.time_ns()
        self.rng = random.Random()
        # Running tasks only: short ones (leader reports) remove themselves when done.
        self._tasks: set[asyncio.Task[None]] = set()
        # Set when a task of the node fails: `raftlog serve` then exits non-zero.
        self.failed: asyncio.Future[None] | None = None
        self.metadata_group: RaftGroup | None = None
        self.forward: ControllerForwarder | None = None
        self._server: ApiServer | None = None
        self.bound_port = 0
        self._build_clocks_and_files(clock)
        self._build_metadata()
        self._build_raft_engine()
        self._build_duties()

    def _build_clocks_and_files(self, clock: MonotonicClock | None) -> None:
        self.faults = assembly.fault_injector(self.settings, self.rng)
        self.wall_clock = assembly.wall_clock(self.faults)
        # Durations (leases, silence, grace periods): never compared with another node's.
        self.clock: MonotonicClock = clock if clock is not None else SystemMonotonicClock()
        # Deleting by age reads the wall clock through this, which holds back forward steps.
        self.retention_clock = RetentionClock(
            self.wall_clock, self.clock, slack_ms=self.config.retention_clock_slack_ms
        )
        self.files = assembly.file_system(self.settings)

    def _build_metadata(self) -> None:
        self.metadata = MetadataMachine(self.settings.cluster_id)
        self.catch_up = MetadataCatchUp(
            node_id=self.node_id,
            incarnation=self.incarnation,
            metadata=self.metadata,
            wait_ms=self.config.metadata.catch_up_wait_ms,
        )
        self.metadata.listeners.append(self.catch_up.observe)
        self.txn_verification = TxnVerification(
            metadata=self.metadata,
            wait_ms=self.config.kafka.txn_verification_wait_ms,
            enabled=self.config.kafka.txn_verification,
        )

    def _build_raft_engine(self) -> None:
        self.transport = assembly.peer_transport(self)
        self.peer_calls = assembly.peer_calls(self)
        self.txn_marker_calls = assembly.txn_marker_calls(self)
        self.host = assembly.raft_group_host(self)
        self.raft_groups = assembly.raft_group_factory(self)
        self.reconciler = assembly.reconciler(self)
        self.replicas = self.reconciler.replicas
        self.scrubber = assembly.scrubber(self)
        self.cleaner = assembly.cleaner(self)

    def _build_duties(self) -> None:
        self.loop_lag, self.lease, self.watch = assembly.leases(self)
        self.metadata_calls = MetadataCalls(
            settings=self.settings,
            metadata=self.metadata,
            metadata_group=lambda: self.metadata_group,
            transport=self.transport,
            peer_calls=lambda: self.peer_calls,
            forward=lambda: self.forward,
            wall_clock=self.wall_clock,
            watch=self.watch,
        )
        self.leadership = assembly.leadership_moves(self)
        self.reassignments = assembly.reassignment_driver(self)
        self.controller_duties = assembly.controller_duties(self)
        self.consumer_groups = assembly.consumer_group_service(self)
        self.duties = NodeDuties(
            settings=self.settings,
            incarnation=self.incarnation,
            metadata=self.metadata,
            metadata_group=lambda: self.metadata_group,
            calls=self.metadata_calls,
            controller=self.controller_duties,
            leadership=self.leadership,
            reassignments=self.reassignments,
            consumer_groups=self.consumer_groups,
            raft_groups=self.raft_groups,
            reconciler=self.reconciler,
            lease=self.lease,
            wall_clock=self.wall_clock,
            retention_clock=self.retention_clock,
            fail=self._fail,
        )
        self.liveness = assembly.node_liveness(self)
        self.api = NodeApi(
            node_id=self.node_id,
            metadata=self.metadata,
            calls=self.metadata_calls,
            catch_up=self.catch_up,
            reconciler=self.reconciler,
            is_fenced=self.duties.is_fenced,
            faults=self.faults,
            marker_calls=lambda: self.txn_marker_calls,
            wall_clock_ms=self.wall_clock.now_ms,
        )
        self.kafka = front_ends.kafka_listener(self.api, self.consumer_groups, self.settings)
        self.txn_markers = assembly.transaction_marker_duty(self)

    # -- what other parts and the metrics read ---------------------------------------------

    def require_metadata_group(self) -> RaftGroup:
        assert self.metadata_group is not None, "the metadata group starts with the node"
        return self.metadata_group

    def is_controller(self) -> bool:
        """True while this node leads the metadata quorum."""
        return self.metadata_calls.is_controller()

    def is_fenced(self) -> bool:
        """The metadata shows this node fenced, or its own clock says its lease lapsed."""
        return self.duties.is_fenced()

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the node's state, answer clients, then run its Raft groups.

        The client listeners (gRPC, then Kafka's with --kafka-listen) are bound before any
        group runs: a group that runs can win an election, and the metadata then
        names this node its leader, so clients must find it answering (or refusing with a
        retriable error while it catches up) from that moment, never a refused connection.
        """
        loop = asyncio.get_running_loop()
        self.failed = loop.create_future()
        loop.set_exception_handler(self._on_loop_exception)
        self._open_metadata_group()
        self._server = await start_api_server(self.api, self.consumer_groups, self.settings)
        self.forward = self._server.forward
        self.bound_port = self._server.bound_port
        if self.kafka is not None:
            await front_ends.start_kafka_listener(self.kafka, self.settings)
        log.info("node %s: client listeners bound; starting its Raft groups", self.node_id)
        await self.transport.start(*self.settings.raft_listen)
        self.transport.update_peers(
            {node: addr for node, addr in self.settings.peers.items() if node != self.node_id}
        )
        self.host.add(self.require_metadata_group())
        # Partitions this node hosted before a restart (from a snapshot).
        self.reconciler.reconcile()
        self.spawn(self.host.run(), "group-host")
        self.spawn(self.liveness.run(), "liveness")
        self.spawn(self.liveness.measure_loop_lag(), "loop-lag")
        self.spawn(self.duties.leadership_loop(), "leadership")
        self.spawn(self.duties.retention_loop(), "retention")
        self.spawn(self.scrubber.run(), "scrubber")
        self.spawn(self.cleaner.run(), "cleaner")
        self.metadata.listeners.append(self.txn_markers.wake)
        self.spawn(self.txn_markers.run(), "txn-markers")

    def _open_metadata_group(self) -> None:
        directory = self.settings.data_dir / "metadata"
        storage, hard_state_store = self.raft_groups.open_storage(directory)
        peers = self.settings.peers
        self.metadata_group = self.raft_groups.make_group(
            METADATA_RAFT_GROUP_ID,
            storage,
            hard_state_store,
            # An observer starts with no voters: it learns the membership (itself a learner)
            # from the controller's log or snapshot, and can never elect itself.
            frozenset(peers) if self.node_id in peers else frozenset(),
            self.metadata,
        )
        self.metadata.listeners.append(self.reconciler.reconcile)
        self.metadata_group.on_leadership_change = self._on_controller_change

    async def stop(self) -> None:
        if self.kafka is not None:
            await self.kafka.close()
        if self._server is not None:
            await self._server.stop()
        self.scrubber.stop()
        self.cleaner.stop()
        self.host.close()
        await _cancel_all(set(self._tasks))
        self.peer_calls.close()
        self.txn_marker_calls.close()
        await self.transport.close()
        for group in list(self.host.groups()):
            group.fail_waiters(NotLeaderError(leader_hint=None))
        for replica in self.replicas.values():
            replica.checkpoint_on_close()  # a clean stop: the next start re-applies nothing
        self.raft_groups.close_all()

    # -- tasks and failures ----------------------------------------------------------------

    def spawn(self, coroutine: Awaitable[None], name: str) -> None:
        """Run `coroutine` as a task of the node: one that fails stops the node."""

        async def guarded() -> None:
            try:
                await coroutine
            except asyncio.CancelledError:
                raise
            except Exception as error:
                # A failed assertion or bug stops the node: it must never limp on with a
                # dead Raft loop (STYLE: assertions are never swallowed).
                log.exception("node %s: task %s failed; stopping the node", self.node_id, name)
                self._fail(error)
                raise

        task = asyncio.create_task(guarded(), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _fail(self, error: BaseException) -> None:
        if self.failed is not None and not self.failed.done():
            self.failed.set_exception(error)

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

    # -- events ----------------------------------------------------------------------------

    def on_peer_restart(self, peer: NodeId) -> None:
        """A peer's HELLO shows a new process: it may have come back with an empty disk.
        Leaders here re-probe its log instead of trusting what it acknowledged before."""
        log.info("node %s: peer %s restarted; re-probing its logs", self.node_id, peer)
        for group in self.host.groups():
            group.node.forget_peer_log(peer)
        self.host.notify()

    def _on_controller_change(self, group: RaftGroup) -> None:
        node = group.node
        log.info(
            "node %s: metadata quorum: now %s in term %s (controller %s); cause: %s",
            self.node_id, node.role.value, node.term, node.leader_id, node.role_cause,
        )  # fmt: skip


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
