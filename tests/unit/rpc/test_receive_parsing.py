"""The receive path's frame parser under every fragmentation the kernel could produce.

A connection is fed a byte stream (HELLO, then MESSAGES frames, some larger than its receive
buffer) in chunks of hypothesis-chosen sizes, through the same get_buffer/buffer_updated calls
asyncio makes, and must deliver exactly the frames that were sent, in order. The socket is a
recording test double of asyncio.Transport; the listening transport is real but unused.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from loopback import A, B, Inbox, append, heartbeat, node

from raftlog.config import TransportConfig
from raftlog.rpc import codec
from raftlog.rpc.peer_connection import PeerConnection
from raftlog.types import RaftGroupId

SMALL_BUFFER = TransportConfig(
    receive_buffer_bytes=512,
    frame_bytes_max=64 * 1024,
    frame_bytes_target=64 * 1024,
    reconnect_backoff_ms_min=60_000,
    reconnect_backoff_ms_max=60_000,
)


class RecordingSocket(asyncio.Transport):
    """Stands in for the socket: records writes, remembers an abort."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.aborted = False

    def write(self, data: Any) -> None:
        self.written += data

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.aborted

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass


def feed(connection: PeerConnection, stream: bytes, chunk_sizes: list[int]) -> None:
    """Deliver `stream` the way asyncio does: into the buffer the protocol hands out."""
    position, turn = 0, 0
    while position < len(stream):
        buffer = connection.get_buffer(-1)
        assert len(buffer) > 0
        size = min(len(buffer), chunk_sizes[turn % len(chunk_sizes)], len(stream) - position)
        buffer[:size] = stream[position : position + size]
        connection.buffer_updated(size)
        position, turn = position + size, turn + 1


frame_specs = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 3000)), min_size=1, max_size=8
)  # (heartbeats, bytes of one append) per frame


@settings(max_examples=60, deadline=None)
@given(frame_specs, st.lists(st.integers(1, 2000), min_size=1, max_size=10))
def test_any_fragmentation_delivers_the_same_frames(
    specs: list[tuple[int, int]], chunk_sizes: list[int]
) -> None:
    frames: list[list[codec.Item]] = []
    for heartbeats, data_bytes in specs:
        items: list[codec.Item] = [(RaftGroupId(n), heartbeat(A, B, n)) for n in range(heartbeats)]
        items.append((RaftGroupId(9), append(A, B, data_bytes)))
        frames.append(items)
    stream = codec.encode_hello(codec.Hello("test", A)) + b"".join(
        bytes(codec.encode_messages(items)) for items in frames
    )

    async def scenario() -> Inbox:
        inbox = Inbox()
        b, _ = await node(B, inbox, config=SMALL_BUFFER)
        b.update_peers({A: ("127.0.0.1", 1)})
        connection = PeerConnection(b, expected=None)
        socket = RecordingSocket()
        connection.connection_made(socket)
        feed(connection, stream, chunk_sizes)
        assert not socket.aborted
        assert bytes(socket.written) == codec.encode_hello(codec.Hello("test", B))
        await b.close()
        return inbox

    inbox = asyncio.run(scenario())
    assert inbox.frames == len(frames)
    assert [(group, message) for _, group, message in inbox.items] == [
        item for items in frames for item in items
    ]
