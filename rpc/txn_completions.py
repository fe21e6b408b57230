"""When the transaction coordinator proposes a transaction's completion: lets a request held
for the end of its producer's previous transaction be proposed right behind the completion,
so both are committed in one Raft round.

Theory of operation. A producer starts its next transaction as soon as EndTxn is answered
(PrepareCommit/PrepareAbort committed), while the controller's marker duty
(`raftlog.node.txn_markers`) still writes the markers; its AddPartitionsToTxn is held until
the transaction is complete (`raftlog.rpc.kafka.txn_handlers`). The duty calls `proposing`
just before it submits CompleteEndTransaction; the metadata `submit` appends the command to
the log before it first yields, so a held request woken here runs after that append and its
own command lands behind it, usually in the same commit, and at apply it is checked against
the completed transaction. Safety never depends on this order: a command that landed first
would be checked against the still-preparing state and rejected CONCURRENT_TRANSACTIONS,
which clients retry.

Bounds: one callback per held request, each held at most the handler's bound, and removed
when its hold ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

__all__ = ["TxnCompletions"]


class TxnCompletions:
    """Per transactional id, the callbacks of requests waiting for its completion."""

    def __init__(self) -> None:
        self._waiters: dict[str, list[Callable[[], None]]] = {}

    def proposing(self, transactional_id: str) -> None:
        """The coordinator is about to propose `transactional_id`'s completion."""
        for callback in self._waiters.pop(transactional_id, []):
            callback()

    @contextlib.contextmanager
    def watch(self, transactional_id: str, callback: Callable[[], None]) -> Iterator[None]:
        """Calls `callback` (at most once) if `transactional_id`'s completion is proposed
        while the block runs."""
        self._waiters.setdefault(transactional_id, []).append(callback)
        try:
            yield
        finally:
            waiters = self._waiters.get(transactional_id)
            if waiters is not None and callback in waiters:
                waiters.remove(callback)
                if not waiters:
                    del self._waiters[transactional_id]

    def waiting(self) -> int:
        """Requests waiting, all ids together."""
        return sum(len(waiters) for waiters in self._waiters.values())
