"""Partition checkpoints: write, load, damage, and a restart that resumes from one.

The restart tests keep three replicas over the same real on-disk log: one that applied every
entry (writing checkpoints as it went), one restarted from its checkpoint that applies only
the entries after it, and one rebuilt from the whole log. The last two must hold identical
producer tables and answer every idempotence check identically.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import struct
from pathlib import Path

import pytest

from raftlog.config import LogConfig
from raftlog.partition.checkpoint import (
    CHECKPOINT_FILE_NAME,
    CheckpointStore,
    PartitionCheckpoint,
    checkpoint_bytes_max,
)
from raftlog.partition.cleaning import (
    CleanerState,
    CompactionSettings,
    finish_cleaning,
    plan_cleaning,
    run_cleaning,
)
from raftlog.partition.producer_state import AbortedTxn
from raftlog.partition.replica import PartitionReplica, encode_snapshot_data
from raftlog.raft.types import Entry, EntryKind, Membership, Snapshot, SnapshotMeta
from raftlog.storage.batch import crc32c, parse_header
from raftlog.storage.file_system import OsFileSystem
from raftlog.storage.raft_log_storage import RaftLogStorage
from raftlog.storage.records import (
    RecordInput,
    decode_batch,
    decode_txn_marker,
    encode_batch,
    encode_txn_marker,
)
from raftlog.storage.segment import TXN_INDEX_SUFFIX
from raftlog.storage.txn_index import ENTRY_BYTES, TransactionIndex
from raftlog.types import NodeId, Offset, Term

PRODUCERS_MAX = 8
# Small segments: the aborted-transaction index spreads over many files.
CONFIG = dataclasses.replace(
    LogConfig(), checkpoint_interval_bytes=4096, segment_bytes_max=8192
).validate()


def _store(directory: Path) -> CheckpointStore:
    return CheckpointStore(OsFileSystem(), str(directory), producers_max=PRODUCERS_MAX)


def test_checkpoint_round_trips_through_the_file(tmp_path: Path) -> None:
    store = _store(tmp_path)
    assert store.load() is None  # missing: apply from the start
    checkpoint = PartitionCheckpoint(Offset(41), Term(3), b"[[7,0,[[0,4,10,14]]]]")
    store.save(checkpoint)
    assert store.load() == checkpoint
    newer = PartitionCheckpoint(Offset(99), Term(4), b"[]")
    store.save(newer)
    assert store.load() == newer
    assert not (tmp_path / (CHECKPOINT_FILE_NAME + ".tmp")).exists()


def test_the_index_counts_round_trip_and_a_checkpoint_without_them_still_loads(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path)
    counted = PartitionCheckpoint(Offset(99), Term(4), b"[]", ((0, 3), (40, 1), (80, 2)))
    store.save(counted)
    assert store.load() == counted
    # The format before the counts: the state is the file's end.
    body = struct.pack(">qqI", 41, 3, 2) + b"[]"
    (tmp_path / CHECKPOINT_FILE_NAME).write_bytes(b"RLPC" + struct.pack(">I", crc32c(body)) + body)
    assert store.load() == PartitionCheckpoint(Offset(41), Term(3), b"[]")


def test_any_damaged_byte_or_cut_makes_the_checkpoint_unusable(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.save(PartitionCheckpoint(Offset(5), Term(1), b"[[1,0,[[0,0,5,5]]]]", ((0, 2),)))
    good = (tmp_path / CHECKPOINT_FILE_NAME).read_bytes()
    for position in range(len(good)):
        damaged = bytearray(good)
        damaged[position] ^= 0x40
        (tmp_path / CHECKPOINT_FILE_NAME).write_bytes(bytes(damaged))
        assert store.load() is None, position
    for length in range(len(good)):
        (tmp_path / CHECKPOINT_FILE_NAME).write_bytes(good[:length])
        assert store.load() is None, length
    (tmp_path / CHECKPOINT_FILE_NAME).write_bytes(good + b"x")
    assert store.load() is None


def test_an_oversized_file_is_ignored_without_reading_it(tmp_path: Path) -> None:
    store = _store(tmp_path)
    (tmp_path / CHECKPOINT_FILE_NAME).write_bytes(b"\0" * (checkpoint_bytes_max(PRODUCERS_MAX) + 1))
    assert store.load() is None


def test_decode_names_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="bad magic"):
        PartitionCheckpoint.decode(b"XXXX" + bytes(24))
    with pytest.raises(ValueError, match="shorter than"):
        PartitionCheckpoint.decode(b"RLPC")


# -- restart ------------------------------------------------------------------------------------


def _produced_entries(seed: int, count: int) -> list[Entry]:
    """Batches of several idempotent producers (some bumping their epoch), one per entry."""
    rng = random.Random(seed)
    sequences: dict[int, int] = {}
    epochs: dict[int, int] = {}
    entries, offset, term = [], 0, 1
    for _ in range(count):
        if rng.random() < 0.05:
            term += 1
            entries.append(Entry(Term(term), Offset(offset), 1, EntryKind.NOOP, b""))
            offset += 1
        producer = rng.randrange(PRODUCERS_MAX + 3)  # more producers than remembered
        if rng.random() < 0.03:
            epochs[producer] = epochs.get(producer, 0) + 1
            sequences[producer] = 0
        records = rng.randint(1, 4)
        batch = encode_batch(
            [RecordInput(None, rng.randbytes(rng.randint(10, 300)), 0) for _ in range(records)],
            producer_id=producer,
            producer_epoch=epochs.get(producer, 0),
            base_sequence=sequences.get(producer, 0),
        )
        sequences[producer] = sequences.get(producer, 0) + records
        entries.append(Entry(Term(term), Offset(offset), records, EntryKind.DATA, batch))
        offset += records
    return entries


def _log_with(directory: Path, entries: list[Entry]) -> RaftLogStorage:
    storage = RaftLogStorage.open(directory, config=CONFIG)
    storage.append(entries)
    storage.sync()
    return storage


def _replica(storage: RaftLogStorage, *, checkpoints: bool) -> PartitionReplica:
    return PartitionReplica(
        topic="t",
        partition=0,
        log=storage,
        config=CONFIG,
        producers_max=PRODUCERS_MAX,
        checkpoint=_store(Path(storage.directory)) if checkpoints else None,
        txn_index=TransactionIndex(storage.log, cached_entries_max=100),
    )


def _apply_after(replica: PartitionReplica, storage: RaftLogStorage, applied: int) -> None:
    offset = applied + 1
    while offset <= storage.last_offset():
        for entry in storage.entries(Offset(offset), bytes_max=64 * 1024):
            replica.apply(entry)
            offset = entry.last_offset + 1


def _verdicts(replica: PartitionReplica, entries: list[Entry]) -> list[object]:
    """How the replica's producer table answers a retry of every batch and a next one."""
    table = replica._committed_producers  # the state under test, read, never changed
    answers: list[object] = []
    for entry in entries:
        if entry.kind is not EntryKind.DATA:
            continue
        header = parse_header(entry.data)
        for base_sequence in (header.base_sequence, header.base_sequence + header.record_count):
            answers.append(
                table.check(
                    producer_id=header.producer_id,
                    epoch=header.producer_epoch,
                    base_sequence=base_sequence,
                    record_count=header.record_count,
                )
            )
    return answers


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_restarted_replica_has_the_state_of_one_rebuilt_from_the_whole_log(
    tmp_path: Path, seed: int
) -> None:
    entries = _produced_entries(seed, 300)
    storage = _log_with(tmp_path / "log", entries)
    running = _replica(storage, checkpoints=True)
    assert running.recover(storage) == -1  # a fresh log has no checkpoint
    _apply_after(running, storage, -1)
    storage.close()

    storage = RaftLogStorage.open(tmp_path / "log", config=CONFIG)
    restarted = _replica(storage, checkpoints=True)
    applied = restarted.recover(storage)
    # Resumed from a checkpoint well into the log, at most one interval behind its end.
    assert 0 < applied <= storage.last_offset()
    assert sum(len(e.data) for e in entries if e.offset > applied) < 2 * 4096 + 1024
    _apply_after(restarted, storage, applied)

    rebuilt = _replica(storage, checkpoints=False)
    assert rebuilt.recover(storage) == -1
    _apply_after(rebuilt, storage, -1)

    assert restarted.snapshot_data() == rebuilt.snapshot_data() == running.snapshot_data()
    assert _verdicts(restarted, entries) == _verdicts(rebuilt, entries)
    storage.close()


def test_a_damaged_checkpoint_means_applying_from_the_start(tmp_path: Path) -> None:
    entries = _produced_entries(7, 200)
    storage = _log_with(tmp_path / "log", entries)
    running = _replica(storage, checkpoints=True)
    running.recover(storage)
    _apply_after(running, storage, -1)
    path = tmp_path / "log" / CHECKPOINT_FILE_NAME
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))

    restarted = _replica(storage, checkpoints=True)
    assert restarted.recover(storage) == -1
    _apply_after(restarted, storage, -1)
    assert restarted.snapshot_data() == running.snapshot_data()
    storage.close()


def test_a_checkpoint_the_log_does_not_vouch_for_is_not_used(tmp_path: Path) -> None:
    entries = _produced_entries(9, 200)
    storage = _log_with(tmp_path / "log", entries)
    store = _store(tmp_path / "log")
    last = entries[-1]
    # Beyond the log's end (the log lost it): unusable.
    store.save(PartitionCheckpoint(Offset(last.last_offset + 5), last.term, b"[]"))
    assert _replica(storage, checkpoints=True).recover(storage) == -1
    # The log holds the offset in another term (another history): unusable.
    store.save(PartitionCheckpoint(last.last_offset, Term(last.term + 1), b"[]"))
    assert _replica(storage, checkpoints=True).recover(storage) == -1
    # The same offset and term: used.
    store.save(PartitionCheckpoint(last.last_offset, last.term, b"[]"))
    assert _replica(storage, checkpoints=True).recover(storage) == last.last_offset
    storage.close()
    assert os.path.exists(store.path)


def test_a_clean_stop_checkpoints_everything_applied(tmp_path: Path) -> None:
    entries = _produced_entries(11, 6)  # well under one checkpoint interval
    storage = _log_with(tmp_path / "log", entries)
    running = _replica(storage, checkpoints=True)
    running.recover(storage)
    _apply_after(running, storage, -1)
    assert _store(tmp_path / "log").load() is None  # no interval reached yet
    running.checkpoint_on_close()
    restarted = _replica(storage, checkpoints=True)
    assert restarted.recover(storage) == storage.last_offset()  # nothing left to re-apply
    assert restarted.snapshot_data() == running.snapshot_data()
    # Nothing applied since: a second clean stop writes nothing (a save renames a new file).
    before = (tmp_path / "log" / CHECKPOINT_FILE_NAME).stat().st_ino
    restarted.checkpoint_on_close()
    assert (tmp_path / "log" / CHECKPOINT_FILE_NAME).stat().st_ino == before
    storage.close()


def test_a_checkpoint_with_every_aborted_transaction_moves_them_into_the_index(
    tmp_path: Path,
) -> None:
    """A checkpoint written before the index listed every aborted transaction (more than
    the new bound on a table's size): it is still loaded and its entries are indexed."""
    entries = _transactional_entries(5, 300)
    storage = _log_with(tmp_path / "log", entries)
    rebuilt = _replica(storage, checkpoints=False)
    rebuilt.recover(storage)
    _apply_after(rebuilt, storage, -1)
    aborted = rebuilt.aborted_transactions(0, 2**62)
    assert aborted
    for name in os.listdir(tmp_path / "log"):
        if name.endswith(TXN_INDEX_SUFFIX):
            os.remove(tmp_path / "log" / name)
    table = json.loads(rebuilt._committed_producers.encode())
    # Padded past the bound a table of PRODUCERS_MAX producers keeps to now.
    table["aborted"] = [[a.producer_id, a.first_offset, a.last_offset] for a in aborted]
    table["padding"] = " " * checkpoint_bytes_max(PRODUCERS_MAX)
    last = entries[-1]
    _store(tmp_path / "log").save(
        PartitionCheckpoint(last.last_offset, last.term, json.dumps(table).encode())
    )
    restarted = _replica(storage, checkpoints=True)
    assert restarted.recover(storage) == last.last_offset
    assert restarted.aborted_transactions(0, 2**62) == aborted
    storage.close()


def _transactional_entries(seed: int, count: int) -> list[Entry]:
    """Transactions of a few producers, interleaved: each opens with transactional batches
    and ends with a COMMIT or ABORT marker (a control batch, stored as built), some left
    open at the end."""
    rng = random.Random(seed)
    sequences: dict[int, int] = {}
    open_now: set[int] = set()
    entries, offset = [], 0
    for _ in range(count):
        producer = rng.randrange(4)
        if producer in open_now and rng.random() < 0.3:
            batch = encode_txn_marker(
                commit=rng.random() < 0.5,
                producer_id=producer,
                producer_epoch=0,
                coordinator_epoch=1,
                timestamp_ms=0,
            )
            open_now.discard(producer)
            entries.append(Entry(Term(1), Offset(offset), 1, EntryKind.DATA, batch))
            offset += 1
            continue
        records = rng.randint(1, 3)
        batch = encode_batch(
            [RecordInput(None, rng.randbytes(rng.randint(10, 300)), 0) for _ in range(records)],
            producer_id=producer,
            producer_epoch=0,
            base_sequence=sequences.get(producer, 0),
            is_transactional=True,
        )
        open_now.add(producer)
        sequences[producer] = sequences.get(producer, 0) + records
        entries.append(Entry(Term(1), Offset(offset), records, EntryKind.DATA, batch))
        offset += records
    return entries


def test_open_transactions_and_the_aborted_index_survive_a_restart(tmp_path: Path) -> None:
    entries = _transactional_entries(5, 300)
    storage = _log_with(tmp_path / "log", entries)
    # Markers are stored as the leader built them (not wrapped as Raft's opaque data) and
    # read back as the same data entries.
    read = list(storage.entries(Offset(0), bytes_max=2**30))
    shape = [(e.offset, e.offset_count, e.kind, parse_header(e.data).attributes) for e in read]
    assert shape == [
        (e.offset, e.offset_count, e.kind, parse_header(e.data).attributes) for e in entries
    ]
    on_disk = [storage.log.read(e.offset, bytes_max=1).headers[0] for e in entries]
    markers = [h for h in on_disk if h.is_control]
    assert markers and all(h.is_transactional and h.producer_id >= 0 for h in markers)
    running = _replica(storage, checkpoints=True)
    running.recover(storage)
    _apply_after(running, storage, -1)
    storage.close()

    storage = RaftLogStorage.open(tmp_path / "log", config=CONFIG)
    restarted = _replica(storage, checkpoints=True)
    applied = restarted.recover(storage)
    assert applied > 0
    _apply_after(restarted, storage, applied)
    rebuilt = _replica(storage, checkpoints=False)
    rebuilt.recover(storage)
    _apply_after(rebuilt, storage, -1)

    table = rebuilt._committed_producers
    aborted = rebuilt.aborted_transactions(0, 2**62)
    assert aborted and table.open_transactions()  # the seed covers both
    assert restarted.aborted_transactions(0, 2**62) == aborted
    assert running.aborted_transactions(0, 2**62) == aborted
    assert restarted.snapshot_data() == rebuilt.snapshot_data() == running.snapshot_data()
    # The index holds every aborted transaction the log holds, once: the restarted and the
    # rebuilt replica re-applied markers it already had.
    assert len(set(aborted)) == len(aborted) == _aborted_in(entries)
    storage.close()


@pytest.mark.parametrize("damage", ["deleted", "cut at an entry boundary"])
def test_an_index_file_that_lost_entries_while_down_is_re_derived(
    tmp_path: Path, damage: str
) -> None:
    """A `.txnindex` file deleted, or cut between two entries (no CRC tells), while the
    node was down: the checkpoint's counts show it, the replica does not resume after the
    checkpoint, and re-applying the log indexes every aborted transaction again."""
    entries = _transactional_entries(5, 300)
    storage = _log_with(tmp_path / "log", entries)
    running = _replica(storage, checkpoints=True)
    running.recover(storage)
    _apply_after(running, storage, -1)
    running.checkpoint_on_close()
    aborted = running.aborted_transactions(0, 2**62)
    storage.close()
    files = sorted((tmp_path / "log").glob("*" + TXN_INDEX_SUFFIX))
    victim = max(files, key=lambda path: path.stat().st_size)  # a file with two entries or more
    size_bytes = victim.stat().st_size
    assert size_bytes >= 2 * ENTRY_BYTES
    if damage == "deleted":
        victim.unlink()
    else:
        os.truncate(victim, size_bytes - ENTRY_BYTES)

    storage = RaftLogStorage.open(tmp_path / "log", config=CONFIG)
    restarted = _replica(storage, checkpoints=True)
    applied = restarted.recover(storage)
    _apply_after(restarted, storage, applied)
    assert restarted.aborted_transactions(0, 2**62) == aborted
    assert applied == -1
    storage.close()


def _aborted_in(entries: list[Entry]) -> int:
    """How many ABORT markers end an open transaction in `entries` (a plain model)."""
    open_now: set[int] = set()
    count = 0
    for entry in entries:
        header = parse_header(entry.data)
        if not header.is_control:
            open_now.add(header.producer_id)
            continue
        marker = decode_txn_marker(entry.data)
        assert marker is not None
        if header.producer_id in open_now and not marker.commit:
            count += 1
        open_now.discard(header.producer_id)
    return count


@pytest.mark.parametrize("seed", [5, 6])
def test_a_follower_installing_a_snapshot_ahead_of_its_offset_indexes_every_later_abort(
    tmp_path: Path, seed: int
) -> None:
    """The snapshot's table is the leader's applied one, ahead of the snapshot's offset:
    replaying the markers after it ends nothing (or reopens a transaction at a later batch),
    so the aborts it accounts for travel beside it, and the follower's index, empty after the
    install, gets each with its true first offset as the markers are applied."""
    entries = _transactional_entries(seed, 300)
    storage = _log_with(tmp_path / "leader", entries)
    leader = _replica(storage, checkpoints=False)
    leader.recover(storage)
    _apply_after(leader, storage, -1)
    cut = entries[len(entries) // 2]
    table = leader._committed_producers.encode(
        aborted=leader.aborted_transactions(cut.last_offset + 1, 2**62)
    )
    snapshot = Snapshot(
        SnapshotMeta(cut.last_offset, cut.term, Membership(voters=frozenset({NodeId(1)}))),
        encode_snapshot_data(cut.last_offset + 1, table),
    )
    follower_storage = RaftLogStorage.open(tmp_path / "follower", config=CONFIG)
    follower_storage.install_snapshot(snapshot)
    follower = _replica(follower_storage, checkpoints=True)
    assert follower.recover(follower_storage) == -1
    follower.restore(snapshot)
    follower_storage.append([e for e in entries if e.offset > cut.last_offset])
    follower_storage.sync()
    _apply_after(follower, follower_storage, cut.last_offset)
    later = leader.aborted_transactions(cut.last_offset + 1, 2**62)
    assert later  # the seed covers aborts after the cut
    assert follower.aborted_transactions(cut.last_offset + 1, 2**62) == later
    assert follower.snapshot_data() == leader.snapshot_data()
    follower_storage.close()
    storage.close()


def _keyed(producer: int, sequence: int, key: bytes, value: bytes, **kw: bool) -> bytes:
    return encode_batch(
        [RecordInput(key, value, 0)],
        producer_id=producer,
        producer_epoch=0,
        base_sequence=sequence,
        **kw,
    )


def test_cleaning_reads_the_aborted_transactions_from_the_index_and_keeps_its_files(
    tmp_path: Path,
) -> None:
    """A compaction pass over segments planned with the replica's aborted transactions
    (as `clean_targets` does) drops the records of aborted transactions, which never shadow
    a committed record of their key, keeps the markers, and leaves the index as it was."""
    marker = {"producer_epoch": 0, "coordinator_epoch": 1, "timestamp_ms": 0}
    batches = [
        _keyed(1, 0, b"k", b"committed", is_transactional=True),
        encode_txn_marker(commit=True, producer_id=1, **marker),
        _keyed(2, 0, b"k", b"aborted", is_transactional=True),
        _keyed(2, 1, b"j", b"aborted", is_transactional=True),
        encode_txn_marker(commit=False, producer_id=2, **marker),
    ]
    # Plain records of other keys after them, so the transactions lie in closed segments.
    batches += [_keyed(3, i, b"f%d" % i, bytes(1000)) for i in range(40)]
    entries = [Entry(Term(1), Offset(i), 1, EntryKind.DATA, b) for i, b in enumerate(batches)]
    storage = _log_with(tmp_path / "log", entries)
    replica = _replica(storage, checkpoints=False)
    replica.recover(storage)
    _apply_after(replica, storage, -1)
    clean_below = storage.last_offset() + 1
    aborted = replica.aborted_transactions_below(clean_below)
    assert aborted == (AbortedTxn(2, 2, 4),)
    index_before = sorted(n for n in os.listdir(tmp_path / "log") if n.endswith(TXN_INDEX_SUFFIX))
    assert index_before
    log = storage.log
    state = CleanerState()
    plan = plan_cleaning(
        log,
        CompactionSettings(compact=True),
        state,
        clean_below=clean_below,
        now_ms=2**62,
        aborted=aborted,
    )
    assert plan is not None and plan.aborted == aborted
    finish_cleaning(log, plan, run_cleaning(plan, lambda _: None), state)
    kept: dict[bytes, list[bytes]] = {}
    markers = 0
    for header, data in log.batches(0, bytes_max=2**30):
        decoded = decode_batch(bytes(data))
        markers += header.is_control
        for record in decoded.records if not header.is_control else ():
            assert record.key is not None and record.value is not None
            kept.setdefault(record.key, []).append(record.value)
    assert kept[b"k"] == [b"committed"] and b"j" not in kept
    assert markers == 2
    assert sorted(n for n in os.listdir(tmp_path / "log") if n.endswith(TXN_INDEX_SUFFIX)) == (
        index_before
    )
    assert replica.aborted_transactions_below(clean_below) == aborted
    storage.close()
