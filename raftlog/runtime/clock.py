"""The monotonic clock port: what leases and controller duties measure silence with.

A node's lease and the controller's view of each node's silence are durations on this node's
own monotonic clock, never compared with another node's clock (and never the wall clock,
which `--chaos` can move). The port lets tests drive both on a `FakeMonotonicClock` without
sleeping; production uses `SystemMonotonicClock`.
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["FakeMonotonicClock", "MonotonicClock", "SystemMonotonicClock"]


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
