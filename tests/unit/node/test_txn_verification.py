"""KIP-890 part 1 on the node (raftlog.node.txn_verification): a partition's verifier
answers from the node's metadata copy, waits for an apply that adds the partition, gives up
after its wait, and is absent when `kafka.txn_verification` is off."""

from __future__ import annotations

import asyncio

from raftlog.metadata import AllocateProducerIds
from raftlog.metadata.commands import AddToTransaction, InitTransaction
from raftlog.node.txn_verification import TxnVerification
from raftlog.types import PartitionId
from tests.unit.metadata.test_metadata_state import Log, create, register
from tests.unit.rpc.txn_coordinator_node import Metadata


def _copy() -> Metadata:
    log = Log()
    log.ok(register(1), register(2), register(3), create("orders"), AllocateProducerIds(100))
    log.ok(InitTransaction("tx", 7, 0, 60_000, 0))
    return Metadata(log)


def _add(partition: int) -> AddToTransaction:
    return AddToTransaction("tx", 7, 0, (("orders", PartitionId(partition)),), (), 5)


def test_the_verifier_waits_for_the_apply_that_adds_the_partition() -> None:
    async def scenario() -> None:
        copy = _copy()
        verification = TxnVerification(metadata=copy, wait_ms=60_000, enabled=True)  # type: ignore[arg-type]
        verify = verification.verifier("orders", 1)
        assert verify is not None
        waiting = asyncio.ensure_future(verify(7, 0))
        await asyncio.sleep(0)
        copy.apply(_add(0))  # another partition: still waiting
        await asyncio.sleep(0)
        assert not waiting.done()
        copy.apply(_add(1))
        assert await asyncio.wait_for(waiting, 5)

    asyncio.run(scenario())


def test_the_verifier_refuses_after_its_wait_and_is_absent_when_switched_off() -> None:
    async def scenario() -> None:
        copy = _copy()
        copy.apply(_add(1))
        verification = TxnVerification(metadata=copy, wait_ms=20, enabled=True)  # type: ignore[arg-type]
        verify = verification.verifier("orders", 1)
        assert verify is not None
        assert await verify(7, 0)
        assert not await verify(7, 1)  # another epoch: not this transaction
        assert not await verify(8, 0)  # another producer
        other = verification.verifier("orders", 2)
        assert other is not None and not await other(7, 0)
        off = TxnVerification(metadata=copy, wait_ms=20, enabled=False)  # type: ignore[arg-type]
        assert off.verifier("orders", 2) is None

    asyncio.run(scenario())
