"""The segmented log against a plain list model, through crashes (Hypothesis stateful test).

The model is the list of batches the log should hold, each with its offsets and its exact
bytes (as patched by the log), plus the log start and how many offsets are durable. Rules
append, read, truncate (Raft §5.3 conflict resolution), roll, flush, delete segments
(snapshots), apply retention, reopen cleanly, and crash: the simulated file system then drops
or tears everything not synced. After a crash the log must equal a prefix of the model that
keeps at least every flushed offset ("nothing flushed is ever lost"); the model then forgets
the rest, as the log did.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from raftlog.config import LogConfig
from raftlog.storage.batch import parse_header, patch_base_offset_and_epoch
from raftlog.storage.log import SegmentedLog
from raftlog.storage.records import RecordInput, encode_batch
from raftlog.storage.sim_file_system import SimFileSystem
from raftlog.storage.wall_clock import ManualWallClock

CONFIG = LogConfig(
    segment_bytes_max=700,
    segment_age_ms_max=500,
    index_interval_bytes=100,
    batch_bytes_max=300,
    append_buffer_bytes_max=200,
    retention_bytes=1500,
    retention_ms=2000,
).validate()
DIRECTORY = "/data/partition-0"


@dataclass(frozen=True)
class ModelBatch:
    base_offset: int
    last_offset: int
    data: bytes

    @property
    def max_timestamp_ms(self) -> int:
        return parse_header(self.data).max_timestamp


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualWallClock(10_000)
        self.files = SimFileSystem(seed=0)
        self.log = SegmentedLog.open(DIRECTORY, config=CONFIG, files=self.files, clock=self.clock)
        self.batches: list[ModelBatch] = []
        self.start_offset = 0
        self.end_offset = 0
        self.durable_offset = 0

    @initialize(seed=st.integers(0, 2**32 - 1))
    def seed_the_file_system(self, seed: int) -> None:
        self.files.random.seed(seed)

    # --- helpers ----------------------------------------------------------------------

    def _boundaries(self) -> list[int]:
        return [b.base_offset for b in self.batches]

    def _drop_model_from(self, offset: int) -> None:
        self.batches = [b for b in self.batches if b.base_offset < offset]
        self.end_offset = offset
        self.durable_offset = min(self.durable_offset, offset)

    def _reopen(self) -> None:
        self.log = SegmentedLog.open(DIRECTORY, config=CONFIG, files=self.files, clock=self.clock)

    def _check_contents(self) -> None:
        offset, held = self.log.log_start_offset, []
        while offset < self.log.log_end_offset:
            for header, view in self.log.batches(offset, bytes_max=400):
                held.append(ModelBatch(header.base_offset, header.last_offset, bytes(view)))
                offset = header.last_offset + 1
        assert held == [b for b in self.batches if b.base_offset >= self.log.log_start_offset]

    # --- rules ------------------------------------------------------------------------

    @rule(
        records=st.integers(1, 4),
        value_bytes=st.integers(0, 40),
        epoch=st.integers(0, 5),
        advance_ms=st.integers(0, 300),
        skew_ms=st.integers(0, 400),
        as_follower=st.booleans(),
    )
    def append(
        self,
        records: int,
        value_bytes: int,
        epoch: int,
        advance_ms: int,
        skew_ms: int,
        as_follower: bool,
    ) -> None:
        self.clock.advance(advance_ms)
        # Producers' clocks disagree: batch timestamps need not rise along the log.
        timestamp_ms = self.clock.now_ms() - skew_ms
        raw = encode_batch([RecordInput(None, b"v" * value_bytes, timestamp_ms)] * records)
        base = self.end_offset
        info = self.log.append(raw, leader_epoch=epoch, base_offset=base if as_follower else None)
        expected = bytearray(raw)
        patch_base_offset_and_epoch(expected, 0, base_offset=base, leader_epoch=epoch)
        assert (info.base_offset, info.last_offset) == (base, base + records - 1)
        self.batches.append(ModelBatch(base, base + records - 1, bytes(expected)))
        self.end_offset = base + records

    @precondition(lambda self: self.end_offset > self.start_offset)
    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(self.start_offset, self.end_offset - 1))
        bytes_max = data.draw(st.integers(1, 600))
        result = self.log.read(offset, bytes_max=bytes_max)
        first = next(b for b in self.batches if b.base_offset <= offset <= b.last_offset)
        assert result.data.startswith(first.data)
        assert len(result.data) <= max(bytes_max, len(first.data))
        expected = b"".join(b.data for b in self.batches if b.base_offset >= first.base_offset)
        assert expected.startswith(result.data)

    @rule(back_ms=st.integers(-50, 2000))
    def offset_for_timestamp(self, back_ms: int) -> None:
        target_ms = self.clock.now_ms() - back_ms
        expected = next(
            (b.base_offset for b in self.batches if b.max_timestamp_ms >= target_ms), None
        )
        assert self.log.offset_for_timestamp(target_ms) == expected

    @precondition(lambda self: self.batches)
    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        offset = data.draw(st.sampled_from([*self._boundaries(), self.end_offset]))
        if offset < self.start_offset:
            return
        self.log.truncate_from(offset)
        self._drop_model_from(offset)

    @rule()
    def roll(self) -> None:
        self.log.roll()
        if self.batches and self.batches[-1].last_offset + 1 == self.end_offset:
            # A roll syncs the segment it closes.
            self.durable_offset = self.end_offset

    @rule()
    def flush(self) -> None:
        assert self.log.flush() == self.end_offset
        self.durable_offset = self.end_offset

    @rule(data=st.data())
    def delete_segments_before(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(self.start_offset, self.end_offset + 3))
        self.log.delete_segments_before(offset)
        start = self.log.log_start_offset
        if offset >= self.end_offset and start == offset:
            self.batches, self.end_offset, self.durable_offset = [], offset, offset
        else:
            # Whole segments only: the start stays at or below `offset`, on a batch boundary.
            assert start <= offset and (start in self._boundaries() or start == self.end_offset)
        self.start_offset = start
        self.batches = [b for b in self.batches if b.base_offset >= start]
        self.durable_offset = max(self.durable_offset, start)

    @rule(advance_ms=st.integers(0, 3000))
    def apply_retention(self, advance_ms: int) -> None:
        self.clock.advance(advance_ms)
        self.log.apply_retention(self.clock.now_ms())
        assert self.log.log_start_offset >= self.start_offset
        self.start_offset = self.log.log_start_offset
        self.batches = [b for b in self.batches if b.base_offset >= self.start_offset]
        self.durable_offset = max(self.durable_offset, self.start_offset)

    @rule()
    def reopen(self) -> None:
        self.log.close()
        self.durable_offset = self.end_offset
        self._reopen()
        self._check_contents()

    @rule(torn=st.sampled_from([None, True, False]))
    def crash(self, torn: bool | None) -> None:
        self.files.crash(torn=torn)
        self._reopen()
        end = self.log.log_end_offset
        assert self.durable_offset <= end <= self.end_offset, (self.durable_offset, end)
        assert end in self._boundaries() or end == self.end_offset
        self._drop_model_from(end)
        self.durable_offset = end
        self._check_contents()

    # --- invariants -------------------------------------------------------------------

    @invariant()
    def offsets_agree(self) -> None:
        assert self.log.log_start_offset == self.start_offset
        assert self.log.log_end_offset == self.end_offset
        assert self.log.durable_end_offset >= self.durable_offset
        assert self.start_offset <= self.log.durable_end_offset <= self.end_offset

    def teardown(self) -> None:
        if not self.log.is_closed:
            self.log.close()


LogMachine.TestCase.settings = settings(
    max_examples=600,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLogStateful = LogMachine.TestCase
