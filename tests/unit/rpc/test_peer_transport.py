"""PeerTransport on loopback: delivery across groups, batching, bounds, reconnects, HELLO checks.

No sleeps: every wait is for an event the transport or the receiver signals; `asyncio.sleep(0)`
only yields one loop iteration so a scheduled flush runs. `run` bounds each test with a hang
guard, which is not a timing threshold: a passing test never comes near it.
"""

from __future__ import annotations

import asyncio
import struct

import pytest
from loopback import A, B, C, Inbox, append, closing, heartbeat, node, pair, run

from raftlog.config import TransportConfig
from raftlog.errors import FrameError
from raftlog.raft.types import AppendRequest, Entry, EntryKind, TimeoutNow
from raftlog.rpc import codec
from raftlog.types import Offset, RaftGroupId, Term


def test_messages_for_many_groups_arrive_in_order_one_frame_per_loop_iteration() -> None:
    async def scenario() -> None:
        a, b, inbox_a, inbox_b = await pair()
        sent = [(RaftGroupId(group), heartbeat(A, B, n)) for n in range(5) for group in range(20)]
        for group, message in sent:
            a.send(B, group, message)
        a.send(B, RaftGroupId(7), append(A, B, 100_000))
        b.send(A, RaftGroupId(3), TimeoutNow(Term(2), B, A))
        await inbox_b.wait_for(len(sent) + 1)
        await inbox_a.wait_for(1)
        assert [(g, m) for _, g, m in inbox_b.items[:-1]] == sent
        assert inbox_b.messages()[-1] == append(A, B, 100_000)
        assert {sender for sender, _, _ in inbox_b.items} == {A}
        assert inbox_a.items == [(B, RaftGroupId(3), TimeoutNow(Term(2), B, A))]
        # Everything sent in one loop iteration went out as one frame.
        assert a.counters().frames_sent == 1 and inbox_b.frames == 1
        assert a.counters().messages_sent == b.counters().messages_received == len(sent) + 1
        await closing(a, b)

    run(scenario)


def test_large_entries_arrive_whole_from_frames_sent_in_parts() -> None:
    """Entry data of SCATTER_DATA_BYTES_MIN or more goes to the socket from the entry's own
    bytes, between the packed rest of the frame, in slices of WRITE_SLICE_BYTES; the receiver
    reuses its large-frame buffer for a smaller frame after it."""

    def request(sizes: list[int], fill: int) -> AppendRequest:
        entries = tuple(
            Entry(Term(1), Offset(index), 1, EntryKind.DATA, bytes([fill + index]) * size)
            for index, size in enumerate(sizes)
        )
        return AppendRequest(Term(1), A, B, Offset(-1), Term(0), entries, Offset(-1))

    async def scenario() -> None:
        a, b, _, inbox_b = await pair()
        large = codec.SCATTER_DATA_BYTES_MIN
        first = request([10, 5 * large, 0, large, 300, 3 * large], fill=1)
        second = request([2 * large, 7], fill=100)
        a.send(B, RaftGroupId(2), heartbeat(A, B, 1))
        a.send(B, RaftGroupId(1), first)
        a.send(B, RaftGroupId(3), heartbeat(A, B, 2))
        await inbox_b.wait_for(3)
        a.send(B, RaftGroupId(1), second)
        await inbox_b.wait_for(4)
        assert inbox_b.messages() == [heartbeat(A, B, 1), first, heartbeat(A, B, 2), second]
        assert a.counters().bytes_sent == b.counters().bytes_received
        await closing(a, b)

    run(scenario)


def test_frames_are_split_at_frame_bytes_max() -> None:
    config = TransportConfig(
        frame_bytes_max=64 * 1024,
        frame_bytes_target=64 * 1024,
        receive_buffer_bytes=4096,
        peer_queue_bytes_max=1 << 20,
    )

    async def scenario() -> None:
        a, b, _, inbox_b = await pair(config=config)
        messages = [append(A, B, 20_000) for _ in range(10)]
        for message in messages:
            a.send(B, RaftGroupId(1), message)
        await inbox_b.wait_for(10)
        assert inbox_b.messages() == messages
        # Three 20 kB appends fit in a 64 KiB frame; frames exceed the 4 KiB receive buffer.
        assert a.counters().frames_sent == 4 == inbox_b.frames
        with pytest.raises(FrameError, match="cannot fit in frame_bytes_max=65536"):
            a.send(B, RaftGroupId(1), append(A, B, 70_000))
        await closing(a, b)

    run(scenario)


def test_a_full_queue_drops_instead_of_blocking() -> None:
    config = TransportConfig(
        frame_bytes_max=128 * 1024,
        frame_bytes_target=128 * 1024,
        receive_buffer_bytes=4096,
        peer_queue_bytes_max=1024 * 1024,
        write_buffer_bytes_max=64 * 1024,
    )

    async def scenario() -> None:
        stalled = asyncio.Event()

        async def stalled_peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readexactly(len(codec.encode_hello(codec.Hello("test", A))))
            writer.write(codec.encode_hello(codec.Hello("test", B)))
            await stalled.wait()  # never reads again: the kernel buffers fill, then ours
            writer.close()

        server = await asyncio.start_server(stalled_peer, "127.0.0.1", 0)
        a, _ = await node(A, Inbox(), config=config)
        a.update_peers({B: ("127.0.0.1", server.sockets[0].getsockname()[1])})
        await a.wait_connected(B)
        message = append(A, B, 100_000)
        for _ in range(400):  # 40 MB without yielding: more than kernel buffers can take
            a.send(B, RaftGroupId(1), message)
        counters = a.counters()
        assert counters.messages_dropped_queue_full > 0
        assert 0 < a.queued_bytes(B) <= config.peer_queue_bytes_max
        assert counters.messages_sent + counters.messages_dropped_queue_full <= 400
        stalled.set()
        await closing(a)
        server.close()

    run(scenario)


async def _unused_port() -> int:
    """A loopback port nothing listens on (it was bound a moment ago): dialing it fails."""
    closed = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port: int = closed.sockets[0].getsockname()[1]
    closed.close()
    await closed.wait_closed()
    return port


def test_a_peer_that_is_down_gets_nothing_queued() -> None:
    slow_redial = TransportConfig(reconnect_backoff_ms_min=60_000, reconnect_backoff_ms_max=60_000)

    async def scenario() -> None:
        port = await _unused_port()
        a, _ = await node(A, Inbox(), config=slow_redial)
        a.update_peers({B: ("127.0.0.1", port)})
        while a.counters().connect_failures < 1:
            await asyncio.sleep(0)  # yield until the first dial has failed
        a.send(B, RaftGroupId(1), heartbeat(A, B, 1))  # backing off for a minute: dropped at once
        assert a.counters().messages_dropped_peer_down == 1 and a.queued_bytes(B) == 0
        await closing(a)

    run(scenario)


def test_reconnects_after_the_peer_restarts() -> None:
    async def scenario() -> None:
        a, b, _, inbox_b = await pair()
        a.send(B, RaftGroupId(1), heartbeat(A, B, 1))
        await inbox_b.wait_for(1)
        port_b = b._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        await b.close()
        inbox_b2 = Inbox()
        b2, _ = await node(B, inbox_b2, port=port_b)
        b2.update_peers({A: ("127.0.0.1", 1)})
        # A notices the loss, backs off, redials and completes a new HELLO exchange.
        while a.counters().connects < 2:
            await asyncio.sleep(0)  # yield to the redial loop; it needs a few iterations
        await a.wait_connected(B)
        a.send(B, RaftGroupId(1), heartbeat(A, B, 2))
        await inbox_b2.wait_for(1)
        assert inbox_b2.messages() == [heartbeat(A, B, 2)]
        await closing(a, b2)

    run(scenario)


def test_a_hello_from_a_peer_ends_the_backoff_toward_it() -> None:
    slow_redial = TransportConfig(reconnect_backoff_ms_min=60_000, reconnect_backoff_ms_max=60_000)

    async def scenario() -> None:
        port_b = await _unused_port()  # B is down: A's first dial fails, then it backs off
        a, port_a = await node(A, Inbox(), config=slow_redial)
        a.update_peers({B: ("127.0.0.1", port_b)})
        while a.counters().connect_failures < 1:
            await asyncio.sleep(0)  # yield until the first dial has failed
        # B comes back and dials A; its HELLO cuts A's minute of backoff short.
        inbox_b = Inbox()
        b, _ = await node(B, inbox_b, port=port_b)
        b.update_peers({A: ("127.0.0.1", port_a)})
        await a.wait_connected(B)  # without the reset: only after 60 s (the hang guard fails)
        a.send(B, RaftGroupId(1), heartbeat(A, B, 1))
        await inbox_b.wait_for(1)
        assert a.counters().connect_failures == 1 and a.counters().connects == 1
        await closing(a, b)

    run(scenario)


def test_peers_can_be_added_removed_and_moved() -> None:
    async def scenario() -> None:
        a, b, _, _ = await pair()
        inbox_c = Inbox()
        c, port_c = await node(C, inbox_c)
        c.update_peers({A: ("127.0.0.1", 1)})
        port_b = b._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        a.update_peers({B: ("127.0.0.1", port_b), C: ("127.0.0.1", port_c)})
        await a.wait_connected(C)
        a.send(C, RaftGroupId(5), heartbeat(A, C, 1))
        await inbox_c.wait_for(1)
        # C learns a new address for A: the connection A dialed to C stays up.
        c.update_peers({A: ("127.0.0.1", 2)})
        a.send(C, RaftGroupId(5), heartbeat(A, C, 2))
        await inbox_c.wait_for(2)
        a.update_peers({C: ("127.0.0.1", port_c)})
        assert not a.is_connected(B)
        a.send(B, RaftGroupId(1), heartbeat(A, B, 1))
        assert a.counters().messages_dropped_unknown_peer == 1
        await closing(a, b, c)

    run(scenario)


async def raw_connection(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def refused(reader: asyncio.StreamReader) -> bytes:
    """What the listener sent before closing on us (it answers only a HELLO it accepts)."""
    try:
        return await reader.read()
    except ConnectionResetError:
        return b""


@pytest.mark.parametrize(
    ("hello", "reason"),
    [
        (codec.Hello("other-cluster", A), "cluster"),
        (codec.Hello("test", C), "unknown node"),
        (codec.Hello("test", B), "its own id"),
    ],
)
def test_hello_from_a_stranger_is_refused(hello: codec.Hello, reason: str) -> None:
    async def scenario() -> None:
        inbox_b = Inbox()
        b, port_b = await node(B, inbox_b)
        b.update_peers({A: ("127.0.0.1", 1)})
        reader, writer = await raw_connection(port_b)
        frame = codec.encode_messages([(RaftGroupId(1), heartbeat(hello.node_id, B, 1))])
        writer.write(codec.encode_hello(hello) + bytes(frame))
        assert await refused(reader) == b"", reason
        assert b.counters().handshakes_refused == 1
        assert inbox_b.items == []
        writer.close()
        await closing(b)

    run(scenario)


@pytest.mark.parametrize(
    "answer", [codec.Hello("other-cluster", B), codec.Hello("test", C)], ids=["cluster", "node"]
)
def test_dialer_refuses_a_listener_that_is_not_the_peer_it_dialed(answer: codec.Hello) -> None:
    async def scenario() -> None:
        async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readexactly(len(codec.encode_hello(codec.Hello("test", A))))
            writer.write(codec.encode_hello(answer))
            await reader.read()
            writer.close()

        server = await asyncio.start_server(impostor, "127.0.0.1", 0)
        a, _ = await node(A, Inbox())
        a.update_peers({B: ("127.0.0.1", server.sockets[0].getsockname()[1])})
        a.send(B, RaftGroupId(1), heartbeat(A, B, 1))  # queued while connecting, never sent
        while a.counters().connect_failures < 2:
            await asyncio.sleep(0)  # yield: each refused redial takes a few loop iterations
        counters = a.counters()
        assert not a.is_connected(B)
        assert counters.connects == 0 and counters.handshakes_refused >= 2
        assert counters.frames_sent == 0 and counters.frames_dropped_disconnected == 1
        await closing(a)
        server.close()
        await server.wait_closed()

    run(scenario)


def test_a_silent_connection_is_closed_after_the_hello_timeout() -> None:
    async def scenario() -> None:
        b, port_b = await node(B, Inbox(), config=TransportConfig(hello_timeout_ms=1))
        reader, writer = await raw_connection(port_b)
        assert await refused(reader) == b""  # we never said HELLO
        assert b.counters().handshakes_refused == 1
        writer.close()
        await closing(b)

    run(scenario)


@pytest.mark.parametrize(
    ("tail", "counter"),
    [
        (struct.pack("!IB", 1 << 30, 2), "frame_errors"),  # over frame_bytes_max
        (struct.pack("!IB", 5, 9) + b"abcd", "frame_errors"),  # unknown frame kind
        (struct.pack("!IBI", 5, 2, 3), "frame_errors"),  # 3 messages, none there
    ],
)
def test_malformed_frames_close_the_connection(tail: bytes, counter: str) -> None:
    async def scenario() -> None:
        inbox_b = Inbox()
        b, port_b = await node(B, inbox_b)
        b.update_peers({A: ("127.0.0.1", 1)})
        reader, writer = await raw_connection(port_b)
        writer.write(codec.encode_hello(codec.Hello("test", A)) + tail)
        hello = await reader.readexactly(len(codec.encode_hello(codec.Hello("test", B))))
        assert hello == codec.encode_hello(codec.Hello("test", B))
        assert await refused(reader) == b""
        assert getattr(b.counters(), counter) == 1
        assert inbox_b.items == []
        writer.close()
        await closing(b)

    run(scenario)


def test_messages_must_name_the_sender_of_the_connection() -> None:
    async def scenario() -> None:
        inbox_b = Inbox()
        b, port_b = await node(B, inbox_b)
        b.update_peers({A: ("127.0.0.1", 1), C: ("127.0.0.1", 1)})
        reader, writer = await raw_connection(port_b)
        forged = codec.encode_messages([(RaftGroupId(1), heartbeat(C, B, 1))])
        writer.write(codec.encode_hello(codec.Hello("test", A)) + bytes(forged))
        await reader.readexactly(len(codec.encode_hello(codec.Hello("test", B))))
        assert await refused(reader) == b""
        assert b.counters().frame_errors == 1 and inbox_b.items == []
        writer.close()
        await closing(b)

    run(scenario)
