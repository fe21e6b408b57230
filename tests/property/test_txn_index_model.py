"""The aborted-transaction index against a plain list (Hypothesis, stateful): over a real
segmented log on the simulated file system, any sequence of appends to the log, rolls,
aborted transactions indexed, Raft truncations, deletions of a prefix (retention, a
snapshot install past the end), flushes and crashes (after which the entries are applied
again, as a replica re-applies the log) leaves an index whose every range query answers
what the list does, with each entry in the file of the segment holding its marker."""

from __future__ import annotations

import dataclasses
import os

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from raftlog.config import LogConfig
from raftlog.storage.log import SegmentedLog
from raftlog.storage.records import RecordInput, encode_batch
from raftlog.storage.segment import TXN_INDEX_SUFFIX, parse_segment_name
from raftlog.storage.sim_file_system import SimFileSystem
from raftlog.storage.txn_index import AbortedTxn, TransactionIndex, decode_entries

DIRECTORY = "/log"
CONFIG = dataclasses.replace(LogConfig(), segment_bytes_max=1 << 20).validate()
BATCH = encode_batch([RecordInput(None, b"v", 0)])  # one offset each


class IndexMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.files = SimFileSystem(seed=7)
        self.log = SegmentedLog.open(DIRECTORY, config=CONFIG, files=self.files)
        self.index = TransactionIndex(self.log, cached_entries_max=4)
        self.model: list[AbortedTxn] = []

    @rule(count=st.integers(1, 8), roll=st.booleans())
    def append_batches(self, count: int, roll: bool) -> None:
        if roll and self.log.log_end_offset > self.log.segment_base_offsets[-1]:
            self.log.roll()
        for _ in range(count):
            self.log.append(BATCH, leader_epoch=1)
        self.log.flush()  # a replica applies only what is durable

    @rule(data=st.data(), producer_id=st.integers(0, 3))
    def abort(self, data: st.DataObject, producer_id: int) -> None:
        after = max(self.model[-1].last_offset if self.model else -1, self.log.log_start_offset)
        if after + 1 >= self.log.log_end_offset:
            return
        marker = data.draw(st.integers(max(after + 1, 1), self.log.log_end_offset - 1))
        first = data.draw(st.integers(0, marker - 1))
        txn = AbortedTxn(producer_id, first, marker)
        assert self.index.append(txn)
        assert not self.index.append(txn)  # a replay
        self.model.append(txn)

    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        start, end = self.log.log_start_offset, self.log.log_end_offset
        # A Raft conflict cuts a short suffix: near the end, so entries accumulate.
        offset = data.draw(st.integers(max(start, end - 6), end))
        self.log.truncate_from(offset)
        self.model = [a for a in self.model if a.last_offset < offset]

    @rule(data=st.data())
    def delete_prefix(self, data: st.DataObject) -> None:
        start, end = self.log.log_start_offset, self.log.log_end_offset
        restart = data.draw(st.integers(0, 9)) == 0  # a snapshot installed past the end
        offset = end + 3 if restart else data.draw(st.integers(start, min(start + 15, end)))
        self.log.delete_segments_before(offset)
        start = self.log.log_start_offset
        self.model = [a for a in self.model if a.last_offset >= start]

    @rule()
    def flush(self) -> None:
        self.index.flush()

    @rule(torn=st.none() | st.booleans())
    def crash(self, torn: bool | None) -> None:
        self.files.crash(torn=torn)
        self.log = SegmentedLog.open(DIRECTORY, config=CONFIG, files=self.files)
        self.index = TransactionIndex(self.log, cached_entries_max=4)
        assert self.index.recover()  # nothing here flips a synced byte
        for txn in self.model:  # the replica re-applies the log
            self.index.append(txn)

    @invariant()
    def answers_as_the_model(self) -> None:
        end = self.log.log_end_offset
        for start, stop in ((0, end + 1), (end // 3, end // 2 + 1), (end // 2, end)):
            assert self.index.collect(start, stop) == [
                a for a in self.model if a.last_offset >= start and a.first_offset < stop
            ], (start, stop)

    @precondition(lambda self: self.model)
    @invariant()
    def each_entry_in_its_segment_file(self) -> None:
        bases = self.log.segment_base_offsets
        ends = (*bases[1:], self.log.log_end_offset)
        held: list[AbortedTxn] = []
        for base, end in zip(bases, ends, strict=True):
            path = os.path.join(DIRECTORY, f"{base:020d}{TXN_INDEX_SUFFIX}")
            if self.files.exists(path):
                entries = decode_entries(self.files.file_bytes(path), base_offset=base).entries
                assert all(base <= a.last_offset < end for a in entries)
                held += entries
        assert held == self.model
        for name in self.files.list_directory(DIRECTORY):
            base = parse_segment_name(name, TXN_INDEX_SUFFIX)
            assert base is None or base in bases  # no file outlives its segment


IndexMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=30, deadline=None)
test_the_index_matches_a_plain_list = IndexMachine.TestCase
