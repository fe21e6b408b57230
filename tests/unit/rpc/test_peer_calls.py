"""Metadata calls over the peer transport (raftlog.rpc.peer_calls), on real loopback
transports: the frames' codec, each outcome a caller can see, the bounds, and that a call
goes ahead of the Raft traffic already queued for the controller."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st
from loopback import FAST, A, B, Inbox, append, call_pair, closing, frame_body, run, spawn_call_task

from raftlog.errors import FrameError, NotControllerError, ProposalDroppedError
from raftlog.metadata import ApplyResult, Command, ErrorCode, NodeHeartbeat
from raftlog.rpc.codec import FrameKind, Item
from raftlog.rpc.peer_calls import (
    Call,
    CallStatus,
    PeerCalls,
    Reply,
    decode_call,
    decode_reply,
    encode_call,
    encode_reply,
)
from raftlog.rpc.peer_transport import PeerTransport
from raftlog.types import NodeId, RaftGroupId

HEARTBEAT = NodeHeartbeat(node_id=A, incarnation=7, now_ms=1000)


@given(
    call_id=st.integers(0, 2**64 - 1),
    timeout_ms=st.integers(0, 2**32 - 1),
    command=st.binary(max_size=200),
)
def test_a_call_survives_its_codec(call_id: int, timeout_ms: int, command: bytes) -> None:
    call = Call(call_id, timeout_ms, command)
    assert decode_call(frame_body(encode_call(call), FrameKind.CALL)) == call


_RESULTS = st.builds(
    ApplyResult,
    st.sampled_from(list(ErrorCode)),
    st.text(max_size=50),
    producer_id_first=st.none() | st.integers(0, 2**62),
)
_REPLIES = st.one_of(
    st.builds(Reply, st.integers(0, 2**64 - 1), st.just(CallStatus.APPLIED), result=_RESULTS),
    st.builds(
        Reply,
        st.integers(0, 2**64 - 1),
        st.sampled_from([s for s in CallStatus if s is not CallStatus.APPLIED]),
        leader_hint=st.none() | st.integers(0, 2**40).map(NodeId),
        message=st.text(max_size=50),
    ),
)


@given(reply=_REPLIES)
def test_a_reply_survives_its_codec(reply: Reply) -> None:
    assert decode_reply(frame_body(encode_reply(reply), FrameKind.REPLY)) == reply


@given(data=st.binary(max_size=60))
def test_malformed_bodies_raise_frame_error_only(data: bytes) -> None:
    for decode in (decode_call, decode_reply):
        with contextlib.suppress(FrameError):
            decode(memoryview(data))


def test_truncated_frames_are_named() -> None:
    with pytest.raises(FrameError, match="truncated CALL"):
        decode_call(memoryview(b"\x00" * 5))
    with pytest.raises(FrameError, match="truncated REPLY"):
        decode_reply(memoryview(b"\x00" * 5))
    reply = bytearray(frame_body(encode_reply(Reply(1, CallStatus.TIMED_OUT)), FrameKind.REPLY))
    reply[8] = 9  # no such status
    with pytest.raises(FrameError, match="status 9"):
        decode_reply(memoryview(reply))


class Callee:
    """What a controller does with a call: scripted per test."""

    def __init__(self) -> None:
        self.served: list[tuple[NodeId, Command, float]] = []
        self.outcome: ApplyResult | BaseException = ApplyResult(ErrorCode.NONE)
        self.release = asyncio.Event()
        self.hold = False

    async def __call__(self, sender: NodeId, command: Command, timeout_s: float) -> ApplyResult:
        self.served.append((sender, command, timeout_s))
        if self.hold:
            await self.release.wait()
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


async def _calls_pair(
    callee: Callee,
    *,
    calls_in_flight_max: int = 8,
    connect: bool = True,
    inbox_b: Inbox | None = None,
) -> tuple[PeerTransport, PeerTransport, PeerCalls, PeerCalls, int]:
    """Node A calls node B (listening on the port returned last)."""

    def make(send: Callable[[NodeId, bytes], bool]) -> PeerCalls:
        return PeerCalls(
            send=send, serve=callee, spawn=spawn_call_task, calls_in_flight_max=calls_in_flight_max
        )

    return await call_pair(make, connect=connect, inbox_b=inbox_b)


def test_a_call_returns_the_controllers_result() -> None:
    async def scenario() -> None:
        callee = Callee()
        callee.outcome = ApplyResult(ErrorCode.NONE, producer_id_first=4000)
        a, b, calls_a, _, _ = await _calls_pair(callee)
        result = await calls_a.call(B, HEARTBEAT, 5.0)
        assert result == ApplyResult(ErrorCode.NONE, producer_id_first=4000)
        [(sender, command, timeout_s)] = callee.served
        assert (sender, command) == (A, HEARTBEAT) and 4.9 < timeout_s <= 5.0
        callee.outcome = ApplyResult(ErrorCode.STALE_INCARNATION, "node 1 restarted")
        assert await calls_a.call(B, HEARTBEAT, 5.0) == callee.outcome
        assert calls_a.waiting() == 0
        assert a.counters().call_frames_sent == 2 and b.counters().call_frames_received == 2
        await closing(a, b)

    run(scenario)


@pytest.mark.parametrize(
    ("outcome", "raised", "match"),
    [
        (NotControllerError(leader_hint=3), NotControllerError, "controller: node 3"),
        (TimeoutError(), TimeoutError, "did not commit"),
        (ProposalDroppedError("leadership changing"), ProposalDroppedError, "changing"),
    ],
)
def test_a_call_raises_what_the_controller_could_not_do(
    outcome: BaseException, raised: type[BaseException], match: str
) -> None:
    async def scenario() -> None:
        callee = Callee()
        callee.outcome = outcome
        a, b, calls_a, _, _ = await _calls_pair(callee)
        with pytest.raises(raised, match=match) as caught:
            await calls_a.call(B, HEARTBEAT, 5.0)
        if isinstance(outcome, NotControllerError):
            assert isinstance(caught.value, NotControllerError)
            assert caught.value.leader_hint == 3
        await closing(a, b)

    run(scenario)


def test_calls_beyond_the_bound_are_dropped_at_once() -> None:
    async def scenario() -> None:
        callee = Callee()
        callee.hold = True
        a, b, calls_a, _, _ = await _calls_pair(callee, calls_in_flight_max=2)
        held = [asyncio.create_task(calls_a.call(B, HEARTBEAT, 10.0)) for _ in range(2)]
        while len(callee.served) < 2:
            await asyncio.sleep(0.001)
        assert not calls_a.has_room()
        # The caller's own bound: a third waiting call goes elsewhere (gRPC) meanwhile.
        calls_a._calls.calls_in_flight_max = 3
        with pytest.raises(ProposalDroppedError, match="2 calls of node 1 in flight"):
            await calls_a.call(B, HEARTBEAT, 10.0)
        assert len(callee.served) == 2
        callee.release.set()
        assert [r.code for r in await asyncio.gather(*held)] == [ErrorCode.NONE] * 2
        await closing(a, b)

    run(scenario)


def test_a_call_that_is_never_answered_times_out() -> None:
    async def scenario() -> None:
        callee = Callee()
        callee.hold = True
        a, b, calls_a, _, _ = await _calls_pair(callee)
        with pytest.raises(TimeoutError):
            await calls_a.call(B, HEARTBEAT, 0.2)
        assert calls_a.waiting() == 0
        callee.release.set()  # its late reply is ignored
        await asyncio.sleep(0.05)
        await closing(a, b)

    run(scenario)


def test_a_controller_that_dies_fails_the_calls_waiting_on_it_at_once() -> None:
    async def scenario() -> None:
        callee = Callee()
        callee.hold = True
        a, b, calls_a, _, _ = await _calls_pair(callee)
        waiting = asyncio.create_task(calls_a.call(B, HEARTBEAT, 20.0))
        while not callee.served:
            await asyncio.sleep(0.001)
        await b.close()  # its connections close as a killed process's would
        with pytest.raises(NotControllerError):
            await asyncio.wait_for(waiting, 5.0)
        assert calls_a.waiting() == 0
        await closing(a)

    run(scenario)


def test_a_call_goes_ahead_of_the_raft_traffic_queued_for_the_controller() -> None:
    async def scenario() -> None:
        order: list[str] = []

        class Recording(Callee):
            async def __call__(
                self, sender: NodeId, command: Command, timeout_s: float
            ) -> ApplyResult:
                order.append("call")
                return await super().__call__(sender, command, timeout_s)

        class RecordingInbox(Inbox):
            def __call__(self, sender: NodeId, items: list[Item]) -> None:
                order.append("raft")
                super().__call__(sender, items)

        a, b, calls_a, _, port_b = await _calls_pair(
            Recording(), connect=False, inbox_b=RecordingInbox()
        )
        # Not connected yet: three appends of a frame each wait in A's queue, then the call.
        a.update_peers({B: ("127.0.0.1", port_b)})
        for _ in range(3):
            a.send(B, RaftGroupId(1), append(A, B, FAST.frame_bytes_target))
        assert (await calls_a.call(B, HEARTBEAT, 10.0)).ok
        while order.count("raft") < 3:
            await asyncio.sleep(0.001)
        assert order == ["call", "raft", "raft", "raft"]
        await closing(a, b)

    run(scenario)
