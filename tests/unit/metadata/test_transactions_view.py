"""MetadataState.transactions() keeps its answer between changes (the controller's marker duty
reads it at every metadata change): after each command, new ids arriving out of order, a
state changing in place, an id expiring and coming back, it still lists every id's current
state in id order."""

from __future__ import annotations

from raftlog.metadata.commands import (
    AddToTransaction,
    AllocateProducerIds,
    CompleteEndTransaction,
    ExpireTransactionalId,
    InitTransaction,
    PrepareEndTransaction,
)
from raftlog.metadata.state import MetadataState
from raftlog.types import PartitionId
from tests.unit.metadata.test_metadata_state import Log, create, register

IDS = ("tx-b", "tx-c", "tx-a")  # initialised in this order, listed by id
PIDS = {"tx-b": 1, "tx-c": 2, "tx-a": 3}
WEEK_MS = 7 * 24 * 3600 * 1000


def _listed(state: MetadataState) -> list[tuple[str, str, int]]:
    return [(t.transactional_id, t.state.value, t.producer_epoch) for t in state.transactions()]


def _expected(state: MetadataState, ids: tuple[str, ...]) -> list[tuple[str, str, int]]:
    found = [state.transaction(t) for t in sorted(ids)]
    return [(t.transactional_id, t.state.value, t.producer_epoch) for t in found if t is not None]


def test_transactions_lists_each_ids_current_state_after_every_change() -> None:
    log = Log()
    log.ok(register(1), register(2), register(3), create("orders"), AllocateProducerIds(100))
    orders0 = (("orders", PartitionId(0)),)
    commands = [
        *(InitTransaction(t, PIDS[t], 0, 60_000, 0) for t in IDS),
        AddToTransaction("tx-c", 2, 0, orders0, (), 1),
        PrepareEndTransaction("tx-c", 2, 0, True, True, 2),
        CompleteEndTransaction("tx-c", 2, 1, 3),
        InitTransaction("tx-a", 3, 1, 60_000, 4),
        ExpireTransactionalId("tx-b", WEEK_MS, WEEK_MS + 10),
        InitTransaction("tx-b", 4, 0, 60_000, WEEK_MS + 20),
    ]
    assert _listed(log.state) == []
    for command in commands:
        log.ok(command)
        assert _listed(log.state) == _expected(log.state, IDS), command
        assert log.state.transactions() is log.state.transactions()  # kept, not rebuilt
    assert _listed(log.state) == [
        ("tx-a", "Empty", 1),
        ("tx-b", "Empty", 0),
        ("tx-c", "CompleteCommit", 1),
    ]
