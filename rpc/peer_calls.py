"""Metadata commands a node submits to the controller over the peer transport.

A node that is not the controller sends its liveness heartbeats, its leadership reports, its
reassignment steps and its clients' admin commands to the controller. They travel as CALL
frames on the node-to-node transport (raftlog.rpc.peer_transport), ahead of the Raft
traffic queued for the controller, and the controller answers each with a REPLY frame on
its own connection back. Forwarded through the controller's client-facing gRPC server
instead, heartbeats waited seconds behind that server's own scheduling while the
controller created a thousand groups, and reached it after the lease they were to renew
(benchmarks/README.md, "Scale under pressure"). gRPC forwarding (raftlog.rpc.forwarding)
remains for a node the controller does not know yet (a new node's first registration) and
while no connection to the controller is up.

Frames (after the transport's `[u32 length][u8 kind]` header):

    CALL   [u64 call id][u32 timeout ms][command bytes (raftlog.metadata.encode_command)]
    REPLY  [u64 call id][u8 status][i64 leader hint][i64 producer id first]
           [u16 code length][code (ErrorCode value, ASCII)][message (UTF-8)]

A call is answered once or not at all: a dropped frame leaves the caller to its timeout.
When the connection the controller dialed to the caller closes (the controller's process
died, or the link broke), the replies it had queued on it are gone: the calls waiting on
it fail at once (`peer_disconnected`), so a client's admin command moves on to the next
controller instead of waiting out its timeout. A controller that is only slow answers
late, so silence alone fails no call: failing them when the peer seemed unreachable for a
second would throw away heartbeats that a controller, its loop stalled, was about to
answer. Call
ids are never reused by one process; a reply to a call no longer waited for is ignored.
Both ends are bounded: `calls_in_flight_max` calls waiting for replies, and as many served
per peer (more are answered DROPPED at once, which the caller may retry).
"""

from __future__ import annotations

import enum
import logging
import struct
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from raftlog.errors import (
    FrameError,
    NotControllerError,
    NotLeaderError,
    ProposalDroppedError,
    RaftlogError,
)
from raftlog.metadata import ApplyResult, Command, ErrorCode
from raftlog.metadata.commands import (
    COMMAND_BYTES_MAX,
    MetadataDecodeError,
    decode_command,
    encode_command,
)
from raftlog.rpc.call_table import CallTable, SendFrame
from raftlog.rpc.codec import FRAME_HEADER, FrameKind
from raftlog.types import NodeId

__all__ = [
    "Call",
    "CallStatus",
    "PeerCalls",
    "Reply",
    "decode_call",
    "decode_reply",
    "encode_call",
    "encode_reply",
]

log = logging.getLogger(__name__)

_CALL = struct.Struct("!QI")  # call id, timeout ms
_REPLY = struct.Struct("!QBqqH")  # call id, status, leader hint, producer id first, code length
_U32_MAX = 2**32 - 1
_REPLY_MESSAGE_BYTES_MAX = 4096


class CallStatus(enum.IntEnum):
    APPLIED = 0  # the command committed; the result says how it applied
    NOT_CONTROLLER = 1  # the callee does not lead the metadata quorum (leader hint: who does)
    TIMED_OUT = 2  # not committed within the call's timeout
    DROPPED = 3  # not proposed (too many calls in flight, leadership changing); retriable


@dataclass(frozen=True, slots=True)
class Call:
    call_id: int
    timeout_ms: int
    command: bytes


@dataclass(frozen=True, slots=True)
class Reply:
    call_id: int
    status: CallStatus
    leader_hint: NodeId | None = None
    result: ApplyResult | None = None  # set when APPLIED
    message: str = ""  # why, when DROPPED

    def __post_init__(self) -> None:
        assert (self.result is not None) == (self.status is CallStatus.APPLIED), self


def encode_call(call: Call) -> bytes:
    """The whole CALL frame, header included."""
    assert 0 <= call.call_id < 2**64 and 0 <= call.timeout_ms <= _U32_MAX, call
    body = _CALL.pack(call.call_id, call.timeout_ms) + call.command
    return FRAME_HEADER.pack(1 + len(body), FrameKind.CALL) + body


def decode_call(body: memoryview) -> Call:
    if len(body) < _CALL.size:
        raise FrameError(f"truncated CALL: {len(body)} bytes, needs {_CALL.size}")
    call_id, timeout_ms = _CALL.unpack_from(body)
    command = body[_CALL.size :]
    if len(command) > COMMAND_BYTES_MAX:
        raise FrameError(f"CALL command of {len(command)} bytes exceeds {COMMAND_BYTES_MAX}")
    return Call(call_id, timeout_ms, command.tobytes())


def encode_reply(reply: Reply) -> bytes:
    result = reply.result
    code = (result.code.value if result is not None else "").encode("ascii")
    text = result.message if result is not None else reply.message
    message = text.encode()[:_REPLY_MESSAGE_BYTES_MAX]
    producer_id_first = -1
    if result is not None and result.producer_id_first is not None:
        producer_id_first = result.producer_id_first
    hint = -1 if reply.leader_hint is None else reply.leader_hint
    body = (
        _REPLY.pack(reply.call_id, reply.status, hint, producer_id_first, len(code))
        + code
        + message
    )
    return FRAME_HEADER.pack(1 + len(body), FrameKind.REPLY) + body


def decode_reply(body: memoryview) -> Reply:
    if len(body) < _REPLY.size:
        raise FrameError(f"truncated REPLY: {len(body)} bytes, needs {_REPLY.size}")
    call_id, status, hint, producer_id_first, code_length = _REPLY.unpack_from(body)
    code_end = _REPLY.size + code_length
    if code_end > len(body) or len(body) - code_end > _REPLY_MESSAGE_BYTES_MAX:
        raise FrameError(f"REPLY of {len(body)} bytes with a code of {code_length} bytes")
    if status not in CallStatus._value2member_map_ or hint < -1 or producer_id_first < -1:
        raise FrameError(f"REPLY with status {status}, leader hint {hint}")
    try:
        code = body[_REPLY.size : code_end].tobytes().decode("ascii")
        message = body[code_end:].tobytes().decode()
        error_code = ErrorCode(code) if status == CallStatus.APPLIED else None
    except (UnicodeDecodeError, ValueError) as error:
        raise FrameError(f"REPLY with an unreadable result: {error}") from error
    result = None
    if error_code is not None:
        first = None if producer_id_first < 0 else producer_id_first
        result = ApplyResult(error_code, message, producer_id_first=first)
    return Reply(
        call_id,
        CallStatus(status),
        leader_hint=None if hint < 0 else NodeId(hint),
        result=result,
        message="" if result is not None else message,
    )


# Serves one call on the controller: the caller's node, the command, how long it may take.
Serve = Callable[[NodeId, Command, float], Awaitable[ApplyResult]]
# Runs a task the node supervises (one that fails stops the node: Node._spawn).
Spawn = Callable[[Coroutine[Any, Any, None], str], None]


class PeerCalls:
    """Both ends of metadata calls for one node: `call` on the caller, `on_frame` serves
    CALLs (through `serve`) and completes calls with their REPLYs."""

    def __init__(
        self, *, send: SendFrame, serve: Serve, spawn: Spawn, calls_in_flight_max: int
    ) -> None:
        self._send = send
        self._serve = serve
        self._spawn = spawn
        self._calls: CallTable[Reply] = CallTable(
            send=send, calls_in_flight_max=calls_in_flight_max
        )

    # --- the caller's end ---

    def has_room(self) -> bool:
        """Whether another call may wait for a reply now (else the caller forwards by gRPC)."""
        return self._calls.has_room()

    async def call(self, peer: NodeId, command: Command, timeout_s: float) -> ApplyResult:
        """Submit `command` on `peer`, the controller; its result once committed. Raises
        NotControllerError (with the callee's hint), ProposalDroppedError or TimeoutError."""
        assert self.has_room(), "call() only while has_room()"
        call_id = self._calls.next_call_id()
        frame = encode_call(
            Call(call_id, min(_U32_MAX, int(timeout_s * 1000)), encode_command(command))
        )
        reply = await self._calls.call(peer, call_id, frame, timeout_s)
        return self._outcome(peer, reply)

    @staticmethod
    def _outcome(peer: NodeId, reply: Reply) -> ApplyResult:
        if reply.status is CallStatus.APPLIED:
            assert reply.result is not None
            return reply.result
        if reply.status is CallStatus.NOT_CONTROLLER:
            raise NotControllerError(leader_hint=reply.leader_hint)
        if reply.status is CallStatus.TIMED_OUT:
            raise TimeoutError(f"node {peer} did not commit the command in time")
        raise ProposalDroppedError(f"node {peer} dropped the command: {reply.message}")

    def peer_disconnected(self, peer: NodeId) -> None:
        """The connection `peer` dialed to this node closed: the replies it had queued for
        us went with it, so the calls waiting on it fail now (retriably)."""
        self._calls.fail_peer(peer, lambda: NotControllerError(leader_hint=None))

    # --- frames from peers ---

    def on_frame(self, sender: NodeId, kind: FrameKind, body: memoryview) -> None:
        """A CALL or REPLY frame from `sender` (raises FrameError on a malformed one)."""
        if kind is FrameKind.REPLY:
            reply = decode_reply(body)
            self._calls.complete(sender, reply.call_id, reply)
            return
        assert kind is FrameKind.CALL, kind
        call = decode_call(body)
        if not self._calls.start_serving(sender):
            message = f"{self._calls.serving(sender)} calls of node {sender} in flight"
            reply = Reply(call.call_id, CallStatus.DROPPED, message=message)
            self._send(sender, encode_reply(reply))
            return
        self._spawn(self._answer(sender, call), f"metadata-call-from-{sender}")

    async def _answer(self, sender: NodeId, call: Call) -> None:
        try:
            await self._answer_once(sender, call)
        finally:
            self._calls.done_serving(sender)

    async def _answer_once(self, sender: NodeId, call: Call) -> None:
        try:
            command = decode_command(call.command)
        except MetadataDecodeError as error:
            result = ApplyResult(ErrorCode.INVALID_REQUEST, f"command: {error}")
            self._send(sender, encode_reply(Reply(call.call_id, CallStatus.APPLIED, result=result)))
            return
        try:
            result = await self._serve(sender, command, call.timeout_ms / 1000)
        except NotLeaderError as error:
            hint = None if error.leader_hint is None else NodeId(error.leader_hint)
            reply = Reply(call.call_id, CallStatus.NOT_CONTROLLER, leader_hint=hint)
        except TimeoutError:
            reply = Reply(call.call_id, CallStatus.TIMED_OUT)
        except RaftlogError as error:
            reply = Reply(call.call_id, CallStatus.DROPPED, message=str(error))
        else:
            reply = Reply(call.call_id, CallStatus.APPLIED, result=result)
        self._send(sender, encode_reply(reply))

    def waiting(self) -> int:
        return self._calls.waiting()

    def close(self) -> None:
        """Serve no more calls (those being served are the spawner's to cancel) and fail
        every call still waiting."""
        self._calls.close(lambda: NotControllerError(leader_hint=None))
