"""A faust-streaming worker (test_faust_exactly_once.py runs it as a subprocess): counts the words
of topic `faust-words` in a Table, exactly once: the input offsets and the table's changelog
records (one per update: the word's new count) commit in one Kafka transaction.

    FAUST_BROKER=host:port FAUST_DATADIR=DIR python tests/kafka/faust_count_app.py worker
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

import faust
from faust.transport.consumer import Consumer

APP_ID = "raftlog-count"
INPUT_TOPIC = "faust-words"
TABLE = "word-counts"
CHANGELOG_TOPIC = f"{APP_ID}-{TABLE}-changelog"

app = faust.App(
    APP_ID,
    broker=f"kafka://{os.environ.get('FAUST_BROKER', 'localhost:9092')}",
    datadir=os.environ.get("FAUST_DATADIR", "faust-data"),
    processing_guarantee="exactly_once",
    store="memory://",
    topic_partitions=1,
    topic_replication_factor=3,
    web_enabled=False,
    # Commit often, so a kill lands between commits with work on either side of it.
    broker_commit_every=50,
    broker_commit_interval=0.5,
    # The killed worker's membership ends when its session does (Kafka's minimum, 6 s); the new
    # worker's join waits for that, not for faust's default of a minute.
    broker_session_timeout=6.0,
    broker_heartbeat_interval=1.0,
)
words = app.topic(INPUT_TOPIC, key_type=bytes, value_type=bytes, value_serializer="raw")
counts = app.Table(TABLE, default=int, partitions=1)

# Two gaps in faust 0.15's exactly-once commit, closed here so that the test checks raftlog's
# transactions rather than faust's: (1) it flushes its send buffer before committing only
# outside transactions (faust-streaming PR #273), so a table update still in the buffer
# misses the transaction of its input offset and is lost if the worker dies before the next
# one; (2) the agent keeps running while a commit awaits the network, so the transaction can
# carry updates of words whose offsets it does not commit, counted again after a crash. A
# commit here flushes first and runs while no word is being counted.
handling = asyncio.Lock()
_force_commit = Consumer.force_commit


async def _force_commit_whole(self: Consumer, *args: Any, **kwargs: Any) -> bool:
    async with handling:
        await self.app.producer.flush()
        committed: bool = await _force_commit(self, *args, **kwargs)
        return committed


Consumer.force_commit = _force_commit_whole  # type: ignore[method-assign]


@app.agent(words)
async def count(stream: AsyncIterator[bytes]) -> None:
    async for word in stream:
        async with handling:
            counts[word.decode()] += 1


if __name__ == "__main__":
    app.main()
