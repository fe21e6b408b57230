"""Every bound in raftlog, in one place, validated together.

Each queue, batch, in-flight window and buffer has a limit, and it lives here. `validate()`
checks each value and how values relate (a heartbeat interval shorter than the election
timeout, a frame that holds any append, ...). Sections are frozen dataclasses with
keyword-only fields; `NodeConfig` aggregates them. Names put units last.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal

from raftlog.errors import ConfigError

__all__ = [
    "COMMIT_NOTICES",
    "PLANTED_BUGS",
    "CommitNotice",
    "KafkaConfig",
    "LogConfig",
    "MetadataConfig",
    "NodeConfig",
    "RaftConfig",
    "TransportConfig",
]

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
# glibc refuses an mmap threshold above HEAP_MAX_SIZE / 2 (32 MiB on 64-bit systems).
MALLOC_MMAP_THRESHOLD_BYTES_MAX = 32 * MIB
# RaftConfig.commit_notice: when a follower sent nothing else learns a new commit offset.
CommitNotice = Literal["immediate", "next_tick"]
COMMIT_NOTICES: tuple[CommitNotice, ...] = ("immediate", "next_tick")

# Deliberate defects the simulator can switch on to prove its checkers can fail
# (`python -m raftlog.sim --bug NAME`). Production configs must leave `planted_bugs` empty.
PLANTED_BUGS: dict[str, str] = {
    "commit-old-term": "leader commits an entry of an earlier term by counting replicas (§5.4.2)",
    "vote-not-persisted": "a vote is granted (message released) before the vote is durable",
    "ack-before-durable": "a follower acknowledges an append before it is durable",
    "truncate-matching": "a follower truncates entries that match the leader's",
    "trust-damaged-log": "a node whose storage lost synced entries votes as if its log were whole",
}


def _require(condition: bool, setting: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{setting}: {message}")


def _require_positive_ints(section: object, *, zero_allowed: tuple[str, ...] = ()) -> None:
    for f in fields(section):  # type: ignore[arg-type]
        value = getattr(section, f.name)
        if isinstance(value, bool) or not isinstance(value, int):
            continue
        if f.name in zero_allowed:
            _require(value >= 0, f.name, f"must not be negative, got {value}")
        else:
            _require(value > 0, f.name, f"must be positive, got {value}")


@dataclass(frozen=True, slots=True, kw_only=True)
class RaftConfig:
    """Bounds and switches of one Raft group (the pure core reads only this section)."""

    election_timeout_ticks: int = 10
    heartbeat_interval_ticks: int = 2
    pre_vote: bool = True
    check_quorum: bool = True
    # Pipelining: a leader keeps at most this many AppendEntries, and this many bytes of
    # entries, in flight to one follower before it waits for acknowledgements.
    inflight_messages_max: int = 64
    inflight_bytes_max: int = 16 * MIB
    append_bytes_max: int = 1 * MIB
    # A leader refuses proposals while this many bytes are appended but not committed.
    uncommitted_bytes_max: int = 64 * MIB
    apply_bytes_max: int = 16 * MIB
    # Entries persisted but not yet applied stay in memory up to this many bytes, so applying
    # them (and serving a follower just behind) does not read them back from the log.
    stable_cache_bytes_max: int = 16 * MIB
    read_index_requests_max: int = 1024
    proposals_max: int = 4096
    # Messages a node queues between two Readys; beyond it, new ones are dropped (Raft
    # tolerates loss) so a driver that stalls cannot grow the outbox without bound.
    outbox_messages_max: int = 4096
    # Idle groups stop heartbeating (raftlog.raft.quiesce); needs node liveness from the host.
    quiesce: bool = True
    # How a follower that is sent nothing else learns a new commit offset. "immediate": an
    # empty append at once (etcd raft), which the follower acknowledges. "next_tick": at the
    # leader's next tick (Redpanda's heartbeats carry it); an append that goes out sooner
    # carries it anyway, and under load one always does, so each write costs every follower
    # one message and one acknowledgement instead of two. Followers then commit (and apply)
    # up to a tick later; the leader's answers to producers are not delayed.
    commit_notice: CommitNotice = "immediate"
    planted_bugs: frozenset[str] = field(default_factory=frozenset)

    def validate(self) -> RaftConfig:
        _require_positive_ints(self)
        _require(
            self.heartbeat_interval_ticks < self.election_timeout_ticks,
            "heartbeat_interval_ticks",
            f"must be below election_timeout_ticks ({self.heartbeat_interval_ticks} >= "
            f"{self.election_timeout_ticks})",
        )
        _require(
            self.append_bytes_max <= self.inflight_bytes_max,
            "append_bytes_max",
            "must not exceed inflight_bytes_max",
        )
        _require(
            self.commit_notice in COMMIT_NOTICES,
            "commit_notice",
            f"must be one of {COMMIT_NOTICES}, got {self.commit_notice!r}",
        )
        unknown = sorted(self.planted_bugs - PLANTED_BUGS.keys())
        _require(not unknown, "planted_bugs", f"unknown bug names {unknown}")
        return self


@dataclass(frozen=True, slots=True, kw_only=True)
class LogConfig:
    """Bounds of one segmented log."""

    # A produced batch larger than segment_bytes_max is refused (RECORD_LIST_TOO_LARGE, as
    # Kafka's log refuses a batch above segment.bytes) and one above batch_bytes_max
    # (max.message.bytes) too (MESSAGE_TOO_LARGE); neither bound is checked against the other.
    # An empty segment takes any batch, so a replica still appends batches written under a
    # larger segment_bytes_max.
    segment_bytes_max: int = 128 * MIB
    segment_age_ms_max: int = 7 * 24 * 3600 * 1000
    # One sparse index entry per this many bytes of batches.
    index_interval_bytes: int = 4 * KIB
    # Index files are preallocated to hold this many entries (Kafka's segment.index.bytes).
    index_entries_max: int = 1 << 20
    batch_bytes_max: int = 1 * MIB
    # A compressed batch may expand to at most this many bytes of records when a client
    # decodes it (a bound against decompression bombs; the broker path never decompresses).
    decompressed_bytes_max: int = 64 * MIB
    read_bytes_max: int = 64 * MIB
    # A Kafka fetch reads on past batches compaction emptied of every record for at most
    # this many bytes (about 275,000 such batches) before it answers with the last of them.
    emptied_scan_bytes_max: int = 16 * MIB
    # Appends wait in user space until a flush, or until this many bytes are pending, and are
    # then handed to the OS in one writev (durable only after the flush's fdatasync).
    append_buffer_bytes_max: int = 4 * MIB
    # A partition replica checkpoints its state machine (producer table) after applying this
    # many bytes of log, so a restart re-applies at most about this much (Kafka snapshots
    # producer state at segment rolls; partition/checkpoint.py).
    checkpoint_interval_bytes: int = 32 * MIB
    # A partition replica keeps the aborted-transaction index entries of the segments it read
    # last in memory, at most this many in all (28 bytes each on disk); others are read from
    # their `.txnindex` files on each read_committed fetch (raftlog.storage.txn_index).
    txn_index_cached_entries_max: int = 100_000
    retention_bytes: int | None = None
    retention_ms: int | None = None
    # How a leader checks a client's batch: "full" also walks the records' framing once
    # (raftlog.storage.records.validate_records), so nothing a consumer cannot decode is
    # stored; "crc" checks the header and CRC only, trusting clients, and saves the walk's
    # cost per record (benchmarks/suites/record_validation.py measures it).
    produce_record_validation: Literal["full", "crc"] = "full"

    def validate(self) -> LogConfig:
        _require_positive_ints(self)
        _require(
            self.produce_record_validation in ("full", "crc"),
            "produce_record_validation",
            f"must be 'full' or 'crc', got {self.produce_record_validation!r}",
        )
        _require(
            self.decompressed_bytes_max >= self.batch_bytes_max,
            "decompressed_bytes_max",
            f"must be at least batch_bytes_max ({self.decompressed_bytes_max} < "
            f"{self.batch_bytes_max})",
        )
        _require(
            self.segment_bytes_max < 2**32 and self.index_entries_max >= 2,
            "segment_bytes_max",
            "index entries hold u32 positions: need segment_bytes_max < 2**32 and "
            f"index_entries_max >= 2 (got {self.segment_bytes_max}, {self.index_entries_max})",
        )
        _require(
            self.retention_bytes is None or self.retention_bytes >= 0,
            "retention_bytes",
            "must be None or non-negative",
        )
        _require(
            self.retention_ms is None or self.retention_ms >= 0,
            "retention_ms",
            "must be None or non-negative",
        )
        return self


@dataclass(frozen=True, slots=True, kw_only=True)
class TransportConfig:
    """Bounds of the node-to-node Raft transport (raftlog.rpc.peer_transport)."""

    # One frame carries many (group, message) pairs; a frame never exceeds this, header included.
    frame_bytes_max: int = 32 * MIB
    frame_messages_max: int = 4096
    # A frame is sealed early once it holds this much, so that the sender's encoding, the
    # socket and the receiver's decoding overlap instead of taking turns on huge frames.
    frame_bytes_target: int = 1 * MIB
    # Bytes accepted by send() for one peer and not yet handed to the socket; beyond it send()
    # drops the message (Raft retries) rather than block the event loop.
    peer_queue_bytes_max: int = 64 * MIB
    # The socket's write buffer high-water mark: above it frames wait in the peer queue.
    write_buffer_bytes_max: int = 4 * MIB
    receive_buffer_bytes: int = 256 * KIB
    connect_timeout_ms: int = 3000
    hello_timeout_ms: int = 3000
    reconnect_backoff_ms_min: int = 50
    reconnect_backoff_ms_max: int = 2000
    # Node liveness (quiesced Raft groups rely on it instead of their own heartbeats): each
    # node sends every peer one heartbeat frame per interval, covering all groups; a peer
    # heard from (any frame) within the timeout is reachable.
    node_heartbeat_interval_ms: int = 100
    node_liveness_timeout_ms: int = 1000
    # Metadata calls to the controller (raftlog.rpc.peer_calls) waiting for replies on a
    # node, and served for one peer on the controller: beyond it a node forwards by gRPC
    # and the controller answers DROPPED.
    calls_in_flight_max: int = 1024

    def validate(self) -> TransportConfig:
        _require_positive_ints(self)
        _require(
            self.node_liveness_timeout_ms >= 3 * self.node_heartbeat_interval_ms,
            "node_liveness_timeout_ms",
            f"must be at least 3 node heartbeat intervals ({self.node_liveness_timeout_ms} < "
            f"3 * {self.node_heartbeat_interval_ms})",
        )
        _require(
            self.frame_bytes_max <= self.peer_queue_bytes_max,
            "frame_bytes_max",
            f"must not exceed peer_queue_bytes_max ({self.frame_bytes_max} > "
            f"{self.peer_queue_bytes_max})",
        )
        _require(
            self.frame_bytes_target <= self.frame_bytes_max,
            "frame_bytes_target",
            f"must not exceed frame_bytes_max ({self.frame_bytes_target} > {self.frame_bytes_max})",
        )
        _require(
            self.receive_buffer_bytes <= self.frame_bytes_max,
            "receive_buffer_bytes",
            "must not exceed frame_bytes_max",
        )
        _require(
            self.reconnect_backoff_ms_min <= self.reconnect_backoff_ms_max,
            "reconnect_backoff_ms_min",
            f"must not exceed reconnect_backoff_ms_max ({self.reconnect_backoff_ms_min} > "
            f"{self.reconnect_backoff_ms_max})",
        )
        return self


@dataclass(frozen=True, slots=True, kw_only=True)
class MetadataConfig:
    """Bounds of the controller's decisions (raftlog.metadata.controller).

    These gate what the controller proposes; what every node accepts when it applies a
    metadata command is fixed by the protocol (raftlog.metadata.commands), never by config,
    since nodes with different configs must still apply identically."""

    # A node whose last heartbeat is this old is fenced; nodes heartbeat several times a lease.
    node_lease_ms: int = 6000
    node_heartbeat_interval_ms: int = 1500
    # How often a node measures its event loop's lag (a timer's lateness): the controller
    # takes that lag out of the silence it fences for (raftlog.node.leases).
    loop_lag_probe_interval_ms: int = 100
    # A fenced node hands away at most this many partition leaderships per second, and stops
    # as soon as it is unfenced: a slow node must not add a storm of elections to its load.
    fenced_transfers_per_s_max: int = 20
    # Leadership reports a node has in flight to the controller at once, one per partition at
    # most: after a thousand elections the rest wait for the next liveness turn's report of
    # stale leaders, instead of a burst the controller would refuse (its per-connection
    # bound, client_requests_in_flight_max) and the metadata log would queue.
    leader_reports_in_flight_max: int = 64
    # A metadata read (Metadata, DescribeTopic, ...) reaching a node whose copy has not caught
    # up since it started waits this long for it, then is refused (retriable NOT_CONTROLLER).
    catch_up_wait_ms: int = 3000
    topics_max: int = 10_000
    partitions_per_topic_max: int = 1000
    replication_factor_max: int = 7
    # Producer ids handed to a node in one AllocateProducerIds.
    producer_id_block_size: int = 1000
    # Topic creates and partition additions are planned on the controller one at a time; a
    # plan found stale when applied (its Raft group ids handed out meanwhile, as by a command
    # of a previous controller applied late) is planned again at most this many times.
    stale_plan_retries_max: int = 3
    # Replica moves and preferred-leader swaps in one rebalance plan.
    rebalance_moves_max: int = 64
    # The controller evens out replicas by itself (one move at a time, never while another
    # runs), moving only between nodes alive for the grace period: a node that just came
    # back, or flaps, is left alone until it has stayed up that long.
    auto_rebalance: bool = True
    rebalance_grace_ms: int = 30_000
    # Consumer groups (raftlog.metadata.consumer_groups): a member silent for the session timeout is
    # removed and its partitions move; members heartbeat every interval; a member asked to
    # revoke partitions is removed if it has not confirmed within its rebalance timeout
    # (capped here). Groups and members are soft state in the controller's memory: bounded.
    group_session_timeout_ms: int = 10_000
    group_heartbeat_interval_ms: int = 1000
    group_rebalance_timeout_ms_max: int = 300_000
    groups_max: int = 10_000
    group_members_max: int = 1000
    # The metadata string a committed offset may carry, in characters as Kafka counts them
    # against its offset.metadata.max.bytes (Java's String.length()); a longer one is refused
    # with OFFSET_METADATA_TOO_LARGE. Committed offsets live in the metadata state: bounded.
    group_offset_metadata_chars_max: int = 4096

    def validate(self) -> MetadataConfig:
        _require_positive_ints(self)
        _require(
            self.node_heartbeat_interval_ms < self.node_lease_ms,
            "node_heartbeat_interval_ms",
            f"must be below node_lease_ms ({self.node_heartbeat_interval_ms} >= "
            f"{self.node_lease_ms})",
        )
        _require(
            self.loop_lag_probe_interval_ms < self.node_lease_ms,
            "loop_lag_probe_interval_ms",
            f"must be below node_lease_ms ({self.loop_lag_probe_interval_ms} >= "
            f"{self.node_lease_ms})",
        )
        _require(
            self.group_heartbeat_interval_ms < self.group_session_timeout_ms,
            "group_heartbeat_interval_ms",
            f"must be below group_session_timeout_ms ({self.group_heartbeat_interval_ms} >= "
            f"{self.group_session_timeout_ms})",
        )
        # The protocol caps of raftlog.metadata.commands (10,000 partitions, 15 replicas,
        # 32,768 characters of offset metadata).
        _require(
            self.partitions_per_topic_max <= 10_000,
            "partitions_per_topic_max",
            f"must not exceed the protocol's 10000, got {self.partitions_per_topic_max}",
        )
        _require(
            self.group_offset_metadata_chars_max <= 32_768,
            "group_offset_metadata_chars_max",
            f"must not exceed the protocol's 32768, got {self.group_offset_metadata_chars_max}",
        )
        _require(
            self.replication_factor_max <= 15,
            "replication_factor_max",
            f"must not exceed the protocol's 15, got {self.replication_factor_max}",
        )
        return self


@dataclass(frozen=True, slots=True, kw_only=True)
class KafkaConfig:
    """Bounds of the Kafka wire-protocol listener (raftlog.rpc.kafka)."""

    # A request frame above this closes its connection (Kafka's socket.request.max.bytes).
    frame_bytes_max: int = 100 * MIB
    # Requests of one connection decoded and not yet answered; reading pauses at the limit
    # (Kafka answers a connection's requests in order, so they queue here, not in memory).
    requests_in_flight_max: int = 16
    # Open Kafka connections a node admits; more are closed at once.
    connections_max: int = 4096
    # A Fetch's own max_wait_ms and a Produce's timeout_ms are capped at these.
    fetch_wait_ms_max: int = 60_000
    produce_timeout_ms_max: int = 300_000
    # KIP-848 subscriptions by regex (rpc/kafka/topic_regex.py): members this node keeps a
    # pattern for while it coordinates, a pattern's length, and the memory RE2 may use for
    # one compiled pattern (a pattern needing more is refused as invalid).
    topic_regex_members_max: int = 1024
    topic_regex_chars_max: int = 1024
    topic_regex_memory_bytes_max: int = 256 * KIB
    # Kafka's auto.create.topics.enable (off, as Redpanda's default): a Metadata request naming
    # an unknown topic, with allow_auto_topic_creation, has the controller create it
    # (rpc/kafka/auto_create.py) with num_partitions partitions and default_replication_factor
    # replicas, capped at the live nodes; both also fill in a CreateTopics' -1 (KIP-464).
    auto_create_topics_enable: bool = False
    num_partitions: int = 1
    default_replication_factor: int = 3
    # Auto-creations a node has on their way to the controller at once (more topics are
    # answered LEADER_NOT_AVAILABLE and created at a later Metadata), and how long one waits.
    auto_create_in_flight_max: int = 64
    auto_create_timeout_ms: int = 30_000
    # KIP-890 part 1 (raftlog/node/txn_verification.py): a partition leader accepts the first
    # transactional batch of a transaction only once its metadata copy shows the partition in
    # that transaction, waiting up to txn_verification_wait_ms for the copy to catch up.
    # Turning the check off is for tests only (the chaos suite shows its checker catches the
    # anomalies the check prevents).
    txn_verification: bool = True
    txn_verification_wait_ms: int = 1_000
    # Kafka's group.initial.rebalance.delay.ms, with its default: the first rebalance of an
    # empty classic group waits this long, and again while members keep joining (up to the
    # rebalance timeout), so consumers started together get their partitions in one
    # generation instead of one rebalance each. 0 completes the join at once.
    group_initial_rebalance_delay_ms: int = 3_000

    def validate(self) -> KafkaConfig:
        _require_positive_ints(self, zero_allowed=("group_initial_rebalance_delay_ms",))
        return self


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeConfig:
    """Everything a node runs with; sections are validated together."""

    # Partition groups send no commit-only appends (commit_notice); the broker keeps them for
    # the metadata group, whose followers act on what they apply.
    raft: RaftConfig = field(default_factory=lambda: RaftConfig(commit_notice="next_tick"))
    log: LogConfig = field(default_factory=LogConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    metadata: MetadataConfig = field(default_factory=MetadataConfig)
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    tick_interval_ms: int = 50
    # The node's event loop (raftlog.serve): "uvloop" runs it on uvloop when uvloop is
    # importable (else asyncio's own, with a log line saying so), "asyncio" on asyncio's.
    # uvloop, measured side by side on the 2-core VM (benchmarks/README.md "uvloop"): acks=all
    # throughput 1.8x (medians), open-loop p50 / p99 0.7x / 0.65x, node-to-node transport
    # 1.17x less CPU per byte; one record in flight through the gRPC client was slower in 3
    # of 4 rounds (through librdkafka even). Turn it off with --set event_loop=asyncio.
    event_loop: Literal["uvloop", "asyncio"] = "uvloop"
    # A host pass whose log writes total at most this many bytes (and that saves no hard
    # state) writes and fsyncs them on the event loop instead of a disk thread: the trip to
    # the thread costs more than a small fdatasync (raftlog.runtime.host). 0: always the
    # thread. A sync on the loop slower than sync_on_loop_slow_ms sends syncs to the thread
    # for a second, so a stalling disk does not stall the loop.
    sync_on_loop_bytes_max: int = 256 * KIB
    sync_on_loop_slow_ms: int = 5
    # When a flush's durable mark (raftlog.storage.durable_mark) is fsynced: "deferred" by
    # the node's mark thread, off the acknowledgement's path (one fsync in series instead of
    # two; a power loss in the moment after can leave a mark that claims less, never more);
    # "in_flush" before anything is acknowledged. docs/storage-faults.md, "What the mark
    # costs", has the measurement.
    durable_mark_sync: Literal["deferred", "in_flush"] = "deferred"
    # Partition groups a node creates in one turn of its event loop (a topic created, a
    # restart), bounded by count and by loop time (at least one a turn): the rest wait for
    # later turns, so heartbeats and the groups already running are served in between
    # (opening a group's storage costs several fsyncs, 3 ms on a quiet disk, far more on a
    # busy one).
    replica_creates_per_turn_max: int = 32
    replica_create_turn_ms_max: int = 20
    # Campaigns a node's groups start by their election timers, per second (a token bucket
    # of a second's worth; raftlog.runtime.host): a slow node whose timers all fire at once
    # spreads the elections out instead of adding their votes and saves to its load.
    campaigns_per_s_max: int = 500
    # Vote requests a node holds for partition groups it does not host yet (a new topic's
    # preferred replica campaigns before the others have created the group), each for one
    # election timeout, stepped when the group is added (raftlog.runtime.host); 0: dropped.
    vote_requests_held_max: int = 1024
    # How often each partition checks retention (whole segments, by bytes and age).
    retention_check_interval_ms: int = 5000
    # Retention by age and the cleaner's horizons read a wall clock that may run at most
    # this far ahead of the monotonic clock since its last trusted reading
    # (raftlog.runtime.clock.RetentionClock): a forward step of the wall clock beyond it
    # is held back instead of deleting young segments.
    retention_clock_slack_ms: int = 1000
    # The scrubber (raftlog.node.scrubber) re-reads every closed segment in the background
    # and checks every batch, at most this many bytes a second per node (0: off), in reads of
    # scrub_chunk_bytes, pausing scrub_round_pause_ms between rounds; damage it finds starts
    # the same repair as damage found at open (docs/storage-faults.md).
    scrub_bytes_per_s: int = 4 * MIB
    scrub_chunk_bytes: int = 1 * MIB
    scrub_round_pause_ms: int = 60_000
    # The log cleaner (raftlog.node.cleaner) visits compacted topics' logs every
    # cleaner_interval_ms and reads at most cleaner_bytes_per_s a second per node, on its own
    # thread (0: off). It costs about 0.075 CPU s per MB read (benchmarks/suites/
    # compaction.py) and shares the interpreter lock with the event loop, so the default
    # keeps it under a tenth of a core; docs/compaction.md.
    cleaner_bytes_per_s: int = 1 * MIB
    cleaner_interval_ms: int = 15_000
    # The metadata quorum snapshots its state after this many offsets (keeps its log short).
    metadata_snapshot_offsets: int = 2000
    # Per-client limits (raftlog.rpc.security): a client over one is refused with
    # RESOURCE_EXHAUSTED at once; the node and other clients are unaffected.
    client_requests_in_flight_max: int = 256
    produce_buffer_bytes_max: int = 256 * MIB
    client_streams_per_connection_max: int = 256
    # Idle client connections are closed after this long (gRPC's max_connection_idle_ms).
    client_connection_idle_ms_max: int = 300_000
    # Client connections a node admits from one IP address and in all (rpc/security.py).
    client_connections_per_address_max: int = 256
    client_connections_max: int = 4096
    # glibc malloc (raftlog.node.malloc_tuning): freed heap kept for reuse up to this many bytes,
    # and blocks below this size served from the heap instead of a fresh mmap, so buffers of
    # a batch are reused instead of page-faulted in anew for every request.
    malloc_trim_threshold_bytes: int = 256 * MIB
    malloc_mmap_threshold_bytes: int = 32 * MIB

    def validate(self) -> NodeConfig:
        self.raft.validate()
        self.log.validate()
        self.transport.validate()
        self.metadata.validate()
        self.kafka.validate()
        # An append holds up to append_bytes_max of entries plus always at least one batch,
        # so twice that bounds it; it must fit in one frame.
        _require(
            self.transport.frame_bytes_max > 2 * self.raft.append_bytes_max,
            "transport.frame_bytes_max",
            "must exceed twice raft.append_bytes_max so any AppendRequest fits in one frame",
        )
        _require(self.tick_interval_ms > 0, "tick_interval_ms", "must be positive")
        _require(
            self.event_loop in ("uvloop", "asyncio"),
            "event_loop",
            f"must be 'uvloop' or 'asyncio', got {self.event_loop!r}",
        )
        _require(
            self.durable_mark_sync in ("deferred", "in_flush"),
            "durable_mark_sync",
            f"must be 'deferred' or 'in_flush', got {self.durable_mark_sync!r}",
        )
        _require(
            self.sync_on_loop_bytes_max >= 0,
            "sync_on_loop_bytes_max",
            f"must be >= 0 (0: never sync on the loop), got {self.sync_on_loop_bytes_max}",
        )
        _require(
            0 < self.sync_on_loop_slow_ms < self.tick_interval_ms,
            "sync_on_loop_slow_ms",
            f"must be positive and below tick_interval_ms ({self.tick_interval_ms}), got "
            f"{self.sync_on_loop_slow_ms}",
        )
        _require(
            self.retention_check_interval_ms > 0,
            "retention_check_interval_ms",
            "must be positive",
        )
        _require(
            self.retention_clock_slack_ms >= 0,
            "retention_clock_slack_ms",
            f"must be >= 0, got {self.retention_clock_slack_ms}",
        )
        _require(
            self.replica_creates_per_turn_max > 0,
            "replica_creates_per_turn_max",
            f"must be positive, got {self.replica_creates_per_turn_max}",
        )
        _require(
            self.replica_create_turn_ms_max > 0,
            "replica_create_turn_ms_max",
            f"must be positive, got {self.replica_create_turn_ms_max}",
        )
        _require(
            self.campaigns_per_s_max > 0,
            "campaigns_per_s_max",
            f"must be positive, got {self.campaigns_per_s_max}",
        )
        _require(
            self.vote_requests_held_max >= 0,
            "vote_requests_held_max",
            f"must be >= 0 (0: dropped), got {self.vote_requests_held_max}",
        )
        _require(self.scrub_bytes_per_s >= 0, "scrub_bytes_per_s", "must be >= 0 (0: off)")
        _require(self.scrub_chunk_bytes > 0, "scrub_chunk_bytes", "must be positive")
        _require(self.scrub_round_pause_ms > 0, "scrub_round_pause_ms", "must be positive")
        _require(self.cleaner_bytes_per_s >= 0, "cleaner_bytes_per_s", "must be >= 0 (0: off)")
        _require(self.cleaner_interval_ms > 0, "cleaner_interval_ms", "must be positive")
        _require(
            self.kafka.num_partitions <= self.metadata.partitions_per_topic_max,
            "kafka.num_partitions",
            f"must not exceed metadata.partitions_per_topic_max ({self.kafka.num_partitions} > "
            f"{self.metadata.partitions_per_topic_max})",
        )
        _require(
            self.kafka.default_replication_factor <= self.metadata.replication_factor_max,
            "kafka.default_replication_factor",
            f"must not exceed metadata.replication_factor_max "
            f"({self.kafka.default_replication_factor} > {self.metadata.replication_factor_max})",
        )
        _require(
            self.raft.append_bytes_max >= self.log.batch_bytes_max,
            "raft.append_bytes_max",
            "must hold at least one batch of log.batch_bytes_max",
        )
        # Per-client limits.
        for name in (
            "client_requests_in_flight_max",
            "client_streams_per_connection_max",
            "client_connection_idle_ms_max",
            "client_connections_per_address_max",
        ):
            _require(getattr(self, name) > 0, name, "must be positive")
        _require(
            self.client_connections_per_address_max <= self.client_connections_max,
            "client_connections_per_address_max",
            f"must not exceed client_connections_max ({self.client_connections_per_address_max}"
            f" > {self.client_connections_max})",
        )
        _require(
            self.produce_buffer_bytes_max >= self.log.batch_bytes_max,
            "produce_buffer_bytes_max",
            "must hold at least one batch of log.batch_bytes_max",
        )
        _require(
            self.malloc_trim_threshold_bytes > 0,
            "malloc_trim_threshold_bytes",
            f"must be positive, got {self.malloc_trim_threshold_bytes}",
        )
        _require(
            0 < self.malloc_mmap_threshold_bytes <= MALLOC_MMAP_THRESHOLD_BYTES_MAX,
            "malloc_mmap_threshold_bytes",
            f"must be in (0, {MALLOC_MMAP_THRESHOLD_BYTES_MAX}] (glibc's limit), got "
            f"{self.malloc_mmap_threshold_bytes}",
        )
        return self
