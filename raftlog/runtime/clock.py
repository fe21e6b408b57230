"""The monotonic clock port: what leases and controller duties measure silence with.

A node's lease and the controller's view of each node's silence are durations on this node's
own monotonic clock, never compared with another node's clock (and never the wall clock,
which `--chaos` can move). The port lets tests drive both on a `FakeMonotonicClock` without
sleeping; production uses `SystemMonotonicClock`.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from raftlog.storage.wall_clock import WallClock

__all__ = ["FakeMonotonicClock", "MonotonicClock", "RetentionClock", "SystemMonotonicClock"]

log = logging.getLogger(__name__)


class MonotonicClock(Protocol):
    def monotonic(self) -> float:
        """Seconds since an arbitrary start; never goes backward."""
        ...


class SystemMonotonicClock:
    def monotonic(self) -> float:
        return time.monotonic()


class FakeMonotonicClock:
    """A clock that moves only when told to (tests)."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self._now_s = start_s

    def monotonic(self) -> float:
        return self._now_s

    def advance(self, seconds: float) -> None:
        assert seconds >= 0, f"a monotonic clock never goes backward ({seconds} s)"
        self._now_s += seconds


class RetentionClock:
    """Wall time for deleting data by age (retention.ms, the cleaner's tombstone and
    compaction-lag horizons): the wall clock, except that it never runs further ahead of
    the last reading it trusted than the monotonic clock ran since, plus `slack_ms`.

    Why: retention compares this node's wall clock with the batches' timestamps, so a
    forward step of the wall clock (a wrong NTP step, a VM restored from a snapshot)
    would delete at once every segment younger than the step, on each replica whose clock
    stepped, records acknowledged seconds before among them. Held back, such a node
    deletes late instead of early; a backward step is followed at once (also late). A
    reading within the bound is trusted and becomes the new anchor, so NTP's slewing (well
    under `slack_ms` between two readings) is followed. The guard lasts while the node
    runs: a node started with its clock already wrong takes that clock as wall time.
    """

    def __init__(self, wall: WallClock, monotonic: MonotonicClock, *, slack_ms: int) -> None:
        assert slack_ms >= 0, slack_ms
        self._wall = wall
        self._monotonic = monotonic
        self._slack_ms = slack_ms
        self._anchor: tuple[int, float] | None = None  # (trusted wall ms, monotonic s)
        self.held_back_ms = 0  # how far the last reading was held back (0: trusted)

    def now_ms(self) -> int:
        wall_ms = self._wall.now_ms()
        monotonic_s = self._monotonic.monotonic()
        if self._anchor is None:
            self._anchor = (wall_ms, monotonic_s)
            return wall_ms
        anchor_ms, anchor_s = self._anchor
        bound_ms = anchor_ms + int((monotonic_s - anchor_s) * 1000) + self._slack_ms
        if wall_ms <= bound_ms:
            if self.held_back_ms:
                log.info("wall clock back within the monotonic bound: retention follows it")
            self._anchor = (wall_ms, monotonic_s)
            self.held_back_ms = 0
            return wall_ms
        if not self.held_back_ms:
            log.warning(
                "wall clock stepped %d ms ahead of the monotonic clock: retention and "
                "compaction horizons follow the monotonic clock (they delete late, never early)",
                wall_ms - bound_ms,
            )
        # Not re-anchored: the bound keeps tracking the monotonic clock from the last
        # trusted reading instead of creeping ahead by the slack on every call.
        self.held_back_ms = wall_ms - bound_ms
        return bound_ms
