"""Consumer groups' committed offsets in the metadata state: CommitGroupOffsets, DeleteGroup,
their rejections (which leave the state untouched), topic deletion and snapshots."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.metadata.commands import (
    CommitGroupOffsets,
    DeleteGroup,
    DeleteTopic,
    ErrorCode,
    MetadataDecodeError,
    decode_command,
    encode_command,
)
from raftlog.metadata.state import MetadataState
from raftlog.types import PartitionId
from tests.unit.metadata.test_metadata_state import Log, create, register


def commit(group: str, *offsets: tuple[str, int, int]) -> CommitGroupOffsets:
    return CommitGroupOffsets(group, tuple((t, PartitionId(p), o) for t, p, o in offsets))


@pytest.fixture
def log() -> Log:
    log = Log()
    log.ok(
        register(1),
        register(2),
        register(3),
        create("orders"),
        create("audit", first_raft_group_id=4),
    )
    return log


def test_commits_overwrite_per_partition_and_read_back(log: Log) -> None:
    log.ok(commit("g", ("orders", 0, 5), ("orders", 1, 7)))
    log.ok(commit("g", ("orders", 0, 9)))
    log.ok(commit("other", ("audit", 2, 1)))
    assert log.state.committed_offsets("g") == {("orders", 0): 9, ("orders", 1): 7}
    assert log.state.committed_offset("g", "orders", 1) == 7
    assert log.state.committed_offset("g", "orders", 2) is None
    assert log.state.consumer_group_ids() == ("g", "other")


def test_bad_commits_are_rejected_and_change_nothing(log: Log) -> None:
    log.ok(commit("g", ("orders", 0, 5)))
    log.rejected(commit("g", ("nope", 0, 1)), ErrorCode.UNKNOWN_TOPIC, "nope")
    log.rejected(commit("g", ("orders", 3, 1)), ErrorCode.UNKNOWN_PARTITION, "has no partition 3")
    log.rejected(commit("", ("orders", 0, 1)), ErrorCode.INVALID_REQUEST, "1-255 characters")
    log.rejected(commit("g"), ErrorCode.INVALID_REQUEST, "1-10000 offsets")
    log.rejected(
        commit("g", ("orders", 0, 1), ("orders", 0, 2)), ErrorCode.INVALID_REQUEST, "twice"
    )
    log.rejected(DeleteGroup("unknown"), ErrorCode.UNKNOWN_GROUP, "'unknown'")


def test_delete_group_and_delete_topic_drop_offsets(log: Log) -> None:
    log.ok(commit("g", ("orders", 0, 5), ("audit", 0, 3)), commit("h", ("orders", 1, 1)))
    log.ok(DeleteTopic("orders"))
    assert log.state.committed_offsets("g") == {("audit", 0): 3}
    assert log.state.consumer_group_ids() == ("g",), "a group with no offsets left is forgotten"
    log.ok(create("orders", first_raft_group_id=7))
    assert log.state.committed_offset("g", "orders", 0) is None, "a re-created topic starts over"
    log.ok(DeleteGroup("g"))
    assert log.state.consumer_group_ids() == ()


def test_offsets_survive_snapshot_and_restore(log: Log) -> None:
    before_any = log.state.snapshot()
    assert b"group_offsets" not in before_any, "older snapshots stay byte-identical"
    assert MetadataState.restore(before_any).snapshot() == before_any
    log.ok(commit("g", ("orders", 0, 5), ("audit", 2, 8)))
    data = log.state.snapshot()
    restored = MetadataState.restore(data)
    assert restored.snapshot() == data
    assert restored.committed_offsets("g") == log.state.committed_offsets("g")


def test_restore_rejects_malformed_group_offsets(log: Log) -> None:
    log.ok(commit("g", ("orders", 0, 5)))
    body = json.loads(log.state.snapshot()[1:])
    for bad in (
        [{"group_id": "g", "offsets": []}],
        [{"group_id": "g", "offsets": [["orders", 0]]}],
        [{"group_id": "g", "offsets": [["orders", 9, 1]]}],  # no such partition
        [{"group_id": "g", "offsets": [["orders", 0, -1]]}],
        [{"group_id": "g"}],
    ):
        body["group_offsets"] = bad
        with pytest.raises(MetadataDecodeError):
            MetadataState.restore(b"\x01" + json.dumps(body).encode())


def test_decode_rejects_malformed_offsets() -> None:
    for offsets in ('[["t",0]]', '[["t","0",1]]', "[[1,0,1]]", '{"t":1}', '[["t",0,true]]'):
        data = (
            b'\x01{"group_id":"g","offsets":' + offsets.encode() + b',"type":"CommitGroupOffsets"}'
        )
        with pytest.raises(MetadataDecodeError):
            decode_command(data)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2**40)), min_size=1, max_size=6))
def test_commit_round_trips_and_the_last_commit_wins(offsets: list[tuple[int, int]]) -> None:
    command = commit("g", *(("orders", p, o) for p, o in dict(offsets).items()))
    assert decode_command(encode_command(command)) == command
    log = Log()
    log.ok(register(1), register(2), register(3), create("orders"))
    expected: dict[tuple[str, int], int] = {}
    for partition, offset in offsets:
        log.ok(commit("g", ("orders", partition, offset)))
        expected[("orders", partition)] = offset
    assert log.state.committed_offsets("g") == expected
