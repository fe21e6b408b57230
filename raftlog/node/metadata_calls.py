"""How a node reaches the metadata quorum: commit a command, answer a peer's call, catch up.

Theory of operation. Every change of the metadata is a command the controller (the metadata
group's leader) proposes and the quorum commits. `MetadataCalls.submit` commits a command
from anywhere on the node: on the controller it proposes it and waits for its apply result;
elsewhere it sends it to the controller as a call over the peer transport
(`raftlog.rpc.peer_calls`) when a connection is up, else forwards it by gRPC
(`raftlog.rpc.forwarding`). Liveness commands (registration, heartbeats) may also go through
the `--bootstrap` addresses while the node knows no controller.

Topic creates and partition additions are planned on the controller (`create_topic`,
`create_partitions`) one at a time: each waits for its predecessor's command to apply, so
it plans on the state that command left (its Raft group ids, its name taken), and many in
flight at once (a stream processor creating its topics) all succeed. A plan still found
stale when applied (a previous controller's command applied late) is planned again, at most
`metadata.stale_plan_retries_max` times, within the request's timeout. An `AutoCreateTopic`
(a node creating a topic for a Kafka client) reaches `submit` from any node and is planned
the same way.

`MetadataCatchUp` latches once this node's copy of the metadata shows its own registration
of this start: everything committed before the node started is then applied, and metadata
reads may be answered from the copy (KRaft's rule, `raftlog.metadata.catch_up`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable

from raftlog.errors import NotControllerError, RaftlogError
from raftlog.metadata import (
    AllocateProducerIds,
    ApplyResult,
    AutoCreateTopic,
    Command,
    CreateTopicRequest,
    DecommissionNode,
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
from raftlog.metadata.machine import MetadataMachine
from raftlog.node.leases import ControllerWatch
from raftlog.raft.types import Role
from raftlog.rpc.forwarding import ControllerForwarder, Lane
from raftlog.rpc.peer_calls import PeerCalls
from raftlog.rpc.peer_transport import PeerTransport
from raftlog.runtime.group import RaftGroup
from raftlog.settings import NodeSettings
from raftlog.storage.wall_clock import WallClock
from raftlog.types import Commitment, NodeId

__all__ = ["MetadataCalls", "MetadataCatchUp"]

log = logging.getLogger(__name__)


class MetadataCalls:
    """Commits metadata commands for this node, wherever the controller is (module doc)."""

    def __init__(
        self,
        *,
        settings: NodeSettings,
        metadata: MetadataMachine,
        metadata_group: Callable[[], RaftGroup | None],
        transport: PeerTransport,
        peer_calls: Callable[[], PeerCalls],
        forward: Callable[[], ControllerForwarder | None],
        wall_clock: WallClock,
        watch: ControllerWatch,
    ) -> None:
        self._settings = settings
        self._node_id = settings.node_id
        self._metadata = metadata
        self._metadata_group = metadata_group
        self._transport = transport
        self._peer_calls = peer_calls
        self._forward = forward
        self._wall_clock = wall_clock
        self._watch = watch
        self._producer_ids_next = 0
        self._producer_ids_end = 0
        # Held while a topic change is planned and committed (module docstring).
        self._planning = asyncio.Lock()

    def _group(self) -> RaftGroup:
        group = self._metadata_group()
        assert group is not None, "the metadata group starts with the node"
        return group

    @property
    def controller_id(self) -> NodeId | None:
        """The metadata quorum's leader as this node knows it (None during an election)."""
        return self._group().node.leader_id

    def is_controller(self) -> bool:
        """True while this node leads the metadata quorum."""
        return self._group().node.role is Role.LEADER

    async def submit(
        self, command: Command, *, timeout_s: float, lane: Lane = "other"
    ) -> ApplyResult:
        """Commit `command` to the metadata quorum, on the controller: a call over the peer
        transport (raftlog.rpc.peer_calls) when connected to it, else forwarded by gRPC on
        the connection of `lane` (raftlog.rpc.forwarding)."""
        if not self.is_controller():
            return await self._send_to_controller(command, timeout_s=timeout_s, lane=lane)
        if isinstance(command, AutoCreateTopic):
            request = CreateTopicRequest(
                name=command.name,
                partition_count=command.partition_count,
                replication_factor=command.replication_factor,
            )
            return await self.create_topic(request, timeout_s=timeout_s)
        if isinstance(command, DecommissionNode):
            # However it arrives (Admin or Internal.SubmitMetadata), a voter is refused.
            plan = plan_decommission(self._metadata.state, command.node_id, self.voters())
            if isinstance(plan, ApplyResult):
                return plan
        if isinstance(command, NodeHeartbeat | RegisterNode):
            # Lease times are the controller's clock, never the sender's (clock skew).
            command = dataclasses.replace(command, now_ms=self._wall_clock.now_ms())
            # The sender is alive now, however long the metadata group takes to commit.
            self._watch.heard(command.node_id)
        offset, future = self._group().propose(
            encode_command(command), offset_count=1, commitment=Commitment.QUORUM
        )
        await asyncio.wait_for(future, timeout_s)
        result = self._metadata.take_result(offset)
        assert result is not None, f"no apply result at offset {offset}"
        return result

    async def create_topic(self, request: CreateTopicRequest, *, timeout_s: float) -> ApplyResult:
        """Plan `request` on this node, the controller, and commit it (module docstring: one
        plan at a time, planned again when stale); TimeoutError past `timeout_s`."""
        config = self._settings.config.metadata
        return await self._plan_and_commit(
            lambda state, now_ms: plan_create_topic(state, request, now_ms, config=config),
            timeout_s=timeout_s,
        )

    async def create_partitions(
        self,
        name: str,
        total: int,
        *,
        timeout_s: float,
        assignments: tuple[tuple[NodeId, ...], ...] | None = None,
    ) -> ApplyResult:
        """Grow topic `name` to `total` partitions, planned as `create_topic` plans (on
        `assignments` if given)."""
        config = self._settings.config.metadata
        return await self._plan_and_commit(
            lambda state, now_ms: plan_create_partitions(
                state, name, total, now_ms, config=config, assignments=assignments
            ),
            timeout_s=timeout_s,
        )

    async def _plan_and_commit(
        self,
        plan: Callable[[MetadataState, int], Command | ApplyResult],
        *,
        timeout_s: float,
    ) -> ApplyResult:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        async with asyncio.timeout_at(deadline):
            await self._planning.acquire()
        try:
            result = reject(ErrorCode.INVALID_REQUEST, "not planned")
            for _ in range(1 + self._settings.config.metadata.stale_plan_retries_max):
                if not self.is_controller():
                    raise NotControllerError(leader_hint=self.controller_id)
                planned = plan(self._metadata.state, self._wall_clock.now_ms())
                if isinstance(planned, ApplyResult):
                    return planned
                remaining_s = max(deadline - loop.time(), 0.0)
                result = await self.submit(planned, timeout_s=remaining_s)
                if result.code is not ErrorCode.INVALID_GROUP_ID:
                    return result
                log.info("a stale plan (%s); planning again", result.message)
            return result
        finally:
            self._planning.release()

    async def _send_to_controller(
        self, command: Command, *, timeout_s: float, lane: Lane
    ) -> ApplyResult:
        controller = self.controller_id
        if controller is None:
            raise NotControllerError(leader_hint=None)
        peer_calls = self._peer_calls()
        if self._transport.is_connected(controller) and peer_calls.has_room():
            return await peer_calls.call(controller, command, timeout_s)
        forward = self._forward()
        if forward is None:
            raise NotControllerError(leader_hint=controller)
        return await forward(self.client_address_of(controller), command, timeout_s, lane=lane)

    async def serve_call(self, sender: NodeId, command: Command, timeout_s: float) -> ApplyResult:
        """A metadata call from node `sender` (raftlog.rpc.peer_calls)."""
        if isinstance(command, NodeHeartbeat | RegisterNode) and command.node_id != sender:
            return reject(
                ErrorCode.INVALID_REQUEST,
                f"node {sender} sent the liveness of node {command.node_id}",
            )
        if not self.is_controller():
            raise NotControllerError(leader_hint=self.controller_id)
        return await self.submit(command, timeout_s=timeout_s)

    async def submit_liveness(self, command: Command, *, timeout_s: float) -> ApplyResult:
        """`submit`, or, on a node that knows no controller yet (an observer before it is a
        learner of the metadata quorum, or just restarted) or whose controller's recorded
        client address no longer answers (it restarted elsewhere and has not registered
        again), through its `--bootstrap` addresses: the one that is the controller
        accepts, the others answer NOT_CONTROLLER."""
        forward = self._forward()
        try:
            return await self.submit(command, timeout_s=timeout_s, lane="liveness")
        except NotControllerError:
            if not self._settings.bootstrap or forward is None:
                raise
        error: RaftlogError = NotControllerError(leader_hint=None)
        for address in self._settings.bootstrap:
            if address == self._settings.client_address:
                continue
            try:
                return await forward(address, command, timeout_s, lane="liveness")
            except NotControllerError as refused:
                error = refused
        raise error

    def client_address_of(self, node_id: NodeId) -> str:
        """The client address node `node_id` registered ("" if unknown)."""
        info = self._metadata.state.node(node_id)
        if info is not None:
            return info.client_address
        if node_id == self._node_id:
            return self._settings.client_address
        return ""

    def voters(self) -> frozenset[NodeId]:
        """The metadata quorum's voters: the bootstrap --peers and the group's membership."""
        return self._group().node.membership.voters | frozenset(self._settings.peers)

    def metadata_role(self, node_id: NodeId) -> str:
        """`node_id` in the metadata quorum as this node's copy of its membership shows it."""
        membership = self._group().node.membership
        if node_id in membership.voters:
            return "voter"
        return "learner" if node_id in membership.learners else "none"

    async def allocate_producer_id(self, *, timeout_s: float) -> int:
        """One producer id, handed out from a block this node got from the quorum."""
        if self._producer_ids_next >= self._producer_ids_end:
            block = self._settings.config.metadata.producer_id_block_size
            result = await self.submit(AllocateProducerIds(count=block), timeout_s=timeout_s)
            if not result.ok or result.producer_id_first is None:
                raise NotControllerError(leader_hint=self.controller_id)
            self._producer_ids_next = result.producer_id_first
            self._producer_ids_end = result.producer_id_first + block
        producer_id = self._producer_ids_next
        self._producer_ids_next += 1
        return producer_id


class MetadataCatchUp:
    """Latches once this node's copy of the metadata has caught up since it started."""

    def __init__(
        self, *, node_id: NodeId, incarnation: int, metadata: MetadataMachine, wait_ms: int
    ) -> None:
        self._node_id = node_id
        self._incarnation = incarnation
        self._metadata = metadata
        self._wait_s = wait_ms / 1000
        self._caught_up = asyncio.Event()

    def observe(self) -> None:
        """After an apply or restore: latch once the copy shows this start's registration,
        so it holds everything committed before the node started."""
        if self._caught_up.is_set():
            return
        if caught_up_since_start(self._metadata.state, self._node_id, self._incarnation):
            log.info(
                "node %s: metadata caught up at offset %s; serving metadata reads",
                self._node_id,
                self._metadata.state.applied_offset,
            )
            self._caught_up.set()

    async def wait(self) -> bool:
        """Wait up to `metadata.catch_up_wait_ms` until the copy has caught up once since
        start (KRaft brokers serve only then); False if it has not, and the caller refuses
        the read, retriably, so the client asks another node."""
        if self._caught_up.is_set():
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._caught_up.wait(), self._wait_s)
        return self._caught_up.is_set()
