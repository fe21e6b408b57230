"""Offset arithmetic of the source, pure: checkpoint form, rate limits and range splitting.

Theory of operation. A streaming position is one offset per (topic, partition): the next
offset to read. Spark stores it in the checkpoint as JSON and compares two positions as
strings, so `to_json_offsets` always writes the same dict for the same position: topics in
sorted order, partitions keyed by their decimal string in sorted order (the order
`json.dumps(sort_keys=True)` would give). For example {("b", 0): 5, ("a", 10): 1, ("a", 2): 7}
becomes {"a": {"10": 1, "2": 7}, "b": {"0": 5}}.

A micro-batch reads `[start, end)` per partition; `end` never exceeds a high watermark the
driver observed, so every record it names is committed and a replayed batch reads the same
records. `limit_offsets` caps how far `end` moves (`maxOffsetsPerTrigger`): the limit is
shared in proportion to each partition's backlog, rounded down, and the remainder handed out
one offset at a time in partition order, so the total moved is exactly min(limit, backlog).
Offsets, not records, are counted (a compacted record or a control batch leaves an offset
without a record), as in Spark's Kafka source. `split_ranges` cuts ranges into at least
`minPartitions` Spark partitions when there is enough data, in proportion to their sizes.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass

from raftlog.client._connection import TopicPartition
from raftlog.errors import ConfigError

__all__ = [
    "OffsetRange",
    "Position",
    "from_json_offsets",
    "limit_offsets",
    "plan_ranges",
    "split_ranges",
    "to_json_offsets",
]

Position = dict[TopicPartition, int]
JsonOffsets = dict[str, dict[str, int]]


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Offsets `[offset_from, offset_to)` of one partition: what one Spark task reads."""

    topic: str
    partition: int
    offset_from: int
    offset_to: int

    @property
    def size(self) -> int:
        return self.offset_to - self.offset_from


def to_json_offsets(position: Mapping[TopicPartition, int]) -> JsonOffsets:
    """The checkpoint form: sorted topics, partitions as sorted decimal-string keys."""
    result: JsonOffsets = {}
    for topic in sorted({tp.topic for tp in position}):
        parts = {str(tp.partition): offset for tp, offset in position.items() if tp.topic == topic}
        result[topic] = {key: parts[key] for key in sorted(parts)}
    assert sum(map(len, result.values())) == len(position)
    return result


def from_json_offsets(offsets: object, *, what: str = "offset") -> Position:
    """Read back `to_json_offsets`; a malformed checkpoint fails naming what it held."""
    if not isinstance(offsets, dict):
        raise ConfigError(f"{what}: expected a JSON object of topics, got {offsets!r}")
    position: Position = {}
    for topic, parts in offsets.items():
        if not isinstance(parts, dict):
            raise ConfigError(f"{what}: topic {topic!r} maps to {parts!r}, not partitions")
        for key, offset in parts.items():
            if not str(key).isdigit() or not isinstance(offset, int) or offset < 0:
                raise ConfigError(f"{what}: bad entry {topic}/{key} = {offset!r}")
            position[TopicPartition(str(topic), int(key))] = offset
    return position


def limit_offsets(start: Position, latest: Position, limit: int) -> Position:
    """`latest`, moved back so that at most `limit` offsets in total lie past `start`."""
    assert limit > 0, limit
    backlog = {tp: max(0, latest[tp] - start.get(tp, latest[tp])) for tp in latest}
    total = sum(backlog.values())
    if total <= limit:
        return dict(latest)
    shares = {tp: backlog[tp] * limit // total for tp in sorted(backlog)}
    remainder = limit - sum(shares.values())
    for tp in sorted(backlog):
        if remainder == 0:
            break
        if shares[tp] < backlog[tp]:
            shares[tp] += 1
            remainder -= 1
    end = {tp: latest[tp] - backlog[tp] + shares[tp] for tp in latest}
    assert sum(end[tp] - latest[tp] + backlog[tp] for tp in latest) == limit
    return end


def plan_ranges(start: Position, end: Position) -> list[OffsetRange]:
    """One range per partition that has offsets to read, in partition order."""
    ranges = [
        OffsetRange(tp.topic, tp.partition, start.get(tp, 0), offset)
        for tp, offset in sorted(end.items())
        if offset > start.get(tp, 0)
    ]
    assert all(r.size > 0 for r in ranges)
    return ranges


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Cut ranges so there are at least `min_partitions` of them (when offsets allow)."""
    if min_partitions is None or len(ranges) >= min_partitions:
        return list(ranges)
    total = sum(r.size for r in ranges)
    result: list[OffsetRange] = []
    for piece in ranges:
        parts = min(piece.size, max(1, -(-piece.size * min_partitions // total)))
        bounds = [piece.offset_from + piece.size * i // parts for i in range(parts + 1)]
        result.extend(
            OffsetRange(piece.topic, piece.partition, low, high)
            for low, high in itertools.pairwise(bounds)
        )
    assert sum(r.size for r in result) == total
    return result
