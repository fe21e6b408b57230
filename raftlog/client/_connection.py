"""The client's view of the cluster: bootstrap list, metadata cache, leader routing, channels.

Theory of operation. A client starts from a bootstrap list of `host:port` addresses. Before
it can route a produce or a fetch it asks any reachable node for Metadata (topics, partition
leaders, node addresses) and caches the answer. Requests for a partition go to its leader's
address. When a server answers NOT_LEADER it usually names the new leader (`leader_id`,
`leader_address`): `apply_leader_hint` records it so the retry goes straight there; without
a hint the topic is marked stale and the next lookup refreshes metadata. Metadata older than
`metadata_max_age_ms` is refreshed too.

This module is the only one in the client that touches gRPC: channels live in a bounded pool
(least recently used closed first) and every transport failure becomes a `ClientError` that
names the address and the operation. All methods are thread-safe: the producer's sender
thread and the caller's threads share one `Cluster`; the lock guards the cache and the pool,
never a network call.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, NamedTuple

import grpc

from raftlog.client._auth import bearer_metadata
from raftlog.client.config import ConnectionConfig
from raftlog.client.errors import (
    ClientClosedError,
    ClientError,
    ConnectionFailedError,
    NoNodeAnsweredError,
    RequestTimedOutError,
    ServerError,
    UnknownTopicOrPartitionError,
    server_error,
)
from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.rpc.v1 import raftlog_pb2_grpc as pb_grpc
from raftlog.tls import diagnose_tls_refusal, grpc_channel_credentials

__all__ = [
    "Cluster",
    "ClusterMetadata",
    "ConnectionOptions",
    "PartitionMetadata",
    "TopicPartition",
    "parse_bootstrap",
    "translate_rpc_error",
]

Clock = Callable[[], float]


class TopicPartition(NamedTuple):
    """A partition of a topic; equal to the plain tuple `(topic, partition)`."""

    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    partition: int
    leader_id: int | None
    leader_epoch: int
    replicas: tuple[int, ...]
    high_watermark: int
    log_start_offset: int


@dataclass(frozen=True, slots=True)
class ClusterMetadata:
    """One Metadata answer: node addresses and, per topic, its partitions in id order."""

    cluster_id: str
    controller_id: int | None
    nodes: dict[int, str]
    topics: dict[str, tuple[PartitionMetadata, ...]]


def parse_bootstrap(bootstrap: str | Sequence[str]) -> tuple[str, ...]:
    """`"h1:p1,h2:p2"` or a list of addresses, checked and deduplicated in order."""
    items = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
    addresses: list[str] = []
    for item in (entry.strip() for entry in items):
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ClientError(f"bootstrap address {item!r} is not host:port (in {bootstrap!r})")
        if item not in addresses:
            addresses.append(item)
    if not addresses:
        raise ClientError(f"bootstrap list {bootstrap!r} names no address")
    assert len(set(addresses)) == len(addresses)
    return tuple(addresses)


def partition_metadata(info: pb.PartitionInfo) -> PartitionMetadata:
    return PartitionMetadata(
        partition=info.partition,
        leader_id=info.leader_id if info.leader_id >= 0 else None,
        leader_epoch=info.leader_epoch,
        replicas=tuple(info.replicas),
        high_watermark=info.high_watermark,
        log_start_offset=info.log_start_offset,
    )


def cluster_metadata(response: pb.MetadataResponse, *, address: str) -> ClusterMetadata:
    """The cache's form of a Metadata answer; partitions are indexed by their id."""
    topics: dict[str, tuple[PartitionMetadata, ...]] = {}
    for topic in response.topics:
        partitions = tuple(
            partition_metadata(p) for p in sorted(topic.partitions, key=lambda p: p.partition)
        )
        # Routing indexes partitions by id, so ids must be exactly 0..n-1.
        if [p.partition for p in partitions] != list(range(len(partitions))):
            raise ServerError(
                "INVALID_RESPONSE",
                f"partition ids {[p.partition for p in partitions]} are not 0..n-1",
                concerning=f"metadata of topic {topic.name!r} from {address}",
            )
        topics[topic.name] = partitions
    return ClusterMetadata(
        cluster_id=response.cluster_id,
        controller_id=response.controller_id if response.controller_id >= 0 else None,
        nodes={node.node_id: node.address for node in response.nodes},
        topics=topics,
    )


def translate_rpc_error(
    error: grpc.RpcError, *, address: str, operation: str, timeout_ms: int
) -> ClientError:
    """A gRPC failure as a client error naming `address` and `operation`."""
    code = error.code() if hasattr(error, "code") else None
    details = error.details() if hasattr(error, "details") else str(error)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return RequestTimedOutError(operation, address=address, timeout_ms=timeout_ms)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, None):
        return ConnectionFailedError(address, _short_reason(details), operation=operation)
    name = code.name if code is not None else "UNKNOWN"
    return ServerError(name, details or "", concerning=f"{operation} to {address}")


def _short_reason(details: str | None) -> str:
    # gRPC's text for a refused connection repeats the address several times; keep the cause.
    text = details or "unavailable"
    _, marker, cause = text.rpartition("remote host: ")
    return cause if marker else text


# RPCs a caller may send as request bytes it serialized itself: a produce request carries a
# megabyte of batch, and building a ProduceRequest around it and serializing that costs two
# more copies plus the protobuf arena's fresh pages, where joining the serialized fields
# costs one copy.
# name -> (gRPC method path, response parser)
_SERIALIZED_RPCS: dict[str, tuple[str, Callable[[bytes], Any]]] = {
    "Log.Produce": ("/raftlog.v1.Log/Produce", pb.ProduceResponse.FromString),
}


class _Channel:
    """One gRPC channel with the stubs of both services."""

    def __init__(
        self,
        address: str,
        config: ConnectionConfig,
        credentials: grpc.ChannelCredentials | None = None,  # TLS
    ) -> None:
        options = [
            ("grpc.max_receive_message_length", config.message_bytes_max),
            ("grpc.max_send_message_length", config.message_bytes_max),
            ("grpc.initial_reconnect_backoff_ms", config.reconnect_backoff_ms_min),
            ("grpc.min_reconnect_backoff_ms", config.reconnect_backoff_ms_min),
            ("grpc.max_reconnect_backoff_ms", config.reconnect_backoff_ms_max),
        ]
        # TLS when the client was given tls_ca=.
        if credentials is not None:
            self.channel = grpc.secure_channel(address, credentials, options=options)
        else:
            self.channel = grpc.insecure_channel(address, options=options)
        # The generated stubs are untyped; calls through them return protobuf messages.
        self.log: Any = pb_grpc.LogStub(self.channel)  # type: ignore[no-untyped-call]
        self.admin: Any = pb_grpc.AdminStub(self.channel)  # type: ignore[no-untyped-call]
        # Produce with a request already serialized by the caller (see `_SERIALIZED_RPCS`).
        self.serialized: dict[str, Any] = {
            name: self.channel.unary_unary(
                path, request_serializer=None, response_deserializer=parse, _registered_method=True
            )
            for name, (path, parse) in _SERIALIZED_RPCS.items()
        }

    def method(self, name: str, *, serialized: bool = False) -> Any:
        if serialized:
            return self.serialized[name]
        service, _, rpc = name.partition(".")
        stub = self.log if service == "Log" else self.admin
        return getattr(stub, rpc)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionOptions:
    """The keywords every client (Producer, Consumer, Admin) takes to reach the cluster.

    Each client's constructor lists them itself, under these names and with these defaults
    (its public signature, pinned by a test), and hands them over in one step:
    `ConnectionOptions.from_arguments(locals())`.
    """

    request_timeout_ms: int = 30_000
    retry_backoff_ms: int = 100
    metadata_max_age_ms: int = 300_000
    clock: Clock = time.monotonic
    tls_ca: str | os.PathLike[str] | None = None  # TLS, trusting this CA
    token: str | None = None  # bearer token (docs/security.md)
    tls_cert: str | os.PathLike[str] | None = None  # client certificate (mTLS)
    tls_key: str | os.PathLike[str] | None = None  # its private key

    @classmethod
    def from_arguments(cls, arguments: Mapping[str, Any]) -> ConnectionOptions:
        """The options among a client constructor's arguments (its `locals()`)."""
        return cls(**{option.name: arguments[option.name] for option in fields(cls)})

    @property
    def config(self) -> ConnectionConfig:
        return ConnectionConfig(
            request_timeout_ms=self.request_timeout_ms,
            retry_backoff_ms=self.retry_backoff_ms,
            metadata_max_age_ms=self.metadata_max_age_ms,
        ).validate()

    def connect(self, bootstrap: str | Sequence[str]) -> Cluster:
        """A `Cluster` for `bootstrap` with these options (no request is made yet)."""
        return Cluster(
            bootstrap,
            self.config,
            clock=self.clock,
            tls_ca=self.tls_ca,
            token=self.token,
            tls_cert=self.tls_cert,
            tls_key=self.tls_key,
        )


class Cluster:
    """Metadata cache, leader routing and the channel pool of one client."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        config: ConnectionConfig,
        *,
        clock: Clock = time.monotonic,
        tls_ca: str | os.PathLike[str] | None = None,
        token: str | None = None,
        tls_cert: str | os.PathLike[str] | None = None,
        tls_key: str | os.PathLike[str] | None = None,
    ) -> None:
        self.bootstrap = parse_bootstrap(bootstrap)
        # TLS trusting `tls_ca`, a client certificate for nodes that
        # require one (mutual TLS), and a bearer token on every call
        self._tls = tls_ca is not None or tls_cert is not None
        self._tls_ca, self._tls_cert, self._tls_key = (
            None if f is None else Path(f) for f in (tls_ca, tls_cert, tls_key)
        )
        self._credentials = (
            grpc_channel_credentials(self._tls_ca, cert=self._tls_cert, key=self._tls_key)
            if self._tls
            else None
        )
        self._call_metadata = bearer_metadata(token)
        self.config = config.validate()
        self._clock = clock
        self._lock = threading.Lock()
        self._channels: OrderedDict[str, _Channel] = OrderedDict()
        self._metadata = ClusterMetadata("", None, {}, {})
        self._fetched_at: dict[str, float] = {}
        self._stale: set[str] = set()
        # topic -> (its partitions as routing keys, until when they are fresh): read without
        # the lock by `topic_partitions`, on every send(); written and dropped under it.
        self._routes: dict[str, tuple[tuple[TopicPartition, ...], float]] = {}
        self._next_address = 0
        self._closed = False

    # -- calls -------------------------------------------------------------------------------

    def call(self, address: str, rpc: str, request: Any, *, timeout_ms: int | None = None) -> Any:
        """Send `request` to `rpc` ("Log.Fetch") at `address` and wait for the answer."""
        timeout_ms = self.config.request_timeout_ms if timeout_ms is None else timeout_ms
        assert timeout_ms > 0, timeout_ms
        method = self._channel(address).method(rpc)
        try:
            return method(request, timeout=timeout_ms / 1000, metadata=self._call_metadata)
        except grpc.RpcError as error:
            raise self._explained(
                translate_rpc_error(error, address=address, operation=rpc, timeout_ms=timeout_ms)
            ) from None

    def call_future(self, address: str, rpc: str, request: Any, *, timeout_ms: int) -> Any:
        """Start `rpc` at `address`; the grpc future's errors go through translate_rpc_error.

        `request` is a message, or for an RPC of `_SERIALIZED_RPCS` its serialized bytes.
        """
        assert timeout_ms > 0, timeout_ms
        serialized = isinstance(request, bytes)
        assert not serialized or rpc in _SERIALIZED_RPCS, rpc
        return (
            self._channel(address)
            .method(rpc, serialized=serialized)
            .future(request, timeout=timeout_ms / 1000, metadata=self._call_metadata)
        )

    def result(self, future: Any, *, address: str, rpc: str, timeout_ms: int) -> Any:
        """The answer of a `call_future` (waiting for it), or its failure as a `ClientError`."""
        try:
            return future.result()
        except grpc.RpcError as error:
            raise self._explained(
                translate_rpc_error(error, address=address, operation=rpc, timeout_ms=timeout_ms)
            ) from None
        except grpc.FutureCancelledError:
            raise ConnectionFailedError(address, "call cancelled", operation=rpc) from None

    def _explained(self, error: ClientError) -> ClientError:
        """A node that refuses this client's TLS certificate (or its lack of one)
        just closes the connection; say so instead of a bare "Socket closed"."""
        if not self._tls or type(error) is not ConnectionFailedError:
            return error
        # A short probe: this runs on a failure path, possibly on a producer's sender thread.
        reason = diagnose_tls_refusal(
            error.address, ca=self._tls_ca, cert=self._tls_cert, key=self._tls_key, timeout_s=1.0
        )
        if reason is None:
            return error
        return ConnectionFailedError(error.address, reason, operation=error.operation)

    def _channel(self, address: str) -> _Channel:
        with self._lock:
            if self._closed:
                raise ClientClosedError(f"client closed: cannot reach {address}")
            channel = self._channels.get(address)
            if channel is None:
                channel = _Channel(address, self.config, self._credentials)
                self._channels[address] = channel
            self._channels.move_to_end(address)
            evicted = []
            while len(self._channels) > self.config.channels_max:
                evicted.append(self._channels.popitem(last=False)[1])
            assert len(self._channels) <= self.config.channels_max
        for old in evicted:
            old.channel.close()
        return channel

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels = list(self._channels.values())
            self._channels.clear()
        for channel in channels:
            channel.channel.close()

    # -- metadata ----------------------------------------------------------------------------

    def addresses(self) -> list[str]:
        """Known node addresses then bootstrap ones, rotated so load and failures spread."""
        with self._lock:
            known = [a for a in self._metadata.nodes.values() if a]
            candidates = list(dict.fromkeys([*known, *self.bootstrap]))
            start = self._next_address % len(candidates)
            self._next_address += 1
        rotated = candidates[start:] + candidates[:start]
        assert rotated and len(rotated) == len(candidates)
        return rotated

    def refresh_metadata(self, topics: Sequence[str] = ()) -> ClusterMetadata:
        """Ask nodes in turn for Metadata of `topics` (all when empty) and cache the answer."""
        failures: list[ClientError] = []
        request = pb.MetadataRequest(topics=list(topics))
        candidates = self.addresses()
        for address in candidates:
            try:
                response = self.call(address, "Log.Metadata", request)
            except ClientClosedError:
                raise
            except ClientError as error:
                failures.append(error)  # try the next node
                continue
            if response.error.code != pb.NONE:
                failures.append(server_error(response.error, concerning=f"metadata from {address}"))
                continue
            return self._store(cluster_metadata(response, address=address), topics)
        assert len(failures) == len(candidates)
        operation = "metadata" + (f" of topic(s) {', '.join(map(repr, topics))}" if topics else "")
        raise NoNodeAnsweredError(operation, failures, addresses=candidates)

    def _store(self, fresh: ClusterMetadata, topics: Sequence[str]) -> ClusterMetadata:
        now = self._clock()
        with self._lock:
            merged_topics = dict(self._metadata.topics) if topics else {}
            merged_topics.update(fresh.topics)
            for name in topics:
                if name not in fresh.topics:
                    merged_topics.pop(name, None)
            nodes = {**self._metadata.nodes, **fresh.nodes}
            self._metadata = replace(fresh, nodes=nodes, topics=merged_topics)
            for name in fresh.topics:
                self._fetched_at[name] = now
                self._stale.discard(name)
            self._routes.clear()  # rebuilt on the next send from the answer just stored
            return self._metadata

    def topic(self, topic: str) -> tuple[PartitionMetadata, ...]:
        """The partitions of `topic`, refreshing metadata when missing, stale or old."""
        with self._lock:
            partitions = self._metadata.topics.get(topic)
            age_s = self._clock() - self._fetched_at.get(topic, float("-inf"))
            fresh = topic not in self._stale and age_s * 1000 < self.config.metadata_max_age_ms
        if partitions is None or not fresh:
            partitions = self.refresh_metadata([topic]).topics.get(topic)
        if not partitions:
            raise UnknownTopicOrPartitionError(
                "UNKNOWN_TOPIC_OR_PARTITION",
                "the cluster's metadata has no such topic",
                concerning=f"topic {topic!r}",
                retriable=True,
            )
        return partitions

    def cached_topic_partitions(self, topic: str) -> tuple[TopicPartition, ...] | None:
        """`topic_partitions(topic)` while the cached answer is fresh, else None.

        The producer asks on every send(): this reads one dict entry and the clock, without
        the lock (a dict read is atomic under the GIL, and a route is dropped under the lock
        whenever its topic goes stale or metadata arrives).
        """
        route = self._routes.get(topic)
        if route is not None and self._clock() < route[1]:
            return route[0]
        return None

    def topic_partitions(self, topic: str) -> tuple[TopicPartition, ...]:
        """The partitions of `topic` as routing keys (as `topic`, refreshing when needed)."""
        cached = self.cached_topic_partitions(topic)
        if cached is not None:
            return cached
        partitions = self.topic(topic)
        routes = tuple(TopicPartition(topic, p) for p in range(len(partitions)))
        with self._lock:
            # Cached only if nothing changed since `topic` answered: a route never outlives
            # the metadata it was built from.
            if self._metadata.topics.get(topic) is partitions and topic not in self._stale:
                fresh_until = self._fetched_at[topic] + self.config.metadata_max_age_ms / 1000
                self._routes[topic] = (routes, fresh_until)
        assert len(routes) == len(partitions) > 0
        return routes

    def leader_address(self, tp: TopicPartition) -> str:
        """The client address of `tp`'s leader (refreshing metadata once if it is unknown)."""
        for attempt in range(2):
            partitions = self.topic(tp.topic)
            if tp.partition >= len(partitions) or tp.partition < 0:
                raise UnknownTopicOrPartitionError(
                    "UNKNOWN_TOPIC_OR_PARTITION",
                    f"topic has {len(partitions)} partitions",
                    concerning=f"{tp.topic}/{tp.partition}",
                    retriable=True,
                )
            leader = partitions[tp.partition].leader_id
            with self._lock:
                address = self._metadata.nodes.get(leader) if leader is not None else None
            if address:
                return address
            if attempt == 0:
                self.mark_stale(tp.topic)
        raise ServerError(
            "LEADER_NOT_AVAILABLE",
            "no leader known (an election may be under way)",
            concerning=f"{tp.topic}/{tp.partition}",
            retriable=True,
        )

    def node_address(self, node_id: int) -> str | None:
        """The client address of `node_id`, asking the cluster once if it is not known."""
        with self._lock:
            address = self._metadata.nodes.get(node_id)
        if not address:
            address = self.refresh_metadata(list(self._metadata.topics)).nodes.get(node_id)
        return address or None

    def mark_stale(self, topic: str) -> None:
        with self._lock:
            self._mark_stale_locked(topic)

    def _mark_stale_locked(self, topic: str) -> None:
        self._stale.add(topic)
        self._routes.pop(topic, None)

    def apply_leader_hint(
        self, tp: TopicPartition, leader_id: int | None, leader_address: str | None
    ) -> None:
        """Record a NOT_LEADER hint; without a usable one the topic's metadata goes stale."""
        with self._lock:
            partitions = self._metadata.topics.get(tp.topic)
            usable = (
                leader_id is not None and partitions is not None and tp.partition < len(partitions)
            )
            if not usable or partitions is None or leader_id is None:
                self._mark_stale_locked(tp.topic)
                return
            nodes = dict(self._metadata.nodes)
            if leader_address:
                nodes[leader_id] = leader_address
            elif leader_id not in nodes:
                self._mark_stale_locked(tp.topic)
            updated = list(partitions)
            updated[tp.partition] = replace(updated[tp.partition], leader_id=leader_id)
            topics = {**self._metadata.topics, tp.topic: tuple(updated)}
            self._metadata = replace(self._metadata, nodes=nodes, topics=topics)
            assert self._metadata.topics[tp.topic][tp.partition].leader_id == leader_id
