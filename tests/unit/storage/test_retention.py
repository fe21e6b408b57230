"""Retention by bytes and by age: a prefix of whole closed segments, never the active one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from raftlog.config import LogConfig
from raftlog.storage.log import SegmentedLog
from raftlog.storage.retention import SegmentSummary, expired_segment_count
from raftlog.storage.wall_clock import ManualWallClock

BatchFactory = Callable[..., bytes]
OpenLog = Callable[..., SegmentedLog]
_SEGMENTS = [SegmentSummary(base, 40) for base in (0, 10, 20)]


def _count(retention_bytes: int | None, retention_ms: int | None, ages: list[int]) -> int:
    return expired_segment_count(
        _SEGMENTS,
        total_bytes=130,
        now_ms=1000,
        retention_bytes=retention_bytes,
        retention_ms=retention_ms,
        max_timestamp_ms=lambda i: 1000 - ages[i],
    )


def test_by_bytes_keeps_at_least_the_retention() -> None:
    assert _count(60, None, [0, 0, 0]) == 1  # the module docstring's worked example
    assert _count(0, None, [0, 0, 0]) == 3  # all closed segments, never the active one
    assert _count(200, None, [0, 0, 0]) == 0


def test_by_age_deletes_an_old_prefix_only() -> None:
    assert _count(None, 100, [500, 101, 100]) == 2
    assert _count(None, 100, [50, 500, 500]) == 0  # a young segment shields older ones
    assert _count(60, 100, [500, 0, 0]) == 1
    assert _count(None, None, [10**6] * 3) == 0


def test_log_retention_by_bytes(
    open_log: OpenLog, batch: BatchFactory, small_config: LogConfig, clock: ManualWallClock
) -> None:
    log = open_log(replace(small_config, retention_bytes=2048))
    for _ in range(60):
        log.append(batch(records=2), leader_epoch=1)
    before = log.size_bytes
    point = log.retention_point(clock.now_ms())  # where a Raft log snapshots first
    deleted = log.apply_retention(clock.now_ms())
    assert point == log.log_start_offset
    assert deleted > 0 and 2048 <= log.size_bytes < before
    assert log.log_start_offset == log.segment_base_offsets[0]
    assert log.apply_retention(clock.now_ms()) == 0
    assert log.retention_point(clock.now_ms()) is None


def test_log_retention_by_age_never_the_active_segment(
    open_log: OpenLog, batch: BatchFactory, small_config: LogConfig, clock: ManualWallClock
) -> None:
    log = open_log(replace(small_config, retention_ms=1000))
    for i in range(30):
        log.append(batch(records=2, timestamp_ms=i), leader_epoch=1)
    log.close()
    log = open_log(replace(small_config, retention_ms=1000))
    closed_count = len(log.segment_base_offsets) - 1
    active_base = log.segment_base_offsets[-1]
    assert log.apply_retention(now_ms=1000) == 0  # no segment is more than 1000 ms old yet
    assert log.apply_retention(now_ms=10**9) == closed_count > 0
    assert log.segment_base_offsets == (active_base,)
    assert log.read(active_base, bytes_max=1).base_offset == active_base


def test_a_moved_log_start_cuts_at_the_segment_holding_it(
    open_log: OpenLog, batch: BatchFactory, small_config: LogConfig
) -> None:
    # DeleteRecords' log start: segments wholly below it may go, the one holding it stays.
    log = open_log(small_config)
    for _ in range(40):
        log.append(batch(records=2), leader_epoch=1)
    bases = log.segment_base_offsets
    assert len(bases) >= 3
    assert log.segment_start_at_or_below(0) is None
    assert log.segment_start_at_or_below(bases[1] - 1) is None  # inside the first segment
    assert log.segment_start_at_or_below(bases[1]) == bases[1]
    assert log.segment_start_at_or_below(bases[2] + 1) == bases[2]
    # Past the end: every closed segment, never the active one.
    assert log.segment_start_at_or_below(log.log_end_offset + 100) == bases[-1]
