"""SegmentedLog behaviour on the real file system: offsets, reads, rolls, truncation,
segment deletion, timestamps, durability bookkeeping and the errors that name what failed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from raftlog.config import LogConfig
from raftlog.errors import (
    BatchTooLargeError,
    CorruptBatchError,
    CrcMismatchError,
    LogClosedError,
    OffsetOutOfRangeError,
    StorageError,
)
from raftlog.storage.batch import parse_header
from raftlog.storage.log import SegmentedLog
from raftlog.storage.wall_clock import ManualWallClock

BatchFactory = Callable[..., bytes]
OpenLog = Callable[..., SegmentedLog]


def _fill(log: SegmentedLog, batch: BatchFactory, count: int, records: int = 2) -> list[int]:
    """Append `count` batches; returns their base offsets."""
    return [
        log.append(batch(records=records, timestamp_ms=i), leader_epoch=1).base_offset
        for i in range(count)
    ]


def test_append_assigns_dense_offsets_and_patches_epoch(
    open_log: OpenLog, batch: BatchFactory
) -> None:
    log = open_log()
    first = log.append(batch(records=3), leader_epoch=4)
    second = log.append(batch(records=1), leader_epoch=5)
    assert (first.base_offset, first.last_offset) == (0, 2)
    assert (second.base_offset, second.last_offset) == (3, 3)
    assert log.log_end_offset == 4
    header = parse_header(log.read(3, bytes_max=1000).data)
    assert (header.base_offset, header.partition_leader_epoch) == (3, 5)


def test_follower_append_must_land_at_the_end(open_log: OpenLog, batch: BatchFactory) -> None:
    log = open_log()
    log.append(batch(), leader_epoch=1, base_offset=0)
    with pytest.raises(StorageError, match=r"base_offset 5 .* ends at 1"):
        log.append(batch(), leader_epoch=1, base_offset=5)


def test_bad_batches_are_refused(open_log: OpenLog, batch: BatchFactory) -> None:
    log = open_log()
    with pytest.raises(BatchTooLargeError, match="exceeds batch_bytes_max=512"):
        log.append(batch(value_bytes=600), leader_epoch=1)
    damaged = bytearray(batch())
    damaged[-1] ^= 1
    with pytest.raises(CrcMismatchError):
        log.append(damaged, leader_epoch=1)
    with pytest.raises(CorruptBatchError, match="bytes after the batch"):
        log.append(batch() + b"xx", leader_epoch=1)
    wrong_magic = bytearray(batch())
    wrong_magic[16] = 1
    with pytest.raises(CorruptBatchError, match="wrong magic 1"):
        log.append(wrong_magic, leader_epoch=1)
    assert log.log_end_offset == 0


def test_read_returns_whole_batches_within_budget(open_log: OpenLog, batch: BatchFactory) -> None:
    log = open_log()
    _fill(log, batch, 4)  # each batch holds two offsets
    size = len(batch(records=2))
    result = log.read(3, bytes_max=size * 2 + 5)
    assert result.base_offset == 2  # the batch containing offset 3
    assert [h.base_offset for h in result.headers] == [2, 4]
    assert len(result.data) == 2 * size
    tiny = log.read(0, bytes_max=1)  # at least one whole batch, even over budget
    assert len(tiny.headers) == 1 and len(tiny.data) == size
    assert [h.base_offset for h, _ in log.batches(4, bytes_max=10**6)] == [4, 6]


def test_read_outside_the_log(open_log: OpenLog, batch: BatchFactory) -> None:
    log = open_log()
    _fill(log, batch, 2)
    assert log.read(4, bytes_max=100).data == b""  # at the end: nothing yet, not an error
    with pytest.raises(OffsetOutOfRangeError, match=r"offset 5 is out of range.*\[0, 4\)"):
        log.read(5, bytes_max=100)


def test_unflushed_appends_are_readable(open_log: OpenLog, batch: BatchFactory) -> None:
    log = open_log()
    _fill(log, batch, 3)
    assert log.durable_end_offset == 0
    assert [h.base_offset for h in log.read(0, bytes_max=10**6).headers] == [0, 2, 4]
    assert log.flush() == 6 == log.durable_end_offset


def test_rolls_by_size_and_reads_across_segments(open_log: OpenLog, batch: BatchFactory) -> None:
    log = open_log()
    bases = _fill(log, batch, 40)
    assert len(log.segment_base_offsets) > 3
    for base in bases:
        result = log.read(base + 1, bytes_max=1)
        assert result.base_offset == base
        assert result.segment_path.endswith(f"{result.segment_path[-24:-4]}.log")
    log.close()
    reopened = open_log()
    assert reopened.segment_base_offsets == log.segment_base_offsets
    assert [reopened.read(b, bytes_max=1).base_offset for b in bases] == bases


def test_rolls_by_age(open_log: OpenLog, batch: BatchFactory, clock: ManualWallClock) -> None:
    log = open_log()
    log.append(batch(timestamp_ms=clock.now_ms()), leader_epoch=1)
    clock.advance(9_999)
    log.append(batch(timestamp_ms=clock.now_ms()), leader_epoch=1)
    assert len(log.segment_base_offsets) == 1
    clock.advance(1)  # the first batch is now segment_age_ms_max old
    log.append(batch(timestamp_ms=clock.now_ms()), leader_epoch=1)
    assert list(log.segment_base_offsets) == [0, 2]


def test_truncate_across_segments(open_log: OpenLog, batch: BatchFactory) -> None:
    log = open_log()
    bases = _fill(log, batch, 40)
    cut = bases[12]
    log.truncate_from(cut)
    assert log.log_end_offset == cut == log.durable_end_offset
    with pytest.raises(OffsetOutOfRangeError):
        log.read(cut + 1, bytes_max=100)
    again = _fill(log, batch, 30)
    assert again[0] == cut
    log.close()
    reopened = open_log()
    assert reopened.log_end_offset == again[-1] + 2
    assert [reopened.read(b, bytes_max=1).base_offset for b in bases[:12] + again] == (
        bases[:12] + again
    )


def test_truncate_at_a_segment_base_and_at_the_start(
    open_log: OpenLog, batch: BatchFactory
) -> None:
    log = open_log()
    _fill(log, batch, 40)
    second = log.segment_base_offsets[1]
    log.truncate_from(second)
    assert log.segment_base_offsets == (0,) and log.log_end_offset == second
    log.append(batch(), leader_epoch=2)  # the segment that became active takes appends
    log.truncate_from(0)
    assert (log.log_start_offset, log.log_end_offset) == (0, 0)


def test_truncate_inside_a_batch_is_refused(open_log: OpenLog, batch: BatchFactory) -> None:
    log = open_log()
    _fill(log, batch, 3)
    with pytest.raises(StorageError, match=r"inside the batch \[2, 3\] at byte"):
        log.truncate_from(3)


def test_delete_segments_before_keeps_whole_segments(
    open_log: OpenLog, batch: BatchFactory
) -> None:
    log = open_log()
    _fill(log, batch, 40)
    bases = log.segment_base_offsets
    deleted = log.delete_segments_before(bases[2] + 1)  # inside the third segment
    assert deleted == 2
    assert log.log_start_offset == bases[2]  # the first kept segment's base
    with pytest.raises(OffsetOutOfRangeError):
        log.read(bases[2] - 1, bytes_max=100)
    assert log.read(bases[2], bytes_max=1).base_offset == bases[2]
    log.close()
    assert open_log().log_start_offset == bases[2]


def test_delete_segments_before_the_end_restarts_the_log(
    open_log: OpenLog, batch: BatchFactory
) -> None:
    log = open_log()
    _fill(log, batch, 40)
    log.delete_segments_before(1000)
    assert (log.log_start_offset, log.log_end_offset, log.durable_end_offset) == (1000,) * 3
    assert log.append(batch(), leader_epoch=3).base_offset == 1000
    log.close()
    reopened = open_log()
    assert (reopened.log_start_offset, reopened.log_end_offset) == (1000, 1001)


def test_offset_for_timestamp(open_log: OpenLog, batch: BatchFactory) -> None:
    log = open_log()
    timestamps = [10, 20, 20, 15, 30, 40, 40, 50] * 5
    bases = [
        log.append(batch(records=2, timestamp_ms=t), leader_epoch=1).base_offset for t in timestamps
    ]
    log.close()
    log = open_log()  # closed segments answer from their time index files

    def model(target: int) -> int | None:
        return next((b for b, t in zip(bases, timestamps, strict=True) if t >= target), None)

    for target in (0, 10, 11, 20, 21, 35, 50, 51):
        assert log.offset_for_timestamp(target) == model(target), target


def test_use_after_close(open_log: OpenLog, batch: BatchFactory) -> None:
    log = open_log()
    log.close()
    with pytest.raises(LogClosedError, match="is closed"):
        log.append(batch(), leader_epoch=1)


def test_index_entries_max_forces_a_roll(
    open_log: OpenLog, batch: BatchFactory, small_config: LogConfig
) -> None:
    log = open_log(replace(small_config, index_entries_max=2, index_interval_bytes=1))
    _fill(log, batch, 6, records=1)
    assert len(log.segment_base_offsets) >= 2
