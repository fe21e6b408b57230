"""Binary codec of the node-to-node transport: frames of (group, Raft message) pairs.

Theory of operation. A connection carries frames, each

    [u32 length][u8 frame kind][body]          length = 1 + len(body), network byte order

and the first frame each way is a HELLO: (protocol version, cluster id, node id), so a node
never accepts Raft traffic from a stranger or from another cluster. Most later frames are
MESSAGES frames, whose body is `[u32 count]` then `count` items `[i64 group][u8 message kind]
[fixed fields][variable parts]`: one frame carries everything the node produced for one peer
in one event-loop iteration, for any number of Raft groups. CALL and REPLY frames carry a
metadata command to the controller and its outcome (raftlog.rpc.peer_calls encodes them).

Integers are signed 64-bit (offsets may be -1), booleans are bits of one flags byte, and an
entry is `[i64 term][i64 offset][i64 offset_count][u8 kind][u32 data length][data]`. Entry
and snapshot data are written as-is.

Copies: `encode_messages` computes the exact frame size first, allocates the frame once and
packs every field into it with `pack_into`, so each payload byte is copied exactly once into
the frame (the socket then sends from it). The transport uses `encode_message_parts`, the same
bytes as a list of buffers in which large entry data is the entry's own `bytes`: those bytes
are copied only into the kernel. `decode_messages` takes a memoryview of the body and
slices each payload out once into the `bytes` an `Entry` holds.

Validation: decoding never trusts the wire. Every read is bounds-checked, and values the Raft
core asserts on (non-negative terms, offsets >= -1, entry kinds, contiguous entries within an
append, disjoint voters and learners) are checked here, so a malformed frame raises
`FrameError` naming what and where instead of tripping an assertion that stops the node.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

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
from raftlog.types import NodeId, Offset, RaftGroupId, Term

__all__ = [
    "FRAME_HEADER",
    "PROTOCOL_VERSION",
    "SCATTER_DATA_BYTES_MIN",
    "Buffer",
    "FrameKind",
    "Hello",
    "Item",
    "MessageKind",
    "decode_frame_header",
    "decode_hello",
    "decode_messages",
    "encode_hello",
    "encode_message_parts",
    "encode_messages",
    "item_size_bytes",
]

PROTOCOL_VERSION = 3  # 2: CALL and REPLY frames; 3: MARKERS and MARKERS_REPLY frames
CLUSTER_ID_BYTES_MAX = 255

Item: TypeAlias = tuple[RaftGroupId, Message]

FRAME_HEADER = struct.Struct("!IB")  # length of (kind + body), frame kind
_HELLO = struct.Struct("!HqqB")  # version, node id, incarnation, cluster id length
_COUNT = struct.Struct("!I")
_ITEM = struct.Struct("!qB")  # group, message kind
_ENTRY = struct.Struct("!qqqBI")  # term, offset, offset_count, kind, data length
_NODE = struct.Struct("!q")
# Entry data this large goes to the socket from the entry's own bytes (encode_message_parts).
SCATTER_DATA_BYTES_MIN = 64 * 1024
# What encode_message_parts returns: bytes and views of them.
Buffer: TypeAlias = bytes | memoryview


class FrameKind(enum.IntEnum):
    HELLO = 1
    MESSAGES = 2
    # A metadata command a node submits to the controller, and its outcome
    # (raftlog.rpc.peer_calls; the transport carries their bodies as they are).
    CALL = 3
    REPLY = 4
    # Transaction markers for a partition leader to write, and their outcome
    # (raftlog.rpc.txn_marker_calls).
    MARKERS = 5
    MARKERS_REPLY = 6


class MessageKind(enum.IntEnum):
    VOTE_REQUEST = 1
    VOTE_RESPONSE = 2
    APPEND_REQUEST = 3
    APPEND_RESPONSE = 4
    HEARTBEAT_REQUEST = 5
    HEARTBEAT_RESPONSE = 6
    SNAPSHOT_REQUEST = 7
    TIMEOUT_NOW = 8


# The fixed fields of each kind; the variable parts (entries, voters, data) follow them.
_FIXED: dict[MessageKind, struct.Struct] = {
    MessageKind.VOTE_REQUEST: struct.Struct("!qqqqqB"),  # term sender receiver last_offset
    MessageKind.VOTE_RESPONSE: struct.Struct("!qqqB"),  # last_term flags / flags
    MessageKind.APPEND_REQUEST: struct.Struct("!qqqqqqI"),  # ... prev_offset prev_term commit n
    MessageKind.APPEND_RESPONSE: struct.Struct("!qqqBqqqq"),
    MessageKind.HEARTBEAT_REQUEST: struct.Struct("!qqqqqB"),  # ... read_context flags
    MessageKind.HEARTBEAT_RESPONSE: struct.Struct("!qqqq"),
    MessageKind.SNAPSHOT_REQUEST: struct.Struct("!qqqqqIIQ"),  # meta, voter/learner counts, len
    MessageKind.TIMEOUT_NOW: struct.Struct("!qqq"),
}
_KIND_OF: dict[type, MessageKind] = {
    VoteRequest: MessageKind.VOTE_REQUEST,
    VoteResponse: MessageKind.VOTE_RESPONSE,
    AppendRequest: MessageKind.APPEND_REQUEST,
    AppendResponse: MessageKind.APPEND_RESPONSE,
    HeartbeatRequest: MessageKind.HEARTBEAT_REQUEST,
    HeartbeatResponse: MessageKind.HEARTBEAT_RESPONSE,
    SnapshotRequest: MessageKind.SNAPSHOT_REQUEST,
    TimeoutNow: MessageKind.TIMEOUT_NOW,
}


@dataclass(frozen=True, slots=True)
class Hello:
    """The first frame each way on a connection: who is speaking, in which cluster."""

    cluster_id: str
    node_id: NodeId
    version: int = PROTOCOL_VERSION
    # Which process of the node is speaking (its start time): a new value tells peers the
    # node restarted and may have lost its log (see RaftNode.forget_peer_log).
    incarnation: int = 0


# --- encoding ---------------------------------------------------------------------------------


def item_size_bytes(message: Message) -> int:
    """Exact encoded size of one (group, message) item, so callers can bound frames up front."""
    kind = _KIND_OF[type(message)]
    size = _ITEM.size + _FIXED[kind].size
    if isinstance(message, AppendRequest):
        size += sum(_ENTRY.size + len(entry.data) for entry in message.entries)
    elif isinstance(message, SnapshotRequest):
        membership = message.snapshot.meta.membership
        size += _NODE.size * len(membership.members) + len(message.snapshot.data)
    assert size >= _ITEM.size + 24, (kind, size)
    return size


def encode_hello(hello: Hello) -> bytes:
    cluster_id = hello.cluster_id.encode()
    if not 0 < len(cluster_id) <= CLUSTER_ID_BYTES_MAX:
        raise FrameError(f"cluster id must be 1..{CLUSTER_ID_BYTES_MAX} bytes, got {hello!r}")
    body = _HELLO.pack(hello.version, hello.node_id, hello.incarnation, len(cluster_id))
    body += cluster_id
    return FRAME_HEADER.pack(1 + len(body), FrameKind.HELLO) + body


def encode_messages(items: Sequence[Item], *, size_bytes: int | None = None) -> bytearray:
    """One MESSAGES frame (header included) holding `items` in order.

    `size_bytes`, when given, is the sum of `item_size_bytes` the caller already computed.
    """
    if size_bytes is None:
        size_bytes = sum(item_size_bytes(message) for _, message in items)
    return _encode(items, size_bytes, deferred=None)


def encode_message_parts(items: Sequence[Item], *, size_bytes: int) -> list[Buffer]:
    """The frame of `encode_messages` as consecutive buffers: entry data of at least
    `SCATTER_DATA_BYTES_MIN` bytes is the entry's own `bytes`, not copied (a leader sends
    each batch to every follower: copying it only into the kernel saves a copy, and the
    allocation of a frame as large, per follower); the rest is packed between them."""
    deferred: list[tuple[int, bytes]] = []
    packed = _encode(items, size_bytes, deferred=deferred)
    view = memoryview(packed)
    parts: list[Buffer] = []
    start = 0
    for position, data in deferred:
        parts += (view[start:position], data)
        start = position
    parts.append(view[start:])
    assert sum(len(part) for part in parts) == FRAME_HEADER.size + _COUNT.size + size_bytes
    return parts


def _encode(
    items: Sequence[Item], size_bytes: int, *, deferred: list[tuple[int, bytes]] | None
) -> bytearray:
    """The frame, packed; with `deferred`, large entry data is left out of it and listed
    there with the position where it belongs."""
    frame_bytes = FRAME_HEADER.size + _COUNT.size + size_bytes
    large_bytes = 0 if deferred is None else _large_data_bytes(items)
    frame = bytearray(frame_bytes - large_bytes)
    FRAME_HEADER.pack_into(frame, 0, frame_bytes - 4, FrameKind.MESSAGES)
    _COUNT.pack_into(frame, FRAME_HEADER.size, len(items))
    position = FRAME_HEADER.size + _COUNT.size
    for group, message in items:
        kind = _KIND_OF[type(message)]
        _ITEM.pack_into(frame, position, group, kind)
        if isinstance(message, AppendRequest):
            position = _encode_append_request(frame, position + _ITEM.size, message, deferred)
        else:
            position = _ENCODERS[kind](frame, position + _ITEM.size, message)
    assert position == len(frame), f"frame size {len(frame)} but wrote {position} bytes"
    return frame


def _large_data_bytes(items: Sequence[Item]) -> int:
    """Bytes of the entry data `encode_message_parts` leaves out of the packed frame."""
    return sum(
        len(entry.data)
        for _, message in items
        if isinstance(message, AppendRequest)
        for entry in message.entries
        if len(entry.data) >= SCATTER_DATA_BYTES_MIN
    )


def _put_data(frame: bytearray, position: int, data: bytes) -> int:
    end = position + len(data)
    frame[position:end] = data
    return end


def _encode_vote_request(frame: bytearray, position: int, m: VoteRequest) -> int:
    flags = int(m.pre_vote) | int(m.transfer) << 1
    fixed = _FIXED[MessageKind.VOTE_REQUEST]
    fixed.pack_into(
        frame, position, m.term, m.sender, m.receiver, m.last_offset, m.last_term, flags
    )
    return position + fixed.size


def _encode_vote_response(frame: bytearray, position: int, m: VoteResponse) -> int:
    flags = int(m.granted) | int(m.pre_vote) << 1
    fixed = _FIXED[MessageKind.VOTE_RESPONSE]
    fixed.pack_into(frame, position, m.term, m.sender, m.receiver, flags)
    return position + fixed.size


def _encode_append_request(
    frame: bytearray,
    position: int,
    m: AppendRequest,
    deferred: list[tuple[int, bytes]] | None = None,
) -> int:
    fixed = _FIXED[MessageKind.APPEND_REQUEST]
    fields = (m.term, m.sender, m.receiver, m.prev_offset, m.prev_term, m.commit_offset)
    fixed.pack_into(frame, position, *fields, len(m.entries))
    position += fixed.size
    pack_entry = _ENTRY.pack_into
    for entry in m.entries:
        data = entry.data
        pack_entry(
            frame, position, entry.term, entry.offset, entry.offset_count, entry.kind, len(data)
        )
        position += _ENTRY.size
        if deferred is not None and len(data) >= SCATTER_DATA_BYTES_MIN:
            deferred.append((position, data))  # sent from the entry's bytes, after this
            continue
        end = position + len(data)
        frame[position:end] = data
        position = end
    return position


def _encode_append_response(frame: bytearray, position: int, m: AppendResponse) -> int:
    fixed = _FIXED[MessageKind.APPEND_RESPONSE]
    fields = (m.term, m.sender, m.receiver, int(m.success), m.last_offset)
    fixed.pack_into(frame, position, *fields, m.reject_offset, m.conflict_term, m.conflict_offset)
    return position + fixed.size


def _encode_heartbeat_request(frame: bytearray, position: int, m: HeartbeatRequest) -> int:
    fixed = _FIXED[MessageKind.HEARTBEAT_REQUEST]
    fields = (m.term, m.sender, m.receiver, m.commit_offset, m.read_context, int(m.quiesce))
    fixed.pack_into(frame, position, *fields)
    return position + fixed.size


def _encode_heartbeat_response(frame: bytearray, position: int, m: HeartbeatResponse) -> int:
    fixed = _FIXED[MessageKind.HEARTBEAT_RESPONSE]
    fixed.pack_into(frame, position, m.term, m.sender, m.receiver, m.read_context)
    return position + fixed.size


def _encode_snapshot_request(frame: bytearray, position: int, m: SnapshotRequest) -> int:
    snapshot: Snapshot = m.snapshot
    meta = snapshot.meta
    voters = sorted(meta.membership.voters)
    learners = sorted(meta.membership.learners)
    fixed = _FIXED[MessageKind.SNAPSHOT_REQUEST]
    fields = (m.term, m.sender, m.receiver, meta.offset, meta.term)
    fixed.pack_into(frame, position, *fields, len(voters), len(learners), len(snapshot.data))
    position += fixed.size
    for node in (*voters, *learners):
        _NODE.pack_into(frame, position, node)
        position += _NODE.size
    return _put_data(frame, position, snapshot.data)


def _encode_timeout_now(frame: bytearray, position: int, m: TimeoutNow) -> int:
    fixed = _FIXED[MessageKind.TIMEOUT_NOW]
    fixed.pack_into(frame, position, m.term, m.sender, m.receiver)
    return position + fixed.size


# Each encoder takes its own message type; the table is keyed by the type's kind, so Any here
# only erases what `_KIND_OF[type(message)]` already guarantees.
_ENCODERS: dict[MessageKind, Callable[[bytearray, int, Any], int]] = {
    MessageKind.VOTE_REQUEST: _encode_vote_request,
    MessageKind.VOTE_RESPONSE: _encode_vote_response,
    MessageKind.APPEND_REQUEST: _encode_append_request,
    MessageKind.APPEND_RESPONSE: _encode_append_response,
    MessageKind.HEARTBEAT_REQUEST: _encode_heartbeat_request,
    MessageKind.HEARTBEAT_RESPONSE: _encode_heartbeat_response,
    MessageKind.SNAPSHOT_REQUEST: _encode_snapshot_request,
    MessageKind.TIMEOUT_NOW: _encode_timeout_now,
}


# --- decoding ---------------------------------------------------------------------------------


def decode_frame_header(
    header: bytes | memoryview, *, frame_bytes_max: int
) -> tuple[FrameKind, int]:
    """(kind, body length) from the first FRAME_HEADER.size bytes of a frame."""
    assert len(header) >= FRAME_HEADER.size, len(header)
    length, kind = FRAME_HEADER.unpack_from(header)
    if length < 1:
        raise FrameError(f"length field {length} leaves no room for the frame kind", position=0)
    if length + 4 > frame_bytes_max:
        raise FrameError(
            f"frame of {length + 4} bytes exceeds frame_bytes_max={frame_bytes_max}", position=0
        )
    if kind not in _FRAME_KINDS:
        raise FrameError(f"unknown frame kind {kind}", position=4)
    return FrameKind(kind), length - 1


_FRAME_KINDS = frozenset(int(kind) for kind in FrameKind)


class _Reader:
    """Bounds-checked cursor over a frame body; positions in errors are body offsets."""

    __slots__ = ("body", "position")

    def __init__(self, body: memoryview) -> None:
        self.body = body
        self.position = 0

    def fixed(self, layout: struct.Struct, what: str) -> tuple[Any, ...]:
        if self.position + layout.size > len(self.body):
            self.fail(
                f"truncated {what}: needs {layout.size} bytes, "
                f"{len(self.body) - self.position} left"
            )
        values = layout.unpack_from(self.body, self.position)
        self.position += layout.size
        return values

    def data(self, length: int, what: str) -> bytes:
        end = self.position + length
        if end > len(self.body):
            self.fail(
                f"truncated {what}: needs {length} bytes, {len(self.body) - self.position} left"
            )
        data = self.body[self.position : end].tobytes()
        self.position = end
        return data

    def fail(self, reason: str) -> Any:
        raise FrameError(reason, position=FRAME_HEADER.size + self.position)


def decode_hello(body: memoryview) -> Hello:
    reader = _Reader(body)
    version, node_id, incarnation, cluster_id_length = reader.fixed(_HELLO, "HELLO")
    cluster_id_bytes = reader.data(cluster_id_length, "HELLO cluster id")
    if reader.position != len(body):
        reader.fail(f"{len(body) - reader.position} trailing bytes after HELLO")
    if version != PROTOCOL_VERSION:
        reader.fail(f"protocol version {version}, this node speaks {PROTOCOL_VERSION}")
    if node_id < 0 or not cluster_id_bytes:
        reader.fail(f"HELLO with node id {node_id} and cluster id {cluster_id_bytes!r}")
    try:
        cluster_id = cluster_id_bytes.decode()
    except UnicodeDecodeError as error:
        raise FrameError(f"cluster id is not UTF-8: {cluster_id_bytes!r}") from error
    return Hello(cluster_id, NodeId(node_id), version, incarnation)


def decode_messages(body: memoryview, *, messages_max: int) -> list[Item]:
    """The items of a MESSAGES frame body; raises FrameError on any malformed byte."""
    reader = _Reader(body)
    (count,) = reader.fixed(_COUNT, "message count")
    if count > messages_max:
        reader.fail(f"{count} messages exceed frame_messages_max={messages_max}")
    items: list[Item] = []
    for _ in range(count):
        group, kind = reader.fixed(_ITEM, "message header")
        if group < 0 or kind not in _DECODERS:
            reader.fail(f"message with group {group} and unknown kind {kind}")
        items.append((RaftGroupId(group), _DECODERS[kind](reader)))
    if reader.position != len(body):
        reader.fail(f"{len(body) - reader.position} trailing bytes after {count} messages")
    assert len(items) == count
    return items


def _check(reader: _Reader, condition: bool, what: str) -> None:
    if not condition:
        reader.fail(what)


def _header(reader: _Reader, term: int, sender: int, receiver: int) -> None:
    _check(reader, term >= 0, f"negative term {term}")
    _check(reader, sender >= 0 and receiver >= 0, f"negative node id {sender}->{receiver}")


def _offsets(reader: _Reader, *offsets: int) -> None:
    for offset in offsets:
        _check(reader, offset >= -1, f"offset {offset} below -1")


def _flags(reader: _Reader, flags: int, bits: int) -> None:
    _check(reader, flags < 1 << bits, f"unknown flag bits {flags:#x}")


def _decode_vote_request(reader: _Reader) -> Message:
    term, sender, receiver, last_offset, last_term, flags = reader.fixed(
        _FIXED[MessageKind.VOTE_REQUEST], "VoteRequest"
    )
    _header(reader, term, sender, receiver)
    _offsets(reader, last_offset)
    _check(reader, last_term >= 0, f"negative last_term {last_term}")
    _flags(reader, flags, 2)
    return VoteRequest(
        Term(term),
        NodeId(sender),
        NodeId(receiver),
        Offset(last_offset),
        Term(last_term),
        pre_vote=bool(flags & 1),
        transfer=bool(flags & 2),
    )


def _decode_vote_response(reader: _Reader) -> Message:
    term, sender, receiver, flags = reader.fixed(_FIXED[MessageKind.VOTE_RESPONSE], "VoteResponse")
    _header(reader, term, sender, receiver)
    _flags(reader, flags, 2)
    return VoteResponse(
        Term(term), NodeId(sender), NodeId(receiver), bool(flags & 1), pre_vote=bool(flags & 2)
    )


_ENTRY_KINDS = {int(kind): kind for kind in EntryKind}


def _decode_entries(
    reader: _Reader, count: int, next_offset: int, term_floor: int, term_max: int
) -> tuple[Entry, ...]:
    """`count` entries starting at `next_offset`, contiguous, terms in [term_floor, term_max]
    and never decreasing (Raft §5.3). The hot loop of the receive path: one combined check per
    entry, and the specific reason is worked out only when it fails."""
    body, position, size = reader.body, reader.position, len(reader.body)
    unpack_entry, header_bytes, kinds = _ENTRY.unpack_from, _ENTRY.size, _ENTRY_KINDS
    entries: list[Entry] = []
    append = entries.append
    for _ in range(count):
        if position + header_bytes > size:
            reader.position = position
            reader.fail(f"truncated entry header after {len(entries)} of {count} entries")
        term, offset, offset_count, kind, length = unpack_entry(body, position)
        data_start = position + header_bytes
        end = data_start + length
        if not (
            offset == next_offset
            and term_floor <= term <= term_max
            and offset_count >= 1
            and kind in kinds
            and end <= size
        ):
            reader.position = position
            _reject_entry(
                reader, (term, offset, offset_count, kind, end), next_offset, term_floor, term_max
            )
        # term and offset come out of unpack_from typed Any: wrapping them in Term()/Offset()
        # would cost two Python calls per entry for nothing (NewTypes are erased at run time).
        data = body[data_start:end].tobytes()
        append(Entry(term, offset, offset_count, kinds[kind], data))
        next_offset, term_floor, position = offset + offset_count, term, end
    reader.position = position
    assert len(entries) == count
    return tuple(entries)


def _reject_entry(
    reader: _Reader, header: tuple[int, ...], next_offset: int, term_floor: int, term_max: int
) -> None:
    term, offset, offset_count, kind, end = header
    _check(reader, offset == next_offset, f"entry at offset {offset}, expected {next_offset}")
    _check(
        reader,
        term_floor <= term <= term_max,
        f"entry term {term} outside [{term_floor}, {term_max}] (terms never decrease)",
    )
    _check(reader, offset_count >= 1, f"entry offset_count {offset_count} below 1")
    _check(reader, kind in _ENTRY_KINDS, f"unknown entry kind {kind}")
    reader.fail(f"truncated entry data: ends at {end}, body has {len(reader.body)} bytes")


def _decode_append_request(reader: _Reader) -> Message:
    fixed = reader.fixed(_FIXED[MessageKind.APPEND_REQUEST], "AppendRequest")
    term, sender, receiver, prev_offset, prev_term, commit_offset, count = fixed
    _header(reader, term, sender, receiver)
    _offsets(reader, prev_offset, commit_offset)
    _check(reader, 0 <= prev_term <= term, f"prev_term {prev_term} outside [0, {term}]")
    # Each entry takes at least its header: reject absurd counts before looping on them.
    left = len(reader.body) - reader.position
    _check(reader, count * _ENTRY.size <= left, f"{count} entries cannot fit in {left} bytes")
    entries = _decode_entries(reader, count, prev_offset + 1, prev_term, term)
    return AppendRequest(
        Term(term),
        NodeId(sender),
        NodeId(receiver),
        Offset(prev_offset),
        Term(prev_term),
        entries,
        Offset(commit_offset),
    )


def _decode_append_response(reader: _Reader) -> Message:
    fixed = reader.fixed(_FIXED[MessageKind.APPEND_RESPONSE], "AppendResponse")
    term, sender, receiver, success, last_offset, reject, conflict_term, conflict = fixed
    _header(reader, term, sender, receiver)
    _offsets(reader, last_offset, reject, conflict)
    _check(reader, conflict_term >= 0, f"negative conflict_term {conflict_term}")
    _flags(reader, success, 1)
    return AppendResponse(
        Term(term),
        NodeId(sender),
        NodeId(receiver),
        bool(success),
        Offset(last_offset),
        reject_offset=Offset(reject),
        conflict_term=Term(conflict_term),
        conflict_offset=Offset(conflict),
    )


def _decode_heartbeat_request(reader: _Reader) -> Message:
    fixed = reader.fixed(_FIXED[MessageKind.HEARTBEAT_REQUEST], "HeartbeatRequest")
    term, sender, receiver, commit_offset, read_context, flags = fixed
    _header(reader, term, sender, receiver)
    _offsets(reader, commit_offset)
    _flags(reader, flags, 1)
    return HeartbeatRequest(
        Term(term),
        NodeId(sender),
        NodeId(receiver),
        Offset(commit_offset),
        read_context,
        quiesce=bool(flags & 1),
    )


def _decode_heartbeat_response(reader: _Reader) -> Message:
    fixed = reader.fixed(_FIXED[MessageKind.HEARTBEAT_RESPONSE], "HeartbeatResponse")
    term, sender, receiver, read_context = fixed
    _header(reader, term, sender, receiver)
    return HeartbeatResponse(Term(term), NodeId(sender), NodeId(receiver), read_context)


def _decode_nodes(reader: _Reader, count: int, what: str) -> frozenset[NodeId]:
    left = len(reader.body) - reader.position
    _check(reader, count * _NODE.size <= left, f"{count} {what} cannot fit in {left} bytes")
    nodes = [NodeId(reader.fixed(_NODE, what)[0]) for _ in range(count)]
    _check(reader, all(node >= 0 for node in nodes), f"negative node id among {what}")
    _check(reader, len(set(nodes)) == count, f"repeated node id among {what}")
    return frozenset(nodes)


def _decode_snapshot_request(reader: _Reader) -> Message:
    fixed = reader.fixed(_FIXED[MessageKind.SNAPSHOT_REQUEST], "SnapshotRequest")
    term, sender, receiver, offset, snapshot_term, voters_count, learners_count, length = fixed
    _header(reader, term, sender, receiver)
    _offsets(reader, offset)
    _check(reader, 0 <= snapshot_term <= term, f"snapshot term {snapshot_term} outside [0, {term}]")
    voters = _decode_nodes(reader, voters_count, "voters")
    learners = _decode_nodes(reader, learners_count, "learners")
    _check(
        reader, not voters & learners, f"nodes {sorted(voters & learners)} both voter and learner"
    )
    meta = SnapshotMeta(Offset(offset), Term(snapshot_term), Membership(voters, learners))
    data = reader.data(length, "snapshot data")
    return SnapshotRequest(Term(term), NodeId(sender), NodeId(receiver), Snapshot(meta, data))


def _decode_timeout_now(reader: _Reader) -> Message:
    term, sender, receiver = reader.fixed(_FIXED[MessageKind.TIMEOUT_NOW], "TimeoutNow")
    _header(reader, term, sender, receiver)
    return TimeoutNow(Term(term), NodeId(sender), NodeId(receiver))


_DECODERS: dict[int, Callable[[_Reader], Message]] = {
    MessageKind.VOTE_REQUEST: _decode_vote_request,
    MessageKind.VOTE_RESPONSE: _decode_vote_response,
    MessageKind.APPEND_REQUEST: _decode_append_request,
    MessageKind.APPEND_RESPONSE: _decode_append_response,
    MessageKind.HEARTBEAT_REQUEST: _decode_heartbeat_request,
    MessageKind.HEARTBEAT_RESPONSE: _decode_heartbeat_response,
    MessageKind.SNAPSHOT_REQUEST: _decode_snapshot_request,
    MessageKind.TIMEOUT_NOW: _decode_timeout_now,
}
