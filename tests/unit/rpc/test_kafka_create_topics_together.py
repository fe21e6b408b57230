"""CreateTopics on the Kafka listener (raftlog.rpc.kafka.admin_handlers.create_topics).

The topics of one request are created together: every topic's create is under way before
any finishes, so the request waits for its slowest topic's leaders, not for the sum of all
of them (librdkafka's 0045_subscribe_many_updates creates 100 topics in one request). A
create the controller dropped unwritten gets NOT_CONTROLLER, which admin clients retry."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

from kio.schema.create_topics.v7 import request as ct
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i32, i32Timedelta

from raftlog.config import NodeConfig
from raftlog.errors import ProposalDroppedError
from raftlog.metadata import ApplyResult, CreateTopicRequest, MetadataState
from raftlog.metadata.commands import ErrorCode as MetadataErrorCode
from raftlog.rpc.kafka.admin_handlers import create_topics

TOPICS = 20


class _Metadata:
    def __init__(self) -> None:
        self.state = MetadataState("cluster-a")


class _Node:
    """A controller whose creates finish only when the test says so."""

    def __init__(self) -> None:
        self.metadata = _Metadata()
        self.under_way: list[str] = []
        self.finish = asyncio.Event()
        self.dropped: set[str] = set()

    async def create_topic(self, request: CreateTopicRequest, *, timeout_s: float) -> ApplyResult:
        self.under_way.append(request.name)
        await self.finish.wait()
        if request.name in self.dropped:
            raise ProposalDroppedError("a newer leader's entry replaced it")
        return ApplyResult(MetadataErrorCode.NONE)


class _Context:
    def __init__(self) -> None:
        self.node = _Node()
        self.node_config = NodeConfig()
        self.config = self.node_config.kafka

    def allowed(self, permission: Any, name: str) -> bool:
        return True


def _request(names: list[str]) -> Any:
    return ct.CreateTopicsRequest(
        topics=tuple(
            ct.CreatableTopic(
                name=ct.TopicName(name),
                num_partitions=i32(1),
                replication_factor=i16(3),
                assignments=(),
                configs=(),
            )
            for name in names
        ),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
        validate_only=False,
    )


def test_every_create_of_one_request_is_under_way_before_any_finishes() -> None:
    async def scenario() -> Any:
        ctx = _Context()
        names = [f"topic-{i}" for i in range(TOPICS)]
        request = asyncio.create_task(create_topics(ctx, _request(names), 7))  # type: ignore[arg-type]
        for _ in range(10 * TOPICS):  # one create per topic, none finished
            if len(ctx.node.under_way) == TOPICS or request.done():
                break
            await asyncio.sleep(0)
        assert sorted(ctx.node.under_way) == sorted(names)
        assert not request.done()
        ctx.node.finish.set()
        return await request

    response = asyncio.run(scenario())
    assert [topic.error_code for topic in response.topics] == [ErrorCode.none] * TOPICS


def test_a_create_the_controller_dropped_gets_not_controller() -> None:
    async def scenario() -> Any:
        ctx = _Context()
        ctx.node.dropped.add("dropped")
        ctx.node.finish.set()
        return await create_topics(ctx, _request(["dropped", "kept"]), 7)  # type: ignore[arg-type]

    response = asyncio.run(scenario())
    assert [(t.name, t.error_code) for t in response.topics] == [
        ("dropped", ErrorCode.not_controller),
        ("kept", ErrorCode.none),
    ]
