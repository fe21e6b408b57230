"""The metadata command codec and the checks that depend on a command alone.

Decoding is strict because every node must read a committed command the same way: anything
but the exact bytes `encode_command` makes is refused with an error naming what is wrong.
"""

from __future__ import annotations

import json

import pytest

from raftlog.errors import RaftlogError
from raftlog.metadata.commands import (
    COMMAND_BYTES_MAX,
    AllocateProducerIds,
    AlterTopicConfig,
    AutoCreateTopic,
    Command,
    CommitGroupOffsets,
    CreatePartitions,
    CreateTopic,
    DeleteGroup,
    DeleteGroupOffsets,
    DeleteTopic,
    ErrorCode,
    FenceNode,
    MetadataDecodeError,
    NodeHeartbeat,
    ReassignPartition,
    RegisterNode,
    ReportLeader,
    check_address,
    check_topic_config,
    check_topic_name,
    decode_command,
    encode_command,
)
from raftlog.types import NodeId, PartitionId, RaftGroupId

EVERY_COMMAND: list[Command] = [
    RegisterNode(NodeId(1), "10.0.0.1:9092", "10.0.0.1:9093", 3, 1_000),
    NodeHeartbeat(NodeId(1), 3, 2_000),
    FenceNode(NodeId(1), 9_000, 6_000),
    CreateTopic(
        name="orders",
        topic_id="abc-_12",
        partition_count=2,
        replication_factor=2,
        config={"retention.ms": "1000", "cleanup.policy": "delete"},
        assignments=((NodeId(1), NodeId(2)), (NodeId(2), NodeId(1))),
        raft_group_ids=(RaftGroupId(1), RaftGroupId(2)),
    ),
    DeleteTopic("orders"),
    AlterTopicConfig("orders", {"cleanup.policy": "compact"}, ("retention.ms",)),
    CreatePartitions("orders", ((NodeId(1), NodeId(2)),), (RaftGroupId(3),)),
    ReassignPartition("orders", PartitionId(0), (NodeId(2), NodeId(3))),
    ReportLeader("orders", PartitionId(1), RaftGroupId(2), NodeId(2), 7),
    AllocateProducerIds(1000),
    AutoCreateTopic("orders", 3, 2),
    CommitGroupOffsets("g", (("orders", PartitionId(0), 5),)),
    CommitGroupOffsets(
        "g", (("orders", PartitionId(0), 5), ("orders", PartitionId(1), 6)), (3, -1), ("m", "")
    ),
    DeleteGroup("g"),
    DeleteGroupOffsets("g", (("orders", PartitionId(0)), ("audit", PartitionId(2)))),
]


@pytest.mark.parametrize("command", EVERY_COMMAND, ids=lambda c: type(c).__name__)
def test_every_command_round_trips(command: Command) -> None:
    data = encode_command(command)
    assert data[0] == 1
    assert decode_command(data) == command
    assert encode_command(decode_command(data)) == data


def test_encoding_does_not_depend_on_config_order() -> None:
    base = EVERY_COMMAND[3]
    assert isinstance(base, CreateTopic)
    reordered = CreateTopic(
        base.name,
        base.topic_id,
        base.partition_count,
        base.replication_factor,
        dict(reversed(list(base.config.items()))),
        base.assignments,
        base.raft_group_ids,
    )
    assert encode_command(reordered) == encode_command(base)


def _body(command: Command) -> dict[str, object]:
    body = json.loads(encode_command(command)[1:])
    assert isinstance(body, dict)
    return body


def _raw(body: object) -> bytes:
    return b"\x01" + json.dumps(body).encode()


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b"", "version None"),
        (b"\x02{}", "version 2"),
        (b"\x01\xff\xfe", "not UTF-8 JSON"),
        (b"\x01[1]", "expected a JSON object, got list"),
        (b'\x01{"type":"Nope"}', "unknown command type 'Nope'"),
        (b'\x01{"count":1}', "unknown command type None"),
        (b'\x01{"type":"AllocateProducerIds","count":NaN}', "NaN is not a number"),
        (b"\x01" + b"[" * 5000, "not UTF-8 JSON"),
        (b"\x01" + b" " * COMMAND_BYTES_MAX, "exceeds"),
        (b'\x01{"type":"AllocateProducerIds","count":' + b"9" * 5000 + b"}", "not UTF-8 JSON"),
    ],
)
def test_decode_rejects_malformed_bytes(data: bytes, fragment: str) -> None:
    with pytest.raises(MetadataDecodeError) as caught:
        decode_command(data)
    assert fragment in str(caught.value)
    assert isinstance(caught.value, RaftlogError)


def test_decode_demands_exactly_the_fields() -> None:
    body = _body(NodeHeartbeat(NodeId(1), 1, 5))
    missing = {k: v for k, v in body.items() if k != "now_ms"}
    with pytest.raises(MetadataDecodeError, match="NodeHeartbeat needs fields"):
        decode_command(_raw(missing))
    with pytest.raises(MetadataDecodeError, match="extra"):
        decode_command(_raw({**body, "extra": 1}))


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("now_ms", True, "NodeHeartbeat.now_ms: expected an integer"),
        ("now_ms", -1, "NodeHeartbeat.now_ms: expected an integer in [0, 2**63), got -1"),
        ("now_ms", 1 << 63, "NodeHeartbeat.now_ms"),
        ("now_ms", 1.5, "NodeHeartbeat.now_ms"),
        ("node_id", "1", "NodeHeartbeat.node_id"),
    ],
)
def test_decode_checks_integer_fields(field: str, value: object, fragment: str) -> None:
    body = _body(NodeHeartbeat(NodeId(1), 1, 5))
    with pytest.raises(MetadataDecodeError) as caught:
        decode_command(_raw({**body, field: value}))
    assert fragment in str(caught.value)


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("assignments", [[1], "x"], "CreateTopic.assignments[1]: expected a list"),
        ("assignments", [[1, -2]], "CreateTopic.assignments[0][1]"),
        ("group_ids", {"a": 1}, "CreateTopic.group_ids: expected a list"),
        ("config", {"retention.ms": 5}, "CreateTopic.config['retention.ms']"),
        ("config", ["x"], "CreateTopic.config: expected an object"),
        ("name", 5, "CreateTopic.name: expected a string"),
    ],
)
def test_decode_checks_nested_fields(field: str, value: object, fragment: str) -> None:
    body = _body(EVERY_COMMAND[3])
    with pytest.raises(MetadataDecodeError) as caught:
        decode_command(_raw({**body, field: value}))
    assert fragment in str(caught.value)


@pytest.mark.parametrize("name", ["a", "A.b_c-9", "x" * 249, "..."])
def test_legal_topic_names(name: str) -> None:
    assert check_topic_name(name) is None


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("", "1-249 characters, got 0"),
        ("x" * 250, "got 250"),
        (".", "not be '.' or '..'"),
        ("..", "not be '.' or '..'"),
        ("a b", "[a-zA-Z0-9._-]"),
        ("é", "[a-zA-Z0-9._-]"),
        ("a/b", "'a/b'"),
    ],
)
def test_illegal_topic_names(name: str, fragment: str) -> None:
    result = check_topic_name(name)
    assert result is not None and result.code is ErrorCode.INVALID_TOPIC_NAME
    assert fragment in result.message


def test_known_topic_config_is_accepted() -> None:
    # max.message.bytes may exceed segment.bytes: each bounds a batch on its own (Kafka's rule).
    assert check_topic_config({"segment.bytes": "2048", "max.message.bytes": "4096"}) is None
    config = {
        "retention.bytes": "-1",
        "retention.ms": "604800000",
        "segment.bytes": "1048576",
        "segment.ms": "1",
        "max.message.bytes": "1048576",
        "cleanup.policy": "delete",
    }
    assert check_topic_config(config) is None
    assert check_topic_config({}) is None


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ({"retention.msx": "1"}, "unknown config key 'retention.msx'"),
        ({"retention.ms": "-2"}, "retention.ms='-2': must be in [-1,"),
        ({"retention.ms": "01"}, "retention.ms='01': must be a decimal integer"),
        ({"retention.ms": " 1"}, "retention.ms=' 1'"),
        ({"retention.ms": "1_000"}, "retention.ms='1_000'"),
        ({"retention.bytes": "-0"}, "retention.bytes='-0'"),
        ({"segment.bytes": "1023"}, "segment.bytes='1023': must be in [1024,"),
        ({"segment.ms": "0"}, "segment.ms='0'"),
        ({"max.message.bytes": "x"}, "max.message.bytes='x'"),
        ({"cleanup.policy": "compacted"}, "cleanup.policy='compacted': must be one of ['delete',"),
        ({"min.cleanable.dirty.ratio": "1.5"}, "min.cleanable.dirty.ratio='1.5': must be a"),
        ({"min.cleanable.dirty.ratio": "nan"}, "min.cleanable.dirty.ratio='nan'"),
        ({"delete.retention.ms": "-1"}, "delete.retention.ms='-1': must be in [0,"),
        ({"max.compaction.lag.ms": "0"}, "max.compaction.lag.ms='0'"),
        (
            {"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"},
            "min.compaction.lag.ms exceeds max.compaction.lag.ms (10 > 5)",
        ),
        ({"min.insync.replicas": "2"}, "min.insync.replicas='2': not supported"),
        ({"retention.ms": "9" * 5000}, "retention.ms: value of 5000 characters exceeds 255"),
    ],
)
def test_invalid_topic_config_names_key_and_value(config: dict[str, str], fragment: str) -> None:
    result = check_topic_config(config)
    assert result is not None and result.code is ErrorCode.INVALID_CONFIG
    assert fragment in result.message


@pytest.mark.parametrize("address", ["localhost:9092", "10.0.0.1:1", "[::1]:65535"])
def test_legal_addresses(address: str) -> None:
    assert check_address("client_address", address) is None


@pytest.mark.parametrize(
    ("address", "fragment"),
    [
        ("localhost", "expected host:port"),
        (":9092", "expected host:port"),
        ("host :1", "expected host:port"),
        ("host:0", "port must be 1-65535"),
        ("host:65536", "port must be 1-65535"),
        ("host:x", "port must be 1-65535"),
        ("host:٣", "port must be 1-65535"),
        ("h" * 300 + ":1", "longer than 255"),
    ],
)
def test_illegal_addresses(address: str, fragment: str) -> None:
    result = check_address("raft_address", address)
    assert result is not None and result.code is ErrorCode.INVALID_REQUEST
    assert fragment in result.message and "raft_address" in result.message
