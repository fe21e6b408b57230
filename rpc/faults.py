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
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, field

from raftlog.errors import ConfigError
from raftlog.types import NodeId

__all__ = [
    "DELIVER",
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


@dataclass(frozen=True, slots=True)
class FaultState:
    """The rules in force, for status pages and the admin RPC."""

    blocked_outgoing: frozenset[NodeId]
    blocked_incoming: frozenset[NodeId]
    default_link: LinkFaults
    links: dict[NodeId, LinkFaults] = field(default_factory=dict)


class FaultInjector:
    """Rules consulted by the transport per frame; every change takes effect on the next frame."""

    def __init__(self, *, rng: random.Random) -> None:
        self._rng = rng
        self._blocked_outgoing: set[NodeId] = set()
        self._blocked_incoming: set[NodeId] = set()
        self._default_link = CLEAN
        self._links: dict[NodeId, LinkFaults] = {}
        self.counters = FaultCounters()
        self.active = False  # False: every frame is delivered untouched

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

    def heal(self) -> None:
        """Remove every rule: the network is whole again."""
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
