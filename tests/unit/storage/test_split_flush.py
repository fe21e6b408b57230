"""`flush` split in three steps so the group host can fsync off the event loop:
prepare (hand appends to the OS) -> ticket.run (fsync, any thread) -> complete (record)."""

from __future__ import annotations

from raftlog.config import LogConfig
from raftlog.storage.log import FlushTicket, SegmentedLog
from raftlog.storage.sim_file_system import SimFileSystem
from raftlog.storage.wall_clock import ManualWallClock
from tests.unit.storage.conftest import make_batch


def _open(sim: SimFileSystem, config: LogConfig) -> SegmentedLog:
    return SegmentedLog.open("/sim/log", config=config, files=sim, clock=ManualWallClock(1))


def _one_append_prepared(sim: SimFileSystem, config: LogConfig) -> tuple[SegmentedLog, FlushTicket]:
    log = _open(sim, config)
    log.append(make_batch(), leader_epoch=1)
    return log, log.prepare_flush()


def test_a_completed_ticket_makes_its_appends_durable(
    sim: SimFileSystem, small_config: LogConfig
) -> None:
    log = _open(sim, small_config)
    for _ in range(5):
        log.append(make_batch(), leader_epoch=1)
    ticket = log.prepare_flush()
    assert log.durable_end_offset < log.log_end_offset, "prepare alone promises nothing"
    ticket.run()
    assert log.complete_flush(ticket) == log.log_end_offset == 5
    log.append(make_batch(), leader_epoch=1)  # after the ticket: not covered by it
    sim.crash(torn=False)
    reopened = _open(sim, small_config)
    assert reopened.log_end_offset == 5


def test_appends_made_while_a_ticket_runs_are_not_counted_durable(
    sim: SimFileSystem, small_config: LogConfig
) -> None:
    log, ticket = _one_append_prepared(sim, small_config)
    log.append(make_batch(), leader_epoch=1)
    ticket.run()
    assert log.complete_flush(ticket) == 1
    assert log.durable_end_offset == 1 < log.log_end_offset == 2
    assert log.flush() == 2


def test_a_prepared_ticket_that_never_ran_is_not_durable(
    sim: SimFileSystem, small_config: LogConfig
) -> None:
    log = _open(sim, small_config)
    log.append(make_batch(), leader_epoch=1)
    log.flush()
    log.append(make_batch(), leader_epoch=1)
    log.prepare_flush()  # the fsync never happens: a crash may drop the append
    sim.crash(torn=False)
    assert _open(sim, small_config).log_end_offset == 1


def _active_file_bytes(sim: SimFileSystem, log: SegmentedLog) -> int:
    return len(sim.file_bytes(log._active().path))


def test_the_ticket_not_the_caller_writes_the_appends(
    sim: SimFileSystem, small_config: LogConfig
) -> None:
    log, ticket = _one_append_prepared(sim, small_config)
    assert _active_file_bytes(sim, log) == 0, "the copy into the file is the ticket's work"
    ticket.run()
    assert _active_file_bytes(sim, log) == log._active().size_bytes
    assert log.complete_flush(ticket) == 1


def test_a_read_of_appends_in_flight_writes_them_once(
    sim: SimFileSystem, small_config: LogConfig
) -> None:
    log = _open(sim, small_config)
    first, second = make_batch(value_bytes=11), make_batch(value_bytes=12)
    log.append(first, leader_epoch=1)
    log.append(second, leader_epoch=1)
    ticket = log.prepare_flush()
    # Base offset and epoch are patched in the log; the rest of each batch is as appended.
    assert log.read(1, bytes_max=1024).data[16:] == second[16:]
    ticket.run()  # the read wrote them: the ticket only fsyncs
    assert log.complete_flush(ticket) == 2
    assert _active_file_bytes(sim, log) == len(first) + len(second)
    sim.crash(torn=False)
    assert _open(sim, small_config).log_end_offset == 2


def test_appends_of_a_ticket_that_never_ran_are_made_durable_by_the_next_flush(
    sim: SimFileSystem, small_config: LogConfig
) -> None:
    log, _ = _one_append_prepared(sim, small_config)  # then abandoned (a cancelled pass)
    assert log.flush() == 1
    sim.crash(torn=False)
    assert _open(sim, small_config).log_end_offset == 1
