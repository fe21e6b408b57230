"""Everything one simulator run does, derived from its seed and printed before it starts.

Theory of operation. A run is a pure function of `(seed, nodes, steps, bugs)`: `derive_options`
draws every fault rate, tick skew and Raft timing from `random.Random(seed)` and returns one
frozen `SimOptions`; the run then draws every later choice from the same generator. Printing
`SimOptions.describe()` first means a failing seed can be replayed and read exactly.

Seeds pick a *fault profile* (calm, lossy, crashy, partitioned, churn, mixed) so that within a
few hundred seeds every kind of fault gets runs where it dominates: a bug that needs a crash
right after a vote shows in crashy runs, one that needs reordered appends in lossy ones, and
one that needs leaders to die soon after taking over (Raft Figure 8) in churn runs, which
kill the leader itself and keep appends small so a new leader catches followers up in
several rounds.

The simulator's own bounds (in-flight messages, trace length, ready rounds) live here rather
than in `raftlog.config`: they bound the test harness, not a production node.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, fields
from typing import Any

from raftlog.config import COMMIT_NOTICES, PLANTED_BUGS, CommitNotice, RaftConfig
from raftlog.errors import ConfigError

__all__ = ["PROFILES", "SimOptions", "derive_options", "parse_seed_range", "scripted_options"]

PROFILES = ("calm", "lossy", "crashy", "partitioned", "churn", "mixed")

# Bounds of the harness itself.
MESSAGES_IN_FLIGHT_MAX = 4096
TRACE_EVENTS_MAX = 30
READY_ROUNDS_MAX = 16
PROPOSAL_OFFSETS_MAX = 3
# Every seed's restarts may find synced data lost (raftlog.raft.repair is always exercised).
STORAGE_FAULT_RATE = 0.25


@dataclass(frozen=True, slots=True, kw_only=True)
class SimOptions:
    """One run's knobs. Rates are per step (one virtual tick) unless the name says otherwise."""

    seed: int
    nodes: int
    steps: int
    profile: str
    bugs: frozenset[str]
    election_timeout_ticks: int
    heartbeat_interval_ticks: int
    pre_vote: bool
    check_quorum: bool
    tick_rates: tuple[float, ...]  # ticks per step for each node: uneven clocks
    drop_rate: float  # per message
    duplicate_rate: float  # per message
    delay_ticks_max: int  # each message waits 1..delay_ticks_max steps: reordering
    partition_rate: float  # chance per step that the partition changes
    crash_rate: float  # chance per step that an up node crashes between steps
    power_failure_rate: float  # chance per step that every up node crashes at once
    leader_crash_rate: float  # chance per step that the current leader crashes
    io_crash_rate: float  # chance per log write or sync that the node dies right there
    save_crash_rate: float  # chance per hard state save (a vote, a term) that it dies there
    torn_writes: bool  # a crash may keep part of the last unsynced append
    # Chance per restart that the stopped node's disk lost synced data (a minority at most).
    storage_fault_rate: float
    restart_delay_ticks_max: int
    propose_rate: float
    append_bytes_max: int
    membership_rate: float
    compaction_rate: float
    transfer_rate: float
    read_rate: float
    campaign_rate: float
    checkpoint_applied: bool  # restart with applied_offset = the durably applied offset
    heal_ticks_max: int
    # Check protocol rules where they apply: votes and acknowledgements leave only once
    # durable, a leader commits by counting only entries of its term (off: end-to-end only).
    protocol_checks: bool = True
    # Quiescence with node liveness (raftlog.raft.quiesce): every step each up node hears
    # every peer whose link to it is open (one heartbeat per node pair, like the transport);
    # a peer unheard for `node_liveness_timeout_ticks` (0: one election timeout) is unreachable.
    quiesce: bool = True
    node_liveness_timeout_ticks: int = 0
    commit_notice: CommitNotice = "immediate"
    messages_in_flight_max: int = MESSAGES_IN_FLIGHT_MAX
    trace_events_max: int = TRACE_EVENTS_MAX

    def __post_init__(self) -> None:
        if self.nodes not in (3, 5):
            raise ConfigError(f"nodes: must be 3 or 5, got {self.nodes}")
        if self.steps < 1:
            raise ConfigError(f"steps: must be positive, got {self.steps}")
        unknown = sorted(self.bugs - PLANTED_BUGS.keys())
        if unknown:
            raise ConfigError(f"bugs: unknown planted bug names {unknown}")
        assert len(self.tick_rates) == self.nodes, self.tick_rates
        assert self.profile in PROFILES, self.profile
        if self.node_liveness_timeout_ticks < 0:
            raise ConfigError(
                f"node_liveness_timeout_ticks: must be >= 0, got {self.node_liveness_timeout_ticks}"
            )

    def liveness_timeout_ticks(self) -> int:
        return self.node_liveness_timeout_ticks or self.election_timeout_ticks

    def raft_config(self) -> RaftConfig:
        # Small byte bounds so pipelining, batching and flow control are exercised.
        return RaftConfig(
            election_timeout_ticks=self.election_timeout_ticks,
            heartbeat_interval_ticks=self.heartbeat_interval_ticks,
            pre_vote=self.pre_vote,
            check_quorum=self.check_quorum,
            inflight_messages_max=8,
            inflight_bytes_max=4096,
            append_bytes_max=self.append_bytes_max,
            uncommitted_bytes_max=16384,
            apply_bytes_max=2048,
            stable_cache_bytes_max=1024,  # below apply_bytes_max: some applies read storage
            quiesce=self.quiesce,
            commit_notice=self.commit_notice,
            planted_bugs=self.bugs,
        ).validate()

    def describe(self) -> str:
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float):
                value = f"{value:.3f}"
            elif isinstance(value, tuple):
                value = ",".join(f"{v:.2f}" for v in value)
            elif isinstance(value, frozenset):
                value = ",".join(sorted(value)) or "-"
            parts.append(f"{f.name}={value}")
        return " ".join(parts)


def _fault_rates(rng: random.Random, profile: str) -> dict[str, float | int | bool]:
    """Draw the network, crash and disk fault mix of one profile."""
    lossy = profile in ("lossy", "mixed")
    crashy = profile in ("crashy", "mixed")
    churn = profile == "churn"
    parted = profile in ("partitioned", "mixed")
    calm = profile == "calm"
    return {
        "drop_rate": rng.uniform(0.05, 0.3) if lossy else rng.uniform(0.0, 0.03),
        "duplicate_rate": rng.uniform(0.02, 0.2) if lossy else rng.uniform(0.0, 0.02),
        "delay_ticks_max": rng.randint(3, 12) if lossy else rng.randint(1, 4),
        "partition_rate": rng.uniform(0.02, 0.08) if parted else (0.0 if calm else 0.005),
        "crash_rate": rng.uniform(0.01, 0.04) if crashy else (0.0 if calm else 0.003),
        "power_failure_rate": rng.uniform(0.002, 0.01) if crashy else 0.0,
        "leader_crash_rate": rng.uniform(0.02, 0.08) if churn else 0.0,
        "io_crash_rate": rng.uniform(0.005, 0.03) if crashy else (0.0 if calm else 0.001),
        "save_crash_rate": rng.uniform(0.05, 0.3) if crashy else (0.0 if calm else 0.002),
        "append_bytes_max": 256 if churn else rng.choice((256, 1024)),
        "torn_writes": rng.random() < 0.7,
        # Quick restarts in crashy runs: a node back within a message delay answers requests
        # that were sent to its previous incarnation (the window of a lost vote).
        "restart_delay_ticks_max": rng.randint(1, 8) if crashy or churn else rng.randint(1, 40),
    }


def derive_options(
    seed: int,
    *,
    nodes: int | None,
    steps: int,
    bugs: frozenset[str] = frozenset(),
    protocol_checks: bool = True,
    profile: str | None = None,
) -> tuple[SimOptions, random.Random]:
    """Draw a run's options from `seed`; return them with the generator the run continues on.

    `profile` forces a fault profile (the draw still happens, so nothing else shifts)."""
    rng = random.Random(seed)
    node_count = nodes if nodes is not None else (3 if seed % 2 else 5)
    drawn_profile = rng.choice(PROFILES)
    if profile is not None and profile not in PROFILES:
        raise ConfigError(f"profile: expected one of {PROFILES}, got {profile!r}")
    profile = profile or drawn_profile
    election_timeout_ticks = rng.randint(8, 20)
    skew = rng.choice((0.0, 0.1, 0.3))
    options = SimOptions(
        seed=seed,
        nodes=node_count,
        steps=steps,
        profile=profile,
        bugs=bugs,
        election_timeout_ticks=election_timeout_ticks,
        heartbeat_interval_ticks=rng.randint(1, max(1, election_timeout_ticks // 4)),
        pre_vote=rng.random() < 0.75,
        check_quorum=rng.random() < 0.75,
        tick_rates=tuple(rng.uniform(1.0 - skew, 1.0 + skew) for _ in range(node_count)),
        propose_rate=rng.uniform(0.1, 0.6),
        membership_rate=rng.choice((0.0, 0.01, 0.03)),
        compaction_rate=rng.choice((0.0, 0.01, 0.05)),
        transfer_rate=rng.choice((0.0, 0.005, 0.02)),
        read_rate=rng.choice((0.0, 0.02, 0.1)),
        campaign_rate=rng.choice((0.0, 0.005)),
        checkpoint_applied=rng.random() < 0.5,
        heal_ticks_max=40 * election_timeout_ticks,
        protocol_checks=protocol_checks,
        # From the seed's bits, not the generator, so adding it shifted no other draw.
        commit_notice=COMMIT_NOTICES[(seed // 2) % len(COMMIT_NOTICES)],
        storage_fault_rate=STORAGE_FAULT_RATE,
        **_fault_rates(rng, profile),  # type: ignore[arg-type]
    )
    return options, rng


def scripted_options(
    *, nodes: int = 3, bugs: frozenset[str] = frozenset(), **overrides: Any
) -> SimOptions:
    """Options with every fault and random action off, for scenarios that script their own
    partitions, crashes and proposals against a `Cluster` (e.g. Raft's Figure 8)."""
    quiet: dict[str, Any] = {
        "seed": 0,
        "nodes": nodes,
        "steps": 1,
        "profile": "calm",
        "bugs": bugs,
        "election_timeout_ticks": 30,
        "heartbeat_interval_ticks": 3,
        "pre_vote": False,
        "check_quorum": False,
        "tick_rates": (1.0,) * nodes,
        "drop_rate": 0.0,
        "duplicate_rate": 0.0,
        "delay_ticks_max": 1,
        "partition_rate": 0.0,
        "crash_rate": 0.0,
        "power_failure_rate": 0.0,
        "leader_crash_rate": 0.0,
        "io_crash_rate": 0.0,
        "save_crash_rate": 0.0,
        "torn_writes": False,
        "storage_fault_rate": 0.0,
        "restart_delay_ticks_max": 1,
        "propose_rate": 0.0,
        "append_bytes_max": 256,
        "membership_rate": 0.0,
        "compaction_rate": 0.0,
        "transfer_rate": 0.0,
        "read_rate": 0.0,
        "campaign_rate": 0.0,
        "checkpoint_applied": False,
        "heal_ticks_max": 600,
    }
    return SimOptions(**(quiet | overrides))


def parse_seed_range(text: str) -> range:
    """`"7"` -> range(7, 8); `"1-2000"` -> range(1, 2001)."""
    first, _, last = text.partition("-")
    try:
        start = int(first)
        stop = int(last) if last else start
    except ValueError:
        raise ConfigError(f"--seeds: expected N or A-B, got {text!r}") from None
    if stop < start or start < 0:
        raise ConfigError(f"--seeds: empty or negative range {text!r}")
    return range(start, stop + 1)
