"""A node's settings under Kafka's broker config names, and its consumer-group settings as
Kafka 3.9's group configs: what DescribeConfigs answers for a BROKER or GROUP resource.

A node's settings are its own, read at start (`raftlog serve --set`, raftlog.config), so
every entry is read-only (IncrementalAlterConfigs refuses broker resources) and its source
is STATIC_BROKER_CONFIG where the node's value differs from raftlog's default, else
DEFAULT_CONFIG. A few entries are raftlog's fixed behaviour under Kafka's name (the
cleanup policy a topic starts with, CreateTime timestamps, batches stored as sent, no
unclean elections, committed offsets kept until their group is deleted), always
DEFAULT_CONFIG. raftlog has no configs of its own per consumer group: a GROUP resource
answers the node's group settings, as Kafka answers a group without overrides.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from raftlog.config import NodeConfig
from raftlog.partition.cleaning import CompactionSettings

__all__ = ["SOURCE_DEFAULT", "SOURCE_STATIC_NODE", "ConfigEntry", "broker_configs", "group_configs"]

# Kafka's ConfigSource and ConfigType ids (DescribeConfigs v1+ and v3+).
SOURCE_STATIC_NODE, SOURCE_DEFAULT = 4, 5
_BOOLEAN, _STRING, _INT, _LONG, _DOUBLE, _LIST = 1, 2, 3, 5, 6, 7
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One setting as DescribeConfigs answers it."""

    name: str
    value: str
    source: int
    config_type: int
    documentation: str


@dataclass(frozen=True, slots=True)
class _Setting:
    name: str
    value: Callable[[NodeConfig], object]  # None stands for Kafka's -1 (no limit)
    config_type: int
    documentation: str


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "-1" if value is None else str(value)


def _entries(settings: tuple[_Setting, ...], config: NodeConfig) -> list[ConfigEntry]:
    defaults = NodeConfig()
    return [
        ConfigEntry(
            name=s.name,
            value=_text(s.value(config)),
            source=SOURCE_DEFAULT if s.value(config) == s.value(defaults) else SOURCE_STATIC_NODE,
            config_type=s.config_type,
            documentation=s.documentation,
        )
        for s in settings
    ]


_COMPACTION = CompactionSettings()
_BROKER_SETTINGS = (
    _Setting("auto.create.topics.enable", lambda c: c.kafka.auto_create_topics_enable, _BOOLEAN,
             "kafka.auto_create_topics_enable: Metadata creates unknown topics"),
    _Setting("num.partitions", lambda c: c.kafka.num_partitions, _INT,
             "kafka.num_partitions: partitions of an auto-created topic or a CreateTopics' -1"),
    _Setting("default.replication.factor", lambda c: c.kafka.default_replication_factor, _INT,
             "kafka.default_replication_factor: replicas of an auto-created topic or a "
             "CreateTopics' -1, at most the live nodes"),
    _Setting("message.max.bytes", lambda c: c.log.batch_bytes_max, _INT,
             "log.batch_bytes_max: the largest batch a topic takes (its max.message.bytes)"),
    _Setting("log.segment.bytes", lambda c: c.log.segment_bytes_max, _INT,
             "log.segment_bytes_max: a topic's segment.bytes, also the largest batch it takes"),
    _Setting("log.roll.ms", lambda c: c.log.segment_age_ms_max, _LONG,
             "log.segment_age_ms_max: a topic's segment.ms"),
    _Setting("log.retention.ms", lambda c: c.log.retention_ms, _LONG,
             "log.retention_ms: a topic's retention.ms (-1: no limit)"),
    _Setting("log.retention.bytes", lambda c: c.log.retention_bytes, _LONG,
             "log.retention_bytes: a topic's retention.bytes (-1: no limit)"),
    _Setting("log.retention.check.interval.ms", lambda c: c.retention_check_interval_ms, _LONG,
             "retention_check_interval_ms"),
    _Setting("log.index.interval.bytes", lambda c: c.log.index_interval_bytes, _INT,
             "log.index_interval_bytes"),
    _Setting("log.cleanup.policy", lambda c: "delete", _LIST,
             "the cleanup.policy of a topic that sets none"),
    _Setting("log.cleaner.enable", lambda c: c.cleaner_bytes_per_s > 0, _BOOLEAN,
             "cleaner_bytes_per_s > 0: compacted topics are cleaned"),
    _Setting("log.cleaner.min.cleanable.ratio", lambda c: _COMPACTION.min_cleanable_dirty_ratio,
             _DOUBLE, "the min.cleanable.dirty.ratio of a topic that sets none"),
    _Setting("log.cleaner.min.compaction.lag.ms", lambda c: _COMPACTION.min_compaction_lag_ms,
             _LONG, "the min.compaction.lag.ms of a topic that sets none"),
    _Setting("log.cleaner.max.compaction.lag.ms", lambda c: _COMPACTION.max_compaction_lag_ms,
             _LONG, "the max.compaction.lag.ms of a topic that sets none"),
    _Setting("log.cleaner.delete.retention.ms", lambda c: _COMPACTION.delete_retention_ms, _LONG,
             "the delete.retention.ms of a topic that sets none"),
    _Setting("log.message.timestamp.type", lambda c: "CreateTime", _STRING,
             "batches keep the timestamps their producers gave them"),
    _Setting("compression.type", lambda c: "producer", _STRING,
             "batches are stored as their producers compressed them"),
    _Setting("unclean.leader.election.enable", lambda c: False, _BOOLEAN,
             "a Raft leader always holds every committed record"),
    _Setting("offsets.retention.minutes", lambda c: _INT32_MAX, _INT,
             "committed offsets are kept until their consumer group is deleted"),
    _Setting("group.initial.rebalance.delay.ms",
             lambda c: c.kafka.group_initial_rebalance_delay_ms, _INT,
             "kafka.group_initial_rebalance_delay_ms"),
    _Setting("group.consumer.session.timeout.ms", lambda c: c.metadata.group_session_timeout_ms,
             _INT, "metadata.group_session_timeout_ms"),
    _Setting("group.consumer.heartbeat.interval.ms",
             lambda c: c.metadata.group_heartbeat_interval_ms, _INT,
             "metadata.group_heartbeat_interval_ms"),
    _Setting("socket.request.max.bytes", lambda c: c.kafka.frame_bytes_max, _INT,
             "kafka.frame_bytes_max"),
    _Setting("max.connections", lambda c: c.kafka.connections_max, _INT,
             "kafka.connections_max"),
)  # fmt: skip
_GROUP_SETTINGS = (
    _Setting("consumer.session.timeout.ms", lambda c: c.metadata.group_session_timeout_ms, _INT,
             "metadata.group_session_timeout_ms"),
    _Setting("consumer.heartbeat.interval.ms",
             lambda c: c.metadata.group_heartbeat_interval_ms, _INT,
             "metadata.group_heartbeat_interval_ms"),
)  # fmt: skip


def broker_configs(config: NodeConfig, node_id: int) -> list[ConfigEntry]:
    """The node's settings as Kafka's broker configs, its id first."""
    ids = [
        ConfigEntry(name, str(node_id), SOURCE_STATIC_NODE, _INT, "the node's id (--node-id)")
        for name in ("broker.id", "node.id")
    ]
    return ids + _entries(_BROKER_SETTINGS, config)


def group_configs(config: NodeConfig) -> list[ConfigEntry]:
    """Kafka 3.9's group configs of a consumer group: the node's group settings."""
    return _entries(_GROUP_SETTINGS, config)
