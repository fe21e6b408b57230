"""Which old segments retention deletes: a pure decision over segment summaries.

Theory of operation (Kafka's rules). Retention only ever deletes a *prefix* of the closed
segments, whole segments only, and never the active segment, so the log stays contiguous
and the newest data always survives.

* By bytes: while the log would still hold at least `retention_bytes` without its oldest
  segment, that segment goes. Example: segments of 40, 40, 40 bytes plus an active one of 10
  (130 in all), retention_bytes=60: dropping the first leaves 90 >= 60, the second 50 < 60,
  so one segment goes.
* By age: a segment goes when its newest batch is older than `retention_ms`, i.e.
  `now_ms - max_timestamp_ms > retention_ms`; the walk stops at the first segment that is
  young enough (a later segment may hold older timestamps, it still waits its turn).

The result is the larger of the two prefixes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["SegmentSummary", "expired_segment_count"]


@dataclass(frozen=True, slots=True)
class SegmentSummary:
    base_offset: int
    size_bytes: int


def expired_segment_count(
    closed: Sequence[SegmentSummary],
    *,
    total_bytes: int,
    now_ms: int,
    retention_bytes: int | None,
    retention_ms: int | None,
    max_timestamp_ms: Callable[[int], int],
) -> int:
    """How many of the oldest `closed` segments retention deletes.

    `total_bytes` counts every segment including the active one; `max_timestamp_ms(i)` gives
    closed segment i's newest timestamp (called lazily: it may read an index file).
    """
    assert total_bytes >= sum(s.size_bytes for s in closed), total_bytes
    by_bytes = 0
    if retention_bytes is not None:
        excess_bytes = total_bytes - retention_bytes
        while by_bytes < len(closed) and excess_bytes - closed[by_bytes].size_bytes >= 0:
            excess_bytes -= closed[by_bytes].size_bytes
            by_bytes += 1
    by_age = 0
    if retention_ms is not None:
        while by_age < len(closed) and now_ms - max_timestamp_ms(by_age) > retention_ms:
            by_age += 1
    count = max(by_bytes, by_age)
    assert 0 <= count <= len(closed)
    return count
