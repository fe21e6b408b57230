"""Partition policy: a topic's log settings and retention, applied to one replica.

Retention drops whole segments and records a snapshot at the cut first (Raft §7), so a
follower behind the new log start is brought up by InstallSnapshot; only committed data is
ever dropped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from raftlog.config import LogConfig
from raftlog.partition.replica import PartitionReplica
from raftlog.raft.membership import membership_at
from raftlog.raft.types import Membership
from raftlog.storage.batch import Compression
from raftlog.storage.raft_log_storage import RaftLogStorage
from raftlog.types import Offset

__all__ = ["apply_retention", "topic_compression", "topic_log_config"]


def topic_log_config(base: LogConfig, topic_config: Mapping[str, str]) -> LogConfig:
    """The node's log config with a topic's overrides (Kafka's names; -1 = unlimited).

    max.message.bytes and segment.bytes each bound a produced batch, neither the other
    (Kafka's rule: the replica refuses a batch over either, `PartitionReplica._verify`)."""
    changes: dict[str, int | None] = {}
    for key, field_name in _TOPIC_LOG_KEYS.items():
        if key in topic_config:
            value = int(topic_config[key])
            changes[field_name] = (
                None if value < 0 and field_name.startswith("retention") else value
            )
    batch_bytes = changes.get("batch_bytes_max") or base.batch_bytes_max
    if batch_bytes > base.decompressed_bytes_max:
        # A client may decompress any batch the topic takes (max.message.bytes up to 2 GiB).
        changes["decompressed_bytes_max"] = batch_bytes
    return dataclasses.replace(base, **changes).validate()  # type: ignore[arg-type]


_TOPIC_LOG_KEYS = {
    "retention.bytes": "retention_bytes",
    "retention.ms": "retention_ms",
    "segment.bytes": "segment_bytes_max",
    "segment.ms": "segment_age_ms_max",
    "max.message.bytes": "batch_bytes_max",
}


def topic_compression(topic_config: Mapping[str, str]) -> Compression | None:
    """The codec a topic's batches are stored in (Kafka's compression.type), or None for
    `producer`: each batch as its producer compressed it."""
    return _COMPRESSION_TYPES[topic_config.get("compression.type", "producer")]


_COMPRESSION_TYPES = {
    "producer": None,
    "uncompressed": Compression.NONE,
    "gzip": Compression.GZIP,
    "snappy": Compression.SNAPPY,
    "lz4": Compression.LZ4,
    "zstd": Compression.ZSTD,
}


def apply_retention(
    replica: PartitionReplica,
    storage: RaftLogStorage,
    bootstrap: Membership,
    now_ms: int,
    *,
    keys_deleted: bool = True,
) -> None:
    """Drop whole expired segments, and those wholly below the log start DeleteRecords set,
    recording a snapshot at the cut first (Raft §7).

    Only committed and applied data is ever dropped: a cut above either waits. The snapshot
    is what a follower behind the new log start receives instead of the missing entries.
    A cut past an open transaction's first offset waits too, until a marker ends it (the
    coordinator aborts a transaction past its timeout): it would drop records whose fate
    read_committed consumers have not learned yet, and the LSO with them.
    """
    if not keys_deleted:
        return  # cleanup.policy=compact: the cleaner keeps the latest of every key instead
    points = [storage.log.retention_point(now_ms)]
    floor = replica.raft_log_start_floor()
    if floor is not None:
        points.append(storage.log.segment_start_at_or_below(floor))
    point = max((p for p in points if p is not None), default=None)
    if point is None:
        return
    first_open = replica.first_open_transaction_offset()
    if first_open is not None and first_open < point:
        return
    # The snapshot carries the producer table as applied, so the cut never passes what the
    # replica applied (a follower may have committed entries it has not yet made durable).
    cut_max = min(replica.group.node.commit_offset, replica.applied_offset) + 1
    offset = Offset(min(point, cut_max) - 1)
    snapshot = storage.snapshot()
    if offset < storage.first_offset() or (snapshot and offset <= snapshot.meta.offset):
        return
    term = storage.term_at(offset)
    if term is None or offset + 1 != point:
        return  # the cut must fall on a segment (hence batch) boundary below the commit
    membership = membership_at(storage, offset, bootstrap)
    storage.compact(replica.compaction_snapshot(offset, term, membership))
