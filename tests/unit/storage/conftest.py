"""Shared fixtures for the storage unit tests: real batches, both file systems, a log."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from raftlog.config import LogConfig
from raftlog.storage.file_system import FileSystem, OsFileSystem
from raftlog.storage.log import SegmentedLog
from raftlog.storage.records import RecordInput, encode_batch
from raftlog.storage.sim_file_system import SimFileSystem
from raftlog.storage.wall_clock import ManualWallClock

BatchFactory = Callable[..., bytes]


def make_batch(*, records: int = 1, value_bytes: int = 10, timestamp_ms: int = 0) -> bytes:
    """A valid v2 batch of `records` records with values of `value_bytes` bytes."""
    return encode_batch(
        [RecordInput(None, bytes([i % 256]) * value_bytes, timestamp_ms) for i in range(records)]
    )


@pytest.fixture
def batch() -> BatchFactory:
    return make_batch


@pytest.fixture
def small_config() -> LogConfig:
    """Small segments and a dense index so a few batches exercise rolls and lookups."""
    return LogConfig(
        segment_bytes_max=1024,
        index_interval_bytes=128,
        batch_bytes_max=512,
        append_buffer_bytes_max=256,
        segment_age_ms_max=10_000,
    ).validate()


@pytest.fixture(params=["os", "sim"])
def files_and_dir(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[FileSystem, str]:
    """Both FileSystem implementations, each with an empty directory to work in."""
    if request.param == "os":
        return OsFileSystem(), str(tmp_path / "log")
    return SimFileSystem(seed=7), "/sim/log"


@pytest.fixture
def sim() -> SimFileSystem:
    return SimFileSystem(seed=11)


@pytest.fixture
def clock() -> ManualWallClock:
    return ManualWallClock(1_000_000)


@pytest.fixture
def open_log(
    tmp_path: Path, small_config: LogConfig, clock: ManualWallClock
) -> Iterator[Callable[..., SegmentedLog]]:
    """Open a log on the real file system in tmp_path (reopening the same directory)."""
    opened: list[SegmentedLog] = []
    directory = os.fspath(tmp_path / "log")

    def _open(config: LogConfig | None = None, files: FileSystem | None = None) -> SegmentedLog:
        log = SegmentedLog.open(
            directory, config=config or small_config, files=files or OsFileSystem(), clock=clock
        )
        opened.append(log)
        return log

    yield _open
    for log in opened:
        if not log.is_closed:
            log.close()
