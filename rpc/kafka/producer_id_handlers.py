"""InitProducerId: producer ids for idempotent and transactional producers.

Idempotence is raftlog's own: a producer id from the same allocator the gRPC
`InitProducerId` uses (blocks handed out by the metadata quorum), epoch 0, and every batch
checked against the partition's producer table by the same `produce` call, so a retried
batch answers with its original offsets and is never written twice. A producer asking again
(after an error, KIP-360) gets a fresh id, which Kafka clients accept. A transactional id
goes to the transaction coordinator (`txn_handlers.init_transactional_producer`).
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from raftlog import errors
from raftlog.metadata.state import ALLOCATED_PRODUCER_ID_LIMIT
from raftlog.rpc.kafka.context import KafkaContext
from raftlog.rpc.kafka.errors import kafka_error
from raftlog.rpc.kafka.schema import NO_THROTTLE, build, response_module
from raftlog.rpc.kafka.txn_handlers import init_transactional_producer

__all__ = ["INIT_PRODUCER_ID", "init_producer_id"]

INIT_PRODUCER_ID = 22
_ALLOCATE_TIMEOUT_S = 10.0


async def init_producer_id(ctx: KafkaContext, request: Any, version: int) -> Any:
    """InitProducerId v0 to v5: without a transactional id a fresh producer id at epoch 0 from
    the node's allocator (`ctx.node.allocate_producer_id`), REQUEST_TIMED_OUT if allocation takes
    over ten seconds, and `kafka_error`'s code for a raftlog error; with one, the transaction
    coordinator's answer. Producer id and epoch are -1 on any error."""
    module = response_module(INIT_PRODUCER_ID, version)
    code, producer_id, epoch = ErrorCode.none, -1, 0
    if request.transactional_id is not None:
        code, producer_id, epoch = await init_transactional_producer(ctx, request, version)
    else:
        try:
            producer_id = await ctx.node.allocate_producer_id(timeout_s=_ALLOCATE_TIMEOUT_S)
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
        producer_epoch=epoch if code is ErrorCode.none else -1,
    )
