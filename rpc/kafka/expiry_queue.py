"""One timer for every classic group member's session: the deadlines of (group id, member id)
keys in a heap, and one asyncio timer armed for the earliest.

Theory of operation. The coordinator pushes a key with its deadline when a member joins (or an
id is handed out); when the timer fires, every key whose deadline has passed is handed to
`on_due`, which either expires the member or, if it was heard from since, pushes it again at
its new deadline. So a live member has one entry, re-pushed about once per session timeout,
and a heartbeat costs no heap operation. An entry outlives its member when the member leaves
or is replaced (its id is then unknown, or its queued deadline differs, and `on_due` skips
it); such stale entries are dropped by rebuilding the heap from `live` whenever it grows past
twice its size after the last rebuild (and past `compact_floor`), so it never holds more than
twice the most members and ids the coordinator has held at once (themselves bounded by
`groups_max` and `group_members_max`), plus `compact_floor`.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable, Iterable

__all__ = ["ExpiryQueue"]

# (deadline ms, tie-breaker, group id, member id)
_Entry = tuple[int, int, str, str]


class ExpiryQueue:
    """Deadlines of (group id, member id) keys, fired in deadline order by one timer."""

    def __init__(
        self,
        *,
        clock_ms: Callable[[], int],
        on_due: Callable[[str, str, int], None],
        live: Callable[[], Iterable[tuple[int, str, str]]],
        compact_floor: int = 1024,
    ) -> None:
        assert compact_floor > 0
        self._clock_ms = clock_ms
        self._on_due = on_due  # (group id, member id, the deadline it was pushed with)
        self._live = live  # every (deadline, group id, member id) that should be queued
        self._compact_floor = compact_floor
        self._compact_at = compact_floor
        self._heap: list[_Entry] = []
        self._order = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_ms: int | None = None

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, deadline_ms: int, group_id: str, member_id: str) -> None:
        """Queue `member_id` of `group_id` to be handed to `on_due` once `deadline_ms` passed.
        Needs a running event loop (the timer is one of its callbacks)."""
        heapq.heappush(self._heap, (deadline_ms, next(self._order), group_id, member_id))
        if len(self._heap) > self._compact_at:
            self._rebuild()
        self._arm()

    def clear(self) -> None:
        """Forget every deadline and stop the timer."""
        self._heap.clear()
        self._compact_at = self._compact_floor
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._timer_ms = None

    def fire(self) -> None:
        """Hand every key whose deadline has passed to `on_due` (earliest first), then arm the
        timer for the next one; what `on_due` pushes meanwhile waits for a later turn."""
        self._timer = self._timer_ms = None
        now_ms = self._clock_ms()
        due: list[_Entry] = []
        while self._heap and self._heap[0][0] <= now_ms:
            due.append(heapq.heappop(self._heap))
        for deadline_ms, _, group_id, member_id in due:
            self._on_due(group_id, member_id, deadline_ms)
        self._arm()

    def _arm(self) -> None:
        if not self._heap:
            return
        first_ms = self._heap[0][0]
        if self._timer is not None and self._timer_ms is not None and self._timer_ms <= first_ms:
            return
        if self._timer is not None:
            self._timer.cancel()
        delay_s = max(0, first_ms - self._clock_ms()) / 1000
        self._timer = asyncio.get_running_loop().call_later(delay_s, self.fire)
        self._timer_ms = first_ms

    def _rebuild(self) -> None:
        """Keep only the entries `live` names (stale ones go)."""
        self._heap = [(d, next(self._order), g, m) for d, g, m in self._live()]
        heapq.heapify(self._heap)
        self._compact_at = max(self._compact_floor, 2 * len(self._heap))
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._timer_ms = None
