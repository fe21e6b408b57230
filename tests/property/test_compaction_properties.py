"""Log compaction against a plain model: random keyed writes with tombstones, random cleaner
runs (at random times), reads from offset 0 after each.

Properties: every offset a reader sees holds the record written there; per key, the last
record read is the key's last write, except that a tombstone may be gone entirely once it is
older than delete.retention.ms; batches keep their offsets and terms, so the log stays dense
in batches, reopens, and the scrubber finds nothing wrong.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftlog.config import LogConfig
from raftlog.partition.cleaning import (
    CleanerState,
    CompactionSettings,
    finish_cleaning,
    plan_cleaning,
    run_cleaning,
)
from raftlog.storage.log import SegmentedLog
from raftlog.storage.records import RecordInput, decode_batch, encode_batch
from raftlog.storage.scrub import verify_closed_segment
from raftlog.storage.sim_file_system import SimFileSystem
from raftlog.storage.wall_clock import ManualWallClock

CONFIG = LogConfig(
    segment_bytes_max=1024, index_interval_bytes=128, batch_bytes_max=512,
    append_buffer_bytes_max=256,
).validate()  # fmt: skip
RETENTION_MS = 50
KEYS = [b"k%d" % i for i in range(6)]

record = st.tuples(st.sampled_from(KEYS), st.one_of(st.none(), st.binary(min_size=1, max_size=40)))
step = st.one_of(
    st.tuples(st.just("write"), st.lists(record, min_size=1, max_size=4), st.integers(0, 30)),
    st.tuples(st.just("clean"), st.none(), st.integers(0, 80)),
)


def read_all(log: SegmentedLog) -> list[tuple[int, bytes | None, bytes | None, int]]:
    """(offset, key, value, term) of every record from offset 0, checking batch density."""
    seen = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        result = log.read(offset, bytes_max=1 << 20)
        position = 0
        for header in result.headers:
            assert header.base_offset == offset, (header, offset)
            batch = decode_batch(result.data, position)
            seen.extend(
                (r.offset, r.key, r.value, header.partition_leader_epoch) for r in batch.records
            )
            position += header.size_bytes
            offset = header.last_offset + 1
    return seen


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step, min_size=1, max_size=40), st.integers(0, 2**32))
def test_compaction_keeps_last_write_of_every_key(steps: list, seed: int) -> None:
    files, clock = SimFileSystem(seed=seed), ManualWallClock(1_000)
    log = SegmentedLog.open("/sim/log", config=CONFIG, files=files, clock=clock)
    written: dict[int, tuple[bytes, bytes | None, int, int]] = {}  # offset -> key, value, ts, term
    expired_below: dict[bytes, int] = {}  # key -> tombstone offset a clean was free to drop
    state = CleanerState()
    policy = CompactionSettings(compact=True, min_cleanable_dirty_ratio=0.0,
                                delete_retention_ms=RETENTION_MS)  # fmt: skip
    term = 1
    for kind, records, delta_ms in steps:
        clock.advance(delta_ms)
        if kind == "write":
            term += delta_ms % 7 == 0
            now = clock.now_ms()
            batch = encode_batch([RecordInput(k, v, now) for k, v in records])
            info = log.append(batch, leader_epoch=term)
            for i, (k, v) in enumerate(records):
                written[info.base_offset + i] = (k, v, now, term)
            continue
        log.flush()
        plan = plan_cleaning(log, policy, state, clean_below=log.log_end_offset,
                             now_ms=clock.now_ms())  # fmt: skip
        if plan is not None:
            finish_cleaning(log, plan, run_cleaning(plan, lambda _: None), state)
            for offset, (k, v, ts, _) in written.items():
                expired = v is None and ts < plan.now_ms - RETENTION_MS
                if expired and offset < plan.dirty_end_offset:
                    expired_below[k] = max(expired_below.get(k, -1), offset)
        check(log, written, expired_below)
    log.close()
    reopened = SegmentedLog.open("/sim/log", config=CONFIG, files=files, clock=clock)
    check(reopened, written, expired_below)
    for path, base, end in reopened.closed_segments():
        problem = verify_closed_segment(files, path, base_offset=base, end_offset=end,
                                        chunk_bytes=4096)  # fmt: skip
        assert problem is None, problem
    reopened.close()


def check(
    log: SegmentedLog,
    written: dict[int, tuple[bytes, bytes | None, int, int]],
    expired_below: dict[bytes, int],
) -> None:
    seen = read_all(log)
    last_seen: dict[bytes | None, bytes | None] = {}
    for offset, key, value, term in seen:
        k, v, _, t = written[offset]
        assert (key, value, term) == (k, v, t), (offset, key, value)
        last_seen[key] = value
    last_written: dict[bytes, tuple[int, bytes | None]] = {}
    for offset in sorted(written):
        k, v, _, _ = written[offset]
        last_written[k] = (offset, v)
    for key, (offset, value) in last_written.items():
        if value is not None:
            assert last_seen.get(key, b"<absent>") == value, (key, offset)
        elif key in last_seen:
            assert last_seen[key] is None, key  # the tombstone itself, or nothing
        else:
            assert expired_below.get(key, -1) >= offset, (key, "tombstone dropped too early")
