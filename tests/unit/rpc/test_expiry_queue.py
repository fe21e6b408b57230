"""The classic group coordinator's session timer: deadlines fire in order on one timer, and the
heap of deadlines stays within twice the most live entries it held, however many members come
and go."""

from __future__ import annotations

import asyncio

from raftlog.rpc.kafka.expiry_queue import ExpiryQueue


class FakeClock:
    def __init__(self) -> None:
        self.now_ms = 0

    def __call__(self) -> int:
        return self.now_ms


def test_due_entries_fire_in_deadline_order_and_later_ones_wait() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        fired: list[tuple[str, str, int]] = []
        queue = ExpiryQueue(
            clock_ms=clock, on_due=lambda g, m, d: fired.append((g, m, d)), live=lambda: ()
        )
        queue.push(30, "g", "late")
        queue.push(10, "g", "early")
        queue.push(1_000_000, "g", "much later")
        clock.now_ms = 40
        queue.fire()
        assert fired == [("g", "early", 10), ("g", "late", 30)] and len(queue) == 1
        queue.clear()
        assert len(queue) == 0

    asyncio.run(scenario())


def test_stale_entries_are_dropped_when_the_heap_outgrows_the_live_ones() -> None:
    async def scenario() -> None:
        live: dict[str, int] = {}
        queue = ExpiryQueue(
            clock_ms=FakeClock(),
            on_due=lambda g, m, d: None,
            live=lambda: [(d, "g", m) for m, d in live.items()],
            compact_floor=8,
        )
        peak = 0
        for i in range(1000):  # members joining and leaving: one stays each round of ten
            member = f"m{i}"
            live[member] = 10_000 + i
            queue.push(live[member], "g", member)
            peak = max(peak, len(live))
            if i % 10:
                del live[member]
            assert len(queue) <= max(8, 2 * peak) + 1, (i, len(queue), peak)

    asyncio.run(scenario())
