"""The client's bounds and options, validated eagerly.

Theory of operation. Producer, Consumer and Admin take Kafka-style keyword options; each
builds one of these frozen sections and calls `validate()` before it opens a connection, so
a bad option fails at construction with a `ConfigError` naming the setting. Every buffer,
batch, pool and wait the client keeps is bounded by a field here. The node's own bounds live
in `raftlog.config`; the client keeps its own because it runs in other processes with other
limits (a producer's `batch_bytes_max` must still fit under the broker's `LogConfig`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

from raftlog.errors import ConfigError

__all__ = [
    "AcksOption",
    "AutoOffsetReset",
    "CompressionOption",
    "ConnectionConfig",
    "ConsumerConfig",
    "ProducerConfig",
]

KIB = 1024
MIB = 1024 * KIB
# The most batches of a partition in flight: a leader remembers a producer's last five batches
# (raftlog.partition.producer_state.REMEMBERED_BATCHES_MAX), so a retried one is still known.
IDEMPOTENT_IN_FLIGHT_MAX = 5

AcksOption = Literal["all", 1, 0, -1]
CompressionOption = Literal["lz4", "zstd", "gzip", "snappy"] | None
AutoOffsetReset = Literal["earliest", "latest", "error"]
# Kafka's isolation.level: read_committed reads up to the last stable offset and skips the
# records of aborted transactions (docs/transactions.md).
IsolationLevel = Literal["read_uncommitted", "read_committed"]


def _require(condition: bool, setting: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{setting}: {message}")


def _require_non_negative_ints(section: object) -> None:
    for f in fields(section):  # type: ignore[arg-type]
        value = getattr(section, f.name)
        if isinstance(value, bool) or not isinstance(value, int):
            continue
        _require(value >= 0, f.name, f"must not be negative, got {value}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionConfig:
    """How the client reaches the cluster: shared by Producer, Consumer and Admin."""

    request_timeout_ms: int = 30_000
    # Metadata older than this is refreshed before it is used again (Kafka's metadata.max.age).
    metadata_max_age_ms: int = 300_000
    # Wait between retries of a failed request so a leader election can finish.
    retry_backoff_ms: int = 100
    # Open gRPC channels kept at once; the least recently used is closed beyond it.
    channels_max: int = 64
    # Largest gRPC message sent or received (a fetch response carries whole batches).
    message_bytes_max: int = 64 * MIB
    # How soon a channel to a node that refused connections tries again. gRPC's own default
    # grows to 120 s, far too long for a node that restarts after a crash.
    reconnect_backoff_ms_min: int = 100
    reconnect_backoff_ms_max: int = 1000

    def validate(self) -> ConnectionConfig:
        _require_non_negative_ints(self)
        _require(self.request_timeout_ms > 0, "request_timeout_ms", "must be positive")
        _require(self.channels_max > 0, "channels_max", "must be positive")
        _require(self.message_bytes_max >= 1 * MIB, "message_bytes_max", "must be >= 1 MiB")
        _require(
            0 < self.reconnect_backoff_ms_min <= self.reconnect_backoff_ms_max,
            "reconnect_backoff_ms_min",
            f"must be positive and not exceed reconnect_backoff_ms_max "
            f"({self.reconnect_backoff_ms_min} > {self.reconnect_backoff_ms_max})",
        )
        return self


@dataclass(frozen=True, slots=True, kw_only=True)
class ProducerConfig:
    """Batching, memory and delivery bounds of a Producer."""

    acks: AcksOption = "all"
    linger_ms: int = 5
    batch_bytes_max: int = 256 * KIB
    buffer_bytes_max: int = 32 * MIB
    # send() blocks at most this long for buffer space or metadata, then raises.
    max_block_ms: int = 60_000
    compression: CompressionOption = None
    enable_idempotence: bool = True
    # A record fails once it has been tried 1 + retries times or delivery_timeout_ms passed.
    retries: int = 2**31 - 1
    delivery_timeout_ms: int = 120_000
    # Batches of one partition sent before the first is answered (Kafka's
    # max.in.flight.requests.per.connection). None: 5 with idempotence (sequence numbers keep
    # order across retries), 1 without (a retry could land after a later batch).
    max_in_flight_per_partition: int | None = None
    connection: ConnectionConfig = ConnectionConfig()

    @property
    def in_flight_per_partition_max(self) -> int:
        """`max_in_flight_per_partition` with its default resolved."""
        if self.max_in_flight_per_partition is not None:
            return self.max_in_flight_per_partition
        return IDEMPOTENT_IN_FLIGHT_MAX if self.enable_idempotence else 1

    def validate(self) -> ProducerConfig:
        self.connection.validate()
        _require_non_negative_ints(self)
        _require(
            self.acks in ("all", 1, 0, -1), "acks", f"must be 'all', 1 or 0, got {self.acks!r}"
        )
        _require(
            self.compression in (None, "lz4", "zstd", "gzip", "snappy"),
            "compression",
            f"must be None, 'lz4', 'zstd', 'gzip' or 'snappy', got {self.compression!r}",
        )
        _require(self.batch_bytes_max >= 1 * KIB, "batch_bytes_max", "must be >= 1 KiB")
        _require(
            self.batch_bytes_max <= self.buffer_bytes_max,
            "batch_bytes_max",
            f"must not exceed buffer_bytes_max ({self.batch_bytes_max} > {self.buffer_bytes_max})",
        )
        _require(
            self.batch_bytes_max < self.connection.message_bytes_max,
            "batch_bytes_max",
            "must be below connection.message_bytes_max so a produce request fits",
        )
        # Kafka's rule: a record must get at least one full attempt before it expires.
        _require(
            self.delivery_timeout_ms >= self.linger_ms + self.connection.request_timeout_ms,
            "delivery_timeout_ms",
            f"must be >= linger_ms + request_timeout_ms ({self.delivery_timeout_ms} < "
            f"{self.linger_ms} + {self.connection.request_timeout_ms})",
        )
        in_flight = self.max_in_flight_per_partition
        _require(
            in_flight is None
            or (
                isinstance(in_flight, int)
                and not isinstance(in_flight, bool)
                and 1 <= in_flight <= IDEMPOTENT_IN_FLIGHT_MAX
            ),
            "max_in_flight_per_partition",
            f"must be an int from 1 to {IDEMPOTENT_IN_FLIGHT_MAX} (the leader remembers the "
            f"last {IDEMPOTENT_IN_FLIGHT_MAX} batches of a producer) or None, got {in_flight!r}",
        )
        _require(
            not self.enable_idempotence or self.acks in ("all", -1),
            "enable_idempotence",
            f"needs acks='all' (got acks={self.acks!r}); pass enable_idempotence=False",
        )
        return self


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerConfig:
    """Fetch sizes, waits and buffers of a Consumer."""

    auto_offset_reset: AutoOffsetReset = "latest"
    isolation_level: IsolationLevel = "read_uncommitted"
    # Bytes asked of one partition per fetch (Kafka's max.partition.fetch.bytes); a batch
    # larger than this is still returned whole by the server.
    partition_fetch_bytes_max: int = 1 * MIB
    fetch_max_wait_ms: int = 500
    fetch_min_bytes: int = 1
    # poll() returns at most this many records; the rest stay buffered for the next poll.
    max_poll_records: int = 500
    # Fetched batches held ahead of the caller, over all partitions: a partition asks for
    # more while records of it are still buffered (prefetch) only while fewer bytes than this
    # are buffered; one with nothing buffered always may. 0: fetch only once drained.
    fetch_buffer_bytes_max: int = 32 * MIB
    # A compressed batch may expand to at most this many bytes (a bound against bombs).
    decompressed_bytes_max: int = 64 * MIB
    # Iteration stops after this long without a record; None iterates until close().
    consumer_timeout_ms: int | None = None
    connection: ConnectionConfig = ConnectionConfig()

    def validate(self) -> ConsumerConfig:
        self.connection.validate()
        _require_non_negative_ints(self)
        _require(
            self.auto_offset_reset in ("earliest", "latest", "error"),
            "auto_offset_reset",
            f"must be 'earliest', 'latest' or 'error', got {self.auto_offset_reset!r}",
        )
        _require(
            self.isolation_level in ("read_uncommitted", "read_committed"),
            "isolation_level",
            f"must be 'read_uncommitted' or 'read_committed', got {self.isolation_level!r}",
        )
        _require(self.max_poll_records > 0, "max_poll_records", "must be positive")
        _require(self.partition_fetch_bytes_max > 0, "partition_fetch_bytes_max", "must be > 0")
        buffer_bytes_max = self.fetch_buffer_bytes_max
        _require(
            type(buffer_bytes_max) is int and buffer_bytes_max >= 0,
            "fetch_buffer_bytes_max",
            f"must be a non-negative int (bytes), got {buffer_bytes_max!r}",
        )
        _require(
            self.partition_fetch_bytes_max < self.connection.message_bytes_max,
            "partition_fetch_bytes_max",
            "must be below connection.message_bytes_max",
        )
        _require(
            self.fetch_max_wait_ms < self.connection.request_timeout_ms,
            "fetch_max_wait_ms",
            f"must be below request_timeout_ms ({self.fetch_max_wait_ms} >= "
            f"{self.connection.request_timeout_ms}) or every long poll would time out",
        )
        return self
