"""The aborted-transaction index (`raftlog.storage.txn_index`): one `.txnindex` file beside
each segment of a real segmented log (on the simulated file system), appended, collected
over ranges spanning segments, cut and deleted with its segments, recovered after damage."""

from __future__ import annotations

import dataclasses
import os

import pytest

from raftlog.config import LogConfig
from raftlog.errors import StorageError
from raftlog.storage.log import SegmentedLog
from raftlog.storage.records import RecordInput, encode_batch
from raftlog.storage.segment import TXN_INDEX_SUFFIX, segment_name
from raftlog.storage.sim_file_system import SimFileSystem
from raftlog.storage.txn_index import (
    ENTRY_BYTES,
    AbortedTxn,
    TransactionIndex,
    decode_entries,
    encode_entry,
)

DIRECTORY = "/log"
CONFIG = dataclasses.replace(LogConfig(), segment_bytes_max=1 << 20).validate()


def _log(files: SimFileSystem, segments: list[int]) -> SegmentedLog:
    """A log whose segments hold `segments[i]` one-offset batches each (rolled by hand)."""
    log = SegmentedLog.open(DIRECTORY, config=CONFIG, files=files)
    for index, count in enumerate(segments):
        if index:
            log.roll()
        for _ in range(count):
            log.append(encode_batch([RecordInput(None, b"v", 0)]), leader_epoch=1)
    log.flush()
    return log


def _file(base: int) -> str:
    return os.path.join(DIRECTORY, segment_name(base, TXN_INDEX_SUFFIX))


def _entries(files: SimFileSystem, base: int) -> list[AbortedTxn]:
    if not files.exists(_file(base)):
        return []
    return decode_entries(files.file_bytes(_file(base)), base_offset=base).entries


# Segments [0, 10), [10, 20), [20, 30), [30, 40).
SEGMENTS = [10, 10, 10, 10]
# A transaction from 2 aborted in the last segment, and shorter ones in between: in marker
# order, a later entry may start earlier than the one before it.
ABORTED = [
    AbortedTxn(1, 3, 5),
    AbortedTxn(2, 6, 12),
    AbortedTxn(3, 14, 25),
    AbortedTxn(4, 2, 33),
    AbortedTxn(5, 34, 36),
]


def _indexed(cached_entries_max: int = 100) -> tuple[SimFileSystem, SegmentedLog, TransactionIndex]:
    files = SimFileSystem()
    log = _log(files, SEGMENTS)
    index = TransactionIndex(log, cached_entries_max=cached_entries_max)
    for txn in ABORTED:
        assert index.append(txn)
    return files, log, index


def _model(aborted: list[AbortedTxn], start: int, end: int) -> list[AbortedTxn]:
    return [a for a in aborted if a.last_offset >= start and a.first_offset < end]


def test_each_entry_lands_in_the_file_of_the_segment_holding_its_marker() -> None:
    files, _, _ = _indexed()
    assert _entries(files, 0) == [AbortedTxn(1, 3, 5)]
    assert _entries(files, 10) == [AbortedTxn(2, 6, 12)]
    assert _entries(files, 20) == [AbortedTxn(3, 14, 25)]
    assert _entries(files, 30) == [AbortedTxn(4, 2, 33), AbortedTxn(5, 34, 36)]
    assert len(files.file_bytes(_file(30))) == 2 * ENTRY_BYTES


@pytest.mark.parametrize("cached_entries_max", [0, 1, 100])
def test_collect_scans_forward_over_every_range(cached_entries_max: int) -> None:
    _, _, index = _indexed(cached_entries_max)
    for start in range(41):
        for end in range(start, 42):
            assert index.collect(start, end) == _model(ABORTED, start, end), (start, end)
    assert index.cached_entries <= cached_entries_max


def test_a_replayed_entry_is_not_appended_twice() -> None:
    files, _, index = _indexed()
    before = {base: files.file_bytes(_file(base)) for base in (0, 10, 20, 30)}
    for txn in ABORTED:
        assert not index.append(txn)
    assert {base: files.file_bytes(_file(base)) for base in (0, 10, 20, 30)} == before


def test_truncating_the_log_cuts_entries_at_and_after_the_cut() -> None:
    files, log, index = _indexed()
    assert index.collect(0, 100) == ABORTED  # cached
    log.truncate_from(34)
    assert _entries(files, 30) == [AbortedTxn(4, 2, 33)]
    assert index.collect(0, 100) == ABORTED[:4]
    log.truncate_from(20)  # segment 20 goes whole, its file with it
    assert not files.exists(_file(20)) and not files.exists(_file(30))
    assert index.collect(0, 100) == ABORTED[:2]
    log.truncate_from(12)
    assert _entries(files, 10) == []
    assert index.collect(0, 100) == ABORTED[:1]


def test_retention_and_a_restart_delete_the_files_with_their_segments() -> None:
    files, log, index = _indexed()
    assert index.collect(0, 100) == ABORTED
    log.delete_segments_before(20)
    assert not files.exists(_file(0)) and not files.exists(_file(10))
    assert index.collect(20, 100) == _model(ABORTED, 20, 100)
    # A snapshot installed past the end: the log restarts empty, with no index.
    log.delete_segments_before(50)
    assert not any(name.endswith(TXN_INDEX_SUFFIX) for name in files.list_directory(DIRECTORY))
    assert index.collect(0, 100) == []
    assert not index.append(AbortedTxn(1, 2, 3))  # below the log's first segment


def test_a_reopened_log_keeps_the_files() -> None:
    files, log, index = _indexed()
    index.flush()
    log.close()
    reopened = SegmentedLog.open(DIRECTORY, config=CONFIG, files=files)
    assert TransactionIndex(reopened, cached_entries_max=10).collect(0, 100) == ABORTED


def test_flush_makes_entries_and_new_files_survive_a_crash() -> None:
    files = SimFileSystem()
    log = _log(files, SEGMENTS)
    index = TransactionIndex(log, cached_entries_max=100)
    for txn in ABORTED[:3]:
        index.append(txn)
    index.flush()
    for txn in ABORTED[3:]:
        index.append(txn)
    files.crash(torn=True)
    reopened = SegmentedLog.open(DIRECTORY, config=CONFIG, files=files)
    recovered = TransactionIndex(reopened, cached_entries_max=100)
    assert recovered.recover()  # a torn, never synced tail is no damage
    assert recovered.collect(0, 100) == ABORTED[:3]
    for txn in ABORTED:  # re-applying the log after the checkpoint
        recovered.append(txn)
    assert recovered.collect(0, 100) == ABORTED


def test_a_damaged_entry_is_reported_and_cut() -> None:
    files, log, index = _indexed()
    index.flush()
    files.corrupt(_file(30), ENTRY_BYTES + 3, b"\xff")
    recovered = TransactionIndex(log, cached_entries_max=100)
    assert not recovered.recover()
    assert _entries(files, 30) == [AbortedTxn(4, 2, 33)]
    assert len(files.file_bytes(_file(30))) == ENTRY_BYTES
    assert recovered.recover()  # repaired: sound again


def test_a_damaged_entry_found_while_running_is_an_error() -> None:
    files, _, index = _indexed(cached_entries_max=0)
    files.corrupt(_file(20), 0, b"\xff")
    with pytest.raises(StorageError, match="CRC32C"):
        index.collect(0, 100)


def test_recover_cuts_entries_past_their_segment_and_open_removes_orphans() -> None:
    files, log, _ = _indexed()
    # A crash after the segment was cut but before its index was: entries past its end.
    handle = files.open(_file(30))
    handle.append([encode_entry(AbortedTxn(6, 37, 45))])
    handle.sync()
    handle.close()
    # An index file whose segment is gone (a crash while deleting the segment).
    orphan = files.open(_file(90), create=True)
    orphan.append([encode_entry(AbortedTxn(7, 91, 92))])
    orphan.sync()
    orphan.close()
    files.sync_directory(DIRECTORY)
    log.close()
    reopened = SegmentedLog.open(DIRECTORY, config=CONFIG, files=files)
    assert not files.exists(_file(90))
    recovered = TransactionIndex(reopened, cached_entries_max=100)
    assert recovered.recover()
    assert recovered.collect(0, 100) == ABORTED


def test_the_cache_stays_within_its_bound() -> None:
    files = SimFileSystem()
    log = _log(files, [20, 20, 20])
    index = TransactionIndex(log, cached_entries_max=5)
    aborted = [AbortedTxn(p, offset - 1, offset) for p, offset in enumerate(range(1, 60, 2))]
    for txn in aborted:
        index.append(txn)
    for start in range(0, 60, 7):
        assert index.collect(start, 60) == _model(aborted, start, 60)
        assert index.cached_entries <= 5


def test_entry_counts_count_each_file_up_to_the_offset() -> None:
    _, _, index = _indexed()
    assert index.entry_counts(4) == ()  # the first marker is at 5
    assert index.entry_counts(34) == ((0, 1), (10, 1), (20, 1), (30, 1))
    assert index.entry_counts(39) == ((0, 1), (10, 1), (20, 1), (30, 2))


def test_entry_counts_keep_the_most_recent_segments_within_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, _, index = _indexed()
    monkeypatch.setattr("raftlog.storage.txn_index.INDEXED_SEGMENTS_MAX", 2)
    assert index.entry_counts(39) == ((20, 1), (30, 2))


def test_missing_entries_tell_a_deleted_or_shortened_file_not_a_removed_segment() -> None:
    files, log, index = _indexed()
    counts = index.entry_counts(39)
    assert index.missing_entries(counts) is None
    log.delete_segments_before(10)  # retention: the segment and its file go together
    assert index.missing_entries(counts) is None
    files.remove(_file(20))
    assert index.missing_entries(counts) == f"{_file(20)}: 0 entries, the checkpoint counted 1"
    handle = files.open(_file(30))
    handle.truncate(ENTRY_BYTES)  # cut between its two entries: every CRC still matches
    handle.close()
    assert index.recover()  # nothing a CRC or the order can tell
    assert index.missing_entries(((30, 2),)) == f"{_file(30)}: 1 entries, the checkpoint counted 2"
