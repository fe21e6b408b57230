"""Log compaction on the simulated file system: batches keep offsets and terms, and a crash at
any step of a pass (writing the copies or swapping them in) leaves each segment either old or
cleaned, never a mix or a hole (raftlog.storage.compaction's swap protocol)."""

from __future__ import annotations

from typing import Any

import pytest

from raftlog.config import LogConfig
from raftlog.errors import StorageError
from raftlog.partition.cleaning import (
    CleanerState,
    CompactionSettings,
    finish_cleaning,
    plan_cleaning,
    run_cleaning,
)
from raftlog.storage.batch import Compression
from raftlog.storage.compaction import clean_batch
from raftlog.storage.file_system import FileHandle
from raftlog.storage.log import SegmentedLog
from raftlog.storage.records import RecordInput, decode_batch, encode_batch
from raftlog.storage.scrub import verify_closed_segment
from raftlog.storage.sim_file_system import SimFileSystem
from raftlog.storage.wall_clock import ManualWallClock

CONFIG = LogConfig(
    segment_bytes_max=1024, index_interval_bytes=128, batch_bytes_max=512,
    append_buffer_bytes_max=256,
).validate()  # fmt: skip
POLICY = CompactionSettings(compact=True, min_cleanable_dirty_ratio=0.0)


class _Killed(Exception):
    """The process died here."""


class KillingFileSystem(SimFileSystem):
    """SimFileSystem whose process dies at its `kill_at`-th mutating call (None: never)."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.calls = 0
        self.kill_at: int | None = None

    def _tick(self) -> None:
        self.calls += 1
        if self.kill_at is not None and self.calls >= self.kill_at:
            raise _Killed

    def open(self, path: str, *, create: bool = False) -> FileHandle:
        if create:
            self._tick()
        return super().open(path, create=create)

    def remove(self, path: str) -> None:
        self._tick()
        super().remove(path)

    def rename(self, source: str, target: str) -> None:
        self._tick()
        super().rename(source, target)

    def sync_directory(self, directory: str) -> None:
        self._tick()
        super().sync_directory(directory)


def fill(log: SegmentedLog, count: int) -> dict[int, tuple[bytes, bytes]]:
    written = {}
    for i in range(count):
        key, value = b"k%d" % (i % 7), b"v%04d" % i
        info = log.append(encode_batch([RecordInput(key, value, 1000)]), leader_epoch=1 + i // 50)
        written[info.base_offset] = (key, value)
    log.flush()
    return written


def records(log: SegmentedLog) -> dict[int, tuple[bytes | None, bytes | None]]:
    out, offset = {}, log.log_start_offset
    while offset < log.log_end_offset:
        result = log.read(offset, bytes_max=1 << 20)
        position = 0
        for header in result.headers:
            assert header.base_offset == offset
            for r in decode_batch(result.data, position).records:
                out[r.offset] = (r.key, r.value)
            position += header.size_bytes
            offset = header.last_offset + 1
    return out


def clean(log: SegmentedLog, now_ms: int = 5000) -> int:
    state = CleanerState()
    plan = plan_cleaning(log, POLICY, state, clean_below=log.log_end_offset, now_ms=now_ms)
    assert plan is not None
    return finish_cleaning(log, plan, run_cleaning(plan, lambda _: None), state)


def test_cleaning_keeps_latest_per_key_offsets_and_terms() -> None:
    files = SimFileSystem(seed=3)
    log = SegmentedLog.open("/sim/log", config=CONFIG, files=files, clock=ManualWallClock(0))
    written = fill(log, 300)
    terms_before = [(h.base_offset, h.partition_leader_epoch) for h in headers(log)]
    size_before = log.size_bytes
    assert clean(log) > 0
    assert log.size_bytes < size_before
    assert [(h.base_offset, h.partition_leader_epoch) for h in headers(log)] == terms_before
    seen = records(log)
    assert all(written[offset] == record for offset, record in seen.items())
    latest = {key: offset for offset, (key, _) in sorted(written.items())}
    closed_end = log.closed_segments()[-1][2]
    for key, offset in latest.items():
        assert offset in seen, key
    latest_closed = {k: o for o, (k, _) in sorted(written.items()) if o < closed_end}
    kept_closed = {o for o in seen if o < closed_end}
    assert kept_closed == set(latest_closed.values())
    for path, base, end in log.closed_segments():
        assert verify_closed_segment(files, path, base_offset=base, end_offset=end,
                                     chunk_bytes=4096) is None  # fmt: skip
    log.close()


def headers(log: SegmentedLog) -> list[Any]:
    out, offset = [], log.log_start_offset
    while offset < log.log_end_offset:
        result = log.read(offset, bytes_max=1 << 20)
        out.extend(result.headers)
        offset = result.next_offset
    return out


@pytest.mark.parametrize("codec", list(Compression))
def test_clean_batch_keeps_header_fields(codec: Compression) -> None:
    batch = encode_batch(
        [RecordInput(b"a", b"1", 10), RecordInput(b"b", None, 12), RecordInput(b"a", b"2", 15)],
        base_offset=40, leader_epoch=7, compression=codec, producer_id=9, producer_epoch=1,
        base_sequence=3,
    )  # fmt: skip
    cleaned, removed = clean_batch(batch, lambda offset, key, tomb, ts: offset != 40)
    assert removed == 1
    before, after = decode_batch(batch), decode_batch(cleaned)
    assert [(r.offset, r.key, r.value, r.timestamp_ms) for r in after.records] == [
        (r.offset, r.key, r.value, r.timestamp_ms) for r in before.records[1:]
    ]
    same = ("base_offset", "partition_leader_epoch", "last_offset_delta", "first_timestamp",
            "max_timestamp", "producer_id", "producer_epoch", "base_sequence")  # fmt: skip
    assert all(getattr(after.header, f) == getattr(before.header, f) for f in same)
    assert after.header.compression is codec
    emptied, removed = clean_batch(batch, lambda *_: False)
    assert removed == 3 and decode_batch(emptied).records == ()
    assert decode_batch(emptied).header.last_offset == 42


def test_a_kill_at_any_step_leaves_old_or_cleaned_segments() -> None:
    steps = count_steps()
    assert steps > 5
    for kill_at in range(1, steps + 1):
        files = KillingFileSystem(seed=kill_at)
        log = SegmentedLog.open("/sim/log", config=CONFIG, files=files, clock=ManualWallClock(0))
        written = fill(log, 80)
        before = {path: files.file_bytes(path) for path, _, _ in log.closed_segments()}
        files.calls, files.kill_at = 0, kill_at
        with pytest.raises(_Killed):
            clean(log)
        files.kill_at = None
        files.crash()
        reopened = SegmentedLog.open(
            "/sim/log", config=CONFIG, files=files, clock=ManualWallClock(0)
        )
        after_open = {path: files.file_bytes(path) for path, _, _ in reopened.closed_segments()}
        assert after_open.keys() == before.keys(), kill_at
        assert all(written[o] == r for o, r in records(reopened).items()), kill_at
        assert {key for key, _ in records(reopened).values()} == {k for k, _ in written.values()}
        assert not files.list_directory("/sim/log/cleaner"), kill_at
        for path, base, end in reopened.closed_segments():
            assert verify_closed_segment(files, path, base_offset=base, end_offset=end,
                                         chunk_bytes=4096) is None, kill_at  # fmt: skip
        assert clean(reopened) >= 0  # a later pass completes the work
        reopened.close()


def count_steps() -> int:
    files = KillingFileSystem(seed=0)
    log = SegmentedLog.open("/sim/log", config=CONFIG, files=files, clock=ManualWallClock(0))
    fill(log, 80)
    files.calls = 0
    clean(log)
    steps = files.calls
    log.close()
    return steps


def test_pass_skips_segments_gone_meanwhile() -> None:
    files = SimFileSystem(seed=5)
    log = SegmentedLog.open("/sim/log", config=CONFIG, files=files, clock=ManualWallClock(0))
    fill(log, 200)
    state = CleanerState()
    plan = plan_cleaning(log, POLICY, state, clean_below=log.log_end_offset, now_ms=5000)
    assert plan is not None
    cleaned = run_cleaning(plan, lambda _: None)
    log.delete_segments_before(plan.segments[2].base_offset)
    installed = log.install_cleaned(cleaned)
    assert installed == len([c for c in cleaned if c.base_offset >= log.log_start_offset])
    assert not files.list_directory("/sim/log/cleaner")
    log.close()
    with pytest.raises(StorageError):
        log.install_cleaned(cleaned)
