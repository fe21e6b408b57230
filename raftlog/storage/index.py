"""Sparse offset and time indexes of one segment, Kafka style.

Theory of operation. Both indexes are arrays of fixed-size big-endian entries, kept in memory
as a `bytearray` laid out exactly like the file, so loading is one read and saving one write,
and a lookup is a binary search with `struct.unpack_from` (no per-entry objects).

* Offset index (`.index`): `relative_offset u32, position u32`. One entry for the first batch
  appended after every `index_interval_bytes` of batches; `relative_offset` is the batch's
  base offset minus the segment's base offset and `position` its byte position in the
  `.log` file. `lookup(offset)` returns the last entry at or below `offset` (or the segment
  start): a reader scans batch headers forward from there, at most about one interval.
* Time index (`.timeindex`): `timestamp_ms i64, relative_offset u32`. An entry is added, at
  the same interval, when the largest batch `max_timestamp` seen so far grows; the entry names
  the batch that reached it. Timestamps in the index therefore only increase, and every batch
  at or before an entry's offset has `max_timestamp <=` that entry's timestamp. A segment's
  last time-index entry is its largest timestamp (added when the segment closes),
  which retention by age reads without scanning the segment.

Both are written once, when their segment closes (the active segment's indexes live in
memory and are rebuilt from the log by recovery). A file whose size is not a whole number of
entries, or whose entries leave the segment, is damaged: `CorruptIndexError` says so and the
log rebuilds it from the segment.
"""

from __future__ import annotations

import struct

from raftlog.errors import StorageError

__all__ = ["CorruptIndexError", "OffsetIndex", "TimeIndex"]

_OFFSET_ENTRY = struct.Struct(">II")
_TIME_ENTRY = struct.Struct(">qI")
_U32_MAX = 2**32 - 1


class CorruptIndexError(StorageError):
    """An index file that cannot be trusted; the log rebuilds it from its segment."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"damaged index {path}: {reason}")
        self.path = path
        self.reason = reason


def _floor_entry(data: bytearray, entry: struct.Struct, key_index: int, key: int) -> int:
    """Index of the last entry whose field `key_index` is <= key, or -1 (binary search)."""
    low, high = 0, len(data) // entry.size
    while low < high:
        middle = (low + high) // 2
        if entry.unpack_from(data, middle * entry.size)[key_index] <= key:
            low = middle + 1
        else:
            high = middle
    return low - 1


class OffsetIndex:
    entry_bytes = _OFFSET_ENTRY.size

    def __init__(self, base_offset: int, *, entries_max: int, data: bytearray | None = None):
        assert base_offset >= 0 and entries_max > 0, (base_offset, entries_max)
        self.base_offset = base_offset
        self.entries_max = entries_max
        self._data = data if data is not None else bytearray()
        assert len(self._data) % self.entry_bytes == 0

    @classmethod
    def load(
        cls, data: bytes, *, base_offset: int, entries_max: int, path: str, log_bytes: int
    ) -> OffsetIndex:
        """Parse a file's bytes, checking the cheap invariants Kafka's sanity check checks."""
        if len(data) % cls.entry_bytes:
            raise CorruptIndexError(
                path, f"size {len(data)} is not a multiple of {cls.entry_bytes}"
            )
        index = cls(base_offset, entries_max=max(entries_max, len(data) // cls.entry_bytes))
        index._data = bytearray(data)
        if index.entry_count:
            first, last = index._entry(0), index._entry(index.entry_count - 1)
            if first[0] > last[0] or first[1] > last[1] or last[1] >= log_bytes:
                raise CorruptIndexError(
                    path, f"entries {first} .. {last} do not fit a log of {log_bytes} bytes"
                )
        return index

    @property
    def entry_count(self) -> int:
        return len(self._data) // self.entry_bytes

    @property
    def is_full(self) -> bool:
        return self.entry_count >= self.entries_max

    def _entry(self, number: int) -> tuple[int, int]:
        relative, position = _OFFSET_ENTRY.unpack_from(self._data, number * self.entry_bytes)
        return relative, position

    def append(self, offset: int, position: int) -> None:
        # On the append path (one call per batch of more than index_interval_bytes): the
        # monotonicity check compares with the last 8 bytes directly.
        relative = offset - self.base_offset
        data = self._data
        assert 0 <= relative <= _U32_MAX and 0 <= position <= _U32_MAX, (offset, position)
        assert len(data) < self.entries_max * 8, "the segment rolls before its index fills"
        assert not data or (relative, position) > _OFFSET_ENTRY.unpack_from(data, len(data) - 8)
        data += _OFFSET_ENTRY.pack(relative, position)

    def lookup(self, offset: int) -> tuple[int, int]:
        """`(offset, position)` of the last indexed batch starting at or below `offset`."""
        assert offset >= self.base_offset, (offset, self.base_offset)
        number = _floor_entry(self._data, _OFFSET_ENTRY, 0, offset - self.base_offset)
        if number < 0:
            return self.base_offset, 0
        relative, position = self._entry(number)
        return self.base_offset + relative, position

    def truncate_from(self, offset: int) -> None:
        """Drop entries for batches starting at or after `offset`."""
        number = _floor_entry(self._data, _OFFSET_ENTRY, 0, offset - self.base_offset - 1)
        del self._data[(number + 1) * self.entry_bytes :]
        assert self.entry_count == number + 1

    def to_bytes(self) -> bytes:
        return bytes(self._data)


class TimeIndex:
    entry_bytes = _TIME_ENTRY.size

    def __init__(self, base_offset: int, *, entries_max: int) -> None:
        assert base_offset >= 0 and entries_max > 0, (base_offset, entries_max)
        self.base_offset = base_offset
        self.entries_max = entries_max
        self._data = bytearray()

    @classmethod
    def load(
        cls, data: bytes, *, base_offset: int, entries_max: int, path: str, offset_span: int
    ) -> TimeIndex:
        if len(data) % cls.entry_bytes:
            raise CorruptIndexError(
                path, f"size {len(data)} is not a multiple of {cls.entry_bytes}"
            )
        index = cls(base_offset, entries_max=max(entries_max, len(data) // cls.entry_bytes + 1))
        index._data = bytearray(data)
        if index.entry_count:
            first, last = index._entry(0), index._entry(index.entry_count - 1)
            if first[0] > last[0] or first[1] > last[1] or last[1] >= offset_span:
                raise CorruptIndexError(
                    path, f"entries {first} .. {last} do not fit {offset_span} offsets"
                )
        return index

    @property
    def entry_count(self) -> int:
        return len(self._data) // self.entry_bytes

    @property
    def is_full(self) -> bool:
        # One slot stays free for the entry added when the segment closes.
        return self.entry_count + 1 >= self.entries_max

    def _entry(self, number: int) -> tuple[int, int]:
        timestamp_ms, relative = _TIME_ENTRY.unpack_from(self._data, number * self.entry_bytes)
        return timestamp_ms, relative

    @property
    def max_timestamp_ms(self) -> int:
        """The largest timestamp indexed, -1 when none."""
        return self._entry(self.entry_count - 1)[0] if self.entry_count else -1

    @property
    def last_entry(self) -> tuple[int, int] | None:
        """`(timestamp_ms, offset)` of the last entry, None when empty."""
        if not self.entry_count:
            return None
        timestamp_ms, relative = self._entry(self.entry_count - 1)
        return timestamp_ms, self.base_offset + relative

    def maybe_append(self, timestamp_ms: int, offset: int) -> bool:
        """Index `offset` if `timestamp_ms` is a new maximum; True when an entry was added."""
        # On the append path: read the last entry once.
        data = self._data
        relative = offset - self.base_offset
        assert 0 <= relative <= _U32_MAX, (offset, self.base_offset)
        if data:
            last_timestamp_ms, last_relative = _TIME_ENTRY.unpack_from(data, len(data) - 12)
            if timestamp_ms <= last_timestamp_ms:
                return False
            assert relative > last_relative, (offset, timestamp_ms)
        assert len(data) < self.entries_max * 12, "the segment rolls before its index fills"
        data += _TIME_ENTRY.pack(timestamp_ms, relative)
        return True

    def lookup(self, timestamp_ms: int) -> int:
        """An offset at or before the first batch with `max_timestamp >= timestamp_ms`.

        Every batch at or before the last entry below `timestamp_ms` is older than it, so a
        forward scan may start at that entry's batch (or the segment start when none)."""
        number = _floor_entry(self._data, _TIME_ENTRY, 0, timestamp_ms - 1)
        if number < 0:
            return self.base_offset
        return self.base_offset + self._entry(number)[1]

    def truncate_from(self, offset: int) -> None:
        """Drop entries for batches at or after `offset` (their timestamps go with them)."""
        # Relative offsets increase along the index too, so the same binary search works.
        kept = _floor_entry(self._data, _TIME_ENTRY, 1, offset - self.base_offset - 1) + 1
        del self._data[kept * self.entry_bytes :]
        assert self.entry_count == kept

    def to_bytes(self) -> bytes:
        return bytes(self._data)
