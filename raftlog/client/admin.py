"""The Admin client: create, delete, grow, list and describe topics; describe the cluster;
list, describe and abort transactions.

Theory of operation. Admin requests may be sent to any node; a node that is not the metadata
controller answers NOT_CONTROLLER naming the controller (`leader_id`, `leader_address`), and
the request follows that hint, a bounded number of hops. An unreachable node is skipped for
the next address (known nodes, then the bootstrap list). A request that reached a node and
failed for another reason is not retried: a CreateTopic whose answer was lost might have
succeeded, and the caller, not the library, should decide what a retry means. Errors carry
the server's code and message and name the topic concerned.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from raftlog.client._connection import ConnectionOptions, TopicPartition
from raftlog.client.errors import (
    ClientError,
    NoNodeAnsweredError,
    NotControllerError,
    NotLeaderForPartitionError,
    server_error,
)
from raftlog.rpc.v1 import raftlog_pb2 as pb

__all__ = [
    "Admin",
    "ClusterDescription",
    "NodeDescription",
    "PartitionDescription",
    "TopicDescription",
    "TransactionDescription",
]

# NOT_CONTROLLER hints followed for one request before giving up (an election settles in a
# few hops; more means the cluster is flapping).
_CONTROLLER_HOPS_MAX = 5
# NOT_LEADER hints followed at once before backing off (leadership still moving).
_LEADER_HOPS_MAX = 5


@dataclass(frozen=True, slots=True)
class PartitionDescription:
    id: int
    leader: int | None
    replicas: tuple[int, ...]
    epoch: int
    high_watermark: int  # -1 when the answering node does not host the partition
    log_start_offset: int
    # A move under way (KIP-455): target nodes not yet replicas, replicas it takes away.
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class TopicDescription:
    name: str
    topic_id: str
    replication_factor: int
    partitions: tuple[PartitionDescription, ...]
    config: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class NodeDescription:
    node_id: int
    address: str
    alive: bool
    state: str = "active"  # "active", "decommissioning" or "decommissioned"
    metadata_role: str = "none"  # "voter", "learner" or "none", as the answering node sees it


@dataclass(frozen=True, slots=True)
class ClusterDescription:
    cluster_id: str
    controller_id: int | None
    nodes: tuple[NodeDescription, ...]


@dataclass(frozen=True, slots=True)
class TransactionDescription:
    """A transactional id as its coordinator holds it (Kafka's TransactionDescription).
    `start_time_ms` is -1 when no transaction is open; `age_ms` is the open transaction's age
    by the answering node's clock (-1 when none is open)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: str  # Kafka's names: Empty, Ongoing, PrepareCommit, PrepareAbort, Complete*
    coordinator_id: int | None
    start_time_ms: int
    last_update_ms: int
    timeout_ms: int
    partitions: tuple[tuple[str, int], ...]
    groups: tuple[str, ...]
    age_ms: int


def transaction_description(info: pb.TransactionInfo, now_ms: int) -> TransactionDescription:
    return TransactionDescription(
        transactional_id=info.transactional_id,
        producer_id=info.producer_id,
        producer_epoch=info.producer_epoch,
        state=info.state,
        coordinator_id=info.coordinator_id if info.coordinator_id >= 0 else None,
        start_time_ms=info.start_time_ms,
        last_update_ms=info.last_update_ms,
        timeout_ms=info.timeout_ms,
        partitions=tuple((tp.topic, p) for tp in info.partitions for p in tp.partitions),
        groups=tuple(info.groups),
        age_ms=max(0, now_ms - info.start_time_ms) if info.start_time_ms >= 0 else -1,
    )


def topic_description(info: pb.TopicInfo) -> TopicDescription:
    partitions = tuple(
        PartitionDescription(
            id=p.partition,
            leader=p.leader_id if p.leader_id >= 0 else None,
            replicas=tuple(p.replicas),
            epoch=p.leader_epoch,
            high_watermark=p.high_watermark,
            log_start_offset=p.log_start_offset,
            adding_replicas=tuple(p.adding_replicas),
            removing_replicas=tuple(p.removing_replicas),
        )
        for p in sorted(info.partitions, key=lambda p: p.partition)
    )
    return TopicDescription(
        name=info.name,
        topic_id=info.topic_id,
        replication_factor=info.replication_factor,
        partitions=partitions,
        config=dict(info.config),
    )


class Admin:
    """Topic and cluster administration (see the module docstring); thread-safe."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        request_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 100,
        metadata_max_age_ms: int = 300_000,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        tls_ca: str | os.PathLike[str] | None = None,  # TLS, trusting this CA
        token: str | None = None,  # bearer token (docs/security.md)
        tls_cert: str | os.PathLike[str] | None = None,  # client certificate (mTLS)
        tls_key: str | os.PathLike[str] | None = None,  # its private key
    ) -> None:
        self._cluster = ConnectionOptions.from_arguments(locals()).connect(bootstrap)
        self._clock = clock
        # Clock and sleep are ports: tests pass a manual clock whose sleep moves it.
        self._sleep = sleep
        self._request_timeout_ms = request_timeout_ms
        self._retry_backoff_ms = retry_backoff_ms
        # The controller gets most of the request timeout to commit the change, so it can
        # answer REQUEST_TIMED_OUT itself before our own deadline cuts the call.
        self._timeout_ms = max(1, request_timeout_ms * 4 // 5)
        assert 0 < self._timeout_ms <= request_timeout_ms

    def create_topic(
        self,
        name: str,
        *,
        partitions: int,
        replication_factor: int,
        config: Mapping[str, str] | None = None,
    ) -> TopicDescription:
        """Create `name`; returns its description as the controller committed it."""
        _require_name(name)
        if partitions <= 0 or replication_factor <= 0:
            raise ClientError(
                f"topic {name!r}: partitions ({partitions}) and replication_factor "
                f"({replication_factor}) must be positive"
            )
        request = pb.CreateTopicRequest(
            name=name,
            partitions=partitions,
            replication_factor=replication_factor,
            config=dict(config or {}),
            timeout_ms=self._timeout_ms,
        )
        response = self.call_controller(
            "Admin.CreateTopic", request, concerning=f"create topic {name!r}"
        )
        return topic_description(response.topic)

    def alter_topic_config(
        self,
        name: str,
        *,
        set_config: Mapping[str, str] | None = None,
        delete_keys: Sequence[str] = (),
    ) -> TopicDescription:
        """Set and remove keys of topic `name`'s config in one change; returns the topic as
        altered. A bad value is refused with INVALID_CONFIG naming the setting."""
        _require_name(name)
        request = pb.AlterTopicConfigRequest(
            name=name, set=dict(set_config or {}), delete=list(delete_keys),
            timeout_ms=self._timeout_ms,
        )  # fmt: skip
        response = self.call_controller(
            "Admin.AlterTopicConfig", request, concerning=f"alter config of topic {name!r}"
        )
        return topic_description(response.topic)

    def delete_topic(self, name: str) -> None:
        _require_name(name)
        request = pb.DeleteTopicRequest(name=name, timeout_ms=self._timeout_ms)
        self.call_controller("Admin.DeleteTopic", request, concerning=f"delete topic {name!r}")

    def create_partitions(self, name: str, total_count: int) -> None:
        """Grow topic `name` to `total_count` partitions (never shrinks)."""
        _require_name(name)
        if total_count <= 0:
            raise ClientError(f"topic {name!r}: total_count must be positive, got {total_count}")
        request = pb.CreatePartitionsRequest(
            name=name, total_count=total_count, timeout_ms=self._timeout_ms
        )
        concerning = f"create partitions of topic {name!r} (to {total_count})"
        self.call_controller("Admin.CreatePartitions", request, concerning=concerning)

    def decommission_node(self, node_id: int) -> None:
        """Start taking observer `node_id` out of the cluster (its replicas move to other
        nodes one at a time); returns once the controller committed the start. Watch
        `describe_cluster()` for the node's state to become "decommissioned"."""
        if node_id < 0:
            raise ClientError(f"node id must be non-negative, got {node_id}")
        request = pb.DecommissionNodeRequest(node_id=node_id, timeout_ms=self._timeout_ms)
        self.call_controller(
            "Admin.DecommissionNode", request, concerning=f"decommission node {node_id}"
        )

    def list_topics(self) -> list[str]:
        response = self.call_controller(
            "Admin.ListTopics", pb.ListTopicsRequest(), concerning="list topics"
        )
        return sorted(response.names)

    def describe_topic(self, name: str) -> TopicDescription:
        _require_name(name)
        request = pb.DescribeTopicRequest(name=name)
        response = self.call_controller(
            "Admin.DescribeTopic", request, concerning=f"describe topic {name!r}"
        )
        return topic_description(response.topic)

    def describe_cluster(self) -> ClusterDescription:
        request = pb.DescribeClusterRequest()
        response = self.call_controller(
            "Admin.DescribeCluster", request, concerning="describe cluster"
        )
        nodes = tuple(
            NodeDescription(
                node.node_id,
                node.address,
                node.alive,
                state=node.state or "active",
                metadata_role=node.metadata_role or "none",
            )
            for node in sorted(response.nodes, key=lambda node: node.node_id)
        )
        controller = response.controller_id if response.controller_id >= 0 else None
        return ClusterDescription(response.cluster_id, controller, nodes)

    def list_transactions(self, states: Sequence[str] = ()) -> list[TransactionDescription]:
        """Every transactional id the coordinator knows, in the given states (default all)."""
        request = pb.ListTransactionsRequest(states=list(states))
        response = self.call_controller(
            "Admin.ListTransactions", request, concerning="list transactions"
        )
        return [transaction_description(t, response.now_ms) for t in response.transactions]

    def describe_transaction(self, transactional_id: str) -> TransactionDescription:
        request = pb.DescribeTransactionRequest(transactional_id=transactional_id)
        concerning = f"describe transactional id {transactional_id!r}"
        response = self.call_controller("Admin.DescribeTransaction", request, concerning=concerning)
        return transaction_description(response.transaction, response.now_ms)

    def abort_transaction(self, transactional_id: str) -> TransactionDescription | None:
        """Abort `transactional_id`'s open transaction through its coordinator, fencing its
        producer; returns once every ABORT marker is written (the id as it is then, None if
        it expired meanwhile). INVALID_TXN_STATE when no transaction is open."""
        request = pb.AbortTransactionRequest(
            transactional_id=transactional_id, timeout_ms=self._timeout_ms
        )
        concerning = f"abort the transaction of {transactional_id!r}"
        response = self.call_controller("Admin.AbortTransaction", request, concerning=concerning)
        if not response.HasField("transaction"):
            return None
        return transaction_description(response.transaction, response.now_ms)

    def delete_records(self, topic: str, offsets: Mapping[int, int]) -> dict[int, int]:
        """Kafka's DeleteRecords (kafka-delete-records.sh): each partition's log start offset
        moves up to its offset (-1: the high watermark); records below it are no longer
        read and retention frees their segments. Returns each partition's log start after
        the deletion (its low watermark). A partition's call goes to its leader, following
        NOT_LEADER hints; retrying is safe (a deletion only ever raises the log start)."""
        return {
            partition: self._delete_records(TopicPartition(topic, partition), offset)
            for partition, offset in offsets.items()
        }

    def _delete_records(self, tp: TopicPartition, offset: int) -> int:
        request = pb.DeleteRecordsRequest(
            topic=tp.topic, partition=tp.partition, offset=offset, timeout_ms=self._timeout_ms
        )
        concerning = f"delete records of {tp.topic}/{tp.partition} below {offset}"
        deadline = self._clock() + self._request_timeout_ms / 1000
        backoff_s = self._retry_backoff_ms / 1000
        hops = 0
        while True:
            try:
                address = self._cluster.leader_address(tp)
                response = self._cluster.call(address, "Log.DeleteRecords", request)
                if response.error.code == pb.NONE:
                    return int(response.low_watermark)
                refusal = server_error(response.error, concerning=f"{concerning} at {address}")
                if isinstance(refusal, NotLeaderForPartitionError):
                    self._cluster.apply_leader_hint(tp, refusal.leader_id, refusal.leader_address)
                raise refusal
            except ClientError as error:
                if not error.retriable or self._clock() + backoff_s >= deadline:
                    raise
                hinted = (
                    isinstance(error, NotLeaderForPartitionError) and error.leader_id is not None
                )
                hops = hops + 1 if hinted else 0
                if not hinted:
                    self._cluster.mark_stale(tp.topic)
                if not hinted or hops > _LEADER_HOPS_MAX:
                    self._sleep(backoff_s)  # an election: let it finish

    def call_controller(self, rpc: str, request: Any, *, concerning: str) -> Any:
        """Send `rpc` (a "Service.Method" name) to any reachable node, following
        NOT_CONTROLLER hints (module docstring); the transactional Producer's coordinator
        calls go this way too.

        While the metadata quorum elects a controller (NOT_CONTROLLER with no hint) the
        request waits `retry_backoff_ms` and tries again, for up to one request timeout: a
        NOT_CONTROLLER answer means nothing was done, so a retry is always safe.
        """
        deadline = self._clock() + self._request_timeout_ms / 1000
        backoff_s = self._retry_backoff_ms / 1000
        candidates = self._cluster.addresses()
        queue = deque(candidates)
        failures: list[ClientError] = []
        unreachable: set[str] = set()
        hops = 0
        while queue:
            address = queue.popleft()
            try:
                response = self._cluster.call(address, rpc, request)
            except ClientError as error:
                if not error.retriable:
                    raise
                failures.append(error)
                unreachable.add(address)
                if not queue and self._clock() + backoff_s < deadline:
                    # Every address failed this round (a controller that just died is still
                    # named by the survivors until they elect another): wait and go again.
                    self._sleep(backoff_s)
                    queue.extend(
                        a
                        for a in candidates
                        if a not in unreachable or len(unreachable) == len(candidates)
                    )
                    unreachable.clear()
                continue
            if response.error.code == pb.NONE:
                return response
            refusal = server_error(response.error, concerning=f"{concerning} at {address}")
            target = self._controller_address(refusal)
            if target is not None and target != address and target in unreachable:
                # The named controller failed to connect a moment ago (it may still be
                # starting, or be dead and about to be replaced): wait, then try it again.
                if self._clock() + backoff_s >= deadline:
                    raise refusal
                self._sleep(backoff_s)
                unreachable.discard(target)
            if target is not None and target != address:
                hops += 1
                if hops > _CONTROLLER_HOPS_MAX:
                    # Hints keep moving (elections): slow down rather than give up.
                    if self._clock() + backoff_s >= deadline:
                        raise refusal
                    self._sleep(backoff_s)
                queue.appendleft(target)
            elif isinstance(refusal, NotControllerError) and self._clock() + backoff_s < deadline:
                self._sleep(backoff_s)  # an election is under way
                queue.appendleft(address)
            else:
                raise refusal
        raise NoNodeAnsweredError(concerning, failures, addresses=candidates)

    def _controller_address(self, error: ClientError) -> str | None:
        if not isinstance(error, NotControllerError):
            return None
        if error.leader_address:
            return error.leader_address
        if error.leader_id is not None:
            return self._cluster.node_address(error.leader_id)
        return None

    def close(self) -> None:
        self._cluster.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _require_name(name: object) -> None:
    if not isinstance(name, str) or not name:
        raise ClientError(f"a topic name must be a non-empty string, got {name!r}")
