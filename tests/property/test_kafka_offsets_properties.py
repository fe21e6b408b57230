"""Kafka offsets over a Raft log, against a plain model (Hypothesis stateful test).

The model is the list of entries the Raft log holds, each a data batch of n records or one
of Raft's own entries (a term's no-op, a membership change), plus the Kafka offset at the
log's first offset. Rules append (a new term starts with its no-op, Raft §8), change the
membership, truncate a suffix (Raft §5.3, a new leader's conflicting entries), cut the log
below a committed offset (retention records a snapshot carrying the Kafka offset there) and
reopen the storage, which must rebuild what it knows from its files. The invariants: every
data record's Kafka offset is the count of data records before it in the whole history (so
a fresh log's first record is at 0 and nothing a reader saw is renumbered), translation
goes both ways, and a read as clients see it holds only data batches, numbered so.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from raftlog.config import LogConfig
from raftlog.raft.types import Entry, EntryKind, Membership, Snapshot, SnapshotMeta
from raftlog.storage.batch import parse_header
from raftlog.storage.kafka_offsets import kafka_offset, raft_offset, to_kafka_batches
from raftlog.storage.raft_log_storage import RaftLogStorage
from raftlog.storage.records import RecordInput, encode_batch
from raftlog.storage.sim_file_system import SimFileSystem
from raftlog.storage.wall_clock import ManualWallClock
from raftlog.types import NodeId, Offset, Term

CONFIG = LogConfig(segment_bytes_max=600, batch_bytes_max=300, index_interval_bytes=100).validate()
DIRECTORY = "/data/partition"
_directories = itertools.count()


@dataclass(frozen=True)
class ModelEntry:
    offset: int
    count: int  # offsets it takes in the Raft log
    kind: EntryKind
    term: int
    kafka: int  # the Kafka offset of its first record (data), or of the next record


class KafkaOffsetsMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.files = SimFileSystem(seed=0)
        self.directory = f"{DIRECTORY}-{next(_directories)}"
        self.storage = self._open()
        self.entries: list[ModelEntry] = []
        self.first = 0  # the log's first offset
        self.kafka_start = 0  # the Kafka offset there
        self.term = 0
        self.kafka_next = 0  # the Kafka offset the next data record gets
        self._start_term()

    def _open(self) -> RaftLogStorage:
        return RaftLogStorage.open(
            self.directory, config=CONFIG, files=self.files, clock=ManualWallClock(1)
        )

    @property
    def end(self) -> int:
        return self.entries[-1].offset + self.entries[-1].count if self.entries else self.first

    def _append(self, kind: EntryKind, count: int) -> None:
        offset = self.end
        if kind is EntryKind.DATA:
            data = encode_batch([RecordInput(None, b"v", 1000)] * count)
        elif kind is EntryKind.CONFIG:
            data = Membership(frozenset({NodeId(1), NodeId(2)})).encode()
        else:
            data = b""
        self.storage.append([Entry(Term(self.term), Offset(offset), count, kind, data)])
        self.entries.append(ModelEntry(offset, count, kind, self.term, self.kafka_next))
        if kind is EntryKind.DATA:
            self.kafka_next += count

    def _start_term(self) -> None:
        self.term += 1
        self._append(EntryKind.NOOP, 1)

    # --- rules ------------------------------------------------------------------------

    @rule(records=st.integers(1, 5))
    def append_data(self, records: int) -> None:
        self._append(EntryKind.DATA, records)

    @rule()
    def new_leader(self) -> None:
        self._start_term()

    @rule()
    def change_membership(self) -> None:
        self._append(EntryKind.CONFIG, 1)

    @precondition(lambda self: len(self.entries) > 1)
    @rule(data=st.data())
    def truncate_suffix(self, data: st.DataObject) -> None:
        """A new leader's log conflicts from some entry on: it replaces the suffix."""
        keep = data.draw(st.integers(1, len(self.entries) - 1))
        cut = self.entries[keep]
        self.entries = self.entries[:keep]
        self.kafka_next = cut.kafka
        self.term += 1
        # The conflicting entry's replacement is the new leader's no-op at the same offset.
        self._append(EntryKind.NOOP, 1)
        assert self.entries[-1].offset == cut.offset

    @precondition(lambda self: len(self.entries) > 2)
    @rule(data=st.data())
    def cut_below(self, data: st.DataObject) -> None:
        """Retention: a snapshot at an entry's last offset, carrying the Kafka offset after
        it, then the log below it goes."""
        index = data.draw(st.integers(0, len(self.entries) - 2))
        entry = self.entries[index]
        offset = entry.offset + entry.count - 1
        kafka_start = self.storage.kafka_offset(offset + 1)
        meta = SnapshotMeta(Offset(offset), Term(entry.term), Membership(frozenset({NodeId(1)})))
        self.storage.compact(Snapshot(meta, b""))
        assert self.storage.kafka_start == kafka_start  # the cut keeps every Kafka offset
        self.entries = self.entries[index + 1 :]
        self.first, self.kafka_start = offset + 1, kafka_start

    @rule()
    def reopen(self) -> None:
        self.storage.sync()
        self.storage.close()
        self.storage = self._open()
        # What a partition's snapshot tells the storage on recovery.
        self.storage.set_kafka_start(self.kafka_start)

    # --- invariants -------------------------------------------------------------------

    @invariant()
    def every_record_keeps_its_kafka_offset(self) -> None:
        for entry in self.entries:
            assert self.storage.kafka_offset(entry.offset) == entry.kafka, entry
            if entry.kind is EntryKind.DATA:
                for index in range(entry.count):
                    assert self.storage.raft_offset(entry.kafka + index) == entry.offset + index
        assert self.storage.kafka_offset(self.end) == self.kafka_next

    @invariant()
    def a_client_read_holds_only_data_numbered_in_order(self) -> None:
        data_entries = [e for e in self.entries if e.kind is EntryKind.DATA]
        if not data_entries:
            return
        expected = data_entries[0].kafka
        while expected < self.kafka_next:  # a read stops at a segment's end
            raw = self.storage.read_kafka(expected, bytes_max=10_000)
            assert raw, f"nothing read at Kafka offset {expected}"
            position = 0
            while position < len(raw):
                header = parse_header(raw[position:])
                assert not header.is_control, "Raft's own entries never reach a client"
                assert header.base_offset == expected, (header.base_offset, expected)
                expected += header.offset_count
                position += header.size_bytes
        assert expected == self.kafka_next


def test_translation_of_a_worked_example() -> None:
    """ARCHITECTURE's example (raftlog.storage.kafka_offsets): no-ops at 0 and 6."""
    internal = [0, 6]

    def kafka(raft: int) -> int:
        return kafka_offset(raft, first=0, kafka_start=0, internal=internal)

    assert [kafka(1), kafka(3), kafka(7), kafka(8)] == [0, 2, 5, 6]
    assert raft_offset(5, first=0, kafka_start=0, internal=internal) == 7
    assert to_kafka_batches(b"", first=0, kafka_start=0, internal=internal) == b""


KafkaOffsetsMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestKafkaOffsets = KafkaOffsetsMachine.TestCase
