"""CreateTopics, DeleteTopics, CreatePartitions and DeleteRecords: the broker's admin calls
(topic configs: `config_handlers`).

Writes go to the controller, as through the gRPC Admin service: a node that is not the
controller answers NOT_CONTROLLER, and Kafka's admin clients refresh metadata (which names
the controller) and retry there. `validate_only` runs the controller's own planning
(`plan_create_topic`, `plan_create_partitions`: pure functions of the metadata state) and
commits nothing. Manual replica assignments are taken as Kafka takes them: the first replica
of each partition is its preferred leader.

The topics of a CreateTopics or CreatePartitions request are handled concurrently, as Kafka's
controller handles them: each waits for its new partitions' leaders, so one after another a
request for 100 topics took 100 such waits and ran past the client's timeout (librdkafka's
0045_subscribe_many_updates). The controller still plans them one at a time, so the outcome
is the same in either order. DeleteTopics deletes one topic after another: a delete is one
metadata commit with no wait for leaders, and a request's hundred deletes at once would
overrun the metadata group's proposals_max (NOT_ENOUGH_REPLICAS for the excess).

DeleteRecords goes to each partition's leader, as in Kafka, which checks the offset against
its high watermark and commits the new log start to the metadata quorum (one command for the
request's partitions, `NodePort.delete_records`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any

from kio.schema.errors import ErrorCode

from raftlog import errors
from raftlog.metadata import (
    ApplyResult,
    CreateTopicRequest,
    plan_create_partitions,
    plan_create_topic,
)
from raftlog.rpc.kafka.cluster_handlers import topic_uuid
from raftlog.rpc.kafka.config_handlers import topic_configs
from raftlog.rpc.kafka.context import KafkaContext
from raftlog.rpc.kafka.errors import kafka_error, metadata_result_error
from raftlog.rpc.kafka.schema import NO_THROTTLE, build, response_module, timedelta_ms
from raftlog.rpc.security import Permission
from raftlog.types import NodeId

__all__ = [
    "CREATE_PARTITIONS",
    "CREATE_TOPICS",
    "DELETE_RECORDS",
    "DELETE_TOPICS",
    "create_partitions",
    "create_topics",
    "delete_records",
    "delete_topics",
]

CREATE_TOPICS, DELETE_TOPICS, DELETE_RECORDS, CREATE_PARTITIONS = 19, 20, 21, 37
_TIMEOUT_MS_DEFAULT = 30_000

Outcome = tuple[ErrorCode, str | None]


async def _admin_call(call: Awaitable[ApplyResult]) -> Outcome:
    """Await a controller write; map its result or error onto (code, message)."""
    try:
        result = await call
    except errors.ProposalDroppedError as error:
        # Written nowhere (not proposed, or replaced by a new leader's entry). Kafka's admin
        # clients retry NOT_CONTROLLER after a metadata refresh; NOT_ENOUGH_REPLICAS, what a
        # dropped produce gets, would end their call.
        return ErrorCode.not_controller, str(error)
    except errors.RaftlogError as error:
        return kafka_error(error), str(error)
    except TimeoutError:
        return ErrorCode.request_timed_out, "not committed in time; it may still be"
    return _result(result)


def _result(result: ApplyResult) -> Outcome:
    if result.ok:
        return ErrorCode.none, None
    return metadata_result_error(result.code), f"{result.code.value}: {result.message}"


def _timeout_s(ctx: KafkaContext, request: Any) -> float:
    timeout_ms = timedelta_ms(request.timeout)
    if timeout_ms <= 0:
        timeout_ms = _TIMEOUT_MS_DEFAULT
    return min(timeout_ms, ctx.config.produce_timeout_ms_max) / 1000


async def create_topics(ctx: KafkaContext, request: Any, version: int) -> Any:
    """CreateTopics v2 to v7: creates each topic through the node port's `create_topic` (the
    controller, which plans concurrent creates one after another), defaulting -1 partitions to
    `kafka.num_partitions` and a -1 replication factor to `kafka.default_replication_factor`,
    at most the live nodes (KIP-464); `validate_only` only plans. Per topic it answers
    INVALID_REPLICA_ASSIGNMENT for manual assignments, TOPIC_AUTHORIZATION_FAILED without admin
    permission, NOT_CONTROLLER off the controller, REQUEST_TIMED_OUT, or the metadata result's
    code (TOPIC_ALREADY_EXISTS, INVALID_TOPIC_EXCEPTION, INVALID_PARTITIONS, INVALID_CONFIG...)."""
    module = response_module(CREATE_TOPICS, version)
    outcomes = await asyncio.gather(*(_create_topic(ctx, request, t) for t in request.topics))
    results = tuple(
        _created(ctx, module, topic.name, code, message)
        for topic, (code, message) in zip(request.topics, outcomes, strict=True)
    )
    return build(module.CreateTopicsResponse, throttle_time=NO_THROTTLE, topics=results)


async def _create_topic(ctx: KafkaContext, request: Any, topic: Any) -> Outcome:
    if not ctx.allowed(Permission.ADMIN, topic.name):
        return ErrorCode.topic_authorization_failed, f"no admin permission on {topic.name}"
    assignments = None
    if topic.assignments:
        if topic.num_partitions != -1 or topic.replication_factor != -1:
            return ErrorCode.invalid_request, (
                "both num_partitions or replication_factor and assignments were set; "
                "both cannot be used at the same time"
            )
        assigned = _manual_assignments(topic.assignments)
        if isinstance(assigned, str):
            return ErrorCode.invalid_replica_assignment, assigned
        assignments = assigned
    state = ctx.node.metadata.state
    live = sum(1 for n in state.nodes() if n.alive) or 1
    if assignments is not None:
        partition_count, replication_factor = len(assignments), len(assignments[0])
    else:
        partition_count = (
            ctx.config.num_partitions if topic.num_partitions < 0 else topic.num_partitions
        )
        replication_factor = (
            min(ctx.config.default_replication_factor, live)
            if topic.replication_factor < 0
            else topic.replication_factor
        )
    wanted = CreateTopicRequest(
        name=topic.name,
        partition_count=partition_count,
        replication_factor=replication_factor,
        config={c.name: c.value or "" for c in topic.configs},
        assignments=assignments,
    )
    if getattr(request, "validate_only", False):
        plan = plan_create_topic(state, wanted, _now_ms(), config=ctx.node_config.metadata)
        return _result(plan) if isinstance(plan, ApplyResult) else (ErrorCode.none, None)
    timeout_s = _timeout_s(ctx, request)
    return await _admin_call(ctx.node.create_topic(wanted, timeout_s=timeout_s))


def _manual_assignments(assignments: Any) -> tuple[tuple[NodeId, ...], ...] | str:
    """CreateTopics' replica lists in partition order, or why they are refused: partition
    indexes 0 to n-1, each once, none with an empty list (Kafka's rules)."""
    by_index = {
        int(a.partition_index): tuple(NodeId(int(b)) for b in a.broker_ids or ())
        for a in assignments
    }
    if sorted(by_index) != list(range(len(assignments))):
        indexes = sorted(int(a.partition_index) for a in assignments)
        return f"partition indexes {indexes} are not 0 to {len(assignments) - 1}, each once"
    if any(not replicas for replicas in by_index.values()):
        return "a partition's replica list is empty"
    return tuple(by_index[i] for i in range(len(assignments)))


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _created(
    ctx: KafkaContext, module: Any, name: str, code: ErrorCode, message: str | None
) -> Any:
    info = ctx.node.metadata.state.topic(name) if code is ErrorCode.none else None
    config_class = getattr(module, "CreatableTopicConfigs", None)  # v5 and later
    configs = (
        ()
        if info is None or config_class is None
        else tuple(
            build(
                config_class,
                name=key,
                value=value,
                read_only=False,
                config_source=source,
                is_sensitive=False,
            )
            for key, value, source in topic_configs(ctx, info.config)
        )
    )
    return build(
        module.CreatableTopicResult,
        name=name,
        topic_id=None if info is None else topic_uuid(info.topic_id),
        error_code=code,
        error_message=message,
        topic_config_error_code=ErrorCode.none,
        num_partitions=-1 if info is None else info.partition_count,
        replication_factor=-1 if info is None else info.replication_factor,
        configs=configs,
    )


async def delete_topics(ctx: KafkaContext, request: Any, version: int) -> Any:
    """DeleteTopics v1 to v6: deletes each named topic through the node port's `delete_topic` (the
    controller). Per topic it answers UNKNOWN_TOPIC_ID for a topic named only by id,
    TOPIC_AUTHORIZATION_FAILED without admin permission, NOT_CONTROLLER off the controller,
    REQUEST_TIMED_OUT, or UNKNOWN_TOPIC_OR_PARTITION."""
    module = response_module(DELETE_TOPICS, version)
    # A -1 array length decodes to None (the fuzz tests send one): no topics, not a crash.
    names = (
        [t.name for t in request.topics or ()]
        if hasattr(request, "topics")
        else list(request.topic_names or ())
    )
    timeout_s = _timeout_s(ctx, request)
    outcomes = [await _delete_topic(ctx, name, timeout_s) for name in names]
    results = tuple(
        build(
            module.DeletableTopicResult,
            name=name,
            topic_id=None,
            error_code=code,
            error_message=message,
        )
        for name, (code, message) in zip(names, outcomes, strict=True)
    )
    return build(module.DeleteTopicsResponse, throttle_time=NO_THROTTLE, responses=results)


async def _delete_topic(ctx: KafkaContext, name: str | None, timeout_s: float) -> Outcome:
    if name is None:
        return ErrorCode.unknown_topic_id, "raftlog deletes topics by name"
    if not ctx.allowed(Permission.ADMIN, name):
        return ErrorCode.topic_authorization_failed, f"no admin permission on {name}"
    return await _admin_call(ctx.node.delete_topic(name, timeout_s=timeout_s))


async def create_partitions(ctx: KafkaContext, request: Any, version: int) -> Any:
    """CreatePartitions v0 to v3: grows each topic to `count` partitions through the node port's
    `create_partitions` (the controller); `validate_only` only plans. Per topic it answers
    INVALID_REPLICA_ASSIGNMENT for manual assignments, TOPIC_AUTHORIZATION_FAILED without admin
    permission, NOT_CONTROLLER off the controller, REQUEST_TIMED_OUT, or the metadata result's code
    (INVALID_PARTITIONS, UNKNOWN_TOPIC_OR_PARTITION)."""
    module = response_module(CREATE_PARTITIONS, version)
    timeout_s = _timeout_s(ctx, request)
    outcomes = await asyncio.gather(
        *(_create_partitions(ctx, request, topic, timeout_s) for topic in request.topics)
    )
    results = tuple(
        build(
            module.CreatePartitionsTopicResult,
            name=topic.name,
            error_code=code,
            error_message=message,
        )
        for topic, (code, message) in zip(request.topics, outcomes, strict=True)
    )
    return build(module.CreatePartitionsResponse, throttle_time=NO_THROTTLE, results=results)


async def _create_partitions(
    ctx: KafkaContext, request: Any, topic: Any, timeout_s: float
) -> Outcome:
    if not ctx.allowed(Permission.ADMIN, topic.name):
        return ErrorCode.topic_authorization_failed, f"no admin permission on {topic.name}"
    assignments = None
    if topic.assignments is not None:
        assignments = tuple(
            tuple(NodeId(int(b)) for b in a.broker_ids or ()) for a in topic.assignments
        )
        if any(not replicas for replicas in assignments):
            return ErrorCode.invalid_replica_assignment, "a partition's replica list is empty"
    if request.validate_only:
        plan = plan_create_partitions(
            ctx.node.metadata.state,
            topic.name,
            topic.count,
            _now_ms(),
            config=ctx.node_config.metadata,
            assignments=assignments,
        )
        return _result(plan) if isinstance(plan, ApplyResult) else (ErrorCode.none, None)
    return await _admin_call(
        ctx.node.create_partitions(
            topic.name, topic.count, timeout_s=timeout_s, assignments=assignments
        )
    )


async def delete_records(ctx: KafkaContext, request: Any, version: int) -> Any:
    """DeleteRecords v0 to v2: moves each partition's log start offset up to the offset asked
    (-1: the high watermark) through the node port's `delete_records`, on the partition's
    leader. Per partition it answers the new log start as the low watermark, or
    TOPIC_AUTHORIZATION_FAILED without admin permission, UNKNOWN_TOPIC_OR_PARTITION,
    NOT_LEADER_OR_FOLLOWER, POLICY_VIOLATION (cleanup.policy without delete),
    OFFSET_OUT_OF_RANGE (past the high watermark) or REQUEST_TIMED_OUT, with low watermark -1."""
    module = response_module(DELETE_RECORDS, version)
    asked = [
        (topic.name, p.partition_index, int(p.offset))
        for topic in request.topics or ()
        for p in topic.partitions or ()
    ]
    allowed = [ctx.allowed(Permission.ADMIN, topic) for topic, _, _ in asked]
    answers = iter(
        await ctx.node.delete_records(
            [a for a, ok in zip(asked, allowed, strict=True) if ok],
            timeout_s=_timeout_s(ctx, request),
        )
    )
    by_topic: dict[str, list[Any]] = {}
    for (topic, partition, _), ok in zip(asked, allowed, strict=True):
        answer = next(answers) if ok else None
        if answer is None:
            code, low_watermark = ErrorCode.topic_authorization_failed, -1
        elif isinstance(answer, errors.RaftlogError):
            code, low_watermark = kafka_error(answer), -1
        else:
            code, low_watermark = ErrorCode.none, answer
        by_topic.setdefault(topic, []).append(
            build(
                module.DeleteRecordsPartitionResult,
                partition_index=partition,
                low_watermark=low_watermark,
                error_code=code,
            )
        )
    results = tuple(
        build(module.DeleteRecordsTopicResult, name=topic, partitions=tuple(partitions))
        for topic, partitions in by_topic.items()
    )
    return build(module.DeleteRecordsResponse, throttle_time=NO_THROTTLE, topics=results)
