"""Metadata: brokers are the nodes' registered Kafka listeners, each partition's leader is
its Raft leader as reported to the metadata quorum, and its leader epoch is that leader's
Raft term (KIP-320), so a client fences stale leaders by the same number Raft does.

Answers come from this node's copy of the metadata, once it has caught up since the node
started (`raftlog.metadata.catch_up`, as the gRPC Metadata call): before that a topic
created while the node was down would look unknown, so every topic asked is answered with
the retriable LEADER_NOT_AVAILABLE instead.

A topic asked by a name Kafka refuses gets INVALID_TOPIC_EXCEPTION; an unknown topic is
created when the node auto-creates topics and the request allows it (`auto_create`),
answered LEADER_NOT_AVAILABLE meanwhile, else UNKNOWN_TOPIC_OR_PARTITION. Asked for them,
the principal's authorized operations on each topic and on the cluster are answered from its
grants (`auth.Session`, KIP-430).
"""

from __future__ import annotations

import base64
import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from raftlog.metadata import MetadataState, check_new_topic_name
from raftlog.metadata.commands import check_topic_name
from raftlog.rpc.kafka.auth import OPERATIONS_NOT_ASKED
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
    metadata copy after `wait_metadata_caught_up`; answers INVALID_TOPIC_EXCEPTION for a name
    Kafka refuses, UNKNOWN_TOPIC_OR_PARTITION for an unknown topic (LEADER_NOT_AVAILABLE while
    it is auto-created), TOPIC_AUTHORIZATION_FAILED without read permission (or, to
    auto-create, admin), LEADER_NOT_AVAILABLE per topic before catch-up and per partition
    without a leader; the authorized operations (v8+) when asked."""
    module = response_module(METADATA, version)
    caught_up = await ctx.node.wait_metadata_caught_up()
    state = ctx.node.metadata.state
    names: list[str | uuid.UUID]
    if request.topics is None:
        names = [t.name for t in state.topics() if ctx.allowed(Permission.READ, t.name)]
        names = names if caught_up else []
    else:
        names = [_requested_name(state, t) for t in request.topics]
    # Before v4 a request could not refuse auto-creation: Kafka creates for it.
    may_create = getattr(request, "allow_auto_topic_creation", True)
    topic_operations = getattr(request, "include_topic_authorized_operations", False)
    cluster_operations = getattr(request, "include_cluster_authorized_operations", False)
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
            _answer(
                ctx,
                module,
                state,
                name,
                caught_up=caught_up,
                may_create=may_create,
                operations_asked=topic_operations,
            )
            for name in names
        ),
        cluster_authorized_operations=ctx.session.cluster_operations()
        if cluster_operations
        else OPERATIONS_NOT_ASKED,
    )


def _requested_name(state: MetadataState, requested: Any) -> str | uuid.UUID:
    """The name of a topic asked for by name or (v10+) id; the id itself if no topic has it."""
    name = getattr(requested, "name", None)
    if name is not None:
        return str(name)
    wanted = getattr(requested, "topic_id", None) or _NO_TOPIC_ID
    found = next((t.name for t in state.topics() if topic_uuid(t.topic_id) == wanted), None)
    return wanted if found is None else found


def _answer(
    ctx: KafkaContext,
    module: Any,
    state: MetadataState,
    name: str | uuid.UUID,
    *,
    caught_up: bool,
    may_create: bool,
    operations_asked: bool,
) -> Any:
    """The answer for one topic asked for (`name`, or the id no topic has)."""
    if isinstance(name, uuid.UUID):
        return _unknown_id(module, name)
    if not ctx.allowed(Permission.READ, name):
        return _refused_topic(module, name, ErrorCode.topic_authorization_failed)
    operations = ctx.session.topic_operations(name) if operations_asked else OPERATIONS_NOT_ASKED
    return _topic(
        ctx, module, state, name, caught_up=caught_up, may_create=may_create, operations=operations
    )


def _unknown_id(module: Any, topic_id: uuid.UUID) -> Any:
    return build(
        module.MetadataResponseTopic,
        error_code=ErrorCode.unknown_topic_id,
        name=None,
        topic_id=topic_id,
        is_internal=False,
        partitions=(),
    )


def _refused_topic(
    module: Any, name: str, code: ErrorCode, operations: int = OPERATIONS_NOT_ASKED
) -> Any:
    return build(
        module.MetadataResponseTopic,
        error_code=code,
        name=name,
        topic_id=_NO_TOPIC_ID,
        is_internal=False,
        partitions=(),
        topic_authorized_operations=operations,
    )


def _unknown_topic(
    ctx: KafkaContext, state: MetadataState, name: str, may_create: bool
) -> ErrorCode:
    """The answer for topic `name`, unknown to a caught-up copy, as Kafka's broker gives it: an
    invalid name is INVALID_TOPIC_EXCEPTION, an auto-created topic LEADER_NOT_AVAILABLE."""
    if check_topic_name(name) is not None:
        return ErrorCode.invalid_topic_exception
    if not (may_create and ctx.auto_topics.enabled):
        return ErrorCode.unknown_topic_or_partition
    if check_new_topic_name(state, name) is not None:
        return ErrorCode.invalid_topic_exception  # it collides with an existing topic's name
    if not ctx.allowed(Permission.ADMIN, name):
        return ErrorCode.topic_authorization_failed
    ctx.auto_topics.create_nowait(name, live_nodes=sum(1 for n in state.nodes() if n.alive))
    return ErrorCode.leader_not_available


def _topic(
    ctx: KafkaContext,
    module: Any,
    state: MetadataState,
    name: str,
    *,
    caught_up: bool,
    may_create: bool,
    operations: int,
) -> Any:
    topic = state.topic(name) if caught_up else None
    if topic is None:
        code = (
            _unknown_topic(ctx, state, name, may_create)
            if caught_up
            else ErrorCode.leader_not_available
        )
        return _refused_topic(module, name, code, operations)
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
        topic_authorized_operations=operations,
    )


DESCRIBE_CLUSTER = 60


async def describe_cluster(ctx: KafkaContext, request: Any, version: int) -> Any:
    """The nodes' Kafka listeners and the controller (the metadata quorum's leader); the
    principal's authorized operations on the cluster when asked."""
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
        cluster_authorized_operations=ctx.session.cluster_operations()
        if request.include_cluster_authorized_operations
        else OPERATIONS_NOT_ASKED,
    )
