"""When the transaction coordinator proposes a transaction's completion: lets a request held
for the end of its producer's previous transaction be proposed right behind the completion,
so both are committed in one Raft round.

Theory of operation. A producer starts its next transaction as soon as EndTxn is answered
(PrepareCommit/PrepareAbort committed), while the controller's marker duty
(`raftlog.node.txn_markers`) still writes the markers; its AddPartitionsToTxn or
AddOffsetsToTxn is held until the transaction is complete (`wait_until_completed`, which
both coordinators call: the Kafka handlers and the gRPC ones). The duty calls `proposing`
just before it submits CompleteEndTransaction; the metadata `submit` appends the command to
the log before it first yields, so a held request woken here runs after that append and its
own command lands behind it, usually in the same commit, and at apply it is checked against
the completed transaction. A request arriving after that call, while the completion is
appended but not yet applied, is not held at all: `proposing` leaves a mark, and its command
lands behind the completion as it is (held, it would wait for the apply and cost a commit of
its own). The coordinators clear the mark (`expect`) before they propose an end a client
asked for (EndTxn, a fencing InitProducerId), so a mark belongs to the latest such end's
completion; an end proposed otherwise (a timeout, an operator's abort) bumps the epoch, so no
client's request matches its preparing state. Safety never depends on this order:
a command that landed first would be checked against the still-preparing state and rejected
CONCURRENT_TRANSACTIONS, which clients retry.

Bounds: one callback per held request, each held at most the handler's bound, and removed
when its hold ends; at most `PROPOSED_MARKS_MAX` marks, the oldest dropped first (a dropped
mark only makes a request wait for the apply).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from raftlog.rpc.port import NodePort

__all__ = ["HOLD_WHILE_ENDING_S", "PROPOSED_MARKS_MAX", "TxnCompletions", "wait_until_completed"]

# How long a request arriving while its producer's previous transaction completes is held for
# that completion, well under clients' request timeouts (30 s); past it the request is
# proposed anyway and rejected CONCURRENT_TRANSACTIONS, which clients retry.
HOLD_WHILE_ENDING_S = 5.0
# Transactional ids whose completion was proposed, kept (the marker duty completes at most a
# few hundred at once).
PROPOSED_MARKS_MAX = 4096


class TxnCompletions:
    """Per transactional id, the callbacks of requests waiting for its completion."""

    def __init__(self) -> None:
        self._waiters: dict[str, list[Callable[[], None]]] = {}
        self._proposed: collections.OrderedDict[str, None] = collections.OrderedDict()

    def expect(self, transactional_id: str) -> None:
        """The coordinator is about to propose an end of `transactional_id`: its earlier
        completion's mark no longer says anything about the next."""
        self._proposed.pop(transactional_id, None)

    def proposing(self, transactional_id: str) -> None:
        """The coordinator is about to propose `transactional_id`'s completion."""
        self._proposed[transactional_id] = None
        self._proposed.move_to_end(transactional_id)
        if len(self._proposed) > PROPOSED_MARKS_MAX:
            self._proposed.popitem(last=False)
        assert len(self._proposed) <= PROPOSED_MARKS_MAX
        for callback in self._waiters.pop(transactional_id, []):
            callback()

    def proposed(self, transactional_id: str) -> bool:
        """Whether the completion of `transactional_id`'s latest end was proposed."""
        return transactional_id in self._proposed

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


async def wait_until_completed(
    node: NodePort, transactional_id: str, producer_id: int, producer_epoch: int
) -> None:
    """Returns once `transactional_id`'s previous transaction is no longer completing (its
    completion proposed, or committed), or after `HOLD_WHILE_ENDING_S`; at once if it is not
    completing or the request is not from the producer its end answered (the bumped epoch,
    or the next producer id at epoch 0 when the end rotates).

    Kafka answers such a request CONCURRENT_TRANSACTIONS and the client backs off and
    retries; here it waits for the completion instead and is then proposed as usual, right
    behind the completion when the wait ended on its proposal (one Raft commit for both). Its
    check at apply decides, as for any request: the client neither backs off nor costs the
    metadata quorum a commit of a command to be rejected."""
    machine = node.metadata

    def completing() -> bool:
        txn = machine.state.transaction(transactional_id)
        return (
            txn is not None
            and txn.state.preparing
            and txn.producer_after_end() == (producer_id, producer_epoch)
        )

    if not completing() or node.txn_completions.proposed(transactional_id):
        return  # nothing to wait for, or the completion is in the log ahead of this request
    wake = asyncio.Event()
    proposed = False

    def on_proposed() -> None:
        nonlocal proposed
        proposed = True
        wake.set()

    machine.listeners.append(wake.set)
    try:
        with node.txn_completions.watch(transactional_id, on_proposed):
            async with asyncio.timeout(HOLD_WHILE_ENDING_S):
                while completing() and not proposed:
                    await wake.wait()
                    wake.clear()
    except TimeoutError:
        pass  # proposed anyway: rejected CONCURRENT_TRANSACTIONS, which the client retries
    finally:
        machine.listeners.remove(wake.set)
