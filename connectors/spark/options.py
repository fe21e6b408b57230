"""The connector's options: Spark's Kafka source names, parsed and validated eagerly.

Theory of operation. Spark hands a data source its options as a case-insensitive map of
strings (keys arrive lower-cased). `parse_source_options` and `parse_sink_options` turn that
map into frozen dataclasses, once, on the driver, when `load()` / `save()` asks for the
schema or the writer; any option that is unknown, malformed or in conflict with another
raises `ConfigError` whose message starts with the option's name, so the job fails before
a task starts. The dataclasses hold plain data only (strings, ints, tuples, dicts) because
they travel inside the pickled reader and writer to every Spark worker.

The names and meanings follow Spark's Kafka source (`subscribe`, `subscribePattern`,
`assign`, `startingOffsets`, `endingOffsets`, `startingTimestamp`, `maxOffsetsPerTrigger`,
`minOffsetsPerTrigger`, `maxTriggerDelay`, `minPartitions`, `failOnDataLoss`,
`includeHeaders`), with `bootstrap` in place of `kafka.bootstrap.servers` and
`isolationLevel` in place of `kafka.isolation.level` (read_committed by default). Bounds the
connector keeps (fetch size, retry window, sink buffer) are options too, each checked against
a fixed range: they live here rather than in `raftlog.config` because they bound Spark
worker processes, not nodes, as the client's own bounds do (`raftlog.client.config`).

Offsets in `startingOffsets` / `endingOffsets` JSON use Kafka's sentinels: -2 earliest,
-1 latest. For example `{"events": {"0": 23, "1": -2}}` starts partition 0 at offset 23 and
partition 1 at its log start.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from raftlog.client._connection import parse_bootstrap
from raftlog.client.errors import ClientError
from raftlog.errors import ConfigError

__all__ = [
    "EARLIEST",
    "LATEST",
    "OffsetSpec",
    "SinkOptions",
    "SourceOptions",
    "Subscription",
    "parse_sink_options",
    "parse_source_options",
]

KIB = 1024
MIB = 1024 * KIB
EARLIEST = -2  # Kafka's sentinel for "the log start" in offset JSON
LATEST = -1  # Kafka's sentinel for "the high watermark"
# The server refuses fetches above this (raftlog.rpc.log_servicer.FETCH_BYTES_MAX).
FETCH_BYTES_LIMIT = 64 * MIB

# "earliest", "latest", or {topic: {partition: offset or sentinel}}.
OffsetSpec = str | dict[str, dict[int, int]]
SubscriptionKind = Literal["subscribe", "subscribePattern", "assign"]

_SOURCE_OPTIONS = (
    "bootstrap",
    "subscribe",
    "subscribePattern",
    "assign",
    "startingOffsets",
    "endingOffsets",
    "startingTimestamp",
    "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "minPartitions",
    "failOnDataLoss",
    "includeHeaders",
    "isolationLevel",
    "fetchBytesMax",
    "fetchWaitMs",
    "retryWindowMs",
)
_SINK_OPTIONS = (
    "bootstrap",
    "topic",
    "lingerMs",
    "bufferBytesMax",
    "compression",
    "deliveryTimeoutMs",
)
# Options Spark itself sets on a data source (a streaming sink gets its checkpoint location).
_SPARK_OWN_OPTIONS = frozenset({"checkpointlocation", "path"})
_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_DURATION = re.compile(r"^\s*(\d+)\s*([a-z]*)\s*$")
_DURATION_UNIT_MS = {
    **dict.fromkeys(("", "ms", "millisecond", "milliseconds"), 1),
    **dict.fromkeys(("s", "sec", "second", "seconds"), 1000),
    **dict.fromkeys(("m", "min", "minute", "minutes"), 60_000),
    **dict.fromkeys(("h", "hour", "hours"), 3_600_000),
}


@dataclass(frozen=True, slots=True)
class Subscription:
    """Which partitions to read: named topics, a topic-name regex, or explicit partitions."""

    kind: SubscriptionKind
    topics: tuple[str, ...] = ()
    pattern: str = ""
    partitions: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceOptions:
    bootstrap: str
    subscription: Subscription
    starting_offsets: OffsetSpec
    ending_offsets: OffsetSpec
    starting_timestamp_ms: int | None = None
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60_000
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    # read_committed (the default): only committed transactions' records, up to the last
    # stable offset; read_uncommitted: every record up to the high watermark.
    read_committed: bool = True
    # Bytes asked for in one Fetch by a worker; a response is converted to one Arrow batch.
    fetch_bytes_max: int = 4 * MIB
    # Long-poll wait of a Fetch that finds nothing new yet (a new leader catching up).
    fetch_wait_ms: int = 500
    # A worker retries a partition (leader elections, restarts) this long without progress.
    retry_window_ms: int = 60_000


@dataclass(frozen=True, slots=True, kw_only=True)
class SinkOptions:
    bootstrap: str
    topic: str | None = None
    linger_ms: int = 5
    buffer_bytes_max: int = 32 * MIB
    compression: Literal["lz4", "zstd", "gzip", "snappy"] | None = None
    delivery_timeout_ms: int = 120_000


def _canonical(options: Mapping[str, str], known: tuple[str, ...], role: str) -> dict[str, str]:
    """Options keyed by their canonical spelling; an unknown name fails naming it."""
    by_lower = {name.lower(): name for name in known}
    result: dict[str, str] = {}
    for key, value in options.items():
        if key.lower() in _SPARK_OWN_OPTIONS:
            continue
        name = by_lower.get(key.lower())
        if name is None:
            raise ConfigError(
                f"{key}: unknown option for the raftlog {role}; known: {', '.join(known)}"
            )
        result[name] = str(value)
    assert set(result) <= set(known)
    return result


def _bootstrap(raw: dict[str, str]) -> str:
    if "bootstrap" not in raw:
        raise ConfigError("bootstrap: required (a comma-separated list of host:port)")
    try:
        return ",".join(parse_bootstrap(raw["bootstrap"]))
    except ClientError as error:
        raise ConfigError(f"bootstrap: {error}") from None


def _int(raw: dict[str, str], name: str, *, low: int, high: int = 2**63 - 1) -> int | None:
    if name not in raw:
        return None
    text = raw[name].strip()
    if not re.fullmatch(r"-?\d+", text):
        raise ConfigError(f"{name}: must be an integer, got {raw[name]!r}")
    value = int(text)
    if not low <= value <= high:
        raise ConfigError(f"{name}: must be in [{low}, {high}], got {value}")
    return value


def _int_or(raw: dict[str, str], name: str, default: int, *, low: int, high: int) -> int:
    value = _int(raw, name, low=low, high=high)
    return default if value is None else value


def _bool(raw: dict[str, str], name: str, default: bool) -> bool:
    text = raw.get(name, str(default)).strip().lower()
    if text not in ("true", "false"):
        raise ConfigError(f"{name}: must be true or false, got {raw[name]!r}")
    return text == "true"


def _duration_ms(raw: dict[str, str], name: str, default: int) -> int:
    """Spark's duration strings: "15m", "30s", "500ms", "2 minutes" or plain milliseconds."""
    if name not in raw:
        return default
    match = _DURATION.match(raw[name].lower())
    if not match or match.group(2) not in _DURATION_UNIT_MS:
        raise ConfigError(f"{name}: must be a duration such as 30s or 15m, got {raw[name]!r}")
    return int(match.group(1)) * _DURATION_UNIT_MS[match.group(2)]


def _topic(name: str, option: str) -> str:
    if not _TOPIC_NAME.match(name):
        raise ConfigError(f"{option}: {name!r} is not a valid topic name")
    return name


def _subscription(raw: dict[str, str]) -> Subscription:
    chosen = [name for name in ("subscribe", "subscribePattern", "assign") if name in raw]
    if len(chosen) != 1:
        named = ", ".join(chosen) if chosen else "none"
        raise ConfigError(
            f"{chosen[-1] if chosen else 'subscribe'}: exactly one of subscribe, "
            f"subscribePattern or assign is required (got {named})"
        )
    kind = chosen[0]
    if kind == "subscribe":
        topics = tuple(t.strip() for t in raw[kind].split(",") if t.strip())
        if not topics:
            raise ConfigError("subscribe: names no topic")
        return Subscription("subscribe", topics=tuple(_topic(t, kind) for t in topics))
    if kind == "subscribePattern":
        try:
            re.compile(raw[kind])
        except re.error as error:
            raise ConfigError(f"subscribePattern: not a regular expression: {error}") from None
        return Subscription("subscribePattern", pattern=raw[kind])
    partitions = _assign_json(raw[kind])
    if not partitions:
        raise ConfigError("assign: names no partition")
    return Subscription("assign", partitions=partitions)


def _json_object(text: str, option: str) -> dict[str, object]:
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{option}: not JSON ({error.msg} at {error.pos})") from None
    if not isinstance(parsed, dict):
        raise ConfigError(f"{option}: must be a JSON object of topics, got {text!r}")
    return parsed


def _assign_json(text: str) -> tuple[tuple[str, int], ...]:
    """Kafka's assign form, `{"topicA": [0, 1], "topicB": [2]}`, sorted."""
    partitions: set[tuple[str, int]] = set()
    for topic, parts in _json_object(text, "assign").items():
        _topic(topic, "assign")
        if not isinstance(parts, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in parts
        ):
            raise ConfigError(f"assign: topic {topic!r} must map to a list of partition numbers")
        partitions.update((topic, p) for p in parts)
    return tuple(sorted(partitions))


def _offset_json(text: str, option: str) -> dict[str, dict[int, int]]:
    """`{"t": {"0": 5, "1": -2}}` as {topic: {partition: offset or sentinel}}."""
    result: dict[str, dict[int, int]] = {}
    for topic, parts in _json_object(text, option).items():
        _topic(topic, option)
        if not isinstance(parts, dict):
            raise ConfigError(f"{option}: topic {topic!r} must map partitions to offsets")
        result[topic] = {}
        for partition, offset in parts.items():
            valid = isinstance(offset, int) and not isinstance(offset, bool) and offset >= EARLIEST
            if not str(partition).isdigit() or not valid:
                raise ConfigError(
                    f"{option}: {topic}/{partition} = {offset!r}: need a partition number and "
                    "an offset >= 0, or -2 (earliest) / -1 (latest)"
                )
            result[topic][int(partition)] = offset
    return result


def _offsets(raw: dict[str, str], name: str, default: str, allowed: tuple[str, ...]) -> OffsetSpec:
    text = raw.get(name, default).strip()
    if text.lower() in allowed:
        return text.lower()
    if not text.startswith("{"):
        raise ConfigError(
            f"{name}: must be {' or '.join(allowed)} or per-partition JSON, got {text!r}"
        )
    return _offset_json(text, name)


def _isolation_level(raw: dict[str, str]) -> bool:
    """True for read_committed (the default), False for read_uncommitted."""
    text = raw.get("isolationLevel", "read_committed").strip().lower()
    if text not in ("read_committed", "read_uncommitted"):
        raise ConfigError(
            f"isolationLevel: must be read_committed or read_uncommitted, got {text!r}"
        )
    return text == "read_committed"


def parse_source_options(options: Mapping[str, str], *, streaming: bool | None) -> SourceOptions:
    """Validate a source's options; `ConfigError` names the first option that is wrong.

    `streaming` None checks what holds for both kinds of read (at `load()`, before Spark says
    which one it is)."""
    raw = _canonical(options, _SOURCE_OPTIONS, "source")
    if streaming is True and "endingOffsets" in raw:
        raise ConfigError("endingOffsets: only for batch reads (spark.read), not readStream")
    if streaming is False:
        for name in ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay"):
            if name in raw:
                raise ConfigError(f"{name}: only for streaming reads (spark.readStream)")
    starting_default = "latest" if streaming else "earliest"
    starting = _offsets(raw, "startingOffsets", starting_default, ("earliest", "latest"))
    ending = _offsets(raw, "endingOffsets", "latest", ("latest",))
    if streaming is False and starting == "latest":
        raise ConfigError("startingOffsets: 'latest' is not allowed for a batch read")
    if isinstance(ending, dict) and any(o == EARLIEST for p in ending.values() for o in p.values()):
        raise ConfigError("endingOffsets: -2 (earliest) is not allowed as an ending offset")
    latest_start = isinstance(starting, dict) and any(
        o == LATEST for p in starting.values() for o in p.values()
    )
    if latest_start and streaming is False:
        raise ConfigError("startingOffsets: -1 (latest) is not allowed for a batch read")
    timestamp_ms = _int(raw, "startingTimestamp", low=0)
    if timestamp_ms is not None and "startingOffsets" in raw:
        raise ConfigError("startingTimestamp: conflicts with startingOffsets; give only one")
    min_rows = _int(raw, "minOffsetsPerTrigger", low=1)
    max_rows = _int(raw, "maxOffsetsPerTrigger", low=1)
    if min_rows is not None and max_rows is not None and min_rows > max_rows:
        raise ConfigError(
            f"minOffsetsPerTrigger: {min_rows} exceeds maxOffsetsPerTrigger {max_rows}"
        )
    if "maxTriggerDelay" in raw and min_rows is None:
        raise ConfigError("maxTriggerDelay: only meaningful with minOffsetsPerTrigger")
    result = SourceOptions(
        bootstrap=_bootstrap(raw),
        subscription=_subscription(raw),
        starting_offsets=starting,
        ending_offsets=ending,
        starting_timestamp_ms=timestamp_ms,
        max_offsets_per_trigger=max_rows,
        min_offsets_per_trigger=min_rows,
        max_trigger_delay_ms=_duration_ms(raw, "maxTriggerDelay", 15 * 60_000),
        min_partitions=_int(raw, "minPartitions", low=1, high=100_000),
        fail_on_data_loss=_bool(raw, "failOnDataLoss", True),
        include_headers=_bool(raw, "includeHeaders", False),
        read_committed=_isolation_level(raw),
        fetch_bytes_max=_int_or(raw, "fetchBytesMax", 4 * MIB, low=KIB, high=FETCH_BYTES_LIMIT),
        fetch_wait_ms=_int_or(raw, "fetchWaitMs", 500, low=1, high=60_000),
        retry_window_ms=_int_or(raw, "retryWindowMs", 60_000, low=1, high=3_600_000),
    )
    assert result.fetch_bytes_max <= FETCH_BYTES_LIMIT
    return result


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    """Validate a sink's options; `ConfigError` names the first option that is wrong."""
    raw = _canonical(options, _SINK_OPTIONS, "sink")
    compression = raw.get("compression", "none").strip().lower()
    if compression not in ("none", "lz4", "zstd", "gzip", "snappy"):
        raise ConfigError(
            f"compression: must be none, lz4, zstd, gzip or snappy, got {compression!r}"
        )
    topic = raw.get("topic")
    result = SinkOptions(
        bootstrap=_bootstrap(raw),
        topic=_topic(topic, "topic") if topic is not None else None,
        linger_ms=_int_or(raw, "lingerMs", 5, low=0, high=60_000),
        buffer_bytes_max=_int_or(raw, "bufferBytesMax", 32 * MIB, low=64 * KIB, high=1024 * MIB),
        compression=None if compression == "none" else compression,  # type: ignore[arg-type]
        delivery_timeout_ms=_int_or(raw, "deliveryTimeoutMs", 120_000, low=1000, high=3_600_000),
    )
    assert result.buffer_bytes_max >= 64 * KIB
    return result
