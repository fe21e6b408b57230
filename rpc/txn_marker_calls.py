"""Transaction markers a node asks a partition leader to write, over the peer transport.

Kafka's WriteTxnMarkers travels node to node: the transaction coordinator (the controller,
docs/transactions.md) ends a transaction by writing a COMMIT or ABORT marker into every
partition of it, through each partition's leader. A marker for a partition led here is
written by a local call; the others are grouped by leader and sent as one MARKERS frame per
leader on the framed peer transport (raftlog.rpc.peer_transport), never gRPC and never the
Kafka listener: the same connections, queues and faults as the metadata calls
(raftlog.rpc.peer_calls), and no client-facing listener in the way. The leader answers with
one MARKERS_REPLY frame once every marker of the frame is committed or refused.

Frames (after the transport's `[u32 length][u8 kind]` header):

    MARKERS        [u64 call id][u32 timeout ms][u16 count], then per marker
                   [i64 producer id][i16 producer epoch][i32 coordinator epoch][u8 commit]
                   [i32 partition][u16 topic length][topic (UTF-8)]
    MARKERS_REPLY  [u64 call id][u16 count], then per marker
                   [i32 partition][i16 error code][u16 topic length][topic (UTF-8)]

A call is answered once or not at all: a lost frame or a peer that disconnects leaves the
caller with TimeoutError or ProposalDroppedError, and the coordinator writes the markers
again (a second marker for a transaction already ended is harmless: Kafka writes it too, and
it ends nothing). The callee serves a frame only from its own replicas and never forwards it,
so a stale leader hint costs one NOT_LEADER_OR_FOLLOWER, never a loop. Both ends are bounded:
`calls_in_flight_max` calls waiting for replies, as many served per peer (more are answered
at once with NOT_LEADER_OR_FOLLOWER for each marker, which the coordinator retries), and at
most MARKERS_PER_CALL_MAX markers a frame.
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from raftlog.errors import FrameError, ProposalDroppedError
from raftlog.rpc.call_table import CallTable, SendFrame
from raftlog.rpc.codec import FRAME_HEADER, FrameKind
from raftlog.types import NodeId, TxnMarker, TxnMarkerResult

__all__ = [
    "MARKERS_PER_CALL_MAX",
    "MarkerCall",
    "MarkerReply",
    "TxnMarkerCalls",
    "decode_marker_call",
    "decode_marker_reply",
    "encode_marker_call",
    "encode_marker_reply",
]

MARKERS_PER_CALL_MAX = 10_000
# Kafka's NOT_LEADER_OR_FOLLOWER: what a marker gets when the callee cannot take the frame.
_NOT_LEADER_OR_FOLLOWER = 6
_CALL = struct.Struct("!QIH")  # call id, timeout ms, marker count
_MARKER = struct.Struct("!qhiBiH")  # producer id, epoch, coordinator epoch, commit, partition, len
_REPLY = struct.Struct("!QH")  # call id, result count
_RESULT = struct.Struct("!ihH")  # partition, error code, topic length
_U32_MAX = 2**32 - 1


@dataclass(frozen=True, slots=True)
class MarkerCall:
    call_id: int
    timeout_ms: int
    markers: tuple[TxnMarker, ...]


@dataclass(frozen=True, slots=True)
class MarkerReply:
    call_id: int
    results: tuple[TxnMarkerResult, ...]


def encode_marker_call(call: MarkerCall) -> bytes:
    """The whole MARKERS frame, header included."""
    assert 0 < len(call.markers) <= MARKERS_PER_CALL_MAX, len(call.markers)
    assert 0 <= call.call_id < 2**64 and 0 <= call.timeout_ms <= _U32_MAX, call
    parts = [_CALL.pack(call.call_id, call.timeout_ms, len(call.markers))]
    for marker in call.markers:
        topic = marker.topic.encode()
        parts.append(
            _MARKER.pack(
                marker.producer_id,
                marker.producer_epoch,
                marker.coordinator_epoch,
                int(marker.commit),
                marker.partition,
                len(topic),
            )
        )
        parts.append(topic)
    body = b"".join(parts)
    return FRAME_HEADER.pack(1 + len(body), FrameKind.MARKERS) + body


def decode_marker_call(body: memoryview) -> MarkerCall:
    """Raises FrameError naming what is wrong with `body`."""
    if len(body) < _CALL.size:
        raise FrameError(f"truncated MARKERS: {len(body)} bytes, needs {_CALL.size}")
    call_id, timeout_ms, count = _CALL.unpack_from(body)
    if not 0 < count <= MARKERS_PER_CALL_MAX:
        raise FrameError(f"MARKERS with {count} markers")
    position = _CALL.size
    markers = []
    for _ in range(count):
        if position + _MARKER.size > len(body):
            raise FrameError(f"MARKERS truncated at byte {position}")
        pid, epoch, coordinator_epoch, commit, partition, topic_length = _MARKER.unpack_from(
            body, position
        )
        position += _MARKER.size
        topic = _topic(body, position, topic_length, "MARKERS")
        position += topic_length
        if pid < 0 or epoch < 0 or coordinator_epoch < 0 or partition < 0 or commit > 1:
            raise FrameError(f"MARKERS with a bad marker for {topic}-{partition}")
        markers.append(TxnMarker(pid, epoch, coordinator_epoch, bool(commit), topic, partition))
    if position != len(body):
        raise FrameError(f"{len(body) - position} bytes follow the MARKERS markers")
    return MarkerCall(call_id, timeout_ms, tuple(markers))


def encode_marker_reply(reply: MarkerReply) -> bytes:
    """The whole MARKERS_REPLY frame, header included."""
    assert len(reply.results) <= MARKERS_PER_CALL_MAX, len(reply.results)
    parts = [_REPLY.pack(reply.call_id, len(reply.results))]
    for result in reply.results:
        topic = result.topic.encode()
        parts.append(_RESULT.pack(result.partition, result.error_code, len(topic)))
        parts.append(topic)
    body = b"".join(parts)
    return FRAME_HEADER.pack(1 + len(body), FrameKind.MARKERS_REPLY) + body


def decode_marker_reply(body: memoryview) -> MarkerReply:
    """Raises FrameError naming what is wrong with `body`."""
    if len(body) < _REPLY.size:
        raise FrameError(f"truncated MARKERS_REPLY: {len(body)} bytes, needs {_REPLY.size}")
    call_id, count = _REPLY.unpack_from(body)
    if count > MARKERS_PER_CALL_MAX:
        raise FrameError(f"MARKERS_REPLY with {count} results")
    position = _REPLY.size
    results = []
    for _ in range(count):
        if position + _RESULT.size > len(body):
            raise FrameError(f"MARKERS_REPLY truncated at byte {position}")
        partition, error_code, topic_length = _RESULT.unpack_from(body, position)
        position += _RESULT.size
        topic = _topic(body, position, topic_length, "MARKERS_REPLY")
        position += topic_length
        results.append(TxnMarkerResult(topic, partition, error_code))
    if position != len(body):
        raise FrameError(f"{len(body) - position} bytes follow the MARKERS_REPLY results")
    return MarkerReply(call_id, tuple(results))


def _topic(body: memoryview, position: int, length: int, frame: str) -> str:
    if position + length > len(body) or length == 0:
        raise FrameError(f"{frame} topic of {length} bytes at byte {position}")
    try:
        return body[position : position + length].tobytes().decode()
    except UnicodeDecodeError as error:
        raise FrameError(f"{frame} topic is not UTF-8: {error}") from error


# Writes markers of partitions this node leads (never forwarding): one result per marker.
Serve = Callable[[Sequence[TxnMarker], float], Awaitable[list[TxnMarkerResult]]]
# Runs a task the node supervises (one that fails stops the node).
Spawn = Callable[[Coroutine[Any, Any, None], str], None]


class TxnMarkerCalls:
    """Both ends of marker calls for one node: `call` on the coordinator's side, `on_frame`
    serves MARKERS frames (through `serve`) and completes calls with their replies."""

    def __init__(
        self, *, send: SendFrame, serve: Serve, spawn: Spawn, calls_in_flight_max: int
    ) -> None:
        self._send = send
        self._serve = serve
        self._spawn = spawn
        self._calls: CallTable[MarkerReply] = CallTable(
            send=send, calls_in_flight_max=calls_in_flight_max
        )

    def has_room(self) -> bool:
        return self._calls.has_room()

    async def call(
        self, peer: NodeId, markers: Sequence[TxnMarker], timeout_s: float
    ) -> list[TxnMarkerResult]:
        """Have `peer` write `markers` (partitions it leads); one result per marker, in
        order. Raises ProposalDroppedError (not sent, or the peer went away) or
        TimeoutError: the markers may or may not have been written."""
        if not self.has_room():
            raise ProposalDroppedError(f"{self._calls.waiting()} marker calls in flight")
        call_id = self._calls.next_call_id()
        frame = encode_marker_call(
            MarkerCall(call_id, min(_U32_MAX, int(timeout_s * 1000)), tuple(markers))
        )
        reply = await self._calls.call(peer, call_id, frame, timeout_s)
        wanted = [(marker.topic, marker.partition) for marker in markers]
        got = [(result.topic, result.partition) for result in reply.results]
        if got != wanted:
            raise FrameError(f"node {peer} answered markers for {got}, asked for {wanted}")
        return list(reply.results)

    def peer_disconnected(self, peer: NodeId) -> None:
        """The connection `peer` dialed to this node closed, with any reply queued on it."""
        self._calls.fail_peer(peer, lambda: ProposalDroppedError(f"node {peer} disconnected"))

    def on_frame(self, sender: NodeId, kind: FrameKind, body: memoryview) -> None:
        """A MARKERS or MARKERS_REPLY frame from `sender` (FrameError on a malformed one)."""
        if kind is FrameKind.MARKERS_REPLY:
            reply = decode_marker_reply(body)
            self._calls.complete(sender, reply.call_id, reply)
            return
        assert kind is FrameKind.MARKERS, kind
        call = decode_marker_call(body)
        if not self._calls.start_serving(sender):
            results = tuple(
                TxnMarkerResult(m.topic, m.partition, _NOT_LEADER_OR_FOLLOWER) for m in call.markers
            )
            self._send(sender, encode_marker_reply(MarkerReply(call.call_id, results)))
            return
        self._spawn(self._answer(sender, call), f"txn-markers-from-{sender}")

    async def _answer(self, sender: NodeId, call: MarkerCall) -> None:
        try:
            results = await self._serve(call.markers, call.timeout_ms / 1000)
            assert len(results) == len(call.markers), (results, call.markers)
            self._send(sender, encode_marker_reply(MarkerReply(call.call_id, tuple(results))))
        finally:
            self._calls.done_serving(sender)

    def close(self) -> None:
        """Serve no more calls and fail every call still waiting."""
        self._calls.close(lambda: ProposalDroppedError("the node is stopping"))
