"""Recovery of the aborted-transaction index (Hypothesis): a replica applies a log of
interleaved transactions over small segments, checkpointing as it goes, until the
simulated file system crashes at any point (losing or tearing what was not synced, and
sometimes flipping a synced byte of an index file); the restarted replica, once it has
re-applied the log after what it recovered, holds exactly the index a plain model derives
from the log: every aborted transaction once, in the file of the segment holding its
marker, and every fetch range gets the ones overlapping it."""

from __future__ import annotations

import dataclasses
import os
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.config import LogConfig
from raftlog.partition.checkpoint import CheckpointStore
from raftlog.partition.replica import PartitionReplica
from raftlog.raft.types import Entry, EntryKind
from raftlog.storage.raft_log_storage import RaftLogStorage
from raftlog.storage.records import RecordInput, encode_batch, encode_txn_marker
from raftlog.storage.segment import TXN_INDEX_SUFFIX, parse_segment_name
from raftlog.storage.sim_file_system import SimFileSystem
from raftlog.storage.txn_index import AbortedTxn, TransactionIndex, decode_entries
from raftlog.types import Offset, Term

DIRECTORY = "/partition"
CONFIG = dataclasses.replace(
    LogConfig(), checkpoint_interval_bytes=2048, segment_bytes_max=4096
).validate()
PRODUCERS = 4


def _entries(seed: int, count: int) -> tuple[list[Entry], list[AbortedTxn]]:
    """Interleaved transactions of a few producers, and the aborted ones (the model)."""
    rng = random.Random(seed)
    sequences = dict.fromkeys(range(PRODUCERS), 0)
    open_at: dict[int, int] = {}
    entries: list[Entry] = []
    aborted: list[AbortedTxn] = []
    offset = 0
    for _ in range(count):
        producer = rng.randrange(PRODUCERS)
        if rng.random() < 0.3:
            commit = rng.random() < 0.4
            batch = encode_txn_marker(
                commit=commit,
                producer_id=producer,
                producer_epoch=0,
                coordinator_epoch=1,
                timestamp_ms=0,
            )
            first = open_at.pop(producer, None)
            if first is not None and not commit:
                aborted.append(AbortedTxn(producer, first, offset))
            entries.append(Entry(Term(1), Offset(offset), 1, EntryKind.DATA, batch))
            offset += 1
            continue
        records = rng.randint(1, 3)
        batch = encode_batch(
            [RecordInput(None, rng.randbytes(rng.randint(10, 200)), 0) for _ in range(records)],
            producer_id=producer,
            producer_epoch=0,
            base_sequence=sequences[producer],
            is_transactional=True,
        )
        open_at.setdefault(producer, offset)
        sequences[producer] += records
        entries.append(Entry(Term(1), Offset(offset), records, EntryKind.DATA, batch))
        offset += records
    return entries, aborted


def _replica(storage: RaftLogStorage) -> PartitionReplica:
    return PartitionReplica(
        topic="t",
        partition=0,
        log=storage,
        config=CONFIG,
        producers_max=PRODUCERS,
        checkpoint=CheckpointStore(storage.files, DIRECTORY, producers_max=PRODUCERS),
        txn_index=_index(storage),
    )


def _index(storage: RaftLogStorage) -> TransactionIndex:
    return TransactionIndex(storage.log, cached_entries_max=8)


def _apply(replica: PartitionReplica, storage: RaftLogStorage, after: int, until: int) -> None:
    offset = after + 1
    while offset <= until:
        for entry in storage.entries(Offset(offset), bytes_max=1):
            replica.apply(entry)
            offset = entry.last_offset + 1


def _index_files(files: SimFileSystem) -> list[tuple[int, str]]:
    found = []
    for name in files.list_directory(DIRECTORY):
        base = parse_segment_name(name, TXN_INDEX_SUFFIX)
        if base is not None:
            found.append((base, os.path.join(DIRECTORY, name)))
    return sorted(found)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    crash_at=st.floats(0, 1),
    torn=st.none() | st.booleans(),
    damage=st.none() | st.tuples(st.integers(0, 2**16), st.integers(1, 255)),
    data=st.data(),
)
def test_recovery_after_a_crash_at_any_point_equals_a_rebuild_from_the_log(
    seed: int,
    crash_at: float,
    torn: bool | None,
    damage: tuple[int, int] | None,
    data: st.DataObject,
) -> None:
    entries, aborted = _entries(seed, 150)
    files = SimFileSystem(seed)
    storage = RaftLogStorage.open(DIRECTORY, config=CONFIG, files=files)
    storage.append(entries)
    storage.sync()  # the host applies only what is durable
    end = entries[-1].last_offset
    running = _replica(storage)
    assert running.recover(storage) == -1
    _apply(running, storage, -1, int(crash_at * end))
    files.crash(torn=torn)
    index_files = _index_files(files)
    if damage is not None and index_files:
        # A synced byte of an index file flipped (bit rot): found, and re-derived.
        where, flip = damage
        _, path = index_files[where % len(index_files)]
        content = files.file_bytes(path)
        if content:
            position = where % len(content)
            files.corrupt(path, position, bytes([content[position] ^ flip]))

    storage = RaftLogStorage.open(DIRECTORY, config=CONFIG, files=files)
    restarted = _replica(storage)
    applied = restarted.recover(storage)
    _apply(restarted, storage, applied, end)

    assert restarted.aborted_transactions(0, end + 1) == aborted
    for _ in range(5):
        start = data.draw(st.integers(0, end + 1))
        stop = data.draw(st.integers(start, end + 2))
        assert restarted.aborted_transactions(start, stop) == [
            a for a in aborted if a.last_offset >= start and a.first_offset < stop
        ]
    # Each entry in the file of the segment holding its marker, once.
    bases = storage.log.segment_base_offsets
    for base, path in _index_files(files):
        decoded = decode_entries(files.file_bytes(path), base_offset=base)
        assert decoded.damage is None and not decoded.torn
        segment_end = next((b for b in bases if b > base), end + 1)
        assert decoded.entries == [a for a in aborted if base <= a.last_offset < segment_end]
    # And a replica rebuilt from the log alone, over a fresh copy of it, agrees.
    fresh = SimFileSystem(seed)
    copy = RaftLogStorage.open(DIRECTORY, config=CONFIG, files=fresh)
    copy.append(entries)
    copy.sync()
    rebuilt = _replica(copy)
    rebuilt.recover(copy)
    _apply(rebuilt, copy, -1, end)
    assert rebuilt.aborted_transactions(0, end + 1) == aborted
    assert rebuilt.snapshot_data() == restarted.snapshot_data()
