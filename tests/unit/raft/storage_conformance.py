"""Conformance checks every `DurableLog` implementation must pass (raftlog.raft.ports).

Reuse: call `run_all(factory)` (or each `check_*` function) with a zero-argument factory that
returns a fresh, empty log. `test_raft_memory_storage.py` runs them against MemoryStorage;
the segmented log can run the same functions so the fake never drifts from production.
Each check states the contract clause it pins (the docstrings of `LogStorage`/`DurableLog`).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from raftlog.raft.ports import DurableLog
from raftlog.raft.types import Entry, EntryKind, Membership, Snapshot, SnapshotMeta
from raftlog.types import NodeId, Offset, Term

Factory = Callable[[], DurableLog]


def entry(term: int, offset: int, count: int = 1, data: bytes = b"d") -> Entry:
    return Entry(Term(term), Offset(offset), count, EntryKind.DATA, data)


def snapshot(offset: int, term: int) -> Snapshot:
    membership = Membership(frozenset({NodeId(1), NodeId(2), NodeId(3)}))
    return Snapshot(SnapshotMeta(Offset(offset), Term(term), membership))


def _filled(factory: Factory) -> DurableLog:
    """[0]@1, [1..3]@1, [4..5]@2, [6]@2 (config)."""
    log = factory()
    config = Entry(
        Term(2), Offset(6), 1, EntryKind.CONFIG, Membership(frozenset({NodeId(1)})).encode()
    )
    log.append([entry(1, 0), entry(1, 1, 3), entry(2, 4, 2)])
    log.append([config])
    log.sync()
    return log


def check_empty_log(factory: Factory) -> None:
    log = factory()
    assert (log.first_offset(), log.last_offset()) == (0, -1)
    assert log.term_at(Offset(-1)) == 0 and log.term_at(Offset(0)) is None
    assert log.snapshot() is None and list(log.config_entries()) == []
    with pytest.raises(LookupError):
        log.entries(Offset(0), bytes_max=1000)


def check_term_at_covers_every_offset_of_an_entry(factory: Factory) -> None:
    log = _filled(factory)
    assert [log.term_at(Offset(o)) for o in range(-1, 8)] == [0, 1, 1, 1, 1, 2, 2, 2, None]
    assert log.last_offset() == 6


def check_entries_start_at_a_base_offset_and_respect_bytes_max(factory: Factory) -> None:
    log = _filled(factory)
    everything = log.entries(Offset(0), bytes_max=10**6)
    assert [e.offset for e in everything] == [0, 1, 4, 6]
    one = log.entries(Offset(1), bytes_max=1)  # always at least one entry
    assert [e.offset for e in one] == [1]
    two = log.entries(Offset(1), bytes_max=everything[1].size_bytes * 2)
    assert [e.offset for e in two] == [1, 4]
    with pytest.raises(LookupError):
        log.entries(Offset(2), bytes_max=1000)  # inside an entry


def check_append_drops_the_suffix_it_replaces(factory: Factory) -> None:
    log = _filled(factory)
    log.append([entry(3, 4)])
    assert log.last_offset() == 4 and log.term_at(Offset(4)) == 3
    assert log.term_at(Offset(5)) is None
    assert list(log.config_entries()) == []  # the config entry at 6 went with the suffix


def check_config_entries_are_listed_in_order(factory: Factory) -> None:
    log = _filled(factory)
    assert [e.offset for e in log.config_entries()] == [6]


def check_compact_drops_the_prefix_and_keeps_the_snapshot(factory: Factory) -> None:
    log = _filled(factory)
    log.compact(snapshot(3, 1))
    assert (log.first_offset(), log.last_offset()) == (4, 6)
    assert log.term_at(Offset(3)) == 1  # the snapshot's term at its offset
    assert log.term_at(Offset(2)) is None
    assert log.snapshot() == snapshot(3, 1)
    with pytest.raises(LookupError):
        log.entries(Offset(1), bytes_max=1000)
    assert [e.offset for e in log.entries(Offset(4), bytes_max=10**6)] == [4, 6]


def check_compact_to_the_last_offset_leaves_an_empty_log(factory: Factory) -> None:
    log = _filled(factory)
    log.compact(snapshot(6, 2))
    assert (log.first_offset(), log.last_offset()) == (7, 6)
    log.append([entry(3, 7)])
    assert log.last_offset() == 7


def check_install_snapshot_replaces_everything(factory: Factory) -> None:
    log = _filled(factory)
    log.install_snapshot(snapshot(20, 5))
    assert (log.first_offset(), log.last_offset()) == (21, 20)
    assert log.term_at(Offset(20)) == 5 and log.term_at(Offset(4)) is None
    assert list(log.config_entries()) == []
    log.append([entry(6, 21, 2)])
    assert log.last_offset() == 22 and log.term_at(Offset(22)) == 6


CHECKS: list[Callable[[Factory], None]] = [
    check_empty_log,
    check_term_at_covers_every_offset_of_an_entry,
    check_entries_start_at_a_base_offset_and_respect_bytes_max,
    check_append_drops_the_suffix_it_replaces,
    check_config_entries_are_listed_in_order,
    check_compact_drops_the_prefix_and_keeps_the_snapshot,
    check_compact_to_the_last_offset_leaves_an_empty_log,
    check_install_snapshot_replaces_everything,
]


def run_all(factory: Factory) -> None:
    for check in CHECKS:
        check(factory)
