"""Metadata: brokers are the nodes' registered Kafka listeners, each partition's leader is
its Raft leader as reported to the metadata quorum, and its leader epoch is that leader's
Raft term (KIP-320), so a client fences stale leaders by the same number Raft does.

Answers come from this node's copy of the metadata, once it has caught up since the node
started (`raftlog.metadata.catch_up`, as the gRPC Metadata call): before that a topic
created while the node was down would look unknown, so every topic asked is answered with
the retriable LEADER_NOT_AVAILABLE instead.
"""

from __future__ import annotations

import base64
import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from raftlog.metadata import MetadataState
from raftlog.rpc.kafka.context import KafkaContext
from raftlog.rpc.kafka.schema import NO_THROTTLE, build, response_module
from raftlog.rpc.security import Permission

__all__ = ["DESCRIBE_CLUSTER", "METADATA", "describe_cluster", "metadata", "topic_uuid"]

METADATA = 3
_NO_TOPIC_ID = uuid.UUID(int=0)


def topic_uuid(topic_id: str) -> uuid.UUID:
    """raftlog's topic id (16 bytes, URL-safe base64 without padding) as Kafka's UUID."""
    raw = base64.urlsafe_b64decode(topic_id + "=" * (-len(topic_id) % 4))
    return uuid.UUID(bytes=raw) if len(raw) == 16 else _NO_TOPIC_ID


async def metadata(ctx: KafkaContext, request: Any, version: int) -> Any:
    """Metadata v1 to v12: the live brokers, the controller and the topics asked for by name or
    (v10+) id, or every topic the principal may read when none are named. Reads the node port's
    metadata copy after `wait_metadata_caught_up`; answers UNKNOWN_TOPIC_OR_PARTITION for unknown
    topics (never creates them), TOPIC_AUTHORIZATION_FAILED without read permission,
    LEADER_NOT_AVAILABLE per topic before catch-up and per partition without a leader."""
    module = response_module(METADATA, version)
    caught_up = await ctx.node.wait_metadata_caught_up()
    state = ctx.node.metadata.state
    if request.topics is None:
        names = [t.name for t in state.topics() if ctx.allowed(Permission.READ, t.name)]
        names = names if caught_up else []
    else:
        names = [_requested_name(state, t) for t in request.topics]
    controller = ctx.node.controller_id
    return build(
        module.MetadataResponse,
        throttle_time=NO_THROTTLE,
        brokers=tuple(
            build(module.MetadataResponseBroker, node_id=node, host=host, port=port, rack=None)
            for node, host, port in ctx.brokers()
        ),
        cluster_id=state.cluster_id,
        controller_id=-1 if controller is None else int(controller),
        topics=tuple(
            _topic(module, state, name, caught_up=caught_up)
            if ctx.allowed(Permission.READ, name)
            else _refused_topic(module, name, ErrorCode.topic_authorization_failed)
            for name in names
        ),
        cluster_authorized_operations=-(2**31),
    )


def _requested_name(state: MetadataState, requested: Any) -> str:
    name = getattr(requested, "name", None)
    if name is not None:
        return str(name)
    wanted = getattr(requested, "topic_id", None)
    found = next((t.name for t in state.topics() if topic_uuid(t.topic_id) == wanted), None)
    return "" if found is None else found


def _refused_topic(module: Any, name: str, code: ErrorCode) -> Any:
    return build(
        module.MetadataResponseTopic,
        error_code=code,
        name=name,
        topic_id=_NO_TOPIC_ID,
        is_internal=False,
        partitions=(),
    )


def _topic(module: Any, state: MetadataState, name: str, *, caught_up: bool) -> Any:
    topic = state.topic(name) if caught_up else None
    if topic is None:
        code = ErrorCode.unknown_topic_or_partition if caught_up else ErrorCode.leader_not_available
        return _refused_topic(module, name, code)
    partitions = tuple(
        build(
            module.MetadataResponsePartition,
            error_code=ErrorCode.none
            if p.leader_id is not None
            else ErrorCode.leader_not_available,
            partition_index=int(p.partition),
            leader_id=-1 if p.leader_id is None else int(p.leader_id),
            leader_epoch=max(p.leader_epoch, -1),
            replica_nodes=tuple(int(r) for r in p.replicas),
            # Raft has no ISR: every replica of the group's membership may become leader
            # once it holds every committed entry, so all of them are listed.
            isr_nodes=tuple(int(r) for r in p.replicas),
            offline_replicas=tuple(
                int(r) for r in p.replicas if (n := state.node(r)) is None or not n.alive
            ),
        )
        for p in state.partitions(name)
    )
    return build(
        module.MetadataResponseTopic,
        error_code=ErrorCode.none,
        name=name,
        topic_id=topic_uuid(topic.topic_id),
        is_internal=False,
        partitions=partitions,
    )


DESCRIBE_CLUSTER = 60


async def describe_cluster(ctx: KafkaContext, request: Any, version: int) -> Any:
    """The nodes' Kafka listeners and the controller (the metadata quorum's leader)."""
    module = response_module(DESCRIBE_CLUSTER, version)
    caught_up = await ctx.node.wait_metadata_caught_up()
    controller = ctx.node.controller_id
    return build(
        module.DescribeClusterResponse,
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none if caught_up else ErrorCode.not_controller,
        error_message=None if caught_up else "this node's metadata has not caught up yet",
        endpoint_type=1,  # brokers
        cluster_id=ctx.node.metadata.state.cluster_id,
        controller_id=-1 if controller is None else int(controller),
        brokers=tuple(
            build(module.DescribeClusterBroker, broker_id=node, host=host, port=port, rack=None)
            for node, host, port in ctx.brokers()
        ),
        cluster_authorized_operations=-(2**31),
    )
