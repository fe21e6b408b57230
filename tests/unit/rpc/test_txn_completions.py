"""The hold of a request that arrives while its producer's previous transaction completes
(`raftlog.rpc.txn_completions.wait_until_completed`, shared by the Kafka and gRPC
coordinators): it waits while the completion is not proposed yet, and is woken when it is;
once the completion is proposed (in the log ahead of the request) it does not wait at all,
until the next end a client asks for clears that mark; marks are bounded."""

from __future__ import annotations

import asyncio

from raftlog.metadata.commands import (
    AddToTransaction,
    AllocateProducerIds,
    InitTransaction,
    PrepareEndTransaction,
)
from raftlog.rpc.txn_completions import PROPOSED_MARKS_MAX, TxnCompletions, wait_until_completed
from raftlog.types import PartitionId
from tests.unit.rpc.txn_coordinator_node import TID, CoordinatorNode


def _started() -> CoordinatorNode:
    node = CoordinatorNode()
    allocated = node.log.apply(AllocateProducerIds(1))
    assert allocated.producer_id_first is not None
    node.log.ok(InitTransaction(TID, allocated.producer_id_first, 0, 60_000, 0))
    return node


def _preparing(node: CoordinatorNode) -> tuple[int, int]:
    """A transaction of TID ended as EndTxn v5 ends it (the epoch bumped), its completion not
    proposed yet: the producer the end answered."""
    txn = node.log.state.transaction(TID)
    assert txn is not None
    producer_id = txn.producer_id
    orders = (("orders", PartitionId(0)),)
    node.log.ok(AddToTransaction(TID, producer_id, txn.producer_epoch, orders, (), 1))
    node.txn_completions.expect(TID)
    node.log.ok(PrepareEndTransaction(TID, producer_id, txn.producer_epoch, True, True, 2))
    after = node.log.state.transaction(TID)
    assert after is not None and after.state.preparing
    return after.producer_after_end()


async def _steps(task: asyncio.Task[None], count: int = 5) -> bool:
    """Whether `task` finished within `count` turns of the event loop."""
    for _ in range(count):
        await asyncio.sleep(0)
    return task.done()


def test_a_request_waits_until_the_completion_is_proposed() -> None:
    async def scenario() -> None:
        node = _started()
        producer = _preparing(node)
        held = asyncio.ensure_future(wait_until_completed(node, TID, *producer))  # type: ignore[arg-type]
        assert not await _steps(held)
        node.txn_completions.proposing(TID)
        assert await _steps(held)

    asyncio.run(scenario())


def test_a_request_after_the_completion_was_proposed_is_not_held() -> None:
    async def scenario() -> None:
        node = _started()
        producer = _preparing(node)
        node.txn_completions.proposing(TID)  # appended, not applied: the state still prepares
        assert node.log.state.transaction(TID).state.preparing
        at_once = asyncio.ensure_future(wait_until_completed(node, TID, *producer))  # type: ignore[arg-type]
        assert await _steps(at_once, 1)
        # The next end a client asks for clears the mark: its request is held again.
        await node.complete()
        producer = _preparing(node)
        held = asyncio.ensure_future(wait_until_completed(node, TID, *producer))  # type: ignore[arg-type]
        assert not await _steps(held)
        await node.complete()
        assert await _steps(held)

    asyncio.run(scenario())


def test_marks_are_bounded_oldest_dropped_first() -> None:
    completions = TxnCompletions()
    for n in range(PROPOSED_MARKS_MAX + 1):
        completions.proposing(f"tx-{n}")
    assert not completions.proposed("tx-0")
    assert completions.proposed("tx-1") and completions.proposed(f"tx-{PROPOSED_MARKS_MAX}")
