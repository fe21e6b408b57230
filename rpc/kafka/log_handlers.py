"""Produce, Fetch, ListOffsets and OffsetForLeaderEpoch: the node calls the gRPC `Log`
service makes (OffsetForLeaderEpoch: KIP-320's truncation check, answered by the leader).

Record batches stay opaque: a produced partition's records are handed to `produce` as one
batch (Kafka's v3+ rule: exactly one RecordBatch v2 per partition), where the leader verifies
its CRC and walks its record framing as for any producer; fetched batches go back as the
bytes the log holds. Fetch answers committed offsets only (below the high watermark); with
isolation_level read_committed (1) only below the last stable offset, with the aborted
transactions of what it returns, so the client skips their records (the node never decodes
records: a client tells markers by their batch attributes). Transactional batches are
checked by the partition leader (KIP-890: the partition must be in the producer's
transaction), not here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode
from kio.static.primitive import Records

from raftlog import errors
from raftlog.partition.replica import AbortedTransaction, OffsetSpec
from raftlog.rpc.kafka.context import KafkaContext
from raftlog.rpc.kafka.errors import kafka_error
from raftlog.rpc.kafka.schema import NO_THROTTLE, build, response_module, timedelta_ms
from raftlog.rpc.kafka.txn_handlers import TRANSACTIONAL_ID_RESOURCE_PREFIX
from raftlog.rpc.security import Permission
from raftlog.types import Commitment

__all__ = [
    "DESCRIBE_PRODUCERS",
    "FETCH",
    "LIST_OFFSETS",
    "OFFSET_FOR_LEADER_EPOCH",
    "PRODUCE",
    "describe_producers",
    "fetch",
    "list_offsets",
    "offset_for_leader_epoch",
    "produce",
]

PRODUCE, FETCH, LIST_OFFSETS, OFFSET_FOR_LEADER_EPOCH, DESCRIBE_PRODUCERS = 0, 1, 2, 23, 61

_COMMITMENTS = {0: Commitment.NONE, 1: Commitment.LEADER, -1: Commitment.QUORUM}
_EARLIEST_TIMESTAMP, _LATEST_TIMESTAMP = -2, -1
_READ_COMMITTED = 1


@dataclass(frozen=True, slots=True)
class _Produced:
    """One partition's answer: its error, base offset (-1 on an error), message and
    per-record errors ((batch index, message), Produce v8+, KIP-467)."""

    code: ErrorCode
    base_offset: int = -1
    message: str | None = None
    record_errors: tuple[tuple[int, str], ...] = ()


async def produce(ctx: KafkaContext, request: Any, version: int) -> Any | None:
    """acks 0/1/-1 are raftlog's acks none/leader/all; acks=0 gets no response at all. A batch
    refused for some of its records (INVALID_RECORD) names each in record_errors."""
    commitment = _COMMITMENTS.get(int(request.acks))
    timeout_ms = min(timedelta_ms(request.timeout), ctx.config.produce_timeout_ms_max)
    # Kafka refuses a transactional produce whole without a write grant on its
    # transactional id (the name `transactional_id:<id>`, as the coordinator's APIs).
    transactional_id = request.transactional_id
    txn_refusal = None
    if transactional_id is not None and not ctx.allowed(
        Permission.WRITE, TRANSACTIONAL_ID_RESOURCE_PREFIX + transactional_id
    ):
        txn_refusal = _Produced(
            ErrorCode.transactional_id_authorization_failed,
            message=f"no write permission on transactional id {transactional_id}",
        )
    calls: list[tuple[str, int, Awaitable[_Produced]]] = []
    loop = asyncio.get_running_loop()
    for topic in request.topic_data:
        for partition in topic.partition_data:
            refusal = (
                txn_refusal
                or _produce_refusal(request, partition.records, commitment)
                or _denied(ctx, Permission.WRITE, topic.name)
            )
            if refusal is not None:
                calls.append((topic.name, partition.index, _done(refusal)))
            else:
                assert commitment is not None
                call = _produce_one(ctx, topic.name, partition, commitment, timeout_ms)
                calls.append((topic.name, partition.index, loop.create_task(call)))
    # Every produce call started above, in request order, before anything awaits: a
    # pipelining producer's batches reach each partition in the order it sent them (each
    # call, one partition or many, is one task: a call run inline here would overtake the
    # tasks of an earlier request's calls). One call (the common case) is awaited itself,
    # not through a gather, whose callback would add a turn of the loop to the answer.
    if len(calls) == 1:
        outcomes = [await calls[0][2]]
    else:
        outcomes = await asyncio.gather(*(call for _, _, call in calls))
    if commitment is Commitment.NONE:
        return None
    module = response_module(PRODUCE, version)
    record_error_class = getattr(module, "BatchIndexAndErrorMessage", None)  # v8 and later
    by_topic: dict[str, list[Any]] = {}
    for (name, index, _), produced in zip(calls, outcomes, strict=True):
        by_topic.setdefault(name, []).append(
            build(
                module.PartitionProduceResponse,
                index=index,
                error_code=produced.code,
                base_offset=produced.base_offset,
                log_append_time=None,
                log_start_offset=-1,
                record_errors=()
                if record_error_class is None
                else tuple(
                    build(
                        record_error_class,
                        batch_index=batch_index,
                        batch_index_error_message=text,
                    )
                    for batch_index, text in produced.record_errors
                ),
                error_message=produced.message,
            )
        )
    return build(
        module.ProduceResponse,
        responses=tuple(
            build(module.TopicProduceResponse, name=name, partition_responses=tuple(parts))
            for name, parts in by_topic.items()
        ),
        throttle_time=NO_THROTTLE,
    )


def _denied(ctx: KafkaContext, permission: Permission, topic: str) -> _Produced | None:
    if ctx.allowed(permission, topic):
        return None
    return _Produced(
        ErrorCode.topic_authorization_failed, message=f"no {permission.value} permission on {topic}"
    )


@dataclass(frozen=True, slots=True)
class _Fetched:
    """One partition's fetch answer (-1 offsets on an error)."""

    code: ErrorCode
    batches: bytes = b""
    high_watermark: int = -1
    log_start_offset: int = -1
    last_stable_offset: int = -1
    aborted: tuple[AbortedTransaction, ...] | None = None


async def _done(value: _Produced) -> _Produced:
    return value


def _produce_refusal(
    request: Any, records: bytes | None, commitment: Commitment | None
) -> _Produced | None:
    if commitment is None:
        return _Produced(
            ErrorCode.invalid_required_acks, message=f"acks must be 0, 1 or -1, got {request.acks}"
        )
    if not records:
        return _Produced(ErrorCode.corrupt_message, message="no record batch for the partition")
    return None


async def _produce_one(
    ctx: KafkaContext, topic: str, partition: Any, commitment: Commitment, timeout_ms: int
) -> _Produced:
    """Produce the partition's batch through the node port; a raftlog error becomes its Kafka
    code and message (and the records it names, for INVALID_RECORD)."""
    try:
        result = await ctx.node.produce(
            topic,
            int(partition.index),
            [bytes(partition.records)],
            commitment=commitment,
            timeout_s=max(timeout_ms, 1) / 1000,
        )
    except errors.InvalidRecordError as error:
        return _Produced(
            ErrorCode.invalid_record, message=str(error), record_errors=error.record_errors
        )
    except errors.RaftlogError as error:
        return _Produced(kafka_error(error), message=str(error))
    return _Produced(ErrorCode.none, base_offset=result.base_offset)


async def fetch(ctx: KafkaContext, request: Any, version: int) -> Any:
    """Committed records of every partition asked; waits up to max_wait for the first new
    data when there is less than min_bytes (raftlog answers as soon as any partition has
    data, which meets the default min_bytes of 1 exactly)."""
    wanted = [
        (topic.topic, partition) for topic in request.topics for partition in topic.partitions
    ]
    wait_ms = min(max(timedelta_ms(request.max_wait), 0), ctx.config.fetch_wait_ms_max)
    answers = await _fetch_all(ctx, request, wanted)
    fetched = sum(len(a.batches) for a in answers if a.code is ErrorCode.none)
    if wait_ms > 0 and fetched < max(1, int(request.min_bytes)):
        await _wait_for_data(ctx, request, wanted, answers, wait_ms)
        answers = await _fetch_all(ctx, request, wanted)
    return _fetch_response(request, version, wanted, answers)


async def _fetch_all(
    ctx: KafkaContext, request: Any, wanted: list[tuple[str, Any]]
) -> list[_Fetched]:
    """Per partition, in order, within the response's max_bytes (the first partition with
    data always gets a batch)."""
    budget = int(getattr(request, "max_bytes", 0x7FFFFFFF)) or 0x7FFFFFFF
    read_committed = _read_committed(request)
    answers = []
    for topic, partition in wanted:
        if not ctx.allowed(Permission.READ, topic):
            answers.append(_Fetched(ErrorCode.topic_authorization_failed))
            continue
        bytes_max = max(1, min(int(partition.partition_max_bytes), budget))
        try:
            result = await ctx.node.fetch(
                topic,
                int(partition.partition),
                int(partition.fetch_offset),
                bytes_max=bytes_max,
                wait_ms_max=0,
                bytes_min=1,
                # An answer with batches but no record makes a Kafka client suspect its size
                # limit (raftlog.storage.raft_log_storage.RaftLog.read).
                skip_emptied=True,
                read_committed=read_committed,
            )
        except errors.RaftlogError as error:
            answers.append(_Fetched(kafka_error(error)))
            continue
        batches = result.batches if budget > 0 else b""
        budget -= len(batches)
        aborted = result.aborted_transactions
        answers.append(
            _Fetched(
                ErrorCode.none,
                batches,
                result.high_watermark,
                result.log_start_offset,
                result.last_stable_offset,
                None if aborted is None else (aborted if batches else ()),
            )
        )
    return answers


def _read_committed(request: Any) -> bool:
    return int(getattr(request, "isolation_level", 0)) == _READ_COMMITTED


async def _wait_for_data(
    ctx: KafkaContext,
    request: Any,
    wanted: list[tuple[str, Any]],
    answers: list[_Fetched],
    wait_ms: int,
) -> None:
    """Until any partition that answered has data past its fetch offset (below the LSO
    under read_committed), or `wait_ms`."""
    read_committed = _read_committed(request)
    polls = [
        asyncio.ensure_future(
            ctx.node.fetch(
                topic,
                int(partition.partition),
                int(partition.fetch_offset),
                bytes_max=1,
                wait_ms_max=wait_ms,
                bytes_min=1,
                read_committed=read_committed,
            )
        )
        for (topic, partition), answer in zip(wanted, answers, strict=True)
        if answer.code is ErrorCode.none
    ]
    if not polls:
        return
    try:
        await asyncio.wait(polls, timeout=wait_ms / 1000, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for poll in polls:
            poll.cancel()
        # Collects what the polls raised (an error shows in the fetch that follows).
        await asyncio.gather(*polls, return_exceptions=True)


def _fetch_response(
    request: Any,
    version: int,
    wanted: list[tuple[str, Any]],
    answers: list[_Fetched],
) -> Any:
    module = response_module(FETCH, version)
    by_topic: dict[str, list[Any]] = {}
    for (topic, partition), answer in zip(wanted, answers, strict=True):
        # Null under read_uncommitted (and on an error), a list under read_committed.
        aborted = None
        if answer.aborted is not None:
            aborted = tuple(
                build(
                    module.AbortedTransaction,
                    producer_id=a.producer_id,
                    first_offset=a.first_offset,
                )
                for a in answer.aborted
            )
        by_topic.setdefault(topic, []).append(
            build(
                module.PartitionData,
                partition_index=partition.partition,
                error_code=answer.code,
                high_watermark=answer.high_watermark,
                last_stable_offset=answer.last_stable_offset,
                log_start_offset=answer.log_start_offset,
                aborted_transactions=aborted,
                preferred_read_replica=-1,
                records=Records(answer.batches),
            )
        )
    return build(
        module.FetchResponse,
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        session_id=0,  # no fetch sessions: every request is a full fetch
        responses=tuple(
            build(module.FetchableTopicResponse, topic=topic, partitions=tuple(parts))
            for topic, parts in by_topic.items()
        ),
    )


async def list_offsets(ctx: KafkaContext, request: Any, version: int) -> Any:
    """ListOffsets v1 to v6: per partition, the log start (timestamp -2), the high watermark (-1)
        (the last stable offset under read_committed) or the first committed offset of a batch at
    or after a timestamp (-1 if none), from the node
        port's `list_offsets` (the partition leader). Answers INVALID_REQUEST for any other negative
        timestamp, TOPIC_AUTHORIZATION_FAILED without read permission, and `kafka_error`'s code
        (NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION...) for a raftlog error."""
    module = response_module(LIST_OFFSETS, version)
    state = ctx.node.metadata.state
    topics = []
    for topic in request.topics:
        parts = []
        for partition in topic.partitions:
            code, offset = _list_offset(
                ctx,
                topic.name,
                int(partition.partition_index),
                int(partition.timestamp),
                read_committed=_read_committed(request),
            )
            info = state.partition(topic.name, int(partition.partition_index))
            parts.append(
                build(
                    module.ListOffsetsPartitionResponse,
                    partition_index=partition.partition_index,
                    error_code=code,
                    timestamp=-1,
                    offset=offset,
                    leader_epoch=-1 if info is None else max(info.leader_epoch, -1),
                )
            )
        topics.append(
            build(module.ListOffsetsTopicResponse, name=topic.name, partitions=tuple(parts))
        )
    return build(module.ListOffsetsResponse, throttle_time=NO_THROTTLE, topics=tuple(topics))


def _list_offset(
    ctx: KafkaContext, topic: str, partition: int, timestamp: int, *, read_committed: bool
) -> tuple[ErrorCode, int]:
    if not ctx.allowed(Permission.READ, topic):
        return ErrorCode.topic_authorization_failed, -1
    if timestamp == _EARLIEST_TIMESTAMP:
        spec, timestamp = OffsetSpec.EARLIEST, 0
    elif timestamp == _LATEST_TIMESTAMP:
        spec, timestamp = OffsetSpec.LATEST, 0
    elif timestamp >= 0:
        spec = OffsetSpec.TIMESTAMP
    else:
        return ErrorCode.invalid_request, -1
    try:
        offset = ctx.node.list_offsets(
            topic, partition, int(spec), timestamp, read_committed=read_committed
        )
        return ErrorCode.none, offset
    except errors.RaftlogError as error:
        return kafka_error(error), -1


def _end_offset(ctx: KafkaContext, topic: str, partition: Any) -> tuple[ErrorCode, int, int]:
    try:
        epoch, end_offset = ctx.node.end_offset_for_epoch(
            topic, int(partition.partition), int(partition.leader_epoch)
        )
    except errors.RaftlogError as error:
        return kafka_error(error), -1, -1
    return ErrorCode.none, epoch, end_offset


async def offset_for_leader_epoch(ctx: KafkaContext, request: Any, version: int) -> Any:
    """OffsetForLeaderEpoch v2 to v4 (KIP-320): per partition, the largest epoch at most the one
    asked and that epoch's end offset, from the node port's `end_offset_for_epoch` (the partition
    leader). Answers TOPIC_AUTHORIZATION_FAILED without read permission and `kafka_error`'s code
    for a raftlog error, with epoch and offset -1."""
    module = response_module(OFFSET_FOR_LEADER_EPOCH, version)
    topics = []
    for topic in request.topics:
        partitions = []
        for partition in topic.partitions:
            code, epoch, end_offset = ErrorCode.none, -1, -1
            if not ctx.allowed(Permission.READ, topic.topic):
                code = ErrorCode.topic_authorization_failed
            else:
                code, epoch, end_offset = _end_offset(ctx, topic.topic, partition)
            partitions.append(
                build(
                    module.EpochEndOffset,
                    error_code=code,
                    partition=partition.partition,
                    leader_epoch=epoch,
                    end_offset=end_offset,
                )
            )
        topics.append(
            build(
                module.OffsetForLeaderTopicResult, topic=topic.topic, partitions=tuple(partitions)
            )
        )
    return build(
        module.OffsetForLeaderEpochResponse, throttle_time=NO_THROTTLE, topics=tuple(topics)
    )


async def describe_producers(ctx: KafkaContext, request: Any, version: int) -> Any:
    """DescribeProducers v0 (KIP-664): per partition, every producer its leader remembers
    (from the applied producer table) with its epoch, last sequence, coordinator epoch and
    current_txn_start_offset (-1 without an open transaction; a hanging transaction shows
    here). TOPIC_AUTHORIZATION_FAILED without read permission, `kafka_error`'s code for a
    raftlog error (NOT_LEADER_OR_FOLLOWER on a follower). raftlog keeps no per-producer
    timestamp: last_timestamp is -1."""
    module = response_module(DESCRIBE_PRODUCERS, version)
    topics = []
    for topic in request.topics:
        partitions = []
        for index in topic.partition_indexes:
            code, message, producers = ErrorCode.none, None, []
            if not ctx.allowed(Permission.READ, topic.name):
                code = ErrorCode.topic_authorization_failed
            else:
                try:
                    producers = ctx.node.describe_producers(topic.name, int(index))
                except errors.RaftlogError as error:
                    code, message = kafka_error(error), str(error)
            active = tuple(
                build(
                    module.ProducerState,
                    producer_id=p.producer_id,
                    producer_epoch=p.producer_epoch,
                    last_sequence=p.last_sequence,
                    last_timestamp=-1,
                    coordinator_epoch=p.coordinator_epoch,
                    current_txn_start_offset=p.current_txn_start_offset,
                )
                for p in producers
            )
            partitions.append(
                build(
                    module.PartitionResponse,
                    partition_index=index,
                    error_code=code,
                    error_message=message,
                    active_producers=active,
                )
            )
        topics.append(build(module.TopicResponse, name=topic.name, partitions=tuple(partitions)))
    return build(module.DescribeProducersResponse, throttle_time=NO_THROTTLE, topics=tuple(topics))
