"""KIP-890 part 1 on a partition leader: is this partition in the producer's transaction?

Theory of operation. A partition leader accepts the first transactional batch of a
producer's transaction only once its node's copy of the metadata shows the partition in that
producer's Ongoing transaction at that epoch (`raftlog.metadata.transactions.
partition_in_transaction`). The coordinator commits AddPartitionsToTxn before it answers the
producer, and the producer sends the batch only after that answer, so the copy is at most a
replication round behind: the check waits up to `kafka.txn_verification_wait_ms` for it,
re-checking at every metadata apply, then answers False (INVALID_TXN_STATE, nothing
written). Without the check, a produce delayed past its transaction's end would open a
transaction the coordinator never heard of, which no marker would ever end (the hanging
transactions and torn reads of Jepsen's Bufstream analysis).

`kafka.txn_verification = false` turns the check off: a test-only switch, so the chaos
suite can show its checker catches what the check prevents.
"""

from __future__ import annotations

import asyncio

from raftlog.metadata.machine import MetadataMachine
from raftlog.metadata.transactions import partition_in_transaction
from raftlog.partition.replica import TxnVerifier

__all__ = ["TxnVerification"]


class TxnVerification:
    """Builds each partition replica's verifier over the node's metadata copy."""

    def __init__(self, *, metadata: MetadataMachine, wait_ms: int, enabled: bool) -> None:
        assert wait_ms >= 0, wait_ms
        self._metadata = metadata
        self._wait_s = wait_ms / 1000
        self._enabled = enabled
        self._changed = asyncio.Event()
        metadata.listeners.append(self._on_apply)

    def verifier(self, topic: str, partition: int) -> TxnVerifier | None:
        """The verifier of one partition replica; None when the check is switched off."""
        if not self._enabled:
            return None

        async def verify(producer_id: int, producer_epoch: int) -> bool:
            return await self.wait_in_transaction(topic, partition, producer_id, producer_epoch)

        return verify

    async def wait_in_transaction(
        self, topic: str, partition: int, producer_id: int, producer_epoch: int
    ) -> bool:
        """True once the metadata copy shows the partition in the producer's ongoing
        transaction at `producer_epoch`; False if it does not within the wait."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._wait_s
        while True:
            state = self._metadata.state
            if partition_in_transaction(state, producer_id, producer_epoch, topic, partition):
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                continue  # one last look at the copy before refusing

    def _on_apply(self) -> None:
        # Wake every waiter once; later waiters wait on a fresh event.
        self._changed.set()
        self._changed = asyncio.Event()
