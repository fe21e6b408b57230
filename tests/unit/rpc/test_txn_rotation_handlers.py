"""The coordinator's handlers at a spent producer epoch, on both front ends: Kafka's EndTxn
v5 and raftlog's gRPC EndTxn rotate to a new producer id and answer it at epoch 0; a retried
EndTxn and a KIP-360 InitProducerId carrying the old producer id get the new producer, not
PRODUCER_FENCED; the next transaction's AddPartitionsToTxn under the new id is held while
the end completes, then joins it.

Reaching epoch 32766 through the wire takes 32766 metadata commits, so these tests run the
real handlers against a real `MetadataState`, its epoch set directly
(`tests/unit/rpc/txn_coordinator_node.py`: each command applied as the controller's Raft
commit would, a transaction completed as the marker duty would)."""

from __future__ import annotations

import asyncio
import datetime
import importlib
from typing import Any

from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i32, i32Timedelta

from raftlog.metadata.transactions import PRODUCER_EPOCH_MAX
from raftlog.rpc.kafka import txn_handlers
from raftlog.rpc.txn_producer_calls import TxnPorts
from raftlog.rpc.txn_producer_calls import end_txn as grpc_end_txn
from raftlog.rpc.v1 import raftlog_pb2 as pb
from tests.unit.rpc.txn_coordinator_node import (
    SPENT,
    TID,
    CoordinatorContext,
    CoordinatorNode,
    spent,
)


def _wire(api: str, version: int) -> Any:
    return importlib.import_module(f"kio.schema.{api}.v{version}.request")


async def _add(ctx: CoordinatorContext, producer_id: int, epoch: int) -> ErrorCode:
    ap = _wire("add_partitions_to_txn", 3)
    request = ap.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=ap.TransactionalId(TID),
        v3_and_below_producer_id=ap.ProducerId(producer_id),
        v3_and_below_producer_epoch=i16(epoch),
        v3_and_below_topics=(
            ap.AddPartitionsToTxnTopic(name=ap.TopicName("orders"), partitions=(i32(0),)),
        ),
    )
    response = await txn_handlers.add_partitions_to_txn(ctx, request, 3)  # type: ignore[arg-type]
    [topic] = response.results_by_topic_v3_and_below
    [partition] = topic.results_by_partition
    code: ErrorCode = partition.partition_error_code
    return code


async def _end(ctx: CoordinatorContext, producer_id: int, epoch: int, commit: bool) -> Any:
    et = _wire("end_txn", 5)
    request = et.EndTxnRequest(
        transactional_id=et.TransactionalId(TID),
        producer_id=et.ProducerId(producer_id),
        producer_epoch=i16(epoch),
        committed=commit,
    )
    return await txn_handlers.end_txn(ctx, request, 5)  # type: ignore[arg-type]


async def _open_at_the_spent_epoch() -> tuple[CoordinatorNode, CoordinatorContext, int]:
    """A coordinator whose transactional id is at the spent epoch with a transaction open."""
    node = CoordinatorNode()
    ctx = CoordinatorContext(node)
    old = spent(node)
    assert await _add(ctx, old, SPENT) is ErrorCode.none
    return node, ctx, old


def test_kafka_end_txn_v5_at_the_spent_epoch_answers_a_new_producer_id() -> None:
    async def scenario() -> None:
        node, ctx, old = await _open_at_the_spent_epoch()
        ended = await _end(ctx, old, SPENT, True)
        assert ended.error_code is ErrorCode.none
        new = int(ended.producer_id)
        assert new != old and int(ended.producer_epoch) == 0
        # The markers carry the old producer id at the bumped epoch.
        txn = node.log.state.transaction(TID)
        assert (txn.producer_id, txn.producer_epoch) == (old, PRODUCER_EPOCH_MAX)
        # The answer lost, the client retries: the same answer, nothing written.
        applied = node.log.state.applied_offset
        again = await _end(ctx, old, SPENT, True)
        assert (again.error_code, int(again.producer_id), int(again.producer_epoch)) == (
            ErrorCode.none,
            new,
            0,
        )
        assert node.log.state.applied_offset == applied
        # The next transaction under the new producer id is held until the end completes.
        next_add = asyncio.ensure_future(_add(ctx, new, 0))
        await asyncio.sleep(0)
        assert not next_add.done() and node.txn_completions.waiting() == 1
        await node.complete()
        assert await next_add is ErrorCode.none
        txn = node.log.state.transaction(TID)
        assert (txn.producer_id, txn.producer_epoch, txn.previous_producer_id) == (new, 0, old)

    asyncio.run(scenario())


def test_kafka_init_producer_id_from_the_rotated_producer_id_is_recognised() -> None:
    async def scenario() -> None:
        node, ctx, old = await _open_at_the_spent_epoch()
        ended = await _end(ctx, old, SPENT, False)
        await node.complete()
        ipi = _wire("init_producer_id", 4)

        def init(producer_id: int, epoch: int) -> Any:
            return ipi.InitProducerIdRequest(
                transactional_id=ipi.TransactionalId(TID),
                transaction_timeout=i32Timedelta.parse(datetime.timedelta(seconds=60)),
                producer_id=ipi.ProducerId(producer_id),
                producer_epoch=i16(epoch),
            )

        handler = txn_handlers.init_transactional_producer
        fenced = await handler(ctx, init(old, 3), 4)  # type: ignore[arg-type]
        assert fenced[0] is ErrorCode.producer_fenced
        # KIP-360 with the producer the client had before the rotation it never heard of.
        recovered = await handler(ctx, init(old, SPENT), 4)  # type: ignore[arg-type]
        assert recovered == (ErrorCode.none, int(ended.producer_id), 1)

    asyncio.run(scenario())


def test_grpc_end_txn_at_the_spent_epoch_answers_a_new_producer_id() -> None:
    async def scenario() -> None:
        node, _, old = await _open_at_the_spent_epoch()
        ports = TxnPorts(node, None)  # type: ignore[arg-type]
        request = pb.EndTxnRequest(
            transactional_id=TID, producer_id=old, producer_epoch=SPENT, commit=True
        )
        ended = await grpc_end_txn(ports, request)
        assert not ended.HasField("error"), ended
        assert ended.producer_id != old and ended.producer_epoch == 0
        await node.complete()
        again = await grpc_end_txn(ports, request)
        assert not again.HasField("error"), again
        assert (again.producer_id, again.producer_epoch) == (ended.producer_id, 0)

    asyncio.run(scenario())
