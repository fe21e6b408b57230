"""The simulated disk: LogStorage conventions, sync, crash with lost and torn unsynced writes."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.errors import OffsetOutOfRangeError
from raftlog.raft.types import Entry, EntryKind, HardState, Membership, Snapshot, SnapshotMeta
from raftlog.sim.disk import CrashSwitch, SimCrash, SimHardStateStore, SimLog
from raftlog.types import NodeId, Offset, Term


def _log(*, seed: int = 0, crash_rate: float = 0.0, torn_writes: bool = True) -> SimLog:
    rng = random.Random(seed)
    return SimLog(crash_switch=CrashSwitch(rng, crash_rate), rng=rng, torn_writes=torn_writes)


def _entry(offset: int, term: int, count: int = 1, kind: EntryKind = EntryKind.DATA) -> Entry:
    return Entry(Term(term), Offset(offset), count, kind, b"d%d-%d" % (offset, term))


def _chain(start: int, term: int, counts: list[int]) -> list[Entry]:
    entries = []
    for count in counts:
        entries.append(_entry(start, term, count))
        start += count
    return entries


def test_empty_log_follows_the_port_conventions() -> None:
    log = _log()
    assert (log.first_offset(), log.last_offset()) == (0, -1)
    assert log.term_at(Offset(-1)) == 0
    assert log.term_at(Offset(0)) is None
    assert log.snapshot() is None and list(log.config_entries()) == []
    with pytest.raises(LookupError):
        log.entries(Offset(0), bytes_max=1000)


def test_entries_cover_their_offsets_and_reads_respect_bytes_max() -> None:
    log = _log()
    config = Entry(
        Term(1), Offset(5), 1, EntryKind.CONFIG, Membership(frozenset({NodeId(1)})).encode()
    )
    log.append([*_chain(0, 1, [2, 3]), config])
    assert log.last_offset() == 5 and log.term_at(Offset(4)) == 1
    assert [e.offset for e in log.entries(Offset(2), bytes_max=1)] == [2]  # at least one
    assert [e.offset for e in log.entries(Offset(0), bytes_max=10_000)] == [0, 2, 5]
    with pytest.raises(LookupError):
        log.entries(Offset(3), bytes_max=1000)  # inside a batch, not a base offset
    assert list(log.config_entries()) == [config]


def test_append_truncates_the_conflicting_suffix_and_reports_it() -> None:
    log = _log()
    log.append(_chain(0, 1, [1, 1, 1]))
    log.appended.clear()
    log.append([_entry(1, 2)])
    assert log.last_offset() == 1 and log.term_at(Offset(1)) == 2
    assert log.truncated_from == 1
    assert log.appended == [(_entry(1, 2), Term(1))]  # with the term of the offset before it
    with pytest.raises(OffsetOutOfRangeError):
        log.append([_entry(5, 2)])  # a hole


def test_crash_loses_what_was_not_synced() -> None:
    log = _log()
    log.append(_chain(0, 1, [1, 1]))
    log.sync()
    log.append(_chain(2, 1, [1, 1, 1]))
    assert log.durable_last_offset == 1 and log.has_pending()
    log.crash()
    assert 1 <= log.last_offset() <= 4 and not log.has_pending()
    assert log.durable_last_offset == log.last_offset()


def test_a_crash_switch_at_rate_one_dies_before_changing_anything() -> None:
    log = _log(crash_rate=1.0)
    with pytest.raises(SimCrash) as crash:
        log.append([_entry(0, 1)])
    assert crash.value.point == "append" and log.last_offset() == -1
    store = SimHardStateStore(crash_switch=CrashSwitch(random.Random(0), 1.0))
    with pytest.raises(SimCrash):
        store.save(HardState(Term(3), NodeId(2)))
    assert store.load() == HardState()


def test_compact_keeps_the_tail_and_answers_the_snapshot_term() -> None:
    log = _log()
    log.append(_chain(0, 1, [2, 2, 2]))
    log.sync()
    membership = Membership(frozenset({NodeId(1)}))
    log.compact(Snapshot(SnapshotMeta(Offset(3), Term(1), membership)))
    assert (log.first_offset(), log.last_offset()) == (4, 5)
    assert log.term_at(Offset(3)) == 1 and log.term_at(Offset(2)) is None
    assert log.entry_at(Offset(4)) == _entry(4, 1, 2)
    log.crash()  # compaction is durable
    assert log.first_offset() == 4


def test_install_snapshot_replaces_the_log_and_survives_only_if_synced() -> None:
    log = _log(seed=3)
    log.append(_chain(0, 1, [1, 1]))
    log.sync()
    snapshot = Snapshot(SnapshotMeta(Offset(9), Term(4), Membership(frozenset({NodeId(1)}))))
    log.install_snapshot(snapshot)
    assert (log.first_offset(), log.last_offset(), log.term_at(Offset(9))) == (10, 9, 4)
    log.sync()
    log.crash()
    assert log.snapshot() == snapshot and log.last_offset() == 9


def _replay(state: list[Entry], entries: list[Entry]) -> list[Entry]:
    """The list model of append: drop entries at offsets >= the first new one, then extend."""
    start = entries[0].offset
    return [e for e in state if e.offset < start] + entries


@st.composite
def _writes(draw: st.DrawFn) -> list[tuple[str, list[Entry]]]:
    """A sequence of syncs and appends; each append starts within (or right after) the log."""
    ops: list[tuple[str, list[Entry]]] = []
    model: list[Entry] = []
    for term in range(1, draw(st.integers(1, 8)) + 1):
        if draw(st.booleans()):
            ops.append(("sync", []))
        bases = [e.offset for e in model] + [model[-1].last_offset + 1 if model else 0]
        start = draw(st.sampled_from(bases))
        counts = draw(st.lists(st.integers(1, 3), min_size=1, max_size=4))
        entries = _chain(start, term, counts)
        model = _replay(model, entries)
        ops.append(("append", entries))
    return ops


@settings(max_examples=150, deadline=None)
@given(ops=_writes(), seed=st.integers(0, 2**16))
def test_a_crash_keeps_the_synced_state_plus_a_prefix_of_later_writes(
    ops: list[tuple[str, list[Entry]]], seed: int
) -> None:
    log = _log(seed=seed)
    durable: list[Entry] = []
    pending: list[list[Entry]] = []
    for kind, entries in ops:
        if kind == "sync":
            log.sync()
            for write in pending:
                durable = _replay(durable, write)
            pending = []
        else:
            log.append(entries)
            pending.append(entries)
    log.crash()
    survivors = log.entries(Offset(0), bytes_max=1 << 30) if log.last_offset() >= 0 else []
    # Allowed outcomes: the durable log, then whole pending writes, then a prefix of one more.
    allowed = [durable]
    state = durable
    for write in pending:
        allowed += [_replay(state, write[:k]) for k in range(1, len(write))]
        state = _replay(state, write)
        allowed.append(state)
    assert list(survivors) in allowed
