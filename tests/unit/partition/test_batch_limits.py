"""The two bounds of a produced batch, as Kafka's log has them: a topic's max.message.bytes
(`batch_bytes_max`, MESSAGE_TOO_LARGE) and its segment.bytes (`segment_bytes_max`,
RECORD_LIST_TOO_LARGE), neither checked against the other."""

from __future__ import annotations

import asyncio

import pytest

from raftlog.config import LogConfig
from raftlog.errors import BatchOverSegmentError, BatchTooLargeError
from raftlog.partition.policy import topic_log_config
from raftlog.storage.records import RecordInput, encode_batch
from raftlog.types import Commitment
from tests.unit.partition.replica_groups import ReplicaGroups


def _batch(value_bytes: int) -> bytes:
    return encode_batch([RecordInput(b"k", bytes(value_bytes), 0)])


def test_a_topic_s_max_message_bytes_may_exceed_its_segment_bytes() -> None:
    config = topic_log_config(LogConfig(), {"segment.bytes": "65536"})
    assert (config.segment_bytes_max, config.batch_bytes_max) == (
        65536,
        LogConfig().batch_bytes_max,
    )
    config = topic_log_config(
        LogConfig(), {"segment.bytes": "1048576", "max.message.bytes": str(100 * 2**20)}
    )
    assert config.batch_bytes_max == 100 * 2**20
    assert config.decompressed_bytes_max >= config.batch_bytes_max  # it validates


def test_a_batch_over_either_bound_is_refused_before_proposing() -> None:
    async def scenario() -> None:
        partition = ReplicaGroups()
        leader = partition.leader
        leader._config = topic_log_config(
            LogConfig(), {"segment.bytes": "4096", "max.message.bytes": "8192"}
        )
        end = leader.group.node.last_offset
        with pytest.raises(BatchTooLargeError, match="batch_bytes_max=8192"):
            await leader.produce([_batch(9000)], commitment=Commitment.LEADER, timeout_s=5)
        with pytest.raises(BatchOverSegmentError, match="segment_bytes_max=4096"):
            await leader.produce([_batch(5000)], commitment=Commitment.LEADER, timeout_s=5)
        assert leader.group.node.last_offset == end
        produced = asyncio.ensure_future(
            leader.produce([_batch(3000)], commitment=Commitment.QUORUM, timeout_s=5)
        )
        await asyncio.sleep(0)
        partition.settle()
        assert (await produced).base_offset == end + 1

    asyncio.run(scenario())
