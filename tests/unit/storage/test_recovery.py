"""Opening after a crash: torn and garbage tails are cut, damaged or missing index files are
rebuilt, closed segments are trusted (open reads only the active one), and a batch whose CRC
fails is never returned. After a clean close open reads no segment at all (only the marker and
the active segment's index files), and a crash after that is recovered by a scan again."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from raftlog.config import LogConfig
from raftlog.errors import CorruptBatchError, CrcMismatchError
from raftlog.storage.batch import crc32c
from raftlog.storage.clean_shutdown import CLEAN_SHUTDOWN_FILE_NAME
from raftlog.storage.file_system import Buffer, FileHandle, FileSystem
from raftlog.storage.log import SegmentedLog
from raftlog.storage.sim_file_system import SimFileSystem
from raftlog.storage.wall_clock import ManualWallClock

BatchFactory = Callable[..., bytes]
OpenLog = Callable[..., SegmentedLog]


def _fill(log: SegmentedLog, batch: BatchFactory, count: int) -> list[int]:
    return [log.append(batch(records=2), leader_epoch=1).base_offset for _ in range(count)]


def _segment_file(log: SegmentedLog, number: int, suffix: str = ".log") -> str:
    return os.path.join(log.directory, f"{log.segment_base_offsets[number]:020d}{suffix}")


def _close_as_if_crashed(log: SegmentedLog) -> None:
    """Close (everything flushed), then drop the clean-shutdown marker: what a crash right
    after a flush leaves, so the next open must scan the active segment."""
    log.close()
    log.files.remove(os.path.join(log.directory, CLEAN_SHUTDOWN_FILE_NAME))


def test_torn_last_batch_is_cut(open_log: OpenLog, batch: BatchFactory) -> None:
    log = open_log()
    bases = _fill(log, batch, 5)
    log.close()
    path = _segment_file(log, -1)
    os.truncate(path, os.path.getsize(path) - 7)  # the last batch lost its tail
    reopened = open_log()
    assert reopened.log_end_offset == bases[-1] == reopened.durable_end_offset
    assert os.path.getsize(path) == len(batch(records=2)) * 4
    assert reopened.append(batch(), leader_epoch=2).base_offset == bases[-1]


def test_garbage_tail_is_cut(open_log: OpenLog, batch: BatchFactory) -> None:
    log = open_log()
    _fill(log, batch, 3)
    log.close()
    with open(_segment_file(log, -1), "ab") as file:
        file.write(b"\x00\x00\x00\x00\x00\x00\x00\x06\x7f\xff\xff\xff" + os.urandom(100))
    assert open_log().log_end_offset == 6


def test_corrupt_batch_in_the_active_segment_cuts_the_rest(
    open_log: OpenLog, batch: BatchFactory
) -> None:
    log = open_log()
    _fill(log, batch, 4)
    _close_as_if_crashed(log)
    size = len(batch(records=2))
    with open(_segment_file(log, -1), "r+b") as file:
        file.seek(size + 70)  # inside the records of the second batch
        file.write(b"\xff")
    reopened = open_log()
    assert reopened.log_end_offset == 2
    assert reopened.read(0, bytes_max=10**6).next_offset == 2


def test_after_a_clean_close_a_damaged_batch_is_not_cut_but_never_returned(
    open_log: OpenLog, batch: BatchFactory
) -> None:
    log = open_log()
    _fill(log, batch, 4)
    log.close()  # clean: everything was flushed, nothing may be cut
    size = len(batch(records=2))
    with open(_segment_file(log, -1), "r+b") as file:
        file.seek(size + 70)
        file.write(b"\xff")
    reopened = open_log()
    assert reopened.log_end_offset == 8
    assert [h.base_offset for h in reopened.read(0, bytes_max=10**6).headers] == [0]
    with pytest.raises(CrcMismatchError):
        reopened.read(2, bytes_max=10**6)


def test_missing_index_files_are_rebuilt(open_log: OpenLog, batch: BatchFactory) -> None:
    log = open_log()
    bases = _fill(log, batch, 40)
    log.close()
    for suffix in (".index", ".timeindex"):
        os.remove(_segment_file(log, 1, suffix))
    reopened = open_log()
    assert os.path.exists(_segment_file(log, 1, ".index"))
    assert [reopened.read(b + 1, bytes_max=1).base_offset for b in bases] == bases


def test_damaged_index_files_are_rebuilt(
    open_log: OpenLog, batch: BatchFactory, small_config: LogConfig
) -> None:
    config = replace(small_config, index_interval_bytes=1)  # an entry per batch
    log = open_log(config)
    bases = _fill(log, batch, 40)
    log.close()
    with open(_segment_file(log, 0, ".index"), "ab") as file:
        file.write(b"xyz")  # not a whole entry
    with open(_segment_file(log, 1, ".index"), "r+b") as file:
        file.seek(8)
        file.write(b"\x00\x00\x00\x01\x00\x00\x00\x05")  # a valid-looking, wrong entry
    with open(_segment_file(log, 2, ".timeindex"), "wb") as file:
        file.write(b"\x01" * 12)  # says timestamp 2**56: beyond the offsets it may name
    reopened = open_log(config)
    assert [reopened.read(b + 1, bytes_max=1).base_offset for b in bases] == bases
    assert reopened.offset_for_timestamp(0) == 0
    assert os.path.getsize(_segment_file(log, 0, ".index")) % 8 == 0


def test_corrupt_batch_in_a_closed_segment_is_never_returned(
    open_log: OpenLog, batch: BatchFactory
) -> None:
    log = open_log()
    _fill(log, batch, 40)
    log.close()
    size = len(batch(records=2))
    second_batch = log.segment_base_offsets[0] + 2
    with open(_segment_file(log, 0), "r+b") as file:
        file.seek(size + 65)
        file.write(b"\xee")
    reopened = open_log()  # closed segments are trusted at open: not scanned
    first = reopened.read(0, bytes_max=10**6)
    assert [h.base_offset for h in first.headers] == [0]  # stops before the bad batch
    with pytest.raises(CrcMismatchError, match=rf"00000000000000000000\.log at byte {size}:"):
        reopened.read(second_batch, bytes_max=10**6)


class _CountingFiles:
    """A FileSystem wrapper that counts the bytes read, per file name suffix."""

    def __init__(self, inner: FileSystem) -> None:
        self.inner = inner
        self.bytes_read: dict[str, int] = {}

    def open(self, path: str, *, create: bool = False) -> FileHandle:
        return _CountingHandle(self, self.inner.open(path, create=create))

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


class _CountingHandle:
    def __init__(self, owner: _CountingFiles, inner: FileHandle) -> None:
        self.owner = owner
        self.inner = inner

    @property
    def path(self) -> str:
        return self.inner.path

    def read_at(self, size_bytes: int, position: int) -> bytes:
        data = self.inner.read_at(size_bytes, position)
        self.owner.bytes_read[self.path] = self.owner.bytes_read.get(self.path, 0) + len(data)
        return data

    def append(self, buffers: Sequence[Buffer]) -> None:
        self.inner.append(buffers)

    def write_at(self, data: Buffer, position: int) -> None:
        self.inner.write_at(data, position)

    def size_bytes(self) -> int:
        return self.inner.size_bytes()

    def sync(self) -> None:
        self.inner.sync()

    def truncate(self, size_bytes: int) -> None:
        self.inner.truncate(size_bytes)

    def close(self) -> None:
        self.inner.close()


def test_open_reads_only_the_active_segment(
    batch: BatchFactory, small_config: LogConfig, clock: ManualWallClock
) -> None:
    sim = SimFileSystem()
    log = SegmentedLog.open("/l", config=small_config, files=sim, clock=clock)
    _fill(log, batch, 60)
    _close_as_if_crashed(log)
    counting = _CountingFiles(sim)
    reopened = SegmentedLog.open("/l", config=small_config, files=counting, clock=clock)  # type: ignore[arg-type]
    active = _segment_file(reopened, -1)
    # Besides the active segment, only the log's small durable mark is read.
    assert set(counting.bytes_read) <= {active, reopened.mark.path}
    assert len(reopened.segment_base_offsets) > 5


def test_open_after_a_clean_close_reads_no_segment(
    batch: BatchFactory, small_config: LogConfig, clock: ManualWallClock
) -> None:
    sim = SimFileSystem()
    log = SegmentedLog.open("/l", config=small_config, files=sim, clock=clock)
    bases = _fill(log, batch, 61)
    log.close()
    counting = _CountingFiles(sim)
    reopened = SegmentedLog.open("/l", config=small_config, files=counting, clock=clock)  # type: ignore[arg-type]
    assert not any(path.endswith(".log") for path in counting.bytes_read), counting.bytes_read
    assert reopened.log_end_offset == bases[-1] + 2 == reopened.durable_end_offset
    # The resumed active segment indexes, reads and keeps appending (and rolling) as before.
    more = _fill(reopened, batch, 30)
    for offset in range(0, more[-1] + 2, 3):
        assert reopened.read(offset, bytes_max=1).base_offset == offset - offset % 2
    assert not sim.exists("/l/" + CLEAN_SHUTDOWN_FILE_NAME)  # taken at open


def test_a_crash_after_a_clean_restart_is_recovered_by_a_scan(
    open_log: OpenLog, batch: BatchFactory
) -> None:
    log = open_log()
    _fill(log, batch, 3)
    log.close()
    reopened = open_log()  # resumes clean, and takes the marker
    bases = _fill(reopened, batch, 2)
    reopened.flush()
    path = _segment_file(reopened, -1)
    os.truncate(path, os.path.getsize(path) - 5)  # a crash tore the last batch
    again = open_log()
    assert again.log_end_offset == bases[-1]


@pytest.mark.parametrize("damage", ["flip", "cut", "not-json", "size", "missing-index"], ids=str)
def test_a_marker_that_does_not_match_means_a_scan(
    open_log: OpenLog, batch: BatchFactory, damage: str
) -> None:
    log = open_log()
    _fill(log, batch, 4)
    log.close()
    marker = Path(log.directory) / CLEAN_SHUTDOWN_FILE_NAME
    data = bytearray(marker.read_bytes())
    if damage == "flip":
        data[-3] ^= 0x10
    elif damage == "cut":
        data = data[:-4]
    elif damage == "not-json":
        data = bytearray(crc32c(b"[1,2").to_bytes(4, "big") + b"[1,2")
    elif damage == "missing-index":
        os.remove(_segment_file(log, -1, ".index"))
    marker.write_bytes(bytes(data))
    path = _segment_file(log, -1)
    size = len(batch(records=2))
    with open(path, "r+b") as file:
        file.seek(size + 70)  # damage the second batch: only a scan cuts the log there
        file.write(b"\xff")
    if damage == "size":
        with open(path, "ab") as file:
            file.write(b"\0" * 5)  # the file no longer has the size the marker recorded
    reopened = open_log()
    assert reopened.log_end_offset == 2


def test_unflushed_appends_may_vanish_but_flushed_ones_never(
    batch: BatchFactory, small_config: LogConfig, clock: ManualWallClock
) -> None:
    for seed in range(30):
        sim = SimFileSystem(seed)
        log = SegmentedLog.open("/l", config=small_config, files=sim, clock=clock)
        _fill(log, batch, 9)
        durable = log.flush()
        _fill(log, batch, 9)
        sim.crash()
        reopened = SegmentedLog.open("/l", config=small_config, files=sim, clock=clock)
        assert durable <= reopened.log_end_offset <= 36
        assert reopened.log_end_offset % 2 == 0  # whole batches only


def test_an_interrupted_restart_leaves_a_usable_log(
    batch: BatchFactory, small_config: LogConfig, clock: ManualWallClock
) -> None:
    sim = SimFileSystem()
    log = SegmentedLog.open("/l", config=small_config, files=sim, clock=clock)
    _fill(log, batch, 3)
    log.close()
    # What a crash between "create the new segment" and "delete the old" leaves behind.
    sim.open("/l/00000000000000000000.log").truncate(0)
    sim.open("/l/00000000000000000500.log", create=True)
    sim.sync_directory("/l")
    reopened = SegmentedLog.open("/l", config=small_config, files=sim, clock=clock)
    assert reopened.segment_base_offsets == (500,)
    assert reopened.append(batch(), leader_epoch=1).base_offset == 500


def test_orphan_index_files_are_removed(open_log: OpenLog, tmp_path: Path) -> None:
    log = open_log()
    log.close()
    orphan = os.path.join(log.directory, f"{77:020d}.index")
    with open(orphan, "wb"):
        pass
    open_log()
    assert not os.path.exists(orphan)


def test_a_garbage_header_in_a_closed_segment_is_named(
    open_log: OpenLog, batch: BatchFactory
) -> None:
    log = open_log()
    _fill(log, batch, 40)
    log.close()
    size = len(batch(records=2))
    with open(_segment_file(log, 0), "r+b") as file:
        file.seek(2 * size + 8)
        file.write(b"\xff\xff\xff\xf0")  # a negative batch_length
    reopened = open_log()
    with pytest.raises(CorruptBatchError, match=rf"00000000000000000000\.log at byte {2 * size}"):
        reopened.read(4, bytes_max=10**6)
    assert [h.base_offset for h in reopened.read(2, bytes_max=10**6).headers] == [2]


def test_a_smaller_index_entries_max_still_opens(
    open_log: OpenLog, batch: BatchFactory, small_config: LogConfig
) -> None:
    dense = replace(small_config, index_interval_bytes=1, segment_bytes_max=4096)
    log = open_log(dense)
    bases = _fill(log, batch, 30)
    log.close()
    for suffix in (".index", ".timeindex"):
        for number in range(len(log.segment_base_offsets) - 1):
            os.remove(_segment_file(log, number, suffix))
    reopened = open_log(replace(dense, index_entries_max=2))
    assert [reopened.read(b, bytes_max=1).base_offset for b in bases] == bases
    reopened.append(batch(), leader_epoch=1)  # the active segment rolls: its index is full
    assert reopened.log_end_offset == bases[-1] + 3


@pytest.mark.parametrize("segment", ["closed", "active after a clean close"])
def test_a_damaged_base_offset_is_never_served(
    open_log: OpenLog, batch: BatchFactory, segment: str
) -> None:
    """Base offsets lie outside the CRC; an unscanned segment checks that they follow on."""
    log = open_log()
    _fill(log, batch, 40 if segment == "closed" else 4)
    log.close()
    number = 0 if segment == "closed" else -1
    base = log.segment_base_offsets[number]
    size = len(batch(records=2))
    with open(_segment_file(log, number), "r+b") as file:
        file.seek(2 * size)  # the high byte of the third batch's base offset
        file.write(b"\x01")
    reopened = open_log()
    first = reopened.read(base, bytes_max=10**6)
    assert [h.base_offset for h in first.headers] == [base, base + 2]
    with pytest.raises(CorruptBatchError, match="no batch holds offset"):
        reopened.read(base + 4, bytes_max=10**6)
