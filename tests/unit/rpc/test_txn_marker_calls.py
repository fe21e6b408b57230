"""Transaction markers node to node (raftlog.rpc.txn_marker_calls), on real loopback
transports: the frames' codec, a call answered with the leader's results in order, and the
bound on calls served per peer."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st
from loopback import B, call_pair, closing, frame_body, run, spawn_call_task

from raftlog.errors import FrameError, ProposalDroppedError
from raftlog.rpc.codec import FrameKind
from raftlog.rpc.peer_transport import PeerTransport
from raftlog.rpc.txn_marker_calls import (
    MarkerCall,
    MarkerReply,
    TxnMarkerCalls,
    decode_marker_call,
    decode_marker_reply,
    encode_marker_call,
    encode_marker_reply,
)
from raftlog.types import NodeId, TxnMarker, TxnMarkerResult

_TOPICS = st.text(min_size=1, max_size=20)
_MARKERS = st.builds(
    TxnMarker,
    st.integers(0, 2**62),
    st.integers(0, 2**15 - 1),
    st.integers(0, 2**31 - 1),
    st.booleans(),
    _TOPICS,
    st.integers(0, 2**31 - 1),
)
_RESULTS = st.builds(
    TxnMarkerResult, _TOPICS, st.integers(0, 2**31 - 1), st.integers(-(2**15), 2**15 - 1)
)


@given(
    call_id=st.integers(0, 2**64 - 1),
    timeout_ms=st.integers(0, 2**32 - 1),
    markers=st.lists(_MARKERS, min_size=1, max_size=5),
)
def test_a_marker_call_survives_its_codec(
    call_id: int, timeout_ms: int, markers: list[TxnMarker]
) -> None:
    call = MarkerCall(call_id, timeout_ms, tuple(markers))
    assert decode_marker_call(frame_body(encode_marker_call(call), FrameKind.MARKERS)) == call


@given(call_id=st.integers(0, 2**64 - 1), results=st.lists(_RESULTS, max_size=5))
def test_a_marker_reply_survives_its_codec(call_id: int, results: list[TxnMarkerResult]) -> None:
    reply = MarkerReply(call_id, tuple(results))
    frame = encode_marker_reply(reply)
    assert decode_marker_reply(frame_body(frame, FrameKind.MARKERS_REPLY)) == reply


@given(data=st.binary(max_size=80))
def test_malformed_marker_frames_raise_frame_error_only(data: bytes) -> None:
    for decode in (decode_marker_call, decode_marker_reply):
        with contextlib.suppress(FrameError):
            decode(memoryview(data))


def test_a_marker_call_with_trailing_bytes_is_refused() -> None:
    marker = TxnMarker(7, 1, 0, True, "t", 0)
    body = bytes(frame_body(encode_marker_call(MarkerCall(1, 5, (marker,))), FrameKind.MARKERS))
    with pytest.raises(FrameError, match="follow"):
        decode_marker_call(memoryview(body + b"x"))


class Leader:
    """What a partition leader does with markers: one scripted code per partition."""

    def __init__(self) -> None:
        self.served: list[tuple[tuple[TxnMarker, ...], float]] = []
        self.codes: dict[int, int] = {}
        self.release = asyncio.Event()
        self.hold = False

    async def __call__(
        self, markers: Sequence[TxnMarker], timeout_s: float
    ) -> list[TxnMarkerResult]:
        self.served.append((tuple(markers), timeout_s))
        if self.hold:
            await self.release.wait()
        return [
            TxnMarkerResult(m.topic, m.partition, self.codes.get(m.partition, 0)) for m in markers
        ]


async def _pair(
    leader: Leader, *, calls_in_flight_max: int = 8
) -> tuple[PeerTransport, PeerTransport, TxnMarkerCalls]:
    def make(send: Callable[[NodeId, bytes], bool]) -> TxnMarkerCalls:
        return TxnMarkerCalls(
            send=send, serve=leader, spawn=spawn_call_task, calls_in_flight_max=calls_in_flight_max
        )

    a, b, calls_a, _, _ = await call_pair(make)
    return a, b, calls_a


def test_markers_are_answered_by_the_leader_in_order() -> None:
    async def scenario() -> None:
        leader = Leader()
        leader.codes = {1: 47}  # INVALID_PRODUCER_EPOCH for partition 1
        a, b, calls_a = await _pair(leader)
        markers = [TxnMarker(9, 2, 5, commit, "orders", p) for p, commit in ((0, True), (1, False))]
        results = await calls_a.call(B, markers, 5.0)
        assert results == [TxnMarkerResult("orders", 0, 0), TxnMarkerResult("orders", 1, 47)]
        [(served, timeout_s)] = leader.served
        assert served == tuple(markers) and 4.9 < timeout_s <= 5.0
        await closing(a, b)

    run(scenario)


def test_a_call_beyond_the_bound_is_dropped_at_once() -> None:
    async def scenario() -> None:
        leader = Leader()
        leader.hold = True
        a, b, calls_a = await _pair(leader, calls_in_flight_max=1)
        marker = TxnMarker(9, 2, 5, True, "orders", 0)
        held = asyncio.create_task(calls_a.call(B, [marker], 10.0))
        while not leader.served:
            await asyncio.sleep(0.01)
        assert not calls_a.has_room()
        with pytest.raises(ProposalDroppedError, match="in flight"):
            await calls_a.call(B, [marker], 10.0)
        leader.release.set()
        assert await held == [TxnMarkerResult("orders", 0, 0)]
        await closing(a, b)

    run(scenario)
