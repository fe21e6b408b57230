"""A Produce that names a transactional id (raftlog.rpc.kafka.log_handlers.produce): refused
whole, TRANSACTIONAL_ID_AUTHORIZATION_FAILED, without a write grant on
`transactional_id:<id>`, before any partition is written; with it, the partitions are
produced (their leader checks the transaction, KIP-890)."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

from kio.schema.errors import ErrorCode
from kio.schema.produce.v9 import request as pr
from kio.static.primitive import Records, i16, i32, i32Timedelta

from raftlog.config import KafkaConfig
from raftlog.partition.replica import ProduceResult
from raftlog.rpc.kafka.log_handlers import produce
from raftlog.rpc.security import Permission
from raftlog.storage.records import RecordInput, encode_batch


class _Node:
    def __init__(self) -> None:
        self.produced: list[tuple[str, int]] = []

    async def produce(self, topic: str, partition: int, batches: list[bytes], **_: Any) -> Any:
        self.produced.append((topic, partition))
        return ProduceResult(5, 5, 6)


class _Context:
    def __init__(self, grants: set[tuple[Permission, str]]) -> None:
        self.grants = grants
        self.config = KafkaConfig()
        self.node = _Node()

    def allowed(self, permission: Permission, name: str) -> bool:
        return (permission, name) in self.grants


def _request() -> Any:
    batch = encode_batch(
        [RecordInput(None, b"v", 0)],
        producer_id=3,
        producer_epoch=0,
        base_sequence=0,
        is_transactional=True,
    )
    return pr.ProduceRequest(
        transactional_id=pr.TransactionalId("tx-1"),
        acks=i16(-1),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=5)),
        topic_data=(
            pr.TopicProduceData(
                name=pr.TopicName("orders"),
                partition_data=tuple(
                    pr.PartitionProduceData(index=i32(p), records=Records(batch)) for p in (0, 1)
                ),
            ),
        ),
    )


def _codes(ctx: _Context) -> list[ErrorCode]:
    response = asyncio.run(produce(ctx, _request(), 9))  # type: ignore[arg-type]
    return [p.error_code for t in response.responses for p in t.partition_responses]


def test_a_transactional_produce_needs_write_on_its_transactional_id() -> None:
    topic_only = _Context({(Permission.WRITE, "orders")})
    assert _codes(topic_only) == [ErrorCode.transactional_id_authorization_failed] * 2
    assert topic_only.node.produced == []
    granted = _Context({(Permission.WRITE, "orders"), (Permission.WRITE, "transactional_id:tx-1")})
    assert _codes(granted) == [ErrorCode.none] * 2
    assert granted.node.produced == [("orders", 0), ("orders", 1)]
