"""Damage told from a torn tail: the durable mark (`raftlog.storage.durable_mark`) says how
far the log had been fsynced, so synced data that a flipped byte, a truncation or a deleted
file took away is reported as `LogDamage` (and the repair flag survives restarts), while a
crash that tore unsynced appends is a plain recovery."""

from __future__ import annotations

import os
from collections.abc import Callable

from raftlog.config import LogConfig
from raftlog.storage.durable_mark import DURABLE_MARK_FILE_NAME, SLOT_BYTES, decode_marks
from raftlog.storage.log import SegmentedLog
from raftlog.storage.sim_file_system import SimFileSystem
from raftlog.storage.wall_clock import ManualWallClock

BatchFactory = Callable[..., bytes]
DIRECTORY = "/l"


def _open(sim: SimFileSystem, config: LogConfig, clock: ManualWallClock) -> SegmentedLog:
    return SegmentedLog.open(DIRECTORY, config=config, files=sim, clock=clock)


def _synced_log(
    sim: SimFileSystem, config: LogConfig, clock: ManualWallClock, batch: BatchFactory, count: int
) -> SegmentedLog:
    log = _open(sim, config, clock)
    for _ in range(count):
        log.append(batch(records=2), leader_epoch=1)
    log.flush()
    return log


def _active_path(log: SegmentedLog) -> str:
    return os.path.join(DIRECTORY, f"{log.segment_base_offsets[-1]:020d}.log")


def test_a_fresh_log_is_whole(sim: SimFileSystem, small_config: LogConfig, clock: ManualWallClock):
    log = _open(sim, small_config, clock)
    sim.crash()
    reopened = _open(sim, small_config, clock)
    assert reopened.damage is None and not reopened.is_repairing
    assert log.mark.path == reopened.mark.path


def test_a_torn_unsynced_tail_is_not_damage(
    sim: SimFileSystem, small_config: LogConfig, clock: ManualWallClock, batch: BatchFactory
) -> None:
    log = _synced_log(sim, small_config, clock, batch, 10)
    for _ in range(5):
        log.append(batch(records=2), leader_epoch=1)
    log.read(log.log_end_offset - 1, bytes_max=1)  # the appends reach the OS, unsynced
    sim.crash(torn=True)
    reopened = _open(sim, small_config, clock)
    assert 20 <= reopened.log_end_offset <= 30
    assert reopened.damage is None and not reopened.is_repairing


def test_a_flipped_byte_in_synced_data_is_damage_until_repaired(
    sim: SimFileSystem, small_config: LogConfig, clock: ManualWallClock, batch: BatchFactory
) -> None:
    log = _synced_log(sim, small_config, clock, batch, 10)
    end = log.log_end_offset
    path = _active_path(log)
    sim.crash()
    position = len(batch(records=2)) * 5 + 70  # inside the records of the sixth batch
    sim.corrupt(path, position, bytes([sim.file_bytes(path)[position] ^ 0x40]))
    reopened = _open(sim, small_config, clock)
    damage = reopened.damage
    assert damage is not None and reopened.is_repairing
    assert damage.end_offset == end and damage.first_offset == reopened.log_end_offset == 10
    assert damage.path == path and "CRC" in damage.describe()
    # A restart before the repair still knows: the flag is durable.
    sim.crash()
    again = _open(sim, small_config, clock)
    assert again.is_repairing and again.damage is not None and again.damage.end_offset == end
    while again.log_end_offset < end:
        again.append(batch(records=2), leader_epoch=2)
    again.flush()
    again.finish_repair()
    sim.crash()
    assert _open(sim, small_config, clock).damage is None


def test_a_truncated_segment_is_damage(
    sim: SimFileSystem, small_config: LogConfig, clock: ManualWallClock, batch: BatchFactory
) -> None:
    log = _synced_log(sim, small_config, clock, batch, 10)
    path = _active_path(log)
    handle = sim.open(path)
    handle.truncate(handle.size_bytes() * 6 // 10)
    handle.sync()
    sim.crash()
    reopened = _open(sim, small_config, clock)
    assert reopened.damage is not None
    assert reopened.damage.end_offset == 20 and reopened.log_end_offset < 20


def test_a_deleted_active_segment_is_damage(
    sim: SimFileSystem, small_config: LogConfig, clock: ManualWallClock, batch: BatchFactory
) -> None:
    log = _synced_log(sim, small_config, clock, batch, 60)
    assert len(log.segment_base_offsets) > 2
    path = _active_path(log)
    sim.crash()
    sim.remove(path)
    sim.sync_directory(DIRECTORY)
    reopened = _open(sim, small_config, clock)
    assert reopened.damage is not None and reopened.damage.end_offset == 120


def test_every_segment_deleted_is_damage(
    sim: SimFileSystem, small_config: LogConfig, clock: ManualWallClock, batch: BatchFactory
) -> None:
    log = _synced_log(sim, small_config, clock, batch, 3)
    sim.crash()
    for name in sim.list_directory(DIRECTORY):
        if name.endswith(".log"):
            sim.remove(os.path.join(DIRECTORY, name))
    reopened = _open(sim, small_config, clock)
    assert reopened.damage is not None and reopened.damage.end_offset == 6
    assert log.log_end_offset == 6 and reopened.log_end_offset == 0


def test_a_lost_or_damaged_mark_is_damage_of_unknown_extent(
    sim: SimFileSystem, small_config: LogConfig, clock: ManualWallClock, batch: BatchFactory
) -> None:
    log = _synced_log(sim, small_config, clock, batch, 4)
    sim.crash()
    sim.remove(log.mark.path)
    reopened = _open(sim, small_config, clock)
    assert reopened.damage is not None and reopened.damage.end_offset is None
    assert reopened.log_end_offset == 8 and reopened.is_repairing
    reopened.finish_repair()
    sim.crash()
    sim.corrupt(log.mark.path, SLOT_BYTES + 20, b"\x7f")  # the older slot: the newer answers
    assert _open(sim, small_config, clock).damage is None
    sim.crash()
    sim.corrupt(log.mark.path, 20, b"\x7f")  # both: the mark is lost
    damaged = _open(sim, small_config, clock)
    assert damaged.damage is not None and "CRC32C" in damaged.damage.cause


def test_a_raft_truncation_lowers_the_mark_first(
    sim: SimFileSystem, small_config: LogConfig, clock: ManualWallClock, batch: BatchFactory
) -> None:
    log = _synced_log(sim, small_config, clock, batch, 10)
    log.truncate_from(8)
    sim.crash()
    reopened = _open(sim, small_config, clock)
    assert reopened.log_end_offset == 8 and reopened.damage is None


def test_a_damaged_read_starts_a_repair_that_survives_a_restart(
    sim: SimFileSystem, small_config: LogConfig, clock: ManualWallClock, batch: BatchFactory
) -> None:
    log = _synced_log(sim, small_config, clock, batch, 60)
    damage = log.start_repair(40, "CRC failed on read", path=_active_path(log))
    assert log.log_end_offset == 40 and damage.end_offset == 120
    sim.crash()
    reopened = _open(sim, small_config, clock)
    assert reopened.is_repairing and reopened.damage is not None
    assert reopened.damage.end_offset == 120


def test_flushes_record_the_mark_and_a_torn_slot_leaves_the_other(
    sim: SimFileSystem, small_config: LogConfig, clock: ManualWallClock, batch: BatchFactory
) -> None:
    log = _synced_log(sim, small_config, clock, batch, 3)
    log.append(batch(records=2), leader_epoch=1)
    ticket = log.prepare_flush()
    ticket.run()
    log.complete_flush(ticket)
    data = sim.file_bytes(os.path.join(DIRECTORY, DURABLE_MARK_FILE_NAME))
    found = decode_marks(data, path="m")
    assert not isinstance(found, str) and found[1].end_offset == 8
    # A write torn by a power loss damages the slot it was writing; the other answers.
    sequence, _ = found
    torn_slot = (sequence % 2) * SLOT_BYTES
    torn = data[:torn_slot] + b"\x00" * 100 + data[torn_slot + 100 :]
    older = decode_marks(torn, path="m")
    assert not isinstance(older, str) and older[0] == sequence - 1 and older[1].end_offset == 6
