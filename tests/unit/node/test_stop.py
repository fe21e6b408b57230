"""A node's stop ends every task it runs, even one that swallowed a cancellation (as
`asyncio.wait_for` does on Python 3.11 when its future completes in the same turn)."""

from __future__ import annotations

import asyncio

from raftlog.node.node import _cancel_all


def test_a_task_that_swallowed_a_cancellation_is_cancelled_again() -> None:
    swallowed: list[int] = []

    async def stubborn() -> None:
        for attempt in range(3):
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                swallowed.append(attempt)
                if attempt < 2:
                    continue
                raise

    async def well_behaved() -> None:
        await asyncio.sleep(3600)

    async def scenario() -> None:
        tasks = {asyncio.create_task(stubborn()), asyncio.create_task(well_behaved())}
        await asyncio.sleep(0)
        await asyncio.wait_for(_cancel_all(tasks), 5.0)
        assert all(task.cancelled() for task in tasks)

    asyncio.run(scenario())
    assert swallowed == [0, 1, 2]


def test_a_task_that_failed_meanwhile_has_its_error_retrieved() -> None:
    async def failing() -> None:
        raise RuntimeError("already logged where it happened")

    async def scenario() -> None:
        task = asyncio.create_task(failing())
        await asyncio.sleep(0)
        await _cancel_all({task})
        assert task.done() and not task.cancelled()

    asyncio.run(scenario())
