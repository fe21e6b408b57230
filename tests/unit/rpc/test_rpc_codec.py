"""The transport codec: every message kind round-trips; malformed frames are named and refused."""

from __future__ import annotations

import struct
import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.errors import FrameError
from raftlog.raft.types import (
    AppendRequest,
    AppendResponse,
    Entry,
    EntryKind,
    HeartbeatRequest,
    HeartbeatResponse,
    Membership,
    Message,
    Snapshot,
    SnapshotMeta,
    SnapshotRequest,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from raftlog.rpc import codec
from raftlog.types import NodeId, Offset, RaftGroupId, Term

I64_MAX = 2**63 - 1
terms = st.integers(0, 2**40).map(Term)
nodes = st.integers(0, 2**31).map(NodeId)
offsets = st.integers(-1, 2**50).map(Offset)
groups = st.integers(0, I64_MAX).map(RaftGroupId)


@st.composite
def append_requests(draw: st.DrawFn) -> AppendRequest:
    term = draw(terms)
    prev_term = draw(st.integers(0, term))
    prev_offset = draw(offsets)
    entries: list[Entry] = []
    next_offset, entry_term = prev_offset + 1, prev_term
    for _ in range(draw(st.integers(0, 5))):
        entry_term = draw(st.integers(entry_term, term))
        count = draw(st.integers(1, 1000))
        kind = draw(st.sampled_from(EntryKind))
        data = draw(st.binary(max_size=300))
        entries.append(Entry(Term(entry_term), Offset(next_offset), count, kind, data))
        next_offset += count
    return AppendRequest(
        Term(term),
        draw(nodes),
        draw(nodes),
        Offset(prev_offset),
        Term(prev_term),
        tuple(entries),
        draw(offsets),
    )


@st.composite
def snapshot_requests(draw: st.DrawFn) -> SnapshotRequest:
    term = draw(terms)
    members = draw(st.lists(nodes, max_size=7, unique=True))
    split = draw(st.integers(0, len(members)))
    membership = Membership(frozenset(members[:split]), frozenset(members[split:]))
    meta = SnapshotMeta(draw(offsets), Term(draw(st.integers(0, term))), membership)
    snapshot = Snapshot(meta, draw(st.binary(max_size=500)))
    return SnapshotRequest(Term(term), draw(nodes), draw(nodes), snapshot)


read_contexts = st.integers(-(2**63), I64_MAX)
BY_KIND: dict[type, st.SearchStrategy[Message]] = {
    VoteRequest: st.builds(
        VoteRequest, terms, nodes, nodes, offsets, terms, st.booleans(), st.booleans()
    ),
    VoteResponse: st.builds(VoteResponse, terms, nodes, nodes, st.booleans(), st.booleans()),
    AppendRequest: append_requests(),
    AppendResponse: st.builds(
        AppendResponse, terms, nodes, nodes, st.booleans(), offsets, offsets, terms, offsets
    ),
    HeartbeatRequest: st.builds(HeartbeatRequest, terms, nodes, nodes, offsets, read_contexts),
    HeartbeatResponse: st.builds(HeartbeatResponse, terms, nodes, nodes, read_contexts),
    SnapshotRequest: snapshot_requests(),
    TimeoutNow: st.builds(TimeoutNow, terms, nodes, nodes),
}
messages: st.SearchStrategy[Message] = st.one_of(*BY_KIND.values())
items = st.lists(st.tuples(groups, messages), max_size=12)


def body_of(frame: bytes | bytearray) -> memoryview:
    kind, length = codec.decode_frame_header(frame, frame_bytes_max=1 << 30)
    assert kind is codec.FrameKind.MESSAGES
    assert length == len(frame) - codec.FRAME_HEADER.size
    return memoryview(frame)[codec.FRAME_HEADER.size :]


@settings(max_examples=300, deadline=None)
@given(items)
def test_every_message_kind_round_trips_in_one_frame(batch: list[codec.Item]) -> None:
    size_bytes = sum(codec.item_size_bytes(message) for _, message in batch)
    frame = codec.encode_messages(batch)
    assert len(frame) == codec.FRAME_HEADER.size + 4 + size_bytes
    assert codec.decode_messages(body_of(frame), messages_max=len(batch)) == batch


def test_all_eight_kinds_are_generated() -> None:
    # The round-trip property is only as good as its coverage of the Message union.
    assert set(BY_KIND) == set(typing.get_args(Message))
    assert len(codec.MessageKind) == len(BY_KIND) == 8


@settings(deadline=None)  # the machine is shared: no per-example time limit
@given(st.text(min_size=1, max_size=60), nodes)
def test_hello_round_trips(cluster_id: str, node_id: NodeId) -> None:
    frame = codec.encode_hello(codec.Hello(cluster_id, node_id))
    kind, length = codec.decode_frame_header(frame, frame_bytes_max=1024)
    assert kind is codec.FrameKind.HELLO
    body = memoryview(frame)[codec.FRAME_HEADER.size :]
    assert len(body) == length
    assert codec.decode_hello(body) == codec.Hello(cluster_id, node_id)


def sample_append() -> AppendRequest:
    entries = (
        Entry(Term(2), Offset(10), 3, EntryKind.DATA, b"abc"),
        Entry(Term(3), Offset(13), 1, EntryKind.NOOP, b""),
    )
    return AppendRequest(Term(3), NodeId(1), NodeId(2), Offset(9), Term(2), entries, Offset(8))


def test_truncated_frames_are_rejected_at_every_cut() -> None:
    frame = codec.encode_messages([(RaftGroupId(1), sample_append())])
    body = bytes(body_of(frame))
    for cut in range(len(body)):
        with pytest.raises(FrameError, match=r"truncated|trailing|cannot fit"):
            codec.decode_messages(memoryview(body[:cut]), messages_max=10)


def test_trailing_bytes_are_rejected() -> None:
    frame = codec.encode_messages([(RaftGroupId(1), sample_append())])
    with pytest.raises(FrameError, match="1 trailing bytes after 1 messages"):
        codec.decode_messages(memoryview(bytes(body_of(frame)) + b"\0"), messages_max=10)


def patched(frame: bytearray, position: int, layout: str, value: int) -> memoryview:
    struct.pack_into(layout, frame, position, value)
    return body_of(frame)


# Positions in the body of a one-item frame of sample_append(): count (4), item header (9),
# fixed AppendRequest fields (52), then the first entry header (29).
ITEM = 4
FIXED = ITEM + 9
ENTRY = FIXED + 52


@pytest.mark.parametrize(
    ("position", "layout", "value", "reason"),
    [
        (0, "!I", 99, "99 messages exceed frame_messages_max=10"),
        (ITEM, "!q", -5, "group -5"),
        (ITEM + 8, "!B", 77, "unknown kind 77"),
        (FIXED, "!q", -1, "negative term -1"),
        (FIXED + 24, "!q", -2, "offset -2 below -1"),
        (FIXED + 32, "!q", 4, "prev_term 4 outside"),
        (FIXED + 48, "!I", 1000, "1000 entries cannot fit"),
        (ENTRY + 8, "!q", 11, "entry at offset 11, expected 10"),
        (ENTRY, "!q", 1, "entry term 1 outside"),
        (ENTRY + 16, "!q", 0, "offset_count 0 below 1"),
        (ENTRY + 24, "!B", 9, "unknown entry kind 9"),
        (ENTRY + 25, "!I", 1000, "truncated entry data"),
    ],
)
def test_malformed_fields_are_named(position: int, layout: str, value: int, reason: str) -> None:
    frame = codec.encode_messages([(RaftGroupId(1), sample_append())])
    body = patched(frame, codec.FRAME_HEADER.size + position, layout, value)
    with pytest.raises(FrameError, match=reason) as error:
        codec.decode_messages(body, messages_max=10)
    assert error.value.position is not None


def test_entry_terms_never_decrease() -> None:
    frame = codec.encode_messages([(RaftGroupId(1), sample_append())])
    second_entry = ENTRY + 29 + 3
    body = patched(frame, codec.FRAME_HEADER.size + second_entry, "!q", 1)
    with pytest.raises(FrameError, match=r"entry term 1 outside \[2, 3\]"):
        codec.decode_messages(body, messages_max=10)


def test_bad_flag_bits_and_overlapping_membership_are_rejected() -> None:
    vote = VoteResponse(Term(1), NodeId(1), NodeId(2), True)
    frame = codec.encode_messages([(RaftGroupId(0), vote)])
    with pytest.raises(FrameError, match="unknown flag bits 0x4"):
        codec.decode_messages(patched(frame, 5 + FIXED + 24, "!B", 4), messages_max=1)
    meta = SnapshotMeta(
        Offset(5), Term(1), Membership(frozenset({NodeId(1)}), frozenset({NodeId(2)}))
    )
    snapshot = SnapshotRequest(Term(1), NodeId(1), NodeId(2), Snapshot(meta))
    frame = codec.encode_messages([(RaftGroupId(0), snapshot)])
    learner = 5 + FIXED + 64
    with pytest.raises(FrameError, match=r"nodes \[1\] both voter and learner"):
        codec.decode_messages(patched(frame, learner, "!q", 1), messages_max=1)


def test_frame_headers_are_checked() -> None:
    with pytest.raises(FrameError, match="exceeds frame_bytes_max=100"):
        codec.decode_frame_header(struct.pack("!IB", 200, 2), frame_bytes_max=100)
    with pytest.raises(FrameError, match="unknown frame kind 9"):
        codec.decode_frame_header(struct.pack("!IB", 20, 9), frame_bytes_max=100)
    with pytest.raises(FrameError, match="no room for the frame kind"):
        codec.decode_frame_header(struct.pack("!IB", 0, 2), frame_bytes_max=100)


def test_malformed_hellos_are_rejected() -> None:
    good = codec.encode_hello(codec.Hello("prod", NodeId(3)))
    body = bytearray(good[codec.FRAME_HEADER.size :])
    with pytest.raises(FrameError, match="trailing bytes after HELLO"):
        codec.decode_hello(memoryview(bytes(body) + b"x"))
    with pytest.raises(FrameError, match="protocol version 7"):
        codec.decode_hello(memoryview(struct.pack("!H", 7) + bytes(body[2:])))
    with pytest.raises(FrameError, match="not UTF-8"):
        codec.decode_hello(memoryview(bytes(body[:-1]) + b"\xff"))
    with pytest.raises(FrameError, match="cluster id must be"):
        codec.encode_hello(codec.Hello("", NodeId(1)))


def _large_append(sizes: list[int]) -> AppendRequest:
    """Entries of these data sizes, each of distinct bytes, from offset 0 in term 1."""
    entries = tuple(
        Entry(Term(1), Offset(index), 1, EntryKind.DATA, bytes([index % 256]) * size)
        for index, size in enumerate(sizes)
    )
    return AppendRequest(Term(1), NodeId(1), NodeId(2), Offset(-1), Term(0), entries, Offset(-1))


LARGE = codec.SCATTER_DATA_BYTES_MIN


@settings(max_examples=100, deadline=None)
@given(items, st.lists(st.sampled_from([0, 10, LARGE - 1, LARGE, 3 * LARGE]), max_size=5))
def test_frame_parts_hold_the_frame_bytes_and_large_data_uncopied(
    batch: list[codec.Item], sizes: list[int]
) -> None:
    batch = [*batch, (RaftGroupId(9), _large_append(sizes))] if sizes else batch
    size_bytes = sum(codec.item_size_bytes(message) for _, message in batch)
    parts = codec.encode_message_parts(batch, size_bytes=size_bytes)
    assert b"".join(parts) == codec.encode_messages(batch)
    large = [e.data for _, m in batch if isinstance(m, AppendRequest) for e in m.entries]
    large = [data for data in large if len(data) >= LARGE]
    assert [part for part in parts if isinstance(part, bytes)] == large
    assert all(any(part is data for part in parts) for data in large), "sent, not copied"
