"""Consumer groups' committed offsets in the metadata state: CommitGroupOffsets (with the leader
epochs and metadata a Kafka commit carries), DeleteGroup, their rejections (which leave the state
untouched), topic deletion and snapshots, and the encodings written before epochs and metadata
were kept, which decode as they did."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.metadata.commands import (
    COMMAND_BYTES_MAX,
    OFFSET_METADATA_CHARS_MAX,
    OFFSETS_PER_COMMIT_MAX,
    CommitGroupOffsets,
    DeleteGroup,
    DeleteGroupOffsets,
    DeleteTopic,
    ErrorCode,
    MetadataDecodeError,
    commit_group_offsets,
    decode_command,
    encode_command,
    offset_metadata_chars,
)
from raftlog.metadata.model import CommittedOffset
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


# -- leader epochs and metadata ------------------------------------------------------------------


def test_epochs_and_metadata_are_kept_with_their_offsets(log: Log) -> None:
    (first,) = commit_group_offsets(
        "g", [("orders", PartitionId(0), 5, 7, "first"), ("orders", PartitionId(1), 6, -1, "")]
    )
    assert first.leader_epochs == (7, -1) and first.metadata == ("first", "")
    log.ok(first)
    assert log.state.committed("g") == {
        ("orders", 0): CommittedOffset(5, 7, "first"),
        ("orders", 1): CommittedOffset(6),
    }
    (plain,) = commit_group_offsets("g", [("orders", PartitionId(0), 8, -1, "")])
    assert plain == commit("g", ("orders", 0, 8)), "a commit with neither keeps the old shape"
    log.ok(plain)
    assert log.state.committed("g")[("orders", 0)] == CommittedOffset(8), "a commit replaces all"
    data = log.state.snapshot()
    assert MetadataState.restore(data).committed("g") == log.state.committed("g")


def test_commands_and_snapshots_written_before_epochs_and_metadata_decode_as_they_did(
    log: Log,
) -> None:
    old_command = b'\x01{"group_id":"g","offsets":[["orders",0,5]],"type":"CommitGroupOffsets"}'
    assert decode_command(old_command) == commit("g", ("orders", 0, 5))
    assert encode_command(commit("g", ("orders", 0, 5))) == old_command
    log.ok(commit("g", ("orders", 0, 5)))
    old_snapshot = log.state.snapshot()
    assert b'"offsets":[["orders",0,5]]' in old_snapshot
    assert MetadataState.restore(old_snapshot).committed("g") == {("orders", 0): CommittedOffset(5)}
    log.ok(*commit_group_offsets("g", [("orders", PartitionId(1), 2, 3, "m")]))
    assert b'["orders",1,2,3,"m"]' in log.state.snapshot()


def test_bad_epochs_and_metadata_are_rejected(log: Log) -> None:
    offsets = ((("orders", PartitionId(0), 1)), ("orders", PartitionId(1), 2))
    log.rejected(
        CommitGroupOffsets("g", offsets, leader_epochs=(1,)), ErrorCode.INVALID_REQUEST, "epochs"
    )
    log.rejected(
        CommitGroupOffsets("g", offsets, metadata=("a", "b", "c")),
        ErrorCode.INVALID_REQUEST,
        "metadata",
    )
    too_long = "x" * (OFFSET_METADATA_CHARS_MAX + 1)
    log.rejected(
        CommitGroupOffsets("g", offsets[:1], metadata=(too_long,)),
        ErrorCode.INVALID_REQUEST,
        "exceeds",
    )
    for epochs in ("[-2]", "[2147483648]", '["1"]', "[true]"):
        data = (
            b'\x01{"group_id":"g","leader_epochs":' + epochs.encode() + b',"offsets":'
            b'[["orders",0,5]],"type":"CommitGroupOffsets"}'
        )
        with pytest.raises(MetadataDecodeError):
            decode_command(data)
    body = json.loads(log.state.snapshot()[1:])
    for bad in ([["orders", 0, 5, -1, ""]], [["orders", 0, 5, -2, "m"]], [["orders", 0, 5, 1]]):
        body["group_offsets"] = [{"group_id": "g", "offsets": bad}]
        with pytest.raises(MetadataDecodeError):
            MetadataState.restore(b"\x01" + json.dumps(body).encode())


def test_metadata_is_measured_as_kafka_measures_it() -> None:
    assert offset_metadata_chars("abc") == 3
    assert offset_metadata_chars("é") == 1  # one UTF-16 unit, two UTF-8 bytes
    assert offset_metadata_chars("\U0001f600") == 2  # outside the BMP: a surrogate pair


def test_a_large_commit_is_split_into_commands_that_fit() -> None:
    metadata = "\u0001" * OFFSET_METADATA_CHARS_MAX  # escaped by JSON: six bytes a character
    entries = [("t" * 249, PartitionId(p), p, 1, metadata) for p in range(12)]
    commands = commit_group_offsets("g", entries)
    assert len(commands) > 1
    assert all(len(encode_command(c)) <= COMMAND_BYTES_MAX for c in commands)
    assert [o for c in commands for o in c.offsets] == [e[:3] for e in entries]
    many = [("t", PartitionId(p), 0, -1, "") for p in range(OFFSETS_PER_COMMIT_MAX + 1)]
    assert [len(c.offsets) for c in commit_group_offsets("g", many)] == [OFFSETS_PER_COMMIT_MAX, 1]


def test_delete_group_offsets_forgets_some_and_then_the_group(log: Log) -> None:
    log.ok(commit("g", ("orders", 0, 5), ("orders", 1, 6), ("audit", 0, 3)))
    log.ok(DeleteGroupOffsets("g", (("orders", PartitionId(0)), ("orders", PartitionId(2)))))
    assert log.state.committed_offsets("g") == {("orders", 1): 6, ("audit", 0): 3}
    log.rejected(DeleteGroupOffsets("g", ()), ErrorCode.INVALID_REQUEST, "1-10000")
    twice = (("audit", PartitionId(0)), ("audit", PartitionId(0)))
    log.rejected(DeleteGroupOffsets("g", twice), ErrorCode.INVALID_REQUEST, "twice")
    log.rejected(DeleteGroupOffsets("h", twice[:1]), ErrorCode.UNKNOWN_GROUP, "'h'")
    log.ok(DeleteGroupOffsets("g", (("orders", PartitionId(1)), ("audit", PartitionId(0)))))
    assert log.state.consumer_group_ids() == (), "a group with no offsets left is forgotten"
