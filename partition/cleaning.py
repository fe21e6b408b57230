"""Compaction of one partition replica: which segments a cleaning pass may touch, and when.

Theory of operation (Kafka's log cleaner, per replica, each replica on its own). A topic
whose `cleanup.policy` includes `compact` is cleaned by `raftlog.storage.compaction` over a
prefix of its closed segments that is

* wholly below the high watermark *and* the replica's applied offset: only committed data
  that the producer table has seen is rewritten, so Raft never truncates a cleaned batch
  (§5.4: committed entries are never overwritten) and idempotence state is unaffected;
* older than `min.compaction.lag.ms` (a segment's newest timestamp), so a consumer that
  keeps up sees every write of a key at least that long.

A pass runs when the dirty part of that prefix (segments not yet cleaned since this replica
started, `CleanerState.first_dirty_offset`) is at least `min.cleanable.dirty.ratio` of it, or
when a dirty segment is older than `max.compaction.lag.ms`, or when a tombstone kept by the
last pass has outlived `delete.retention.ms`. The state lives in memory: after a restart the
first pass treats everything as dirty and rewrites what it must (cleaning is idempotent).

Transactions, as Kafka's cleaner: `clean_below` is at most the last stable offset, so no
open transaction's batch is cleaned; the records of aborted transactions (read from the replica's
aborted-transaction index, the `.txnindex` files beside the segments, at planning time:
`CleaningPass.aborted`) are dropped and never shadow a committed record of their key;
markers stay, and so does each segment's index file (a cleaned segment keeps its offsets).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from raftlog.config import LogConfig
from raftlog.partition.producer_state import AbortedTxn
from raftlog.storage.batch import BatchHeader
from raftlog.storage.compaction import (
    CleanedSegment,
    SegmentToClean,
    build_offset_map,
    latest_record_keeper,
    write_cleaned_segment,
)
from raftlog.storage.file_system import FileSystem
from raftlog.storage.log import SegmentedLog

__all__ = [
    "CleanerState",
    "CleaningPass",
    "CompactionSettings",
    "aborted_batches",
    "compaction_settings",
    "plan_cleaning",
    "run_cleaning",
]

_LAG_MS_NONE = 2**63 - 1


@dataclass(frozen=True, slots=True, kw_only=True)
class CompactionSettings:
    """A topic's cleanup settings (Kafka's names and defaults)."""

    compact: bool = False
    delete: bool = True
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = _LAG_MS_NONE
    delete_retention_ms: int = 24 * 3600 * 1000


def compaction_settings(topic_config: Mapping[str, str]) -> CompactionSettings:
    """The settings of a topic config already checked by `metadata.commands`."""
    policies = set(topic_config.get("cleanup.policy", "delete").split(","))
    defaults = CompactionSettings()
    return CompactionSettings(
        compact="compact" in policies,
        delete="delete" in policies,
        min_cleanable_dirty_ratio=float(
            topic_config.get("min.cleanable.dirty.ratio", defaults.min_cleanable_dirty_ratio)
        ),
        min_compaction_lag_ms=int(
            topic_config.get("min.compaction.lag.ms", defaults.min_compaction_lag_ms)
        ),
        max_compaction_lag_ms=int(
            topic_config.get("max.compaction.lag.ms", defaults.max_compaction_lag_ms)
        ),
        delete_retention_ms=int(
            topic_config.get("delete.retention.ms", defaults.delete_retention_ms)
        ),
    )


@dataclass(slots=True)
class CleanerState:
    """What the cleaner remembers of one replica between passes (in memory only)."""

    first_dirty_offset: int = 0
    # When the oldest tombstone the last pass kept may go (None: it kept none).
    tombstone_due_ms: int | None = None
    passes: int = 0
    bytes_read: int = 0
    bytes_saved: int = 0


@dataclass(frozen=True, slots=True)
class CleaningPass:
    """One planned pass: everything the disk thread needs, nothing of the event loop's."""

    files: FileSystem
    directory: str
    config: LogConfig
    segments: tuple[SegmentToClean, ...]
    now_ms: int
    delete_retention_ms: int
    dirty_end_offset: int
    tombstones_kept_ms: list[int] = field(default_factory=list)
    # The aborted transactions (Raft offsets) whose batches lose their records.
    aborted: tuple[AbortedTxn, ...] = ()


def plan_cleaning(
    log: SegmentedLog,
    settings: CompactionSettings,
    state: CleanerState,
    *,
    clean_below: int,
    now_ms: int,
    aborted: Sequence[AbortedTxn] = (),
) -> CleaningPass | None:
    """The pass to run now on `log` (event loop), or None. `clean_below` is the first
    offset the cleaner must not touch: the last stable offset (at most the high watermark
    and the applied offset + 1); `aborted` the replica's aborted transactions."""
    if not settings.compact or log.is_repairing or log.is_closed:
        return None
    lag_horizon_ms = now_ms - settings.min_compaction_lag_ms
    cleanable: list[tuple[SegmentToClean, int, int]] = []
    for path, base, end, size_bytes, max_timestamp_ms in log.closed_segment_stats():
        if end > clean_below or max_timestamp_ms > lag_horizon_ms:
            break  # a prefix only: later segments wait for these
        cleanable.append((SegmentToClean(path, base, end), size_bytes, max_timestamp_ms))
    if not cleanable:
        return None
    total_bytes = sum(size for _, size, _ in cleanable)
    dirty = [c for c in cleanable if c[0].base_offset >= state.first_dirty_offset]
    dirty_bytes = sum(size for _, size, _ in dirty)
    overdue = any(now_ms - max_ms > settings.max_compaction_lag_ms for _, _, max_ms in dirty)
    tombstones_due = state.tombstone_due_ms is not None and now_ms >= state.tombstone_due_ms
    ratio = dirty_bytes / total_bytes if total_bytes else 0.0
    if not (dirty and (ratio >= settings.min_cleanable_dirty_ratio or overdue)) and not (
        tombstones_due
    ):
        return None
    return CleaningPass(
        files=log.files,
        directory=log.directory,
        config=log.config,
        segments=tuple(segment for segment, _, _ in cleanable),
        now_ms=now_ms,
        delete_retention_ms=settings.delete_retention_ms,
        dirty_end_offset=cleanable[-1][0].end_offset,
        aborted=tuple(a for a in aborted if a.first_offset < cleanable[-1][0].end_offset),
    )


def run_cleaning(plan: CleaningPass, pace: Callable[[int], None]) -> list[CleanedSegment]:
    """Read the planned segments, write cleaned copies of those that shrink (disk thread)."""
    aborted = aborted_batches(plan.aborted)
    latest = build_offset_map(plan.files, plan.segments, pace, aborted)
    keep_latest = latest_record_keeper(
        latest, now_ms=plan.now_ms, delete_retention_ms=plan.delete_retention_ms
    )

    def keep(offset: int, key: bytes | None, is_tombstone: bool, timestamp_ms: int) -> bool:
        kept = keep_latest(offset, key, is_tombstone, timestamp_ms)
        if kept and is_tombstone:
            plan.tombstones_kept_ms.append(timestamp_ms)
        return kept

    cleaned = []
    for segment in plan.segments:
        result = write_cleaned_segment(
            plan.files, plan.directory, segment, plan.config, keep, pace, aborted
        )
        if result is not None:
            cleaned.append(result)
    return cleaned


def aborted_batches(aborted: Sequence[AbortedTxn]) -> Callable[[BatchHeader], bool]:
    """Whether a batch belongs to one of the `aborted` transactions: transactional, of
    that producer, from the transaction's first offset up to its ABORT marker (a producer's
    transactions on a partition never overlap, so the latest start at or before the batch
    is the only candidate)."""
    starts: dict[int, list[tuple[int, int]]] = {}
    for txn in sorted(aborted, key=lambda a: a.first_offset):
        starts.setdefault(txn.producer_id, []).append((txn.first_offset, txn.last_offset))

    def is_aborted(header: BatchHeader) -> bool:
        if not header.is_transactional or header.is_control:
            return False
        ranges = starts.get(header.producer_id)
        if not ranges:
            return False
        index = bisect.bisect_right(ranges, (header.base_offset, 2**63)) - 1
        return index >= 0 and header.base_offset < ranges[index][1]

    return is_aborted


def finish_cleaning(
    log: SegmentedLog, plan: CleaningPass, cleaned: list[CleanedSegment], state: CleanerState
) -> int:
    """Swap the cleaned copies in (event loop) and remember the pass; returns bytes saved."""
    installed = log.install_cleaned(cleaned)
    saved = sum(c.bytes_before - c.bytes_after for c in cleaned) if installed else 0
    state.first_dirty_offset = max(state.first_dirty_offset, plan.dirty_end_offset)
    kept = plan.tombstones_kept_ms
    state.tombstone_due_ms = min(kept) + plan.delete_retention_ms + 1 if kept else None
    state.passes += 1
    state.bytes_saved += saved
    return saved
