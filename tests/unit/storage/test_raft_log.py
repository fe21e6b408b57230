"""RaftLogStorage: the DurableLog conformance suite the in-memory fake passes, then what only
the disk adds: entries survive reopening and crashes, the leader-epoch checkpoint is rebuilt
when lost, snapshots are finished after a crash, partition batches are stored as is."""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from raftlog.config import LogConfig
from raftlog.errors import CorruptBatchError
from raftlog.raft.ports import DurableLog
from raftlog.raft.types import Entry, EntryKind, Membership, Snapshot, SnapshotMeta
from raftlog.storage.batch import iter_batches, parse_header
from raftlog.storage.compaction import clean_batch
from raftlog.storage.raft_log_storage import CHECKPOINT_FILE_NAME, RaftLogStorage
from raftlog.storage.records import RecordInput, decode_batch, encode_batch
from raftlog.storage.sim_file_system import SimFileSystem
from raftlog.storage.wall_clock import ManualWallClock
from raftlog.types import NodeId, Offset, Term

CONFIG = LogConfig(segment_bytes_max=600, index_interval_bytes=64, batch_bytes_max=400).validate()
_directories = itertools.count()


def _conformance() -> ModuleType:
    """tests/unit/raft/storage_conformance.py, shared with the MemoryStorage tests."""
    if "storage_conformance" in sys.modules:
        return sys.modules["storage_conformance"]
    path = Path(__file__).resolve().parents[1] / "raft" / "storage_conformance.py"
    spec = importlib.util.spec_from_file_location("storage_conformance", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["storage_conformance"] = module
    spec.loader.exec_module(module)
    return module


conformance = _conformance()


def _open(files: SimFileSystem, directory: str = "/g/log") -> RaftLogStorage:
    return RaftLogStorage.open(directory, config=CONFIG, files=files, clock=ManualWallClock(5))


def _fresh() -> DurableLog:
    return _open(SimFileSystem(), f"/g/log-{next(_directories)}")


@pytest.mark.parametrize("check", conformance.CHECKS, ids=lambda c: c.__name__)
def test_raft_log_storage_conforms(check: Callable[[Callable[[], DurableLog]], None]) -> None:
    check(_fresh)


def _data_entry(term: int, offset: int, records: int = 2) -> Entry:
    batch = encode_batch([RecordInput(None, b"value", 1000)] * records)
    return Entry(Term(term), Offset(offset), records, EntryKind.DATA, batch)


def _history() -> list[Entry]:
    membership = Membership(frozenset({NodeId(1), NodeId(2)}))
    entries = [Entry(Term(1), Offset(0), 1, EntryKind.NOOP, b"")]
    entries.append(Entry(Term(1), Offset(1), 1, EntryKind.CONFIG, membership.encode()))
    offset = 2
    for term in (1, 1, 2, 2, 2, 3):
        entries.append(_data_entry(term, offset))
        offset += 2
    entries.append(Entry(Term(4), Offset(offset), 1, EntryKind.DATA, b"a metadata command"))
    return entries


def _everything(storage: RaftLogStorage) -> list[Entry]:
    return list(storage.entries(storage.first_offset(), bytes_max=10**6))


def test_entries_survive_reopening_with_their_terms() -> None:
    sim = SimFileSystem()
    storage = _open(sim)
    storage.append(_history())
    storage.sync()
    before = _everything(storage)
    terms = [storage.term_at(Offset(o)) for o in range(-1, 16)]
    storage.close()
    reopened = _open(sim)
    assert _everything(reopened) == before
    assert [reopened.term_at(Offset(o)) for o in range(-1, 16)] == terms
    assert [e.offset for e in reopened.config_entries()] == [1]
    assert reopened.entries(Offset(14), bytes_max=1)[0].data == b"a metadata command"


def test_partition_batches_are_stored_as_is_and_control_batches_skip_nothing() -> None:
    storage = _open(SimFileSystem())
    storage.append(_history())
    raw = storage.read(2, bytes_max=1)
    header = parse_header(raw)
    assert (header.base_offset, header.partition_leader_epoch, header.is_control) == (2, 1, False)
    assert [r.value for r in decode_batch(raw).records] == [b"value", b"value"]
    assert parse_header(storage.read(0, bytes_max=1)).is_control  # the leader's no-op
    assert storage.read(15, bytes_max=100) == b""


def test_reads_stop_before_the_first_batch_that_reaches_end_offset() -> None:
    """What a partition fetch relies on: nothing at or above the high watermark."""
    storage = _open(SimFileSystem())
    storage.append(_history())
    everything = storage.read(0, bytes_max=1 << 20)
    ends = [h.last_offset for _, h in iter_batches(everything)]
    for end_offset in range(16):
        cut = storage.read(0, bytes_max=1 << 20, end_offset=end_offset)
        kept = [h.last_offset for _, h in iter_batches(cut)]
        assert kept == [e for e in ends[: len(kept)]] and all(e < end_offset for e in kept)
        assert len(kept) == len(ends) or ends[len(kept)] >= end_offset
        assert everything.startswith(cut)


def _emptied_entry(term: int, offset: int, records: int = 2) -> Entry:
    """A data entry as the cleaner leaves it when every record went: the header stays."""
    emptied, removed = clean_batch(_data_entry(term, offset, records).data, lambda *_: False)
    assert removed == records and parse_header(emptied).record_count == 0
    return Entry(Term(term), Offset(offset), records, EntryKind.DATA, emptied)


def _compacted_history(emptied_before: int, emptied_after: int) -> list[Entry]:
    """A no-op, `emptied_before` emptied batches (several segments of them), one batch with
    records, then `emptied_after` emptied batches."""
    entries = [Entry(Term(1), Offset(0), 1, EntryKind.NOOP, b"")]
    offset = 1
    for index in range(emptied_before + 1 + emptied_after):
        make = _data_entry if index == emptied_before else _emptied_entry
        entries.append(make(1, offset))
        offset += 2
    return entries


def _read_batches(storage: RaftLogStorage, offset: int, **options: object) -> list[tuple[int, int]]:
    data = storage.read(offset, bytes_max=1 << 20, **options)  # type: ignore[arg-type]
    return [(h.base_offset, h.record_count) for _, h in iter_batches(data)]


def test_a_skipping_read_steps_over_segments_of_emptied_batches_to_a_record() -> None:
    storage = _open(SimFileSystem())
    storage.append(_compacted_history(emptied_before=40, emptied_after=5))
    assert len(storage.log.segment_base_offsets) > 5, "the emptied run spans segments"
    # The plain read serves the emptied batches of one segment as they are.
    plain = _read_batches(storage, 1)
    assert plain and all(count == 0 for _, count in plain)
    # Skipping, from anywhere in the run (inside a batch too): the batch with records.
    for offset in (1, 2, 30, 80):
        assert _read_batches(storage, offset, skip_emptied=True) == [(81, 2)]
    # Past the last record only emptied batches remain: the last one alone, so a client
    # still moves to the end.
    assert _read_batches(storage, 83, skip_emptied=True) == [(91, 0)]
    assert _read_batches(storage, 83, skip_emptied=True, end_offset=89) == [(87, 0)]
    assert storage.read(93, bytes_max=1 << 20, skip_emptied=True) == b""


def test_a_skipping_read_gives_up_after_its_scan_budget() -> None:
    config = dataclasses.replace(CONFIG, emptied_scan_bytes_max=1)
    storage = RaftLogStorage.open(
        "/g/log", config=config, files=SimFileSystem(), clock=ManualWallClock(5)
    )
    storage.append(_compacted_history(emptied_before=40, emptied_after=0))
    first_segment = _read_batches(storage, 1)
    assert _read_batches(storage, 1, skip_emptied=True) == [first_segment[-1]]


def test_a_crash_never_leaves_the_epoch_cache_ahead_of_the_log() -> None:
    for seed in range(15):
        sim = SimFileSystem(seed)
        storage = _open(sim)
        history = _history()
        storage.append(history[:5])
        storage.sync()
        storage.append(history[5:])  # new terms reach the checkpoint, the log may lose them
        sim.crash()
        reopened = _open(sim)
        last = reopened.last_offset()
        assert 7 <= last <= 14
        for entry in reopened.entries(Offset(0), bytes_max=10**6):
            assert reopened.term_at(entry.offset) == entry.term
        assert reopened.term_at(Offset(last + 1)) is None
        reopened.append([_data_entry(9, last + 1)])
        assert reopened.term_at(Offset(last + 2)) == 9


def test_a_lost_checkpoint_is_rebuilt_from_the_log() -> None:
    sim = SimFileSystem()
    storage = _open(sim)
    storage.append(_history())
    storage.close()
    sim.remove(f"/g/log/{CHECKPOINT_FILE_NAME}")
    reopened = _open(sim)
    assert [reopened.term_at(Offset(o)) for o in (0, 2, 6, 12, 14)] == [1, 1, 2, 3, 4]
    assert [e.offset for e in reopened.config_entries()] == [1]


def test_a_damaged_checkpoint_is_rebuilt() -> None:
    sim = SimFileSystem()
    storage = _open(sim)
    storage.append(_history())
    storage.close()
    sim.corrupt(f"/g/log/{CHECKPOINT_FILE_NAME}", 6, b"9")
    assert _open(sim).term_at(Offset(12)) == 3


def test_compaction_and_snapshot_survive_reopening() -> None:
    sim = SimFileSystem()
    storage = _open(sim)
    storage.append(_history())
    membership = Membership(frozenset({NodeId(1), NodeId(2)}))
    snapshot = Snapshot(SnapshotMeta(Offset(9), Term(2), membership), b"state")
    storage.compact(snapshot)
    storage.close()
    reopened = _open(sim)
    assert reopened.snapshot() == snapshot
    assert (reopened.first_offset(), reopened.log_start_offset()) == (10, 10)
    assert reopened.term_at(Offset(9)) == 2 and reopened.term_at(Offset(8)) is None
    assert list(reopened.config_entries()) == []
    with pytest.raises(LookupError):
        reopened.entries(Offset(8), bytes_max=100)


def test_install_snapshot_interrupted_by_a_crash_is_finished_on_open() -> None:
    sim = SimFileSystem()
    storage = _open(sim)
    storage.append(_history())
    storage.sync()
    membership = Membership(frozenset({NodeId(3)}))
    snapshot = Snapshot(SnapshotMeta(Offset(40), Term(7), membership), b"")
    storage._save_snapshot(snapshot)  # the first step of install_snapshot, then a crash
    sim.crash()
    reopened = _open(sim)
    assert (reopened.first_offset(), reopened.last_offset()) == (41, 40)
    assert reopened.term_at(Offset(40)) == 7
    reopened.append([_data_entry(8, 41)])
    assert reopened.entries(Offset(41), bytes_max=1)[0].term == 8


class RaftLogMachine(RuleBasedStateMachine):
    """RaftLogStorage against a list of entries, through crashes: after a crash the storage
    holds a prefix of the model that keeps every synced entry (Raft §5.1: what a node has
    acknowledged is on disk), and every term_at agrees with the model."""

    def __init__(self) -> None:
        super().__init__()
        self.files = SimFileSystem(seed=0)
        self.storage = _open(self.files)
        self.model: list[Entry] = []
        self.durable_count = 0
        self.snapshot_offset = -1
        self.snapshot_term = 0
        self.term = 1

    @initialize(seed=st.integers(0, 2**32 - 1))
    def seed_the_file_system(self, seed: int) -> None:
        self.files.random.seed(seed)

    def _next_offset(self, keep: int) -> int:
        return self.model[keep - 1].last_offset + 1 if keep else self.snapshot_offset + 1

    @rule(
        back=st.integers(0, 3),
        count=st.integers(1, 3),
        bump=st.booleans(),
        kind=st.sampled_from([EntryKind.DATA, EntryKind.NOOP, EntryKind.CONFIG, None]),
    )
    def append(self, back: int, count: int, bump: bool, kind: EntryKind | None) -> None:
        keep = max(self.durable_count if back > 2 else 0, len(self.model) - back)
        start, self.term = self._next_offset(keep), self.term + int(bump)
        if kind is None:
            new = _data_entry(self.term, start, count)  # a real batch
        else:
            new = Entry(
                Term(self.term),
                Offset(start),
                1 if kind is not EntryKind.DATA else count,
                kind,
                b"x" * count,
            )
        self.storage.append([new])
        self.model = [*self.model[:keep], new]
        self.durable_count = min(self.durable_count, keep)

    @rule()
    def sync(self) -> None:
        self.storage.sync()
        self.durable_count = len(self.model)

    @precondition(lambda self: self.durable_count > 0)
    @rule(data=st.data())
    def compact(self, data: st.DataObject) -> None:
        # Raft compacts only committed, hence durable, entries.
        upto = data.draw(st.integers(1, self.durable_count))
        covered = self.model[upto - 1]
        membership = Membership(frozenset({NodeId(1)}))
        snapshot = Snapshot(SnapshotMeta(covered.last_offset, covered.term, membership), b"s")
        self.storage.compact(snapshot)
        self.model = self.model[upto:]
        self.durable_count -= upto
        self.snapshot_offset, self.snapshot_term = covered.last_offset, covered.term

    @rule(ahead=st.integers(1, 20))
    def install_snapshot(self, ahead: int) -> None:
        offset = self._next_offset(len(self.model)) + ahead
        self.term += 1
        membership = Membership(frozenset({NodeId(2)}))
        self.storage.install_snapshot(
            Snapshot(SnapshotMeta(Offset(offset), Term(self.term), membership))
        )
        self.model, self.durable_count = [], 0
        self.snapshot_offset, self.snapshot_term = offset, self.term

    @rule()
    def reopen(self) -> None:
        self.storage.close()
        self.durable_count = len(self.model)
        self.storage = _open(self.files)

    @rule(torn=st.sampled_from([None, True, False]))
    def crash(self, torn: bool | None) -> None:
        self.files.crash(torn=torn)
        self.storage = _open(self.files)
        held = len([e for e in self.model if e.last_offset <= self.storage.last_offset()])
        assert self.durable_count <= held <= len(self.model)
        self.model = self.model[:held]
        self.durable_count = held

    @invariant()
    def matches_model(self) -> None:
        storage = self.storage
        assert storage.first_offset() == self.snapshot_offset + 1
        assert storage.term_at(Offset(self.snapshot_offset)) == self.snapshot_term
        last = self.model[-1].last_offset if self.model else self.snapshot_offset
        assert storage.last_offset() == last
        assert storage.term_at(Offset(last + 1)) is None
        for entry in self.model:
            assert storage.term_at(entry.last_offset) == entry.term
        if self.model:
            got = storage.entries(storage.first_offset(), bytes_max=10**9)
            assert [(e.offset, e.term, e.kind, e.offset_count) for e in got] == [
                (e.offset, e.term, e.kind, e.offset_count) for e in self.model
            ]
        configs = [e.offset for e in self.model if e.kind is EntryKind.CONFIG]
        assert [e.offset for e in storage.config_entries()] == configs

    def teardown(self) -> None:
        if not self.storage.log.is_closed:
            self.storage.close()


RaftLogMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
TestRaftLogMachine = RaftLogMachine.TestCase


def _checkpoint_bytes(sim: SimFileSystem) -> bytes | None:
    path = f"/g/log/{CHECKPOINT_FILE_NAME}"
    if not sim.exists(path):
        return None
    handle = sim.open(path)
    try:
        return handle.read_at(handle.size_bytes(), 0)
    finally:
        handle.close()


def test_a_new_term_is_checkpointed_by_the_sync_ticket_not_by_the_append() -> None:
    """An election must not replace and fsync a file per group on the event loop: the append
    only marks the checkpoint pending; the host's disk thread writes it before the fsyncs."""
    sim = SimFileSystem()
    storage = _open(sim)
    storage.append(_history()[:5])
    storage.sync()
    before = _checkpoint_bytes(sim)
    storage.append([_data_entry(7, storage.last_offset() + 1)])
    assert _checkpoint_bytes(sim) == before  # nothing written by the append itself
    ticket = storage.prepare_sync()
    assert ticket.prelude is not None
    assert _checkpoint_bytes(sim) == before
    ticket.run()  # what the disk thread does
    storage.complete_sync(ticket)
    assert _checkpoint_bytes(sim) != before
    sim.crash()
    reopened = _open(sim)
    assert reopened.term_at(reopened.last_offset()) == 7
    assert reopened.last_offset() == storage.last_offset()


def test_an_older_checkpoint_never_replaces_a_newer_one() -> None:
    """A compaction on the loop may write the checkpoint while a ticket prepared before it
    waits for a disk thread: the stale prelude must not bring the older version back."""
    sim = SimFileSystem()
    storage = _open(sim)
    storage.append(_history())  # terms 1-4 and a CONFIG entry: checkpoint pending
    stale_ticket = storage.prepare_sync()  # its prelude holds that version
    membership = Membership(frozenset({NodeId(1), NodeId(2)}))
    storage.compact(Snapshot(SnapshotMeta(Offset(9), Term(2), membership), b"state"))
    after_compaction = _checkpoint_bytes(sim)  # written at once, CONFIG offset 1 dropped
    stale_ticket.run()
    assert _checkpoint_bytes(sim) == after_compaction
    storage.complete_sync(stale_ticket)
    storage.close()
    reopened = _open(sim)
    assert [reopened.term_at(Offset(o)) for o in (9, 10, 12, 14)] == [2, 2, 3, 4]
    assert list(reopened.config_entries()) == []


def test_a_pending_checkpoint_is_written_by_close() -> None:
    sim = SimFileSystem()
    storage = _open(sim)
    storage.append(_history())
    storage.close()
    assert _checkpoint_bytes(sim) is not None
    sim.crash()  # close synced everything: nothing to rebuild, nothing lost
    assert [_open(sim).term_at(Offset(o)) for o in (0, 6, 12, 14)] == [1, 2, 3, 4]


@pytest.mark.parametrize("damage", ["flip", "delete"])
def test_a_lost_snapshot_empties_the_log_for_a_repair(damage: str) -> None:
    """A log that starts above 0 needs its snapshot: lost or damaged, the log starts over,
    empty and repairing (docs/storage-faults.md), and a leader sends both again."""
    sim = SimFileSystem()
    storage = _open(sim)
    storage.append(_history())
    membership = Membership(frozenset({NodeId(1), NodeId(2)}))
    storage.compact(Snapshot(SnapshotMeta(Offset(13), Term(3), membership), b"state"))
    storage.sync()
    assert storage.log.log_start_offset == 12
    path = "/g/log/snapshot"
    if damage == "flip":
        sim.corrupt(path, 10, b"\xee")
    else:
        sim.remove(path)
        sim.sync_directory("/g/log")
    sim.crash()
    reopened = _open(sim)
    assert reopened.snapshot() is None and reopened.is_repairing
    assert (reopened.first_offset(), reopened.last_offset()) == (0, -1)
    assert reopened.damage is not None and reopened.damage.path == path
    sim.crash()
    assert _open(sim).is_repairing


def test_a_flipped_leader_epoch_is_caught_on_read() -> None:
    """The epoch lies outside the batch CRC; reads check it against the epoch checkpoint."""
    sim = SimFileSystem()
    storage = _open(sim)
    storage.append(_history())
    storage.close()
    path = "/g/log/00000000000000000000.log"
    sim.corrupt(path, 15, bytes([sim.file_bytes(path)[15] ^ 0x04]))  # the first batch's epoch
    reopened = _open(sim)
    with pytest.raises(CorruptBatchError, match="carries leader epoch 5, the epoch checkpoint"):
        reopened.entries(Offset(0), bytes_max=10**6)


def test_a_killed_process_s_unsynced_raft_entries_are_known_after_restart() -> None:
    # A no-op and a CONFIG entry in the leader's term, written to the OS but not synced when
    # the process died (SIGKILL keeps the page cache). The checkpoint is written only by a
    # sync, so it does not list them; the restart must still know them, or the replica uses
    # an old membership and counts the no-op as a Kafka offset (Hypothesis found it).
    files = SimFileSystem()
    storage = _open(files)
    storage.append([_data_entry(1, 0)])
    storage.sync()
    membership = Membership(frozenset({NodeId(1), NodeId(2)}))
    storage.append(
        [
            Entry(Term(1), Offset(2), 1, EntryKind.NOOP, b""),
            Entry(Term(1), Offset(3), 1, EntryKind.CONFIG, membership.encode()),
            _data_entry(1, 4),
        ]
    )
    storage.log.read(5, bytes_max=1)  # the appends reach the OS, unsynced
    restarted = _open(files)  # no close, no crash: the process was killed
    assert restarted.last_offset() == 5
    assert [entry.offset for entry in restarted.config_entries()] == [3]
    assert restarted.internal_offsets() == [2, 3]
    assert restarted.kafka_offset(4) == 2
    # The tail scanned is written into the checkpoint: a second restart reads it there.
    again = _open(files)
    assert again.internal_offsets() == [2, 3]


def test_the_end_of_a_repair_writes_the_checkpoint_before_the_mark_claims_its_entries() -> None:
    files = SimFileSystem()
    storage = _open(files)
    storage.append([_data_entry(1, 0)])
    storage.sync()
    storage.log.start_repair(0, "a flipped byte", path="/g/log/x")
    membership = Membership(frozenset({NodeId(1), NodeId(2)}))
    storage.append(
        [
            Entry(Term(1), Offset(0), 1, EntryKind.NOOP, b""),
            Entry(Term(1), Offset(1), 1, EntryKind.CONFIG, membership.encode()),
        ]
    )
    storage.log.roll()  # syncs the closing segment: the durable end passes both entries
    storage.finish_repair()
    restarted = _open(files)  # killed: the pending checkpoint was never synced by a flush
    assert [entry.offset for entry in restarted.config_entries()] == [1]
    assert restarted.internal_offsets() == [0, 1]
