"""The node as its front ends see it: `NodeApi` implements `raftlog.rpc.port.NodePort`.

Theory of operation. The gRPC servicers and the Kafka listener translate their wire protocols
to these calls and back, and get values back (results, offsets, producer states), never a
replica or a Raft group to call into. Data calls go to the partition replica this node hosts
(`UnknownTopicOrPartitionError` if none); admin calls are planned on the controller and
committed through the metadata quorum (`MetadataCalls`); metadata reads answer from this
node's copy once it has caught up since the node started (`MetadataCatchUp`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from raftlog.errors import (
    CorruptBatchError,
    NotControllerError,
    NotLeaderError,
    UnknownTopicOrPartitionError,
)
from raftlog.metadata import (
    ApplyResult,
    Command,
    CreateTopicRequest,
    DeleteTopic,
    plan_decommission,
)
from raftlog.metadata.machine import MetadataMachine
from raftlog.node.metadata_calls import MetadataCalls, MetadataCatchUp
from raftlog.node.reconcile import Reconciler
from raftlog.partition.replica import FetchResult, OffsetSpec, PartitionReplica, ProduceResult
from raftlog.raft.types import Role
from raftlog.rpc.faults import FaultInjector
from raftlog.runtime import recorder
from raftlog.types import Commitment, NodeId

__all__ = ["NodeApi"]


class NodeApi:
    """The data, admin and metadata-read calls of one node (module docstring)."""

    def __init__(
        self,
        *,
        node_id: NodeId,
        metadata: MetadataMachine,
        calls: MetadataCalls,
        catch_up: MetadataCatchUp,
        reconciler: Reconciler,
        is_fenced: Callable[[], bool],
        faults: FaultInjector | None,
    ) -> None:
        self.node_id = node_id
        self.metadata = metadata
        self.faults = faults
        self._calls = calls
        self._catch_up = catch_up
        self._reconciler = reconciler
        self._replicas: Mapping[tuple[str, int], PartitionReplica] = reconciler.replicas
        self._is_fenced = is_fenced

    # -- metadata reads (raftlog.rpc.port.MetadataReadPort) -------------------------------

    @property
    def controller_id(self) -> NodeId | None:
        """The metadata quorum's leader as this node knows it (None during an election)."""
        return self._calls.controller_id

    def is_controller(self) -> bool:
        """True while this node leads the metadata quorum."""
        return self._calls.is_controller()

    def client_address_of(self, node_id: NodeId) -> str:
        """The client address node `node_id` registered ("" if unknown)."""
        return self._calls.client_address_of(node_id)

    def leader_address(self, leader_id: int | None) -> str:
        """The client address of node `leader_id` ("" when unknown or None)."""
        return "" if leader_id is None else self._calls.client_address_of(NodeId(leader_id))

    async def wait_metadata_caught_up(self) -> bool:
        """False if this node's copy has not caught up since start within the bound."""
        return await self._catch_up.wait()

    def metadata_role(self, node_id: NodeId) -> str:
        """`node_id`'s role in the metadata quorum: "voter", "learner" or "none"."""
        return self._calls.metadata_role(node_id)

    def partition_high_watermark(self, topic: str, partition: int) -> int:
        """The partition's high watermark if this node leads it, else -1."""
        replica = self._replicas.get((topic, partition))
        if replica is None or replica.group.node.role is not Role.LEADER:
            return -1
        return replica.high_watermark

    # -- data ------------------------------------------------------------------------------

    def _replica(self, topic: str, partition: int) -> PartitionReplica:
        replica = self._replicas.get((topic, partition))
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
        """Append `batches` at the partition leader and wait for `commitment`."""
        replica = self._replica(topic, partition)
        if self._is_fenced():
            # A fenced node leads nothing; the client retries at the new leader.
            raise NotLeaderError(leader_hint=None)
        result = await replica.produce(batches, commitment=commitment, timeout_s=timeout_s)
        recorder.recorder().on_produce(sum(map(len, batches)))
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
        """Committed batches from `offset`, raw; a damaged read starts a repair instead."""
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
        recorder.recorder().on_fetch(len(result.batches))
        return result

    def list_offsets(self, topic: str, partition: int, spec: int, timestamp_ms: int) -> int:
        """The offset `spec` (an `OffsetSpec` value) names; by timestamp with `timestamp_ms`."""
        return self._replica(topic, partition).list_offset(OffsetSpec(spec), timestamp_ms)

    def describe_producer(
        self, topic: str, partition: int, producer_id: int
    ) -> tuple[int, int, int] | None:
        """(epoch, last sequence, last offset) the producer has committed (KIP-664)."""
        return self._replica(topic, partition).describe_producer(producer_id)

    def end_offset_for_epoch(self, topic: str, partition: int, epoch: int) -> tuple[int, int]:
        """Kafka's OffsetForLeaderEpoch, answered by the partition leader."""
        return self._replica(topic, partition).end_offset_for_epoch(epoch)

    async def allocate_producer_id(self, *, timeout_s: float) -> int:
        """A producer id unique in the cluster (from a block committed by the quorum)."""
        return await self._calls.allocate_producer_id(timeout_s=timeout_s)

    # -- admin -----------------------------------------------------------------------------

    async def submit(self, command: Command, *, timeout_s: float) -> ApplyResult:
        """Commit a metadata command, forwarding it to the controller if needed."""
        return await self._calls.submit(command, timeout_s=timeout_s)

    def _require_controller(self) -> None:
        if not self._calls.is_controller():
            raise NotControllerError(leader_hint=self._calls.controller_id)

    async def create_topic(self, request: CreateTopicRequest, *, timeout_s: float) -> ApplyResult:
        """Plan on the controller (one topic change at a time, `MetadataCalls.create_topic`),
        commit, then wait (within the timeout) for leaders."""
        self._require_controller()
        deadline = asyncio.get_running_loop().time() + timeout_s
        result = await self._calls.create_topic(request, timeout_s=timeout_s)
        if result.ok:
            await self._wait_for_leaders(request.name, deadline)
        return result

    async def create_partitions(self, name: str, total: int, *, timeout_s: float) -> ApplyResult:
        """Grow topic `name` to `total` partitions (controller only), as `create_topic`."""
        self._require_controller()
        deadline = asyncio.get_running_loop().time() + timeout_s
        result = await self._calls.create_partitions(name, total, timeout_s=timeout_s)
        if result.ok:
            await self._wait_for_leaders(name, deadline)
        return result

    async def delete_topic(self, name: str, *, timeout_s: float) -> ApplyResult:
        """Delete topic `name` (controller only)."""
        self._require_controller()
        return await self._calls.submit(DeleteTopic(name=name), timeout_s=timeout_s)

    async def decommission_node(self, node_id: NodeId, *, timeout_s: float) -> ApplyResult:
        """Start decommissioning `node_id` (refused for a metadata voter); the controller's
        duties then carry it out."""
        self._require_controller()
        plan = plan_decommission(self.metadata.state, node_id, self._calls.voters())
        if isinstance(plan, ApplyResult):
            return plan
        return await self._calls.submit(plan, timeout_s=timeout_s)

    async def _wait_for_leaders(self, topic: str, deadline: float) -> None:
        """Best effort: return once every partition of `topic` reported a leader."""
        loop = asyncio.get_running_loop()
        while loop.time() < deadline:
            partitions = self.metadata.state.partitions(topic)
            if partitions and all(p.leader_id is not None for p in partitions):
                return
            await asyncio.sleep(0.05)
