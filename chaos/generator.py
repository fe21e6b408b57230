"""Generators: when faults start and stop, and how fast clients invoke operations.

Theory of operation. The fault schedule is decided up front from the seed, as data: a quiet
gap, then a fault held for a while, then healed, again and again until the load phase ends,
so every fault is healed before the final read. Gaps and holds are drawn uniformly within
bounds so faults land at different points of elections and recoveries. Which nodes a fault
hits is decided only when it starts (`raftlog.chaos.nemesis.plan_fault`), because the
leaders move. `RateLimiter` spaces one worker's invocations on an injected clock.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["PlannedFault", "RateLimiter", "fault_schedule"]


@dataclass(frozen=True, slots=True)
class PlannedFault:
    start_s: float
    stop_s: float
    nemesis: str

    def __post_init__(self) -> None:
        assert 0 <= self.start_s < self.stop_s, self


def fault_schedule(
    rng: random.Random,
    nemeses: Sequence[str],
    *,
    duration_s: float,
    gap_s: tuple[float, float] = (2.0, 5.0),
    hold_s: tuple[float, float] = (2.0, 6.0),
    faults_max: int = 1000,
) -> list[PlannedFault]:
    """Non-overlapping faults within [0, duration_s), each healed before duration_s."""
    assert duration_s > 0 and 0 < gap_s[0] <= gap_s[1] and 0 < hold_s[0] <= hold_s[1]
    schedule: list[PlannedFault] = []
    if not nemeses:
        return schedule
    now = rng.uniform(*gap_s)
    while len(schedule) < faults_max:
        hold = rng.uniform(*hold_s)
        if now + hold >= duration_s:
            break
        schedule.append(PlannedFault(now, now + hold, rng.choice(list(nemeses))))
        now += hold + rng.uniform(*gap_s)
    assert all(a.stop_s < b.start_s for a, b in itertools.pairwise(schedule))
    return schedule


class RateLimiter:
    """Invocations at most `rate_per_s`, evenly spaced; `wait` sleeps through `sleep`."""

    def __init__(
        self, rate_per_s: float, *, clock: Callable[[], float], sleep: Callable[[float], object]
    ) -> None:
        assert rate_per_s > 0
        self._interval_s = 1.0 / rate_per_s
        self._clock = clock
        self._sleep = sleep
        self._next_s = clock()

    def wait(self) -> None:
        """Sleep until the next slot, at least one interval after the previous one; a caller that
        fell behind gets no burst to catch up."""
        now = self._clock()
        if self._next_s > now:
            self._sleep(self._next_s - now)
        # Falling behind does not earn a burst: the next slot is at least one interval away.
        self._next_s = max(self._next_s, now) + self._interval_s
        assert self._next_s > now
