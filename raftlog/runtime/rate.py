"""A token bucket on the monotonic-clock port: at most `per_s_max` events a second, with
bursts of up to one second's worth, for the runtime's storm breakers (campaigns a node
starts, leadership handoffs of a fenced node). Tested on `FakeMonotonicClock`."""

from __future__ import annotations

from raftlog.runtime.clock import MonotonicClock

__all__ = ["TokenBucket"]


class TokenBucket:
    def __init__(self, per_s_max: int, clock: MonotonicClock) -> None:
        assert per_s_max > 0, per_s_max
        self.per_s_max = per_s_max
        self._clock = clock
        self._tokens = float(per_s_max)  # full: a node starts with a second's worth
        self._refilled_at = clock.monotonic()

    def available(self) -> bool:
        """Whether one event may happen now (refills first)."""
        now = self._clock.monotonic()
        elapsed_s = now - self._refilled_at
        assert elapsed_s >= 0, "the monotonic clock went backward"
        self._tokens = min(float(self.per_s_max), self._tokens + elapsed_s * self.per_s_max)
        self._refilled_at = now
        return self._tokens >= 1

    def take(self) -> None:
        """Count one event (after `available`; an event the bucket could not refuse, such
        as one already under way, may take it below zero: it is paid back first)."""
        self._tokens -= 1
