"""Sparse offset and time indexes: lookups agree with a linear scan, damage is detected."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.storage.index import CorruptIndexError, OffsetIndex, TimeIndex


def test_offset_index_lookup_finds_the_floor_entry() -> None:
    index = OffsetIndex(100, entries_max=10)
    for offset, position in ((110, 400), (120, 800), (135, 1300)):
        index.append(offset, position)
    assert index.lookup(100) == (100, 0)  # before the first entry: the segment start
    assert index.lookup(109) == (100, 0)
    assert index.lookup(110) == (110, 400)
    assert index.lookup(134) == (120, 800)
    assert index.lookup(10**6) == (135, 1300)


def test_offset_index_truncate_and_full() -> None:
    index = OffsetIndex(0, entries_max=3)
    for offset in (5, 10, 15):
        index.append(offset, offset * 10)
    assert index.is_full
    index.truncate_from(10)  # the entry *at* 10 goes with the batch it names
    assert index.entry_count == 1
    assert index.lookup(14) == (5, 50)


@given(st.lists(st.integers(1, 50), min_size=0, max_size=40), st.integers(0, 3000))
@settings(max_examples=200)
def test_offset_index_lookup_matches_linear_model(gaps: list[int], target: int) -> None:
    index = OffsetIndex(7, entries_max=100)
    entries, offset = [], 7
    for gap in gaps:
        offset += gap
        entries.append((offset, offset * 3))
        index.append(offset, offset * 3)
    expected = max((e for e in entries if e[0] <= 7 + target), default=(7, 0))
    assert index.lookup(7 + target) == expected
    loaded = OffsetIndex.load(
        index.to_bytes(), base_offset=7, entries_max=100, path="x", log_bytes=10**9
    )
    assert loaded.lookup(7 + target) == expected


def test_offset_index_load_rejects_damage() -> None:
    with pytest.raises(CorruptIndexError, match=r"damaged index /x/0\.index: size 5"):
        OffsetIndex.load(b"12345", base_offset=0, entries_max=4, path="/x/0.index", log_bytes=9)
    index = OffsetIndex(0, entries_max=4)
    index.append(3, 500)
    with pytest.raises(CorruptIndexError, match="do not fit a log of 100 bytes"):
        OffsetIndex.load(index.to_bytes(), base_offset=0, entries_max=4, path="p", log_bytes=100)


def test_time_index_keeps_only_new_maxima() -> None:
    index = TimeIndex(50, entries_max=10)
    assert index.maybe_append(1000, 50)
    assert not index.maybe_append(900, 60)  # not a new maximum
    assert index.maybe_append(2000, 70)
    assert index.max_timestamp_ms == 2000
    assert index.last_entry == (2000, 70)
    # Batches at or before offset 50 are at most 1000 ms: a search for 1500 may start there.
    assert index.lookup(1500) == 50
    assert index.lookup(1000) == 50  # no entry strictly below 1000: the segment start
    assert index.lookup(5000) == 70
    index.truncate_from(70)
    assert index.max_timestamp_ms == 1000


def test_time_index_load_rejects_damage() -> None:
    with pytest.raises(CorruptIndexError, match="size 13"):
        TimeIndex.load(bytes(13), base_offset=0, entries_max=4, path="t", offset_span=5)
    index = TimeIndex(0, entries_max=4)
    index.maybe_append(10, 9)
    with pytest.raises(CorruptIndexError, match="do not fit 5 offsets"):
        TimeIndex.load(index.to_bytes(), base_offset=0, entries_max=4, path="t", offset_span=5)
