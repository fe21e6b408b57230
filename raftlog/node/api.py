"""The node as its front ends see it: `NodeApi` implements `raftlog.rpc.port.NodePort`.

Theory of operation. The gRPC servicers and the Kafka listener translate their wire protocols
to these calls and back, and get values back (results, offsets, producer states), never a
replica or a Raft group to call into. Data calls go to the partition replica this node hosts
(`UnknownTopicOrPartitionError` if none); admin calls are planned on the controller and
committed through the metadata quorum (`MetadataCalls`); metadata reads answer from this
node's copy once it has caught up since the node started (`MetadataCatchUp`).

Transaction markers (`write_txn_markers`, Kafka's WriteTxnMarkers) go to each partition's
leader: written here when this node leads the partition, else grouped by the leader the
metadata copy names and sent node to node (`raftlog.rpc.txn_marker_calls`); each answer
comes once its marker is committed. A node serving a peer's markers writes only those of
partitions it leads and never forwards them again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence

from raftlog.errors import (
    CorruptBatchError,
    FrameError,
    NotControllerError,
    NotLeaderError,
    PolicyViolationError,
    ProposalDroppedError,
    RaftlogError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
)
from raftlog.metadata import (
    AlterTopicConfig,
    ApplyResult,
    Command,
    CreateTopicRequest,
    DeleteRecords,
    DeleteTopic,
    plan_decommission,
)
from raftlog.metadata.machine import MetadataMachine
from raftlog.node.metadata_calls import MetadataCalls, MetadataCatchUp
from raftlog.node.reconcile import Reconciler
from raftlog.partition.replica import (
    FetchResult,
    OffsetSpec,
    PartitionReplica,
    ProducerDescription,
    ProduceResult,
)
from raftlog.raft.types import Role
from raftlog.rpc.faults import FaultInjector
from raftlog.rpc.kafka.errors import kafka_error
from raftlog.rpc.txn_completions import TxnCompletions
from raftlog.rpc.txn_marker_calls import MARKERS_PER_CALL_MAX, TxnMarkerCalls
from raftlog.runtime import recorder
from raftlog.types import Commitment, NodeId, PartitionId, TxnMarker, TxnMarkerResult

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
        marker_calls: Callable[[], TxnMarkerCalls],
        wall_clock_ms: Callable[[], int],
    ) -> None:
        self.node_id = node_id
        self.metadata = metadata
        self.faults = faults
        self._calls = calls
        self._catch_up = catch_up
        self._reconciler = reconciler
        self._replicas: Mapping[tuple[str, int], PartitionReplica] = reconciler.replicas
        self._is_fenced = is_fenced
        self._marker_calls = marker_calls
        self._wall_clock_ms = wall_clock_ms
        self.txn_completions = TxnCompletions()

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
        read_committed: bool = False,
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
                read_committed=read_committed,
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

    def list_offsets(
        self,
        topic: str,
        partition: int,
        spec: int,
        timestamp_ms: int,
        *,
        read_committed: bool = False,
    ) -> int:
        """The offset `spec` (an `OffsetSpec` value) names; by timestamp with `timestamp_ms`;
        LATEST is the last stable offset with `read_committed`."""
        return self._replica(topic, partition).list_offset(
            OffsetSpec(spec), timestamp_ms, read_committed=read_committed
        )

    def partition_log_start_offset(self, topic: str, partition: int) -> int:
        """The partition's log start offset (Kafka offsets) if this node leads it, else -1."""
        replica = self._replicas.get((topic, partition))
        if replica is None or replica.group.node.role is not Role.LEADER:
            return -1
        return replica.log_start_offset

    async def delete_records(
        self, offsets: Sequence[tuple[str, int, int]], *, timeout_s: float
    ) -> list[int | RaftlogError]:
        """Kafka's DeleteRecords on partitions this node leads: each (topic, partition,
        offset) moves the partition's log start up to `offset` (-1: the high watermark).

        The new start is a metadata command (`DeleteRecords`), so whichever replica leads
        later honours it; retention then drops the segments wholly below it. Answers each
        partition's log start once this node's metadata has it (Kafka's low watermark), or
        its error: UnknownTopicOrPartitionError, NotLeaderError, PolicyViolationError (a
        topic without cleanup.policy delete), OffsetOutOfRangeError (past the high
        watermark), RequestTimedOutError, ProposalDroppedError."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        answers: list[int | RaftlogError] = []
        # (topic, partition) -> its replica, the highest start asked, the answers it fills.
        wanted: dict[tuple[str, int], tuple[PartitionReplica, int, list[int]]] = {}
        for index, (topic, partition, offset) in enumerate(offsets):
            try:
                replica = self._replica(topic, partition)
                if not self._reconciler.compaction_settings(topic).delete:
                    raise PolicyViolationError(
                        f"{topic}-{partition}: records of a topic whose cleanup.policy does "
                        "not include delete cannot be deleted"
                    )
                start = replica.deletion_offset(offset)
            except RaftlogError as error:
                answers.append(error)
                continue
            answers.append(replica.log_start_offset)
            if start > replica.log_start_offset:
                _, earlier, indexes = wanted.get((topic, partition), (replica, start, []))
                wanted[(topic, partition)] = (replica, max(start, earlier), [*indexes, index])
        if not wanted:
            return answers
        command = DeleteRecords(
            offsets=tuple((t, PartitionId(p), start) for (t, p), (_, start, _) in wanted.items()),
            raft_group_ids=tuple(r.group.raft_group_id for r, _, _ in wanted.values()),
        )
        failure: RaftlogError | None = None
        try:
            result = await self._calls.submit(command, timeout_s=timeout_s)
        except RaftlogError as error:
            failure = error
        except TimeoutError:
            failure = RequestTimedOutError("the deletion was not committed in time")
        else:
            if not result.ok:
                # Its only refusal: a partition's topic was deleted (and maybe created anew).
                failure = UnknownTopicOrPartitionError(*next(iter(wanted)))
        if failure is None:
            # Committed on the controller; this node's copy of the metadata follows shortly.
            remaining_s = deadline - asyncio.get_running_loop().time()
            if not await self._metadata_shows(
                lambda: all(r.log_start_offset >= s for r, s, _ in wanted.values()), remaining_s
            ):
                failure = RequestTimedOutError("the deletion is committed, not yet applied here")
        for replica, _, indexes in wanted.values():
            for index in indexes:
                answers[index] = failure if failure is not None else replica.log_start_offset
        return answers

    async def _metadata_shows(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        """Wait up to `timeout_s` until this node's metadata, as applied, meets `condition`."""
        shown = asyncio.Event()

        def look() -> None:
            if condition():
                shown.set()

        self.metadata.listeners.append(look)
        try:
            look()
            await asyncio.wait_for(shown.wait(), max(timeout_s, 0.0))
        except TimeoutError:
            return False
        finally:
            self.metadata.listeners.remove(look)
        return True

    def describe_producers(self, topic: str, partition: int) -> list[ProducerDescription]:
        """Every producer the partition remembers (Kafka's DescribeProducers)."""
        return self._replica(topic, partition).describe_producers()

    def transaction_start_offset(self, topic: str, partition: int, producer_id: int) -> int:
        """Where the producer's open transaction on the partition starts, -1 if none."""
        return self._replica(topic, partition).transaction_start_offset(producer_id)

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

    # -- transaction markers ---------------------------------------------------------------

    async def write_txn_markers(
        self, markers: Sequence[TxnMarker], *, timeout_s: float
    ) -> list[TxnMarkerResult]:
        """Write each marker through its partition's leader, here or on a peer (module
        docstring); one result per marker, in order, 0 once committed."""
        codes: list[int | None] = [None] * len(markers)
        local: list[int] = []
        remote: dict[NodeId, list[int]] = {}
        state = self.metadata.state
        for index, marker in enumerate(markers):
            replica = self._replicas.get((marker.topic, marker.partition))
            if replica is not None and replica.group.node.role is Role.LEADER:
                local.append(index)
                continue
            info = state.partition(marker.topic, marker.partition)
            if info is None:
                codes[index] = _code(UnknownTopicOrPartitionError(marker.topic, marker.partition))
            elif info.leader_id is None or info.leader_id == self.node_id:
                codes[index] = _code(NotLeaderError(leader_hint=None))
            else:
                remote.setdefault(NodeId(info.leader_id), []).append(index)
        jobs = [self._write_local([markers[i] for i in local], timeout_s)]
        order = list(local)  # the markers' indexes in the order the answers come back
        for leader, indexes in remote.items():
            for chunk_start in range(0, len(indexes), MARKERS_PER_CALL_MAX):
                chunk = indexes[chunk_start : chunk_start + MARKERS_PER_CALL_MAX]
                jobs.append(self._write_remote(leader, [markers[i] for i in chunk], timeout_s))
                order.extend(chunk)
        answers = [code for job in await asyncio.gather(*jobs) for code in job]
        for index, code in zip(order, answers, strict=True):
            codes[index] = code
        return [
            TxnMarkerResult(marker.topic, marker.partition, code)
            for marker, code in zip(markers, codes, strict=True)
            if code is not None
        ]

    async def write_local_txn_markers(
        self, markers: Sequence[TxnMarker], timeout_s: float
    ) -> list[TxnMarkerResult]:
        """A peer's markers: those of partitions this node leads are written, the others
        answered NOT_LEADER_OR_FOLLOWER / UNKNOWN_TOPIC_OR_PARTITION (never forwarded)."""
        codes = await self._write_local(markers, timeout_s)
        return [
            TxnMarkerResult(marker.topic, marker.partition, code)
            for marker, code in zip(markers, codes, strict=True)
        ]

    async def _write_local(self, markers: Sequence[TxnMarker], timeout_s: float) -> list[int]:
        return list(await asyncio.gather(*(self._write_one(m, timeout_s) for m in markers)))

    async def _write_one(self, marker: TxnMarker, timeout_s: float) -> int:
        try:
            if (marker.topic, marker.partition) not in self._replicas and (
                self.metadata.state.partition(marker.topic, marker.partition) is not None
            ):
                # Not hosted here (yet): a restart still replaying its metadata, a copy
                # reopened for repair. The partition exists, so the coordinator must retry,
                # not drop the marker (raftlog.node.txn_markers).
                raise NotLeaderError(leader_hint=None)
            replica = self._replica(marker.topic, marker.partition)
            if self._is_fenced():
                raise NotLeaderError(leader_hint=None)  # as produce: a fenced node leads nothing
            if self.faults is not None and self.faults.holds_txn_markers:
                self.faults.counters.held_txn_markers += 1
                raise RequestTimedOutError("markers held (test fault hold_txn_markers)")
            await replica.write_txn_marker(
                producer_id=marker.producer_id,
                producer_epoch=marker.producer_epoch,
                coordinator_epoch=marker.coordinator_epoch,
                commit=marker.commit,
                timestamp_ms=self._wall_clock_ms(),
                timeout_s=timeout_s,
            )
        except RaftlogError as error:
            return _code(error)
        return 0

    async def _write_remote(
        self, leader: NodeId, markers: list[TxnMarker], timeout_s: float
    ) -> list[int]:
        try:
            results = await self._marker_calls().call(leader, markers, timeout_s)
        except TimeoutError:
            return [_code(RequestTimedOutError("markers"))] * len(markers)
        except (ProposalDroppedError, FrameError):
            # Not sent, or the leader went away with the answer: the coordinator retries
            # (a repeated marker ends nothing).
            return [_code(NotLeaderError(leader_hint=None))] * len(markers)
        return [result.error_code for result in results]

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

    async def create_partitions(
        self,
        name: str,
        total: int,
        *,
        timeout_s: float,
        assignments: tuple[tuple[NodeId, ...], ...] | None = None,
    ) -> ApplyResult:
        """Grow topic `name` to `total` partitions (controller only), as `create_topic`; the
        new partitions on `assignments` if given (an operator's choice)."""
        self._require_controller()
        deadline = asyncio.get_running_loop().time() + timeout_s
        result = await self._calls.create_partitions(
            name, total, timeout_s=timeout_s, assignments=assignments
        )
        if result.ok:
            await self._wait_for_leaders(name, deadline)
        return result

    async def alter_topic_config(
        self, command: AlterTopicConfig, *, timeout_s: float
    ) -> ApplyResult:
        """Alter a topic's config (controller only: its answer describes the topic from this
        node's metadata, which on the controller holds the change once the call returns; a
        forwarded call returns before this node has applied it)."""
        self._require_controller()
        return await self._calls.submit(command, timeout_s=timeout_s)

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


def _code(error: RaftlogError) -> int:
    """The Kafka error code a marker's result carries for `error`."""
    return int(kafka_error(error).value)
