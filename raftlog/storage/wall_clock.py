"""The wall-clock port: milliseconds since the Unix epoch (segment age, retention, timestamps).

`SystemWallClock` reads the operating system's clock; `ManualWallClock` moves only when told
(the simulator, tests). Durations are measured on the monotonic clock instead
(`raftlog.runtime.clock`), never on this one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

__all__ = ["ManualWallClock", "SystemWallClock", "WallClock"]


class WallClock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock time in milliseconds since the Unix epoch."""
        ...


class SystemWallClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


@dataclass
class ManualWallClock:
    """A clock that moves only when told to."""

    time_ms: int = 0

    def now_ms(self) -> int:
        return self.time_ms

    def advance(self, delta_ms: int) -> None:
        assert delta_ms >= 0, delta_ms
        self.time_ms += delta_ms
