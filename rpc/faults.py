"""Fault injection for the node-to-node transport: partitions, loss, duplication, delay, reorder.

Theory of operation. A node started with the explicit chaos flag builds one `FaultInjector` and
hands it to its `PeerTransport`; without the flag the transport gets None and never consults
anything (not even an attribute check per message: one `is None` test per frame). The chaos
suite changes the rules at run time through a small admin API (`block`, `unblock`,
`set_link`, `heal`, `state`), which an admin RPC will call on each node.

The transport asks once per outgoing frame (`outgoing(peer) -> FrameFate`) and once per
incoming frame (`allow_incoming(peer) -> bool`). Faults act on whole frames, which is what the
network would do to a TCP segment carrying them, lifted to where the kernel cannot help
(this kernel lacks netem):

- block: frames to (OUTGOING) and/or from (INCOMING) a peer vanish. A partition between
  halves A and B blocks each node of B on every node of A and vice versa; a one-way partition
  A -> B blocks B as OUTGOING on A (or A as INCOMING on B).
- drop with probability p, duplicate with probability p (the frame goes twice), delay by
  `delay_ms` plus a uniform jitter in [0, `delay_jitter_ms`], and reorder with probability p
  (the frame is held back and sent right after the next frame to that peer, or after
  `reorder_window_ms` if none comes).

All randomness comes from the `random.Random` passed in, so a chaos run replays from its seed.
Rules for one peer (`set_link(peer, ...)`) override the default rule (`set_link(None, ...)`).

Marker holds. `hold_txn_markers` makes this node, as a partition leader, refuse every
transaction marker (COMMIT/ABORT) it is asked to write, answering REQUEST_TIMED_OUT as if
the write had timed out, so the coordinator keeps retrying: a test stops a transaction
between its decision (PrepareCommit/PrepareAbort, committed) and its markers on this node's
partitions, deterministically, then kills the node or lifts the hold (`heal` lifts it too).

Clock faults. The injector also owns the node's wall clock (`ChaosClock`): the system clock
plus a settable offset and an optional rate, so the chaos suite can jump one node's clock by
minutes or skew nodes against each other (`set_clock`; `heal` puts it back on the system
clock). A node without --chaos reads the storage `SystemClock` directly and never sees this.
"""

from __future__ import annotations

import enum
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from raftlog.errors import ConfigError
from raftlog.types import NodeId

__all__ = [
    "DELIVER",
    "ChaosClock",
    "Direction",
    "FaultCounters",
    "FaultInjector",
    "FaultState",
    "FrameFate",
    "LinkFaults",
]


class Direction(enum.Flag):
    OUTGOING = enum.auto()
    INCOMING = enum.auto()
    BOTH = OUTGOING | INCOMING


def _probability(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"{name}: a probability must be in [0, 1], got {value}")


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkFaults:
    """What happens to frames on one link (or on every link, as the default rule)."""

    drop_probability: float = 0.0
    duplicate_probability: float = 0.0
    reorder_probability: float = 0.0
    reorder_window_ms: int = 100
    delay_ms: int = 0
    delay_jitter_ms: int = 0

    def __post_init__(self) -> None:
        _probability("drop_probability", self.drop_probability)
        _probability("duplicate_probability", self.duplicate_probability)
        _probability("reorder_probability", self.reorder_probability)
        for name in ("reorder_window_ms", "delay_ms", "delay_jitter_ms"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}: must not be negative, got {getattr(self, name)}")

    @property
    def is_clean(self) -> bool:
        return self == CLEAN


CLEAN = LinkFaults()


@dataclass(frozen=True, slots=True)
class FrameFate:
    """The injector's verdict on one outgoing frame."""

    copies: int  # 0: dropped, 1: delivered, 2: duplicated
    delay_s: float = 0.0
    hold_back_s: float | None = None  # reorder: held until the next frame, at most this long

    def __post_init__(self) -> None:
        assert 0 <= self.copies <= 2, self
        assert self.delay_s >= 0.0, self


DELIVER = FrameFate(1)
DROP = FrameFate(0)


@dataclass(slots=True)
class FaultCounters:
    """Frames each rule acted on; the chaos suite reads them to confirm a fault took effect."""

    blocked_outgoing: int = 0
    blocked_incoming: int = 0
    dropped: int = 0
    duplicated: int = 0
    delayed: int = 0
    reordered: int = 0
    held_txn_markers: int = 0  # markers refused under hold_txn_markers


@dataclass(frozen=True, slots=True)
class FaultState:
    """The rules in force, for status pages and the admin RPC."""

    blocked_outgoing: frozenset[NodeId]
    blocked_incoming: frozenset[NodeId]
    default_link: LinkFaults
    links: dict[NodeId, LinkFaults] = field(default_factory=dict)


class ChaosClock:
    """Wall-clock milliseconds (the storage `Clock` port) that the chaos suite can move.

    It reads the system clock plus `offset_ms`, running at `rate` (1.0: real speed) since the
    rate was last set; the time gained or lost at earlier rates is kept in `_drift_ns`, so a
    rate change never jumps the clock. `source_ns` is the system clock; a test passes its own.
    """

    def __init__(self, source_ns: Callable[[], int] = time.time_ns) -> None:
        self._source_ns = source_ns
        self.offset_ms = 0
        self.rate = 1.0
        self._anchor_ns = source_ns()
        self._drift_ns = 0

    def now_ms(self) -> int:
        now_ns = self._source_ns()
        return (now_ns + self._gained_ns(now_ns)) // 1_000_000 + self.offset_ms

    def _gained_ns(self, now_ns: int) -> int:
        return self._drift_ns + int((now_ns - self._anchor_ns) * (self.rate - 1.0))

    def set(self, *, offset_ms: int | None = None, rate: float | None = None) -> None:
        """Offset the clock by `offset_ms` from the system clock and/or run it at `rate`."""
        if rate is not None:
            if not 0.0 < rate <= 100.0:
                raise ConfigError(f"clock rate: must be in (0, 100], got {rate}")
            now_ns = self._source_ns()
            self._drift_ns = self._gained_ns(now_ns)
            self._anchor_ns = now_ns
            self.rate = rate
        if offset_ms is not None:
            if abs(offset_ms) > _CLOCK_OFFSET_MS_MAX:
                raise ConfigError(
                    f"clock offset_ms: at most {_CLOCK_OFFSET_MS_MAX} either way, got {offset_ms}"
                )
            self.offset_ms = offset_ms

    def reset(self) -> None:
        """Back on the system clock (heal): no offset, real speed, no drift kept."""
        self.offset_ms = 0
        self.rate = 1.0
        self._drift_ns = 0
        self._anchor_ns = self._source_ns()

    @property
    def is_clean(self) -> bool:
        return self.offset_ms == 0 and self.rate == 1.0 and self._drift_ns == 0


# A day either way: enough for any jump a test wants, and a typo (seconds for ms) is caught.
_CLOCK_OFFSET_MS_MAX = 86_400_000


class FaultInjector:
    """Rules consulted by the transport per frame; every change takes effect on the next frame."""

    def __init__(self, *, rng: random.Random, clock: ChaosClock | None = None) -> None:
        self._rng = rng
        self.clock = clock or ChaosClock()
        self._blocked_outgoing: set[NodeId] = set()
        self._blocked_incoming: set[NodeId] = set()
        self._default_link = CLEAN
        self._links: dict[NodeId, LinkFaults] = {}
        self.counters = FaultCounters()
        self.active = False  # False: every frame is delivered untouched
        # True: markers for partitions this node leads are refused (module docstring).
        self.holds_txn_markers = False

    # --- admin API (called by the chaos suite through an admin RPC) ---

    def block(self, peer: NodeId, *, direction: Direction = Direction.BOTH) -> None:
        if Direction.OUTGOING in direction:
            self._blocked_outgoing.add(peer)
        if Direction.INCOMING in direction:
            self._blocked_incoming.add(peer)
        self._update_active()

    def unblock(self, peer: NodeId, *, direction: Direction = Direction.BOTH) -> None:
        if Direction.OUTGOING in direction:
            self._blocked_outgoing.discard(peer)
        if Direction.INCOMING in direction:
            self._blocked_incoming.discard(peer)
        self._update_active()

    def set_link(self, peer: NodeId | None, faults: LinkFaults) -> None:
        """Faults on frames to `peer`, or the default for every peer without its own rule."""
        if peer is None:
            self._default_link = faults
        elif faults.is_clean and self._default_link.is_clean:
            self._links.pop(peer, None)
        else:
            self._links[peer] = faults
        self._update_active()

    def set_clock(self, *, offset_ms: int | None = None, rate: float | None = None) -> None:
        """Move this node's wall clock (see `ChaosClock.set`)."""
        self.clock.set(offset_ms=offset_ms, rate=rate)

    def hold_txn_markers(self, hold: bool) -> None:
        """Refuse (True) or write again (False) the transaction markers this node leads."""
        self.holds_txn_markers = hold

    def heal(self) -> None:
        """Remove every rule: the network is whole again, the clock is the system's and
        markers are written."""
        self.clock.reset()
        self.holds_txn_markers = False
        self._blocked_outgoing.clear()
        self._blocked_incoming.clear()
        self._default_link = CLEAN
        self._links.clear()
        self._update_active()
        assert not self.active

    def state(self) -> FaultState:
        return FaultState(
            frozenset(self._blocked_outgoing),
            frozenset(self._blocked_incoming),
            self._default_link,
            dict(self._links),
        )

    def _update_active(self) -> None:
        self.active = bool(
            self._blocked_outgoing
            or self._blocked_incoming
            or not self._default_link.is_clean
            or any(not link.is_clean for link in self._links.values())
        )

    # --- transport API ---

    def allow_incoming(self, peer: NodeId) -> bool:
        if peer in self._blocked_incoming:
            self.counters.blocked_incoming += 1
            return False
        return True

    def outgoing(self, peer: NodeId) -> FrameFate:
        if peer in self._blocked_outgoing:
            self.counters.blocked_outgoing += 1
            return DROP
        link = self._links.get(peer, self._default_link)
        if link.is_clean:
            return DELIVER
        return self._roll(link)

    def _roll(self, link: LinkFaults) -> FrameFate:
        # One draw per rule, always in the same order, so a seed replays the same fates.
        rng = self._rng
        dropped = rng.random() < link.drop_probability
        duplicated = rng.random() < link.duplicate_probability
        reordered = rng.random() < link.reorder_probability
        jitter_ms = rng.uniform(0, link.delay_jitter_ms) if link.delay_jitter_ms else 0.0
        if dropped:
            self.counters.dropped += 1
            return DROP
        delay_s = (link.delay_ms + jitter_ms) / 1000
        self.counters.duplicated += duplicated
        self.counters.delayed += delay_s > 0
        self.counters.reordered += reordered
        hold_back_s = link.reorder_window_ms / 1000 if reordered else None
        return FrameFate(2 if duplicated else 1, delay_s, hold_back_s)
