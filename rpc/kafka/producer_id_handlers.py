"""InitProducerId (idempotent producers) and OffsetForLeaderEpoch (KIP-320 truncation checks).

Idempotence is raftlog's own: a producer id from the same allocator the gRPC
`InitProducerId` uses (blocks handed out by the metadata quorum), epoch 0, and every batch
checked against the partition's producer table by the same `produce` call, so a retried
batch answers with its original offsets and is never written twice. A producer asking again
(after an error, KIP-360) gets a fresh id, which Kafka clients accept. Transactions are not
supported: a transactional id gets Kafka's TRANSACTIONAL_ID_AUTHORIZATION_FAILED, a fatal
error for the client, never a silent success.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from raftlog import errors
from raftlog.metadata.state import ALLOCATED_PRODUCER_ID_LIMIT
from raftlog.rpc.kafka.context import KafkaContext
from raftlog.rpc.kafka.errors import kafka_error
from raftlog.rpc.kafka.schema import NO_THROTTLE, build, response_module
from raftlog.rpc.security import Permission

__all__ = [
    "INIT_PRODUCER_ID",
    "OFFSET_FOR_LEADER_EPOCH",
    "init_producer_id",
    "offset_for_leader_epoch",
]

INIT_PRODUCER_ID, OFFSET_FOR_LEADER_EPOCH = 22, 23
_ALLOCATE_TIMEOUT_S = 10.0


async def init_producer_id(ctx: KafkaContext, request: Any, version: int) -> Any:
    module = response_module(INIT_PRODUCER_ID, version)
    code, producer_id = ErrorCode.none, -1
    if request.transactional_id is not None:
        code = ErrorCode.transactional_id_authorization_failed
    else:
        try:
            producer_id = await ctx.broker.allocate_producer_id(timeout_s=_ALLOCATE_TIMEOUT_S)
        except errors.RaftlogError as error:
            code = kafka_error(error)
        except TimeoutError:
            code = ErrorCode.request_timed_out
        else:
            # Ids from 2**62 up belong to clients that derive their own (the Spark sink).
            assert 0 <= producer_id < ALLOCATED_PRODUCER_ID_LIMIT, producer_id
    return build(
        module.InitProducerIdResponse,
        throttle_time=NO_THROTTLE,
        error_code=code,
        producer_id=producer_id,
        producer_epoch=0 if code is ErrorCode.none else -1,
    )


def _end_offset(ctx: KafkaContext, topic: str, partition: Any) -> tuple[ErrorCode, int, int]:
    try:
        replica = ctx.broker.replica(topic, int(partition.partition))
        epoch, end_offset = replica.end_offset_for_epoch(int(partition.leader_epoch))
    except errors.RaftlogError as error:
        return kafka_error(error), -1, -1
    return ErrorCode.none, epoch, end_offset


async def offset_for_leader_epoch(ctx: KafkaContext, request: Any, version: int) -> Any:
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
