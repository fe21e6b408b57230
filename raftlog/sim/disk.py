"""Simulated disk: a DurableLog and a HardStateStore that crash the way real disks do.

Theory of operation. `SimLog` keeps two states: the *visible* log (what the core reads, every
append included) and the *durable* log (what the last `sync()` made safe). Appends and
snapshot installs go to the visible log and to a list of pending operations; `sync()` copies
the visible state to the durable one and clears the list. `crash()` is what a power cut does:
the visible log becomes the durable one plus a random prefix of the pending operations, and
with torn writes the last kept append may be cut part way through its entries (a prefix of
batches survives, never a hole: the segmented log truncates a torn tail on recovery).

`compact()` is the simulator's own action on applied (hence synced) entries, so it applies to
both states at once, like a snapshot file written and renamed atomically.

`SimHardStateStore.save` is atomic and durable, as the `HardStateStore` port promises.

A `CrashSwitch` decides, per disk call, whether the node dies right *there*: `SimCrash`
propagates out of the ready processor after `messages` were sent but before the entries or
the vote were durable, which is exactly the window a planted "reply before durable" bug needs.

Faults on synced data (`damage`, applied while the node is down): the disk loses durable
entries from some offset on, the entry-level outcome of a flipped bit, a truncated file, a
lost or a misdirected write (the segmented log's scan keeps what verifies and cuts the rest),
or loses the durable mark. `mark` is that mark (`raftlog.storage.durable_mark`): the last
offset a sync made durable, kept apart from the log. `recover()` compares them as the real
log's open does and says whether the node must start repairing (`raftlog.raft.repair`).

The log also records, for the checker, every entry appended with the term of the entry before
it (log matching is checked per append) and the lowest offset truncated since last drained.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from raftlog.errors import OffsetOutOfRangeError, StorageError
from raftlog.raft.types import NO_OFFSET, Entry, EntryKind, HardState, Snapshot
from raftlog.types import Offset, Term

__all__ = ["CrashSwitch", "SimCrash", "SimHardStateStore", "SimLog"]


class SimCrash(Exception):
    """The simulated node dies inside a port call; the cluster catches it and crashes it."""

    def __init__(self, point: str) -> None:
        super().__init__(f"crash at {point}")
        self.point = point


@dataclass(slots=True)
class CrashSwitch:
    """Seeded decision, per disk call, to crash there. `rate` 0 turns crashes off (heal)."""

    rng: random.Random
    rate: float

    def maybe_crash(self, point: str) -> None:
        assert 0.0 <= self.rate <= 1.0, self.rate
        if self.rate and self.rng.random() < self.rate:
            raise SimCrash(point)


@dataclass(slots=True)
class _LogState:
    """Entries in offset order (contiguous) after an optional snapshot."""

    snapshot: Snapshot | None = None
    entries: list[Entry] = field(default_factory=list)
    bases: list[int] = field(default_factory=list)  # entries[i].offset, for bisect

    def copy(self) -> _LogState:
        return _LogState(self.snapshot, list(self.entries), list(self.bases))

    def first_offset(self) -> Offset:
        return Offset(self.snapshot.meta.offset + 1) if self.snapshot else Offset(0)

    def last_offset(self) -> Offset:
        if self.entries:
            return self.entries[-1].last_offset
        return self.snapshot.meta.offset if self.snapshot else NO_OFFSET

    def index_containing(self, offset: int) -> int | None:
        i = bisect.bisect_right(self.bases, offset) - 1
        if i < 0 or self.entries[i].last_offset < offset:
            return None
        return i

    def truncate_from(self, offset: int) -> None:
        i = bisect.bisect_left(self.bases, offset)
        del self.entries[i:]
        del self.bases[i:]

    def push(self, entry: Entry) -> None:
        assert entry.offset == self.last_offset() + 1, (entry.offset, self.last_offset())
        self.entries.append(entry)
        self.bases.append(entry.offset)


@dataclass(frozen=True, slots=True)
class _Append:
    entries: tuple[Entry, ...]


@dataclass(frozen=True, slots=True)
class _Install:
    snapshot: Snapshot


class SimLog:
    """A DurableLog over memory whose `crash()` keeps only what `sync()` made durable."""

    def __init__(self, *, crash_switch: CrashSwitch, rng: random.Random, torn_writes: bool):
        self._switch = crash_switch
        self._rng = rng
        self._torn_writes = torn_writes
        self._visible = _LogState()
        self._durable = _LogState()
        self._pending: list[_Append | _Install] = []
        self._pending_from: Offset | None = None  # lowest offset a pending write touches
        # For the checker: (entry, term of the offset before it) per append, and truncations.
        self.appended: list[tuple[Entry, Term | None]] = []
        self.truncated_from: Offset | None = None
        # The durable mark (None: lost), and whether a repair is under way.
        self.mark: Offset | None = NO_OFFSET
        self.repairing = False

    # --- LogStorage (read side) ---

    def first_offset(self) -> Offset:
        return self._visible.first_offset()

    def last_offset(self) -> Offset:
        return self._visible.last_offset()

    def term_at(self, offset: Offset) -> Term | None:
        state = self._visible
        if state.snapshot is not None and offset == state.snapshot.meta.offset:
            return state.snapshot.meta.term
        if offset == NO_OFFSET and state.snapshot is None:
            return Term(0)
        i = state.index_containing(offset)
        return None if i is None else state.entries[i].term

    def entries(self, start: Offset, *, bytes_max: int) -> Sequence[Entry]:
        state = self._visible
        i = bisect.bisect_left(state.bases, start)
        if i == len(state.bases) or state.bases[i] != start:
            raise LookupError(
                f"no entry starts at offset {start} (log holds "
                f"[{state.first_offset()}, {state.last_offset()}])"
            )
        taken: list[Entry] = []
        size_bytes = 0
        for entry in state.entries[i:]:
            if taken and size_bytes + entry.size_bytes > bytes_max:
                break
            taken.append(entry)
            size_bytes += entry.size_bytes
        assert taken and taken[0].offset == start
        return taken

    def config_entries(self) -> Sequence[Entry]:
        return [e for e in self._visible.entries if e.kind == EntryKind.CONFIG]

    def snapshot(self) -> Snapshot | None:
        return self._visible.snapshot

    def entry_at(self, offset: Offset) -> Entry | None:
        """The entry whose base offset is `offset`, if held (for the checker)."""
        i = self._visible.index_containing(offset)
        if i is None or self._visible.bases[i] != offset:
            return None
        return self._visible.entries[i]

    def entry_containing(self, offset: Offset) -> Entry | None:
        i = self._visible.index_containing(offset)
        return None if i is None else self._visible.entries[i]

    def has_pending(self) -> bool:
        """Whether appends or snapshot installs wait for a sync."""
        return bool(self._pending)

    # --- DurableLog (write side) ---

    def append(self, entries: Sequence[Entry]) -> None:
        if not entries:
            return
        self._switch.maybe_crash("append")
        _apply_append(self._visible, tuple(entries), log=self)
        self._pending.append(_Append(tuple(entries)))
        self._note_pending(entries[0].offset)

    def install_snapshot(self, snapshot: Snapshot) -> None:
        self._switch.maybe_crash("install_snapshot")
        self._note_truncation(Offset(0))
        self._visible = _LogState(snapshot=snapshot)
        self._pending.append(_Install(snapshot))
        self._note_pending(Offset(0))

    def compact(self, snapshot: Snapshot) -> None:
        offset = snapshot.meta.offset
        assert not self._pending, "compact only durable, applied entries"
        assert offset <= self._durable.last_offset(), (offset, self._durable.last_offset())
        for state in (self._visible, self._durable):
            i = bisect.bisect_right(state.bases, offset)
            assert i == 0 or state.entries[i - 1].last_offset == offset, "compact at a batch end"
            del state.entries[:i]
            del state.bases[:i]
            state.snapshot = snapshot

    def sync(self) -> None:
        self._switch.maybe_crash("sync")
        self._durable = self._visible.copy()
        self._pending.clear()
        self._pending_from = None
        durable_last = self._durable.last_offset()
        if self.repairing and self.mark is not None:
            self.mark = max(self.mark, durable_last)  # a repair keeps the end it lost
        elif not self.repairing:
            self.mark = durable_last

    # --- storage faults on synced data ---

    def damage(self, rng: random.Random) -> str | None:
        """Lose durable entries from a random one on, or the mark; the node is down. Returns
        what was lost, or None when there was nothing synced to lose."""
        assert not self._pending, "damage hits a stopped node's disk"
        entries = self._durable.entries
        if rng.random() < 0.1:
            self.mark = None
            return "lost the durable mark"
        if not entries:
            return None
        cut = entries[rng.randrange(len(entries))].offset
        last = entries[-1].last_offset
        self._note_truncation(cut)
        for state in (self._durable, self._visible):
            state.truncate_from(cut)
        return f"lost synced offsets {cut}..{last}"

    def recover(self) -> Offset | None:
        """At start: if the log lost synced data (below its mark, or the mark itself), the
        repair starts, durably, and this is the last offset the log had reached."""
        last = self._durable.last_offset()
        if self.mark is None or last < self.mark:
            self.repairing = True
            self.mark = max(last, self.mark if self.mark is not None else NO_OFFSET)
        return self.mark if self.repairing else None

    def finish_repair(self) -> None:
        assert self.repairing
        self.repairing = False
        self.mark = self._durable.last_offset()

    # --- faults ---

    @property
    def durable_last_offset(self) -> Offset:
        return self._durable.last_offset()

    def durable_through(self) -> Offset:
        """The last offset up to which the durable log agrees with the visible one."""
        last = self._durable.last_offset()
        if self._pending_from is None:
            return last
        return Offset(min(last, self._pending_from - 1))

    def _note_pending(self, offset: Offset) -> None:
        if self._pending_from is None or offset < self._pending_from:
            self._pending_from = offset

    def crash(self) -> int:
        """Lose what was not synced, keeping a random prefix of it. Returns entries kept."""
        pending, self._pending = self._pending, []
        self._pending_from = None
        state = self._durable.copy()
        kept_entries = 0
        for op in pending[: self._rng.randint(0, len(pending))]:
            if isinstance(op, _Install):
                state = _LogState(snapshot=op.snapshot)
                continue
            entries = op.entries
            torn = self._torn_writes and self._rng.random() < 0.3
            if torn:
                entries = entries[: self._rng.randint(0, len(entries))]
            if entries:
                _apply_append(state, entries, log=None)
                kept_entries += len(entries)
            if torn:
                break  # the disk wrote in order: nothing after a torn write survives
        self._visible = state
        self._durable = state.copy()
        return kept_entries

    def _note_truncation(self, offset: Offset) -> None:
        if self.truncated_from is None or offset < self.truncated_from:
            self.truncated_from = offset


def _apply_append(state: _LogState, entries: tuple[Entry, ...], *, log: SimLog | None) -> None:
    """Drop entries at offsets >= entries[0].offset, then append `entries` (contiguous)."""
    start = entries[0].offset
    if not state.first_offset() <= start <= state.last_offset() + 1:
        raise OffsetOutOfRangeError(
            start, log_start_offset=state.first_offset(), log_end_offset=state.last_offset() + 1
        )
    if start <= state.last_offset():
        if state.index_containing(start) is not None and start not in state.bases:
            raise StorageError(f"append at offset {start} splits a batch")
        state.truncate_from(start)
        if log is not None:
            log._note_truncation(start)
    for entry in entries:
        prev_term = _term_before(state, entry.offset)
        state.push(entry)
        if log is not None:
            log.appended.append((entry, prev_term))


def _term_before(state: _LogState, offset: Offset) -> Term | None:
    before = offset - 1
    if state.snapshot is not None and before == state.snapshot.meta.offset:
        return state.snapshot.meta.term
    if before == NO_OFFSET:
        return Term(0)
    i = state.index_containing(before)
    return None if i is None else state.entries[i].term


class SimHardStateStore:
    """Term and vote; `save` is atomic and durable, but the node may die just before it."""

    def __init__(self, *, crash_switch: CrashSwitch) -> None:
        self._switch = crash_switch
        self._hard_state = HardState()

    def load(self) -> HardState:
        return self._hard_state

    def save(self, hard_state: HardState) -> None:
        assert hard_state.term >= self._hard_state.term, (hard_state, self._hard_state)
        self._switch.maybe_crash("save")
        self._hard_state = hard_state
