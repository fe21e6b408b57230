"""Idempotent producers: the per-partition table that keeps retried batches from landing twice.

Theory of operation (Kafka's idempotence, KIP-98). A producer gets a producer id and epoch and
numbers its records per partition: a batch carries `base_sequence` and `record_count`, so it
covers sequences `[base_sequence, base_sequence + record_count - 1]`. For each producer the
table keeps its epoch, the last sequence written and the last few batches (sequence range ->
offsets). A new batch is then exactly one of:

    NEW           base_sequence == last_sequence + 1; 0 for a new epoch of a known producer;
                  any sequence for a producer the table does not know
    DUPLICATE     its sequence range equals one of the remembered batches: answer with the
                  offsets that batch was written at, write nothing
    OUT_OF_ORDER  anything else (a gap: an earlier batch was lost; the producer must fail it)
    FENCED        an epoch older than the one on record

A producer the table does not know (its topic was recreated, or its state was evicted or
deleted with the log) may continue any sequence, as Kafka accepts (ProducerAppendInfo: "there
is no current producer epoch ... accept writes with any sequence number"): refusing it
OUT_OF_ORDER_SEQUENCE is fatal to librdkafka's idempotent producer (librdkafka test 0107).

The table is a pure value: it is rebuilt deterministically by applying committed batches in
offset order (on every replica), saved in partition snapshots and checkpoints, and the leader
checks new batches against a copy that also holds its own uncommitted appends.
"""

from __future__ import annotations

import enum
import json
from collections import OrderedDict, deque
from dataclasses import dataclass

__all__ = ["ProducerStateTable", "SequenceVerdict", "Verdict"]

# Kafka remembers the last five batches per producer: the most a producer keeps in flight.
REMEMBERED_BATCHES_MAX = 5
# Producer ids a partition remembers unless told otherwise (the idle-longest are evicted).
PRODUCERS_MAX_DEFAULT = 10_000


class Verdict(enum.Enum):
    NEW = "new"
    DUPLICATE = "duplicate"
    OUT_OF_ORDER = "out-of-order"
    FENCED = "fenced"


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
    __slots__ = ("batches", "epoch")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.batches: deque[_Batch] = deque(maxlen=REMEMBERED_BATCHES_MAX)

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

    def __len__(self) -> int:
        return len(self._producers)

    def check(
        self, *, producer_id: int, epoch: int, base_sequence: int, record_count: int
    ) -> SequenceVerdict:
        assert producer_id >= 0 and record_count > 0
        producer = self._producers.get(producer_id)
        if producer is None:
            return SequenceVerdict(Verdict.NEW)
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

    def record(
        self,
        *,
        producer_id: int,
        epoch: int,
        base_sequence: int,
        record_count: int,
        base_offset: int,
        last_offset: int,
    ) -> None:
        """Remember a batch that was written (applied, or appended by this leader)."""
        producer = self._producers.pop(producer_id, None)
        if producer is None or epoch > producer.epoch:
            producer = _Producer(epoch)
        producer.batches.append(
            _Batch(base_sequence, base_sequence + record_count - 1, base_offset, last_offset)
        )
        self._producers[producer_id] = producer
        while len(self._producers) > self._producers_max:
            self._producers.popitem(last=False)

    def copy(self) -> ProducerStateTable:
        return ProducerStateTable.decode(self.encode(), producers_max=self._producers_max)

    def encode(self) -> bytes:
        return json.dumps(
            [
                [
                    pid,
                    p.epoch,
                    [
                        [b.first_sequence, b.last_sequence, b.base_offset, b.last_offset]
                        for b in p.batches
                    ],
                ]
                for pid, p in self._producers.items()
            ],
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, data: bytes, *, producers_max: int) -> ProducerStateTable:
        table = cls(producers_max=producers_max)
        if not data:
            return table
        for pid, epoch, batches in json.loads(data):
            producer = _Producer(int(epoch))
            for first, last, base, end in batches:
                producer.batches.append(_Batch(int(first), int(last), int(base), int(end)))
            table._producers[int(pid)] = producer
        return table
