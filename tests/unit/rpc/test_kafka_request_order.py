"""The Kafka listener's order of a connection's requests (`rpc.kafka.server.in_order`).

A pipelining producer's Produce requests must reach their partitions in the order sent, or
the partition refuses the later batch OUT_OF_ORDER_SEQUENCE after acknowledging the earlier
one, which librdkafka takes as fatal. The race these tests pin down was found by
tests/kafka/test_transaction_faults.py on a loaded machine: a Produce that waited for an
earlier Metadata request resumes a turn of the loop after that request is served, and a
Produce arriving in that turn, with nothing left to wait for, used to begin first.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Coroutine
from typing import Any

from raftlog.rpc.kafka.frame import RequestHeader
from raftlog.rpc.kafka.server import PRODUCE_API_KEY, _Pending, in_order

METADATA_API_KEY = 3


class _Connection:
    """The listener's bookkeeping of one connection, with handlers that record when they
    begin (what reaching the partition is, for a Produce: its first step proposes)."""

    def __init__(self) -> None:
        self.pending: collections.deque[_Pending] = collections.deque()
        self.begun: list[str] = []

    def start(
        self, name: str, api_key: int, body: Coroutine[Any, Any, None] | None = None
    ) -> _Pending:
        request = _Pending(RequestHeader(api_key, 0, len(self.pending), None), 0)
        handler = in_order(self.pending, request, self._handler(name, body))
        request.task = asyncio.get_running_loop().create_task(self._serve(request, handler))
        self.pending.append(request)
        return request

    async def _handler(self, name: str, body: Coroutine[Any, Any, None] | None) -> None:
        self.begun.append(name)
        if body is not None:
            await body

    @staticmethod
    async def _serve(request: _Pending, handler: Coroutine[Any, Any, Any]) -> None:
        await handler
        request.answer(None)


async def _turns(count: int) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


def test_a_produce_arriving_as_a_waiting_produce_wakes_begins_after_it() -> None:
    async def scenario() -> list[str]:
        connection = _Connection()
        metadata_served = asyncio.get_running_loop().create_future()
        connection.start("metadata", METADATA_API_KEY, _wait(metadata_served))
        connection.start("produce-1", PRODUCE_API_KEY)  # waits for the metadata request
        await _turns(2)
        assert connection.begun == ["metadata"]
        metadata_served.set_result(None)
        await _turns(1)  # the metadata request is served; produce-1's wake is queued
        assert connection.pending[0].answered
        assert connection.begun == ["metadata"]
        connection.start("produce-2", PRODUCE_API_KEY)  # nothing unanswered but produce-1
        await asyncio.gather(*(r.task for r in connection.pending if r.task is not None))
        return connection.begun

    assert asyncio.run(scenario()) == ["metadata", "produce-1", "produce-2"]


def test_produce_requests_that_need_not_wait_overlap() -> None:
    """Without a request of another kind before them, Produce requests do not wait for one
    another's answers (a pipelining producer keeps several batches under way)."""

    async def scenario() -> list[str]:
        connection = _Connection()
        loop = asyncio.get_running_loop()
        committed = [loop.create_future() for _ in range(3)]
        for i, future in enumerate(committed):
            connection.start(f"produce-{i}", PRODUCE_API_KEY, _wait(future))
        await _turns(2)
        begun = list(connection.begun)
        for future in committed:
            future.set_result(None)
        await asyncio.gather(*(r.task for r in connection.pending if r.task is not None))
        return begun

    assert asyncio.run(scenario()) == ["produce-0", "produce-1", "produce-2"]


def test_a_chain_of_waiting_produce_requests_begins_in_order() -> None:
    """Several Produce requests behind a request of another kind, and more arriving while
    the first ones wake: all begin in the order they came."""

    async def scenario() -> list[str]:
        connection = _Connection()
        served = asyncio.get_running_loop().create_future()
        connection.start("metadata", METADATA_API_KEY, _wait(served))
        for i in range(3):
            connection.start(f"produce-{i}", PRODUCE_API_KEY)
        served.set_result(None)
        for i in range(3, 6):
            await _turns(1)
            connection.start(f"produce-{i}", PRODUCE_API_KEY)
        await asyncio.gather(*(r.task for r in connection.pending if r.task is not None))
        return connection.begun

    assert asyncio.run(scenario()) == ["metadata"] + [f"produce-{i}" for i in range(6)]


def test_any_other_request_waits_for_every_earlier_one_to_be_served() -> None:
    async def scenario() -> list[str]:
        connection = _Connection()
        committed = asyncio.get_running_loop().create_future()
        connection.start("produce", PRODUCE_API_KEY, _wait(committed))
        connection.start("metadata", METADATA_API_KEY)
        await _turns(3)
        begun = list(connection.begun)
        committed.set_result(None)
        await asyncio.gather(*(r.task for r in connection.pending if r.task is not None))
        return begun + connection.begun

    assert asyncio.run(scenario()) == ["produce", "produce", "metadata"]


async def _wait(future: asyncio.Future[None]) -> None:
    await future
