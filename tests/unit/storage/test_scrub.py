"""verify_closed_segment: a whole closed segment passes; a flipped byte, a truncation, a
missing file or offsets out of sequence are each found, at the first offset not intact."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from raftlog.config import LogConfig
from raftlog.storage.log import SegmentedLog
from raftlog.storage.scrub import verify_closed_segment
from raftlog.storage.sim_file_system import SimFileSystem
from raftlog.storage.wall_clock import ManualWallClock

BatchFactory = Callable[..., bytes]


def _closed(
    sim: SimFileSystem, config: LogConfig, clock: ManualWallClock, batch: BatchFactory
) -> tuple[SegmentedLog, str, int, int]:
    log = SegmentedLog.open("/l", config=config, files=sim, clock=clock)
    for _ in range(40):
        log.append(batch(records=2), leader_epoch=1)
    log.flush()
    path, base, end = log.closed_segments()[1]
    return log, path, base, end


def _verify(sim: SimFileSystem, path: str, base: int, end: int, chunk_bytes: int = 100):
    paced: list[int] = []
    problem = verify_closed_segment(
        sim, path, base_offset=base, end_offset=end, chunk_bytes=chunk_bytes, pace=paced.append
    )
    return problem, paced


@pytest.mark.parametrize("chunk_bytes", [1, 100, 1 << 20])
def test_a_whole_segment_passes_and_every_byte_is_paced(
    sim: SimFileSystem,
    small_config: LogConfig,
    clock: ManualWallClock,
    batch: BatchFactory,
    chunk_bytes: int,
) -> None:
    _, path, base, end = _closed(sim, small_config, clock, batch)
    problem, paced = _verify(sim, path, base, end, chunk_bytes)
    assert problem is None
    assert sum(paced) == len(sim.file_bytes(path))


def test_every_flipped_byte_is_found_at_its_batch(
    sim: SimFileSystem, small_config: LogConfig, clock: ManualWallClock, batch: BatchFactory
) -> None:
    _, path, base, end = _closed(sim, small_config, clock, batch)
    good = sim.file_bytes(path)
    size = len(batch(records=2))
    for position in range(len(good)):
        if position % size in (12, 13, 14, 15):
            continue  # the leader epoch, outside the CRC: RaftLogStorage checks it on read
        sim.corrupt(path, position, bytes([good[position] ^ 0x20]))
        problem, _ = _verify(sim, path, base, end)
        assert problem is not None, position
        assert problem.offset <= base + 2 * (position // size), (position, problem)
        sim.corrupt(path, position, bytes([good[position]]))


def test_truncation_and_a_missing_file_are_found(
    sim: SimFileSystem, small_config: LogConfig, clock: ManualWallClock, batch: BatchFactory
) -> None:
    _, path, base, end = _closed(sim, small_config, clock, batch)
    handle = sim.open(path)
    handle.truncate(handle.size_bytes() - len(batch(records=2)))
    problem, _ = _verify(sim, path, base, end)
    assert problem is not None and problem.offset == end - 2 and "ends at offset" in problem.cause
    sim.remove(path)
    problem, _ = _verify(sim, path, base, end)
    assert problem is not None and problem.offset == base and "missing" in problem.cause
    assert not os.path.exists(path)
