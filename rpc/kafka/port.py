"""The broker as the Kafka listener sees it: exactly the calls its handlers make.

A `typing.Protocol`, so `raftlog.broker.Broker` satisfies it structurally without importing
this package, and the handlers never reach past it into Raft or the log: a Kafka Produce is
the same `produce` call the gRPC `Log.Produce` makes, a Fetch the same `fetch`, and so on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from raftlog.metadata import ApplyResult, Command, CreateTopicRequest, MetadataState
from raftlog.partition.replica import FetchResult, ProduceResult
from raftlog.runtime.group import Commitment
from raftlog.types import NodeId

__all__ = ["GroupsView", "KafkaBroker", "MetadataView", "ReplicaView"]


class MetadataView(Protocol):
    """This node's copy of the metadata quorum's state."""

    @property
    def state(self) -> MetadataState: ...


class ReplicaView(Protocol):
    """A partition replica hosted on this node."""

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]: ...


class GroupsView(Protocol):
    """raftlog's consumer-group service: the controller term it coordinates in, if any (set
    once the controller has applied its term's first entry, so committed offsets it reads
    are complete)."""

    @property
    def controller_term(self) -> Callable[[], int | None]: ...


class KafkaBroker(Protocol):
    @property
    def metadata(self) -> MetadataView: ...

    @property
    def groups(self) -> GroupsView: ...

    async def submit(self, command: Command, *, timeout_s: float) -> ApplyResult: ...

    @property
    def controller_id(self) -> NodeId | None: ...

    async def wait_metadata_caught_up(self) -> bool: ...

    async def produce(
        self,
        topic: str,
        partition: int,
        batches: list[bytes],
        *,
        commitment: Commitment,
        timeout_s: float,
    ) -> ProduceResult: ...

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
    ) -> FetchResult: ...

    def list_offsets(self, topic: str, partition: int, spec: int, timestamp_ms: int) -> int: ...

    def replica(self, topic: str, partition: int) -> ReplicaView: ...

    async def allocate_producer_id(self, *, timeout_s: float) -> int: ...

    async def create_topic(
        self, request: CreateTopicRequest, *, timeout_s: float
    ) -> ApplyResult: ...

    async def delete_topic(self, name: str, *, timeout_s: float) -> ApplyResult: ...

    async def create_partitions(
        self, name: str, total: int, *, timeout_s: float
    ) -> ApplyResult: ...
