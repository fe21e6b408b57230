"""The durable mark's deferred fsync (`raftlog.storage.durable_mark`, "When the record is
fsynced"): a flush writes the record before anything is acknowledged and leaves its fsync to
the syncer; the record never claims more than the log holds, a power loss before the
deferred fsync leaves an older record (claiming less, the log's synced batches kept), and a
write torn by a power loss never takes the anchor slot with it."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from raftlog.config import LogConfig, NodeConfig
from raftlog.errors import ConfigError, StorageError
from raftlog.storage.durable_mark import (
    DURABLE_MARK_FILE_NAME,
    SLOT_BYTES,
    DurableMark,
    MarkRecord,
    ThreadMarkSyncer,
    decode_marks,
)
from raftlog.storage.file_system import FileHandle, OsFileSystem
from raftlog.storage.log import SegmentedLog
from raftlog.storage.sim_file_system import SimFileSystem
from raftlog.storage.wall_clock import ManualWallClock

BatchFactory = Callable[..., bytes]
DIRECTORY = "/l"
MARK_PATH = os.path.join(DIRECTORY, DURABLE_MARK_FILE_NAME)


class QueuedSyncer:
    """Holds the deferred fsyncs until the test runs them (a syncer thread, paused)."""

    def __init__(self) -> None:
        self.queued: list[Callable[[], None]] = []

    def submit(self, sync: Callable[[], None]) -> None:
        self.queued.append(sync)

    def run_all(self) -> None:
        queued, self.queued = self.queued, []
        for sync in queued:
            sync()


def _durable_record(sim: SimFileSystem) -> MarkRecord:
    """The record in force in what a power loss would leave of the mark, torn or not."""
    found = decode_marks(bytes(sim._durable[MARK_PATH].durable), path="m")
    assert not isinstance(found, str), found
    return found[1]


def _current_record(sim: SimFileSystem) -> MarkRecord:
    found = decode_marks(sim.file_bytes(MARK_PATH), path="m")
    assert not isinstance(found, str), found
    return found[1]


def _slot_record(data: bytes, start: int) -> MarkRecord | None:
    found = decode_marks(data[start : start + SLOT_BYTES] + bytes(SLOT_BYTES), path="m")
    return None if isinstance(found, str) else found[1]


def _deferred_log(
    sim: SimFileSystem, config: LogConfig, clock: ManualWallClock, batch: BatchFactory, count: int
) -> tuple[SegmentedLog, QueuedSyncer]:
    """A log whose mark fsyncs wait for the test, holding `count` unflushed batches."""
    syncer = QueuedSyncer()
    log = SegmentedLog.open(DIRECTORY, config=config, files=sim, clock=clock, mark_syncer=syncer)
    for _ in range(count):
        log.append(batch(records=2), leader_epoch=1)
    return log, syncer


def test_a_flush_writes_the_mark_at_once_and_leaves_its_fsync_to_the_syncer(
    sim: SimFileSystem, small_config: LogConfig, clock: ManualWallClock, batch: BatchFactory
) -> None:
    log, syncer = _deferred_log(sim, small_config, clock, batch, 1)
    assert log.flush() == 2  # the first record after open is fsynced at once (below)
    assert not syncer.queued and _durable_record(sim) == MarkRecord(2)
    for _ in range(3):
        log.append(batch(records=2), leader_epoch=1)
    assert log.flush() == 8
    # Written before the flush returned (what a killed process leaves: the page cache) ...
    assert _current_record(sim) == MarkRecord(8)
    # ... fsynced only by the syncer: a power loss now leaves the record before it.
    assert _durable_record(sim) == MarkRecord(2)
    assert len(syncer.queued) == 1
    syncer.run_all()
    assert _durable_record(sim) == MarkRecord(8)


def test_a_power_loss_before_the_deferred_fsync_keeps_every_synced_batch(
    sim: SimFileSystem, small_config: LogConfig, clock: ManualWallClock, batch: BatchFactory
) -> None:
    log, syncer = _deferred_log(sim, small_config, clock, batch, 4)
    log.flush()
    syncer.run_all()
    for _ in range(3):
        log.append(batch(records=2), leader_epoch=1)
    assert log.flush() == 14  # acknowledgeable now; the mark's fsync still queued
    sim.crash(torn=True)
    reopened = SegmentedLog.open(DIRECTORY, config=small_config, files=sim, clock=clock)
    # The mark claimed less (8), never more: no damage, and the synced batches past it stay.
    assert reopened.damage is None and not reopened.is_repairing
    assert reopened.log_end_offset == 14


def test_records_written_while_a_sync_is_pending_never_touch_the_anchor(
    sim: SimFileSystem,
) -> None:
    sim.make_directory(DIRECTORY)
    syncer = QueuedSyncer()
    mark = DurableMark(sim, DIRECTORY, syncer)
    mark.write(MarkRecord(10))  # durable, the anchor
    anchor_bytes = sim.file_bytes(MARK_PATH)
    for end in (11, 12, 13):
        mark.advance(MarkRecord(end))
    assert len(syncer.queued) == 1  # one sync queued carries every record written meanwhile
    data = sim.file_bytes(MARK_PATH)
    found = decode_marks(data, path="m")
    assert not isinstance(found, str) and found[1] == MarkRecord(13)
    # The anchor's slot still holds record 10, byte for byte as before the three writes.
    slots = {start: _slot_record(data, start) for start in (0, SLOT_BYTES)}
    assert sorted(slots.values(), key=lambda r: r.end_offset) == [MarkRecord(10), MarkRecord(13)]
    anchor = next(start for start, record in slots.items() if record == MarkRecord(10))
    assert data[anchor : anchor + SLOT_BYTES] == anchor_bytes[anchor : anchor + SLOT_BYTES]
    scratch = SLOT_BYTES - anchor
    # A power loss tearing the scratch slot leaves the anchor's record in force.
    torn = bytearray(data)
    torn[scratch : scratch + 100] = bytes(100)
    older = decode_marks(bytes(torn), path="m")
    assert not isinstance(older, str) and older[1] == MarkRecord(10)
    syncer.run_all()
    assert _durable_record(sim) == MarkRecord(13)
    # The synced scratch is the new anchor: the next record goes to the other slot.
    mark.advance(MarkRecord(14))
    after = sim.file_bytes(MARK_PATH)
    assert after[scratch : scratch + SLOT_BYTES] == data[scratch : scratch + SLOT_BYTES]


def _anchored_mark(sim: SimFileSystem, *, then: int) -> tuple[DurableMark, QueuedSyncer]:
    """A mark whose record 10 is fsynced and record `then` written, its fsync queued."""
    sim.make_directory(DIRECTORY)
    syncer = QueuedSyncer()
    mark = DurableMark(sim, DIRECTORY, syncer)
    mark.write(MarkRecord(10))
    mark.advance(MarkRecord(then))
    return mark, syncer


def test_write_is_durable_when_it_returns_even_with_a_sync_pending(sim: SimFileSystem) -> None:
    mark, syncer = _anchored_mark(sim, then=20)
    mark.write(MarkRecord(15))  # a truncation lowering the mark
    assert _durable_record(sim) == MarkRecord(15)
    syncer.run_all()  # finds nothing left to sync
    assert _durable_record(sim) == MarkRecord(15)
    sim.crash(torn=True)
    assert DurableMark(sim, DIRECTORY).load() == MarkRecord(15)


def test_the_first_record_after_a_restart_is_fsynced_at_once(sim: SimFileSystem) -> None:
    # After a restart the slot in force may be page cache a killed process left: it cannot
    # anchor deferred writes until a write of this process was fsynced.
    sim.make_directory(DIRECTORY)
    DurableMark(sim, DIRECTORY).write(MarkRecord(10))
    syncer = QueuedSyncer()
    mark = DurableMark(sim, DIRECTORY, syncer)
    assert mark.load() == MarkRecord(10)
    mark.advance(MarkRecord(12))
    assert not syncer.queued and _durable_record(sim) == MarkRecord(12)
    mark.advance(MarkRecord(13))
    assert len(syncer.queued) == 1 and _durable_record(sim) == MarkRecord(12)


class _FailingSync:
    """A mark file whose fsync reports an I/O error (EIO from a failing disk)."""

    def __init__(self, inner: FileHandle) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def sync(self) -> None:
        raise OSError(5, "Input/output error")


def test_a_failed_deferred_fsync_fails_the_next_write(sim: SimFileSystem) -> None:
    mark, syncer = _anchored_mark(sim, then=11)
    assert mark._handle is not None
    mark._handle = _FailingSync(mark._handle)  # type: ignore[assignment]
    syncer.run_all()
    with pytest.raises(StorageError, match="fsync of the durable mark failed"):
        mark.advance(MarkRecord(12))
    with pytest.raises(StorageError, match="fsync of the durable mark"):
        mark.write(MarkRecord(12))


def test_the_mark_thread_syncs_and_close_waits_for_it(tmp_path: Path) -> None:
    files = OsFileSystem()
    directory = str(tmp_path)
    syncer = ThreadMarkSyncer()
    mark = DurableMark(files, directory, syncer)
    mark.write(MarkRecord(0))
    writers = [
        threading.Thread(target=lambda n=n: mark.advance(MarkRecord(n)))  # type: ignore[misc]
        for n in range(1, 50)
    ]
    for writer in writers:
        writer.start()
        writer.join()  # in order: a flush's records only grow
    mark.close()  # returns once the thread's fsync of the last record is done
    assert not mark._syncing and not mark._dirty
    assert DurableMark(files, directory).load() == MarkRecord(49)


def test_with_the_inline_syncer_a_failed_fsync_fails_the_flush_itself(sim: SimFileSystem) -> None:
    sim.make_directory(DIRECTORY)
    mark = DurableMark(sim, DIRECTORY)  # in_flush: nothing is acknowledged past a failure
    mark.write(MarkRecord(10))
    mark.write(MarkRecord(11))
    assert mark._handle is not None
    mark._handle = _FailingSync(mark._handle)  # type: ignore[assignment]
    with pytest.raises(StorageError, match="fsync of the durable mark failed"):
        mark.advance(MarkRecord(12))


def test_the_node_setting_names_its_choices() -> None:
    assert NodeConfig().durable_mark_sync == "deferred"
    NodeConfig(durable_mark_sync="in_flush").validate()
    with pytest.raises(ConfigError, match="durable_mark_sync: must be 'deferred' or 'in_flush'"):
        NodeConfig(durable_mark_sync="sometimes").validate()  # type: ignore[arg-type]
