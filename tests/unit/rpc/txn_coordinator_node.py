"""The transaction coordinator's node port over a real `MetadataState`, for unit tests of the
coordinator's handlers (Kafka and gRPC): each command submitted is applied at once, as the
controller's Raft commit would apply it, and `complete` does what the marker duty does once
the markers are written."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from raftlog.metadata.commands import (
    AllocateProducerIds,
    ApplyResult,
    Command,
    CompleteEndTransaction,
    InitTransaction,
)
from raftlog.metadata.state import MetadataState
from raftlog.metadata.transactions import PRODUCER_EPOCH_MAX
from raftlog.rpc.txn_completions import TxnCompletions
from tests.unit.metadata.test_metadata_state import Log, create, register

TID = "tx-1"
SPENT = PRODUCER_EPOCH_MAX - 1


class Metadata:
    """The node's metadata copy: the state, and the listeners called after each apply."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.listeners: list[Callable[[], None]] = []

    @property
    def state(self) -> MetadataState:
        return self.log.state

    def apply(self, command: Command) -> None:
        """Apply `command` (it must succeed), then call the listeners, as the machine does."""
        self.log.ok(command)
        for listener in self.listeners:
            listener()


class CoordinatorNode:
    """The node port as far as the coordinator uses it, over a real metadata state."""

    def __init__(self) -> None:
        self.log = Log()
        self.log.ok(register(1), register(2), register(3), create("orders"))
        self.metadata = Metadata(self.log)
        self.txn_completions = TxnCompletions()
        self.controller_id = 1

    def is_controller(self) -> bool:
        return True

    def leader_address(self, leader_id: int | None) -> str:
        return ""

    async def submit(self, command: Command, *, timeout_s: float) -> ApplyResult:
        result = self.log.apply(command)
        for listener in list(self.metadata.listeners):
            listener()
        return result

    async def allocate_producer_id(self, *, timeout_s: float) -> int:
        result = await self.submit(AllocateProducerIds(1), timeout_s=timeout_s)
        assert result.producer_id_first is not None
        return result.producer_id_first

    async def complete(self) -> None:
        """The marker duty: the markers written, it proposes the completion."""
        txn = self.log.state.transaction(TID)
        assert txn is not None and txn.state.preparing
        self.txn_completions.proposing(TID)
        command = CompleteEndTransaction(TID, txn.producer_id, txn.producer_epoch, 0)
        assert (await self.submit(command, timeout_s=1)).ok


class Groups:
    def follow_term(self, term: int | None) -> bool:
        return True


class CoordinatorContext:
    def __init__(self, node: CoordinatorNode) -> None:
        self.node = node
        self.groups = Groups()

    def controller_term(self) -> int:
        return 1

    def allowed(self, permission: Any, name: str) -> bool:
        return True


def spent(node: CoordinatorNode) -> int:
    """A producer id of TID at the spent epoch, with no transaction open."""
    allocated = node.log.apply(AllocateProducerIds(1))
    assert allocated.producer_id_first is not None
    producer_id = allocated.producer_id_first
    node.log.ok(InitTransaction(TID, producer_id, 0, 60_000, 0))
    txn = node.log.state.transaction(TID)
    node.log.state._transactions.put(replace(txn, producer_epoch=SPENT))
    node.log.state._transaction_changed(TID)
    return producer_id
