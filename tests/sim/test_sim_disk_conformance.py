"""Conformance: the simulator's disk answers every LogStorage read as the core's MemoryStorage.

Both fakes implement the same ports; this runs one random sequence of valid writes against
both and compares every read after each write, so neither drifts from the port's contract
(`raftlog.raft.ports`): offsets, terms at offsets and at snapshot boundaries, batch reads
bounded by bytes, CONFIG entries, snapshots.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.raft.memory import MemoryStorage
from raftlog.raft.types import Entry, EntryKind, Membership, Snapshot, SnapshotMeta
from raftlog.sim.disk import CrashSwitch, SimLog
from raftlog.types import NodeId, Offset, Term

MEMBERSHIP = Membership(frozenset({NodeId(1), NodeId(2)}))


def _reads(log: SimLog | MemoryStorage) -> tuple[object, ...]:
    first, last = log.first_offset(), log.last_offset()
    terms = tuple(log.term_at(Offset(o)) for o in range(-1, last + 3))
    batches: list[tuple[Entry, ...] | None] = []
    for offset in range(first, last + 1):
        for bytes_max in (1, 200, 10_000):
            try:
                batches.append(tuple(log.entries(Offset(offset), bytes_max=bytes_max)))
            except LookupError:
                batches.append(None)
    return first, last, terms, tuple(batches), tuple(log.config_entries()), log.snapshot()


@st.composite
def _operations(draw: st.DrawFn) -> list[tuple[str, int, int, list[int]]]:
    """(kind, offset choice, term, batch sizes); offsets are resolved against the live log."""
    kinds = st.sampled_from(["append", "append", "append", "sync", "compact", "install"])
    return [
        (
            draw(kinds),
            draw(st.integers(0, 1000)),
            term,
            draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)),
        )
        for term in range(1, draw(st.integers(1, 12)) + 1)
    ]


def _batch(start: int, term: int, counts: list[int]) -> list[Entry]:
    entries = []
    for i, count in enumerate(counts):
        kind = EntryKind.CONFIG if (start + i) % 5 == 0 else EntryKind.DATA
        data = MEMBERSHIP.encode() if kind is EntryKind.CONFIG else b"t%d-%d" % (term, start)
        entries.append(Entry(Term(term), Offset(start), count, kind, data))
        start += count
    return entries


def _apply(
    logs: tuple[SimLog, MemoryStorage], kind: str, pick: int, term: int, counts: list[int]
) -> None:
    sim, memory = logs
    bases = (
        [e.offset for e in sim.entries(sim.first_offset(), bytes_max=1 << 30)]
        if sim.last_offset() >= sim.first_offset()
        else []
    )
    if kind == "append":
        starts = [*bases, sim.last_offset() + 1]
        batch = _batch(starts[pick % len(starts)], term, counts)
        sim.append(batch)
        memory.append(batch)
    elif kind == "sync":
        sim.sync()
        memory.sync()
    elif kind == "compact" and bases and not sim.has_pending():
        entry = sim.entry_at(Offset(bases[pick % len(bases)]))
        assert entry is not None
        snapshot = Snapshot(SnapshotMeta(entry.last_offset, entry.term, MEMBERSHIP))
        sim.compact(snapshot)
        memory.compact(snapshot)
    elif kind == "install":
        offset = sim.last_offset() + 1 + pick % 4
        snapshot = Snapshot(SnapshotMeta(Offset(offset), Term(term), MEMBERSHIP))
        sim.install_snapshot(snapshot)
        memory.install_snapshot(snapshot)


@settings(max_examples=60, deadline=None)
@given(operations=_operations())
def test_the_simulated_disk_reads_like_memory_storage(
    operations: list[tuple[str, int, int, list[int]]],
) -> None:
    rng = random.Random(0)
    logs = (SimLog(crash_switch=CrashSwitch(rng, 0.0), rng=rng, torn_writes=False), MemoryStorage())
    for kind, pick, term, counts in operations:
        _apply(logs, kind, pick, term, counts)
        assert _reads(logs[0]) == _reads(logs[1]), (kind, pick, term, counts)
