"""The node's log cleaner (raftlog.node.cleaner): a round plans on the loop, cleans on its
own thread and swaps on the loop; it never touches what lies at or above `clean_below`, and
skips a log closed meanwhile or a topic that is not compacted."""

from __future__ import annotations

import asyncio

from raftlog.config import LogConfig
from raftlog.node.cleaner import CleanTarget, LogCleaner
from raftlog.partition.cleaning import CompactionSettings
from raftlog.storage.log import SegmentedLog
from raftlog.storage.records import RecordInput, encode_batch
from raftlog.storage.sim_file_system import SimFileSystem
from raftlog.storage.wall_clock import ManualWallClock
from raftlog.types import RaftGroupId

CONFIG = LogConfig(
    segment_bytes_max=1024, index_interval_bytes=128, batch_bytes_max=512,
    append_buffer_bytes_max=256,
).validate()  # fmt: skip
SETTINGS = CompactionSettings(compact=True, min_cleanable_dirty_ratio=0.0)


def _log() -> SegmentedLog:
    log = SegmentedLog.open(
        "/sim/log", config=CONFIG, files=SimFileSystem(1), clock=ManualWallClock(0)
    )
    for i in range(100):
        log.append(encode_batch([RecordInput(b"k%d" % (i % 3), b"v" * 40, 0)]), leader_epoch=1)
    log.flush()
    return log


def _cleaner(targets: list[CleanTarget]) -> LogCleaner:
    return LogCleaner(bytes_per_s=1 << 30, targets=lambda: targets, now_ms=lambda: 10_000)


def test_a_round_cleans_only_below_clean_below() -> None:
    log = _log()
    bases = log.segment_base_offsets
    below = bases[len(bases) // 2]
    sizes = {path: size for path, _, _, size, _ in log.closed_segment_stats()}
    cleaner = _cleaner([CleanTarget(RaftGroupId(1), log, SETTINGS, clean_below=below)])
    assert asyncio.run(cleaner.clean_round()) > 0
    assert cleaner.passes == 1 and cleaner.bytes_read > 0 and cleaner.cpu_s > 0
    for path, base, end, size, _ in log.closed_segment_stats():
        if end > below:
            assert size == sizes[path], (base, "touched above clean_below")
    assert any(size < sizes[p] for p, _, end, size, _ in log.closed_segment_stats() if end <= below)
    assert asyncio.run(cleaner.clean_round()) == 0  # nothing dirty is left below the bound
    log.close()


def test_a_closed_log_and_a_policy_without_compact_are_left_alone() -> None:
    log = _log()
    target = CleanTarget(RaftGroupId(1), log, CompactionSettings(), clean_below=log.log_end_offset)
    assert asyncio.run(_cleaner([target]).clean_round()) == 0
    log.close()
    closed = CleanTarget(RaftGroupId(1), log, SETTINGS, clean_below=log.log_end_offset)
    assert asyncio.run(_cleaner([closed]).clean_round()) == 0
