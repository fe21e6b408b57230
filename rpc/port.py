"""The node as the API front ends see it: the one port the gRPC servicers and the Kafka
listener (`raftlog.rpc.kafka`) depend on, implemented by `raftlog.node.node.Node`.

Each front end translates its wire protocol to these calls and back; none reaches into the
node's groups, transport or storage, so a Kafka Produce is the same `produce` call the gRPC
`Log.Produce` makes (the calls the Kafka handlers use are listed in
`raftlog.rpc.kafka.context`). Errors are the `raftlog.errors` tree: each front end
maps them to its own codes (a `leader_hint` on NotLeader/NotController names where to go).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from raftlog.errors import RaftlogError
from raftlog.metadata import (
    AlterTopicConfig,
    ApplyResult,
    Command,
    CreateTopicRequest,
    MetadataState,
)
from raftlog.partition.replica import FetchResult, ProducerDescription, ProduceResult
from raftlog.rpc.faults import FaultInjector
from raftlog.rpc.txn_completions import TxnCompletions
from raftlog.types import Commitment, NodeId, TxnMarker, TxnMarkerResult

__all__ = ["MetadataCopy", "MetadataReadPort", "NodePort"]


class MetadataCopy(Protocol):
    # Called after every apply or restore (a handler waiting for a change adds one and
    # removes it when done).
    listeners: list[Callable[[], None]]

    @property
    def state(self) -> MetadataState:
        """This node's applied copy of the metadata state (replaced on a snapshot restore:
        read it anew for each request)."""
        ...


class MetadataReadPort(Protocol):
    """What answering a metadata read needs: this node's copy and where nodes live."""

    @property
    def node_id(self) -> NodeId:
        """This node's id."""
        ...

    @property
    def metadata(self) -> MetadataCopy:
        """This node's copy of the metadata quorum's state."""
        ...

    @property
    def controller_id(self) -> NodeId | None:
        """The metadata quorum's leader as this node knows it (None during an election)."""
        ...

    def leader_address(self, leader_id: int | None) -> str:
        """The client address of node `leader_id` ("" when unknown or None)."""
        ...

    async def wait_metadata_caught_up(self) -> bool:
        """Wait up to `metadata.catch_up_wait_ms` until this node's copy of the metadata has
        caught up once since it started; False if not (refuse the read, retriably)."""
        ...

    def partition_high_watermark(self, topic: str, partition: int) -> int:
        """The partition's high watermark if this node leads it, else -1."""
        ...

    def partition_log_start_offset(self, topic: str, partition: int) -> int:
        """The partition's log start offset (Kafka offsets) if this node leads it, else -1."""
        ...

    def metadata_role(self, node_id: NodeId) -> str:
        """`node_id`'s role in the metadata quorum: "voter", "learner" or "none"."""
        ...


class NodePort(MetadataReadPort, Protocol):
    """The data, admin and node-internal calls of a node (module docstring)."""

    @property
    def faults(self) -> FaultInjector | None:
        """The transport's fault hook; None unless the node was started with --chaos."""
        ...

    @property
    def txn_completions(self) -> TxnCompletions:
        """Where the transaction coordinator tells held requests it proposes a completion
        (`raftlog.rpc.txn_completions`)."""
        ...

    def describe_producer(
        self, topic: str, partition: int, producer_id: int
    ) -> tuple[int, int, int] | None:
        """(epoch, last sequence, last offset) the producer has *committed* on the partition
        (KIP-664), answered by its leader; None if none is remembered."""
        ...

    def end_offset_for_epoch(self, topic: str, partition: int, epoch: int) -> tuple[int, int]:
        """Kafka's OffsetForLeaderEpoch, answered by the partition leader: (the largest
        epoch <= `epoch`, the end offset of that epoch)."""
        ...

    async def produce(
        self,
        topic: str,
        partition: int,
        batches: list[bytes],
        *,
        commitment: Commitment,
        timeout_s: float,
    ) -> ProduceResult:
        """Append RecordBatch v2 `batches` at the partition leader and wait for
        `commitment`; NotLeaderError (retriable) on a follower or a fenced node."""
        ...

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
        """Committed batches from `offset` (raw bytes, never decoded), waiting up to
        `wait_ms_max` for `bytes_min`; with `skip_emptied`, without the batches compaction
        emptied of every record (raftlog.storage.raft_log_storage, for Kafka clients); with
        `read_committed`, only below the last stable offset, listing the aborted
        transactions among them."""
        ...

    async def delete_records(
        self, offsets: Sequence[tuple[str, int, int]], *, timeout_s: float
    ) -> list[int | RaftlogError]:
        """Kafka's DeleteRecords: each (topic, partition, offset) moves the partition's log
        start up to `offset` (-1: the high watermark), on its leader; answers each one's new
        log start (the low watermark) or its error."""
        ...

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
        ...

    def describe_producers(self, topic: str, partition: int) -> list[ProducerDescription]:
        """Every producer the partition remembers, with its open transaction's first offset
        (Kafka's DescribeProducers), answered by the partition leader."""
        ...

    def transaction_start_offset(self, topic: str, partition: int, producer_id: int) -> int:
        """Where the producer's open transaction on the partition starts (DescribeProducers'
        current_txn_start_offset), -1 if none; answered by the partition leader."""
        ...

    async def allocate_producer_id(self, *, timeout_s: float) -> int:
        """A producer id unique in the cluster (from a block committed by the quorum)."""
        ...

    async def write_txn_markers(
        self, markers: Sequence[TxnMarker], *, timeout_s: float
    ) -> list[TxnMarkerResult]:
        """Kafka's WriteTxnMarkers: write each COMMIT/ABORT marker into its partition through
        the partition's leader (here, or node to node on the peer transport), answering
        each once its marker is committed; one result per marker, in order, with a Kafka
        error code (0 = written)."""
        ...

    def is_controller(self) -> bool:
        """True while this node leads the metadata quorum."""
        ...

    def client_address_of(self, node_id: NodeId) -> str:
        """The client address node `node_id` registered ("" if unknown)."""
        ...

    async def submit(self, command: Command, *, timeout_s: float) -> ApplyResult:
        """Commit a metadata command, forwarding it to the controller if needed."""
        ...

    async def create_topic(self, request: CreateTopicRequest, *, timeout_s: float) -> ApplyResult:
        """Plan on the controller, commit, then wait (within the timeout) for leaders;
        NotControllerError elsewhere."""
        ...

    async def create_partitions(
        self,
        name: str,
        total: int,
        *,
        timeout_s: float,
        assignments: tuple[tuple[NodeId, ...], ...] | None = None,
    ) -> ApplyResult:
        """Grow topic `name` to `total` partitions (controller only), the new ones on
        `assignments` if given."""
        ...

    async def alter_topic_config(
        self, command: AlterTopicConfig, *, timeout_s: float
    ) -> ApplyResult:
        """Alter a topic's config (controller only)."""
        ...

    async def delete_topic(self, name: str, *, timeout_s: float) -> ApplyResult:
        """Delete topic `name` (controller only)."""
        ...

    async def decommission_node(self, node_id: NodeId, *, timeout_s: float) -> ApplyResult:
        """Start decommissioning `node_id` (controller only; refused for a metadata voter)."""
        ...
