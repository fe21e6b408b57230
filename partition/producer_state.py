"""Idempotent producers: the per-partition table that keeps retried batches from landing twice.

Theory of operation (Kafka's idempotence, KIP-98). A producer gets a producer id and epoch and
numbers its records per partition: a batch carries `base_sequence` and `record_count`, so it
covers sequences `[base_sequence, base_sequence + record_count - 1]`. For each producer the
table keeps its epoch, the last sequence written and the last few batches (sequence range ->
offsets). A new batch is then exactly one of:

    NEW           base_sequence == last_sequence + 1; 0 for a new epoch of a known producer;
                  any sequence for a producer the table does not know
    DUPLICATE     its sequence range equals one of the remembered batches: answer with the
                  offsets that batch was written at, write nothing (for a transactional
                  batch, only a batch of the transaction still open: a match with an ended
                  transaction's batch is a client reusing sequences, OUT_OF_ORDER)
    OUT_OF_ORDER  anything else (a gap: an earlier batch was lost; the producer must fail it)
    FENCED        an epoch older than the one on record

A producer the table does not know (its topic was recreated, or its state was evicted or
deleted with the log) may continue any sequence, as Kafka accepts (ProducerAppendInfo: "there
is no current producer epoch ... accept writes with any sequence number"): refusing it
OUT_OF_ORDER_SEQUENCE is fatal to librdkafka's idempotent producer (librdkafka test 0107).

Transactions (KIP-98). A transactional batch opens its producer's transaction on the partition
if none is open: the table keeps the transaction's first offset until a COMMIT or ABORT marker
(a control batch with the producer's id and epoch) ends it. A non-transactional batch of a
producer whose transaction is open is refused INVALID_TXN_STATE. A marker is refused when its
producer epoch is older than the producer's (INVALID_PRODUCER_EPOCH) or its coordinator epoch
older than the last marker's (TRANSACTION_COORDINATOR_FENCED); a marker for a producer the
table does not know, or one with no open transaction, is written and ends nothing (Kafka's
ProducerAppendInfo.appendEndTxnMarker: a marker of an empty transaction adds nothing to the
aborted index). An ABORT that ends an open transaction returns (producer id, first offset,
the marker's offset), which the replica appends to the aborted-transaction index
(`raftlog.storage.txn_index`, one file per segment), which read_committed fetches answer
from; the table itself keeps no list of aborted transactions. The earliest open
transaction's first offset bounds the last stable offset (LSO), and a producer with an open
transaction is never evicted (its transaction would stay open forever otherwise).

Worked example, offsets in Raft offsets: producer 7 writes transactional batches at 10-11
and 14, producer 8 one at 12; the earliest open transaction starts at 10, so the LSO is 10.
An ABORT of 7 at 15 returns (7, 10, 15) for the aborted index and the LSO moves to 12 (8's
transaction); a COMMIT of 8 at 16 adds nothing and the LSO is the high watermark again.

The table is a pure value: it is rebuilt deterministically by applying committed batches in
offset order (on every replica), saved in partition snapshots and checkpoints, and the leader
checks new batches against a copy that also holds its own uncommitted appends. A saved table
may carry a list of aborted transactions beside it (`encode(aborted=...)`,
`decode_aborted`): the replica's entries the table already accounts for whose markers lie
after the saved offset (a snapshot's table can be ahead of its offset); a table saved
before the index existed lists every aborted transaction there.
"""

from __future__ import annotations

import enum
import json
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from raftlog.storage.txn_index import AbortedTxn

__all__ = ["AbortedTxn", "ProducerStateTable", "SequenceVerdict", "Verdict", "decode_aborted"]

# Kafka remembers the last five batches per producer: the most a producer keeps in flight.
REMEMBERED_BATCHES_MAX = 5
# Producer ids a partition remembers unless told otherwise (the idle-longest are evicted).
PRODUCERS_MAX_DEFAULT = 10_000


class Verdict(enum.Enum):
    NEW = "new"
    DUPLICATE = "duplicate"
    OUT_OF_ORDER = "out-of-order"
    FENCED = "fenced"
    # A non-transactional batch while the producer's transaction is open.
    INVALID_TXN_STATE = "invalid-txn-state"
    # A marker from a coordinator older than the last marker's.
    COORDINATOR_FENCED = "coordinator-fenced"


@dataclass(frozen=True, slots=True)
class SequenceVerdict:
    verdict: Verdict
    base_offset: int = -1  # DUPLICATE: where the original batch was written
    last_offset: int = -1
    message: str = ""


@dataclass(frozen=True, slots=True)
class _Batch:
    first_sequence: int
    last_sequence: int
    base_offset: int
    last_offset: int


class _Producer:
    __slots__ = ("batches", "coordinator_epoch", "epoch", "txn_first_offset")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.batches: deque[_Batch] = deque(maxlen=REMEMBERED_BATCHES_MAX)
        self.txn_first_offset = -1  # the open transaction's first offset; -1: none open
        self.coordinator_epoch = -1  # of the last marker

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_sequence if self.batches else -1


class ProducerStateTable:
    """Producer id -> epoch and recent batches; at most `producers_max` ids (oldest evicted)."""

    def __init__(self, *, producers_max: int) -> None:
        assert producers_max > 0
        self._producers_max = producers_max
        # Ordered by last write, so eviction drops the producer idle the longest.
        self._producers: OrderedDict[int, _Producer] = OrderedDict()
        # Producer id -> its open transaction's first offset (a copy of txn_first_offset,
        # so the LSO does not scan every producer).
        self._open: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._producers)

    def check(
        self,
        *,
        producer_id: int,
        epoch: int,
        base_sequence: int,
        record_count: int,
        transactional: bool = False,
    ) -> SequenceVerdict:
        assert producer_id >= 0 and record_count > 0
        producer = self._producers.get(producer_id)
        if producer is None:
            return SequenceVerdict(Verdict.NEW)
        verdict = self._check_sequence(producer_id, producer, epoch, base_sequence, record_count)
        if (
            verdict.verdict is Verdict.DUPLICATE
            and transactional
            and not 0 <= producer.txn_first_offset <= verdict.base_offset
        ):
            # A retry is always of a batch of the transaction still open here: a transaction
            # ends only once all its batches were answered or given up. So the same
            # sequences in a batch after the original's transaction ended are a different
            # batch: librdkafka's abort_transaction purges batches it queued for a retry, even
            # ones a leader had written before it failed, and numbers its next batches from the
            # purged ones' sequences. Answered as the duplicate, that new record would be
            # acknowledged at the aborted one's offset and never written. OUT_OF_ORDER_SEQUENCE
            # is Kafka's answer to a sequence that does not follow the last one; librdkafka
            # 2.16 takes it as fatal ("sequence desynchronization") and the application starts
            # a new producer (tests/kafka/test_sequence_reuse.py).
            return SequenceVerdict(
                Verdict.OUT_OF_ORDER,
                message=f"producer {producer_id} sent sequences {base_sequence}-"
                f"{base_sequence + record_count - 1} again after the transaction of its batch at "
                f"offset {verdict.base_offset} ended: a new batch, not a retry",
            )
        if verdict.verdict is Verdict.NEW and not transactional and producer.txn_first_offset >= 0:
            return SequenceVerdict(
                Verdict.INVALID_TXN_STATE,
                message=f"producer {producer_id} sent a non-transactional batch while its "
                f"transaction from offset {producer.txn_first_offset} is open",
            )
        return verdict

    @staticmethod
    def _check_sequence(
        producer_id: int, producer: _Producer, epoch: int, base_sequence: int, record_count: int
    ) -> SequenceVerdict:
        if epoch > producer.epoch:
            if base_sequence == 0:
                return SequenceVerdict(Verdict.NEW)
            return SequenceVerdict(
                Verdict.OUT_OF_ORDER,
                message=f"producer {producer_id} epoch {epoch} must start at sequence 0, "
                f"got {base_sequence}",
            )
        if epoch < producer.epoch:
            return SequenceVerdict(
                Verdict.FENCED,
                message=f"producer {producer_id} epoch {epoch} is older than {producer.epoch}",
            )
        last_sequence = base_sequence + record_count - 1
        for batch in producer.batches:
            if batch.first_sequence == base_sequence and batch.last_sequence == last_sequence:
                return SequenceVerdict(Verdict.DUPLICATE, batch.base_offset, batch.last_offset)
        if base_sequence == producer.last_sequence + 1:
            return SequenceVerdict(Verdict.NEW)
        return SequenceVerdict(
            Verdict.OUT_OF_ORDER,
            message=f"producer {producer_id} sent sequence {base_sequence}, expected "
            f"{producer.last_sequence + 1}",
        )

    def describe(self, producer_id: int) -> tuple[int, int, int] | None:
        """(epoch, last sequence, last offset) of `producer_id`; None if none is remembered."""
        producer = self._producers.get(producer_id)
        if producer is None or not producer.batches:
            return None
        last = producer.batches[-1]
        return producer.epoch, last.last_sequence, last.last_offset

    def describe_all(self) -> list[tuple[int, int, int, int, int]]:
        """(producer id, epoch, last sequence, coordinator epoch, open transaction's first
        offset or -1) of every producer remembered (Kafka's DescribeProducers)."""
        return [
            (pid, p.epoch, p.last_sequence, p.coordinator_epoch, p.txn_first_offset)
            for pid, p in self._producers.items()
        ]

    def record(
        self,
        *,
        producer_id: int,
        epoch: int,
        base_sequence: int,
        record_count: int,
        base_offset: int,
        last_offset: int,
        transactional: bool = False,
    ) -> None:
        """Remember a batch that was written (applied, or appended by this leader); a
        transactional one opens its producer's transaction if none is open."""
        producer = self._take(producer_id, epoch)
        producer.batches.append(
            _Batch(base_sequence, base_sequence + record_count - 1, base_offset, last_offset)
        )
        if transactional and producer.txn_first_offset < 0:
            producer.txn_first_offset = base_offset
            self._open[producer_id] = base_offset
        self._producers[producer_id] = producer
        self._evict()

    def _take(self, producer_id: int, epoch: int) -> _Producer:
        """The producer's entry, out of the table (the caller puts it back, last), moved to
        `epoch` if that is newer: a new epoch forgets the old one's batches (its sequences
        start again) but not an open transaction, which only a marker ends (as Kafka)."""
        producer = self._producers.pop(producer_id, None)
        if producer is None:
            return _Producer(epoch)
        if epoch > producer.epoch:
            renewed = _Producer(epoch)
            renewed.txn_first_offset = producer.txn_first_offset
            renewed.coordinator_epoch = producer.coordinator_epoch
            return renewed
        return producer

    def _evict(self) -> None:
        """Drop the producers idle the longest beyond the bound, never one whose transaction
        is open (its transaction would never end here)."""
        if len(self._producers) <= self._producers_max:
            return
        for producer_id in list(self._producers):
            if len(self._producers) <= self._producers_max:
                return
            if producer_id not in self._open:
                del self._producers[producer_id]

    # -- transactions --------------------------------------------------------------------------

    def check_marker(
        self, *, producer_id: int, epoch: int, coordinator_epoch: int
    ) -> SequenceVerdict:
        """Whether a COMMIT/ABORT marker may be written (Kafka's checks for control batches
        from the coordinator): NEW, FENCED or COORDINATOR_FENCED."""
        producer = self._producers.get(producer_id)
        if producer is None:
            return SequenceVerdict(Verdict.NEW)
        if epoch < producer.epoch:
            return SequenceVerdict(
                Verdict.FENCED,
                message=f"marker of producer {producer_id} with epoch {epoch}, older than "
                f"{producer.epoch}",
            )
        if coordinator_epoch < producer.coordinator_epoch:
            return SequenceVerdict(
                Verdict.COORDINATOR_FENCED,
                message=f"marker of producer {producer_id} from coordinator epoch "
                f"{coordinator_epoch}, older than {producer.coordinator_epoch}",
            )
        return SequenceVerdict(Verdict.NEW)

    def end_transaction(
        self, *, producer_id: int, epoch: int, coordinator_epoch: int, commit: bool, offset: int
    ) -> AbortedTxn | None:
        """Apply a marker written at `offset`: the producer's open transaction (if any) ends;
        an ABORT of an open one is returned, for the aborted-transaction index."""
        producer = self._producers.get(producer_id)
        if producer is not None and producer.txn_first_offset > offset:
            # A replay: a snapshot's table may be ahead of the snapshot's offset (the
            # replica's compaction_snapshot), and this marker ended an earlier transaction.
            return None
        producer = self._take(producer_id, epoch)
        first = producer.txn_first_offset
        producer.txn_first_offset = -1
        producer.coordinator_epoch = max(producer.coordinator_epoch, coordinator_epoch)
        self._open.pop(producer_id, None)
        self._producers[producer_id] = producer
        self._evict()
        if first < 0 or commit:
            return None
        return AbortedTxn(producer_id, first, offset)

    def has_open_transaction(self, producer_id: int) -> bool:
        return producer_id in self._open

    def open_transaction_first_offset(self, producer_id: int) -> int | None:
        """The first offset of `producer_id`'s open transaction (DescribeProducers'
        current_txn_start_offset); None when none is open."""
        return self._open.get(producer_id)

    def first_open_offset(self) -> int | None:
        """The first offset of the earliest open transaction: the LSO's bound."""
        return min(self._open.values()) if self._open else None

    def open_transactions(self) -> dict[int, int]:
        """Producer id -> first offset of every open transaction."""
        return dict(self._open)

    def copy(self) -> ProducerStateTable:
        return ProducerStateTable.decode(self.encode(), producers_max=self._producers_max)

    def encode(self, *, aborted: Sequence[AbortedTxn] = ()) -> bytes:
        """JSON: {"producers": [[id, epoch, batches, txn first offset, coordinator epoch],
        ...], "aborted": [[id, first offset, last offset], ...]} with `aborted` carried
        beside the table (module docstring). A table written before transactions is a bare
        list of [id, epoch, batches] (`decode` reads both)."""
        producers = [
            [
                pid,
                p.epoch,
                [
                    [b.first_sequence, b.last_sequence, b.base_offset, b.last_offset]
                    for b in p.batches
                ],
                p.txn_first_offset,
                p.coordinator_epoch,
            ]
            for pid, p in self._producers.items()
        ]
        carried = [[a.producer_id, a.first_offset, a.last_offset] for a in aborted]
        document = {"producers": producers, "aborted": carried}
        return json.dumps(document, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes, *, producers_max: int) -> ProducerStateTable:
        table = cls(producers_max=producers_max)
        if not data:
            return table
        document: Any = json.loads(data)
        if isinstance(document, list):  # written before transactions
            document = {"producers": document, "aborted": []}
        for pid, epoch, batches, *txn in document["producers"]:
            producer = _Producer(int(epoch))
            for first, last, base, end in batches:
                producer.batches.append(_Batch(int(first), int(last), int(base), int(end)))
            if txn:
                producer.txn_first_offset, producer.coordinator_epoch = int(txn[0]), int(txn[1])
                if producer.txn_first_offset >= 0:
                    table._open[int(pid)] = producer.txn_first_offset
            table._producers[int(pid)] = producer
        return table


def decode_aborted(data: bytes) -> list[AbortedTxn]:
    """The aborted transactions a saved table carries beside it, in marker order."""
    if not data:
        return []
    document: Any = json.loads(data)
    if isinstance(document, list):  # written before transactions
        return []
    return [AbortedTxn(int(pid), int(first), int(last)) for pid, first, last in document["aborted"]]
