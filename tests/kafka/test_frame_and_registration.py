"""The Kafka frame codec without sockets, and the Kafka address nodes register."""

from __future__ import annotations

import dataclasses
import struct

import pytest

from raftlog.metadata import MetadataState, RegisterNode, decode_command, encode_command
from raftlog.rpc.kafka.frame import (
    FrameDecoder,
    FrameError,
    decode_body,
    decode_header,
    response_frame,
)
from raftlog.rpc.kafka.schema import request_reader
from raftlog.types import NodeId


def _frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def _header(api_key: int, version: int, correlation_id: int, client_id: bytes | None) -> bytes:
    client = b"\xff\xff" if client_id is None else struct.pack(">h", len(client_id)) + client_id
    return struct.pack(">hhi", api_key, version, correlation_id) + client


def test_frames_come_out_whole_whatever_the_chunking() -> None:
    frames = [_header(18, 0, i, b"c") for i in range(3)]
    stream = b"".join(_frame(f) for f in frames)
    decoder = FrameDecoder(frame_bytes_max=1024)
    out = []
    for i in range(len(stream)):  # one byte at a time
        decoder.receive_data(stream[i : i + 1])
        while (frame := decoder.next_frame()) is not None:
            out.append(frame)
    assert out == frames and decoder.buffered_bytes() == 0


@pytest.mark.parametrize("size", [-1, 0, 7, 1025])
def test_a_size_outside_the_bounds_is_refused(size: int) -> None:
    decoder = FrameDecoder(frame_bytes_max=1024)
    decoder.receive_data(struct.pack(">i", size))
    with pytest.raises(FrameError, match=f"frame size {size} outside"):
        decoder.next_frame()


def test_header_v1_and_v2_decode_and_tagged_fields_are_skipped() -> None:
    plain = _header(3, 1, 42, b"kcat")
    header, offset = decode_header(plain, flexible=False)
    assert (header.api_key, header.api_version, header.correlation_id) == (3, 1, 42)
    assert header.client_id == "kcat" and offset == len(plain)
    # v2: one tagged field (tag 0, 2 bytes), then the body.
    flexible = _header(3, 12, 7, None) + b"\x01\x00\x02ab" + b"BODY"
    header, offset = decode_header(flexible, flexible=True)
    assert header.client_id is None and flexible[offset:] == b"BODY"


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (struct.pack(">hhi", 3, 1, 1), "truncated"),
        (struct.pack(">hhih", 3, 1, 1, 9) + b"abc", "overruns"),
        (struct.pack(">hhih", 3, 1, 1, -2), "neither -1"),
        (struct.pack(">hhih", 3, 1, 1, 2) + b"\xff\xfe", "not UTF-8"),
        (_header(3, 12, 1, b"c") + b"\x01\x00\x09", "overruns"),
    ],
)
def test_broken_headers_name_what_is_wrong(frame: bytes, message: str) -> None:
    with pytest.raises(FrameError, match=message):
        decode_header(frame, flexible=True)


def test_a_body_that_overruns_its_frame_is_refused_and_trailing_bytes_ignored() -> None:
    reader = request_reader(18, 0)  # ApiVersions v0: an empty body
    frame = _header(18, 0, 1, b"c")
    assert decode_body(frame, len(frame), reader, what="ApiVersions v0") is not None
    # As Kafka's brokers do: librdkafka's AdminClient sends Metadata v12 with 3 extra bytes.
    assert decode_body(frame + b"xyz", len(frame), reader, what="ApiVersions v0") is not None
    metadata = request_reader(3, 1)  # Metadata v1: an array of topic names
    with pytest.raises(FrameError, match="does not decode"):
        decode_body(frame + b"\x00\x00\x00\x05", len(frame), metadata, what="Metadata v1")


def test_a_null_array_the_schema_does_not_allow_is_refused_and_one_it_allows_kept() -> None:
    # kio decodes a -1 length as None whatever the schema says; a handler iterating it would
    # fail, so it is refused like any body that does not decode.
    describe_groups = request_reader(15, 0)  # groups: a non-nullable array of names
    with pytest.raises(FrameError, match=r"DescribeGroupsRequest\.groups is null"):
        decode_body(b"\xff\xff\xff\xff", 0, describe_groups, what="DescribeGroups v0")
    metadata = request_reader(3, 1)  # topics: null means every topic from v1 on
    assert decode_body(b"\xff\xff\xff\xff", 0, metadata, what="Metadata v1").topics is None


def test_response_frame_sizes_itself_and_adds_tagged_fields_when_flexible() -> None:
    pieces = response_frame(9, [b"ab", b"cde"], flexible=True)
    data = b"".join(pieces)
    assert struct.unpack_from(">ii", data) == (len(data) - 4, 9)
    assert data[8:] == b"\x00abcde"
    assert b"".join(response_frame(9, [b"x"], flexible=False))[8:] == b"x"


def _register(kafka_address: str = "") -> RegisterNode:
    return RegisterNode(
        node_id=NodeId(1),
        client_address="127.0.0.1:9091",
        raft_address="127.0.0.1:9191",
        incarnation=5,
        now_ms=7,
        kafka_address=kafka_address,
    )


def test_register_node_bytes_without_a_kafka_address_are_what_they_were() -> None:
    data = encode_command(_register())
    assert b"kafka_address" not in data and decode_command(data) == _register()
    with_kafka = _register("127.0.0.1:9092")
    assert decode_command(encode_command(with_kafka)) == with_kafka


def test_kafka_address_is_registered_checked_and_kept_by_snapshots() -> None:
    state = MetadataState("c")
    assert state.apply(1, encode_command(_register("127.0.0.1:9092"))).ok
    restored = MetadataState.restore(state.snapshot())
    node = restored.node(NodeId(1))
    assert node is not None and node.kafka_address == "127.0.0.1:9092"
    bad = dataclasses.replace(_register(), node_id=NodeId(2), kafka_address="no-port")
    result = state.apply(2, encode_command(bad))
    assert not result.ok and "kafka_address" in result.message
