"""The transaction coordinator's duty on the controller: finish decided transactions and abort
those that ran past their timeout.

Theory of operation. The decision to commit or abort is a metadata command
(PrepareEndTransaction), committed before EndTxn is answered; everything after it is this
duty's, driven only by the replicated state, so a new controller picks up exactly where the
old one stopped:

1. every transactional id in PrepareCommit/PrepareAbort gets its COMMIT/ABORT marker written
   into each partition of its transaction (`write_txn_markers` on the node port, which routes
   each to its partition's leader), at the id's current epoch (the bumped one after EndTxn
   v5) and with the metadata term as the coordinator epoch; once every marker is written
   (or its partition is gone) the controller commits CompleteEndTransaction, which also
   commits or drops the transaction's pending offsets. Just before submitting it, the duty
   tells the requests held for it (`raftlog.rpc.txn_completions`), which propose behind it.
   A marker written twice (a controller change between markers and completion) ends nothing
   new: the partition's transaction is already over, so it changes nothing readers see. A
   retry after some markers failed (a partition without a leader, say) writes only the
   others: each marker takes an offset, so rewriting those already written would add one to
   every healthy partition per retry;
2. every Ongoing transaction older than its timeout is aborted by the coordinator itself:
   PrepareEndTransaction(abort) with the epoch bumped, which fences its producer (its next
   request carries an epoch from the past), then step 1;
3. every id with no transaction open and unchanged for TRANSACTIONAL_ID_EXPIRATION_MS is
   forgotten (ExpireTransactionalId; its check at apply keeps an id used meanwhile).

Bounds: at most `COMPLETIONS_IN_FLIGHT_MAX` transactions complete at once; a failed marker
write is retried after `RETRY_BACKOFF_S`. The duty wakes on every metadata change and every
`TICK_S`, the resolution of timeouts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

from raftlog.errors import RaftlogError
from raftlog.metadata import ApplyResult, Command, MetadataState
from raftlog.metadata.commands import (
    CompleteEndTransaction,
    ExpireTransactionalId,
    PrepareEndTransaction,
)
from raftlog.metadata.transactions import (
    TRANSACTIONAL_ID_EXPIRATION_MS,
    TransactionState,
    TxnState,
)
from raftlog.rpc.txn_completions import TxnCompletions
from raftlog.runtime.recorder import recorder
from raftlog.types import TxnMarker, TxnMarkerResult

__all__ = ["COMPLETIONS_IN_FLIGHT_MAX", "TransactionMarkerDuty", "markers_of"]

log = logging.getLogger(__name__)

COMPLETIONS_IN_FLIGHT_MAX = 64
TICK_S = 0.1
RETRY_BACKOFF_S = 0.2
MARKER_TIMEOUT_S = 5.0
SUBMIT_TIMEOUT_S = 5.0
# Kafka's codes a marker write answers: written; no such partition (on the node asked).
_NONE, _UNKNOWN_TOPIC_OR_PARTITION = 0, 3

Submit = Callable[[Command], Awaitable[ApplyResult]]
_Attempt = tuple[int, int, int, str, int]  # producer id, epoch, started_ms, state, term
WriteMarkers = Callable[[Sequence[TxnMarker], float], Awaitable[list[TxnMarkerResult]]]


def markers_of(
    state: MetadataState, txn: TransactionState, coordinator_epoch: int
) -> list[TxnMarker]:
    """The markers that end `txn` (preparing), one per partition of it that still exists."""
    assert txn.state.preparing, txn
    return [
        TxnMarker(
            producer_id=txn.producer_id,
            producer_epoch=txn.producer_epoch,
            coordinator_epoch=coordinator_epoch,
            commit=txn.state is TxnState.PREPARE_COMMIT,
            topic=topic,
            partition=partition,
        )
        for topic, partition in sorted(txn.partitions)
        if state.partition(topic, partition) is not None
    ]


class TransactionMarkerDuty:
    def __init__(
        self,
        *,
        state: Callable[[], MetadataState],
        controller_term: Callable[[], int | None],
        submit: Submit,
        write_markers: WriteMarkers,
        wall_clock_ms: Callable[[], int],
        completions: TxnCompletions | None = None,
    ) -> None:
        self._state = state
        self._completions = completions
        self._controller_term = controller_term
        self._submit = submit
        self._write_markers = write_markers
        self._wall_clock_ms = wall_clock_ms
        self._wake = asyncio.Event()
        self._in_flight: dict[str, asyncio.Task[None]] = {}
        # Per transactional id whose completion is under way: the attempt (producer id,
        # epoch, start, state, controller term) and the partitions whose markers it wrote. At
        # most one entry per id in the state; cleared when the term changes, dropped once the
        # completion is submitted.
        self._written: dict[str, tuple[_Attempt, frozenset[tuple[str, int]]]] = {}
        self._written_term: int | None = None

    def wake(self) -> None:
        """A metadata listener: something may have become preparing."""
        self._wake.set()

    async def run(self) -> None:
        try:
            while True:
                self.step()
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), TICK_S)
        finally:
            await self.close()

    def step(self) -> None:
        """One pass: start completing preparing transactions, abort timed-out ones."""
        term = self._controller_term()
        if term != self._written_term:
            self._written.clear()
            self._written_term = term
        if term is None:
            return
        state = self._state()
        now_ms = self._wall_clock_ms()
        for txn in state.transactions():
            if len(self._in_flight) >= COMPLETIONS_IN_FLIGHT_MAX:
                break
            if txn.transactional_id in self._in_flight:
                continue
            if txn.state.preparing:
                self._start(txn.transactional_id, self._complete(txn, term))
            elif txn.timed_out(now_ms):
                self._start(txn.transactional_id, self._abort_timed_out(txn, now_ms))
            elif txn.expired(now_ms, TRANSACTIONAL_ID_EXPIRATION_MS):
                expire = ExpireTransactionalId(
                    txn.transactional_id, TRANSACTIONAL_ID_EXPIRATION_MS, now_ms
                )
                self._start(txn.transactional_id, self._expire(expire))

    def _start(self, transactional_id: str, work: Awaitable[None]) -> None:
        async def guarded() -> None:
            try:
                await work
            except (RaftlogError, TimeoutError) as error:
                log.info("transaction %r: %s; retrying", transactional_id, error)
                await asyncio.sleep(RETRY_BACKOFF_S)
            finally:
                del self._in_flight[transactional_id]
                self._wake.set()

        self._in_flight[transactional_id] = asyncio.create_task(
            guarded(), name=f"txn-{transactional_id}"
        )

    async def _complete(self, txn: TransactionState, term: int) -> None:
        # Which transaction, not only which producer: a client without KIP-890 part 2 (EndTxn
        # below v5) keeps its epoch from one transaction to the next, so (producer id, epoch,
        # term) alone would let a set left from one transaction skip the next one's markers.
        attempt = (txn.producer_id, txn.producer_epoch, txn.started_ms, txn.state.value, term)
        earlier = self._written.get(txn.transactional_id)
        written = earlier[1] if earlier is not None and earlier[0] == attempt else frozenset()
        markers = [
            m for m in markers_of(self._state(), txn, term) if (m.topic, m.partition) not in written
        ]
        results = await self._write_markers(markers, MARKER_TIMEOUT_S) if markers else []
        failed = [r for r in results if not self._done(r)]
        if failed:
            written |= {(r.topic, r.partition) for r in results if self._done(r)}
            self._written[txn.transactional_id] = (attempt, written)
            log.info("transaction %r: markers not written yet: %s", txn.transactional_id, failed)
            await asyncio.sleep(RETRY_BACKOFF_S)
            return
        if self._controller_term() != term:
            return  # the next controller completes it
        command = CompleteEndTransaction(
            txn.transactional_id, txn.producer_id, txn.producer_epoch, self._wall_clock_ms()
        )
        if self._completions is not None:
            # Requests held for this completion propose right behind it (same commit).
            self._completions.proposing(txn.transactional_id)
        try:
            result = await self._submit(command)
        finally:
            # Even when the answer is lost (a timeout; the completion may still commit):
            # a retry then writes every marker again, which ends nothing new.
            self._written.pop(txn.transactional_id, None)
        if not result.ok:
            log.info("transaction %r: completion refused: %s", txn.transactional_id, result)
            return
        recorder().on_transaction_completed(commit=txn.state is TxnState.PREPARE_COMMIT)

    def _done(self, result: TxnMarkerResult) -> bool:
        """Whether a marker needs no retry: it was written, or its partition is gone from the
        coordinator's own metadata. A node answers UNKNOWN_TOPIC_OR_PARTITION also while it
        does not host the partition *yet* (restarted, still replaying its metadata; its copy
        reopened for repair): taking that answer as final would complete the transaction
        without the marker, leave its records open on that partition, and let the producer's
        next ABORT there index them as aborted, hiding committed records from read_committed
        readers. Kafka's coordinator, too, drops a marker only when its metadata cache no
        longer has the partition."""
        if result.error_code == _NONE:
            return True
        return (
            result.error_code == _UNKNOWN_TOPIC_OR_PARTITION
            and self._state().partition(result.topic, result.partition) is None
        )

    async def _abort_timed_out(self, txn: TransactionState, now_ms: int) -> None:
        log.info(
            "transaction %r: open %d ms, past its timeout of %d ms: aborting",
            txn.transactional_id, now_ms - txn.started_ms, txn.timeout_ms,
        )  # fmt: skip
        command = PrepareEndTransaction(
            txn.transactional_id, txn.producer_id, txn.producer_epoch, False, True, now_ms
        )
        if (await self._submit(command)).ok:
            recorder().on_transaction_timed_out()

    async def _expire(self, command: ExpireTransactionalId) -> None:
        log.info(
            "transactional id %r: unused past its expiration: forgotten", command.transactional_id
        )
        await self._submit(command)

    async def close(self) -> None:
        """Cancels the completions under way (the next controller, or this one on its next
        run, starts them again from the replicated state)."""
        tasks = list(self._in_flight.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
