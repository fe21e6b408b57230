"""Loopback helpers shared by the transport and fault tests (imported as a sibling module)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

from raftlog.config import TransportConfig
from raftlog.raft.types import AppendRequest, Entry, EntryKind, HeartbeatRequest, Message
from raftlog.rpc import codec
from raftlog.rpc.faults import FaultInjector
from raftlog.rpc.peer_transport import PeerTransport
from raftlog.types import NodeId, Offset, RaftGroupId, Term

HANG_GUARD_S = 30
FAST = TransportConfig(reconnect_backoff_ms_min=1, reconnect_backoff_ms_max=5)
A, B, C = NodeId(1), NodeId(2), NodeId(3)


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), HANG_GUARD_S))


class Inbox:
    """Collects what a transport delivers; tests wait for a number of messages."""

    def __init__(self) -> None:
        self.items: list[tuple[NodeId, RaftGroupId, Message]] = []
        self.frames = 0
        self.changed = asyncio.Event()

    def __call__(self, sender: NodeId, items: list[codec.Item]) -> None:
        self.frames += 1
        self.items.extend((sender, group, message) for group, message in items)
        self.changed.set()

    async def wait_for(self, count: int) -> None:
        while len(self.items) < count:
            self.changed.clear()
            await self.changed.wait()

    def messages(self) -> list[Message]:
        return [message for _, _, message in self.items]


def heartbeat(sender: NodeId, receiver: NodeId, n: int) -> HeartbeatRequest:
    return HeartbeatRequest(Term(1), sender, receiver, Offset(n), read_context=n)


def append(sender: NodeId, receiver: NodeId, data_bytes: int) -> AppendRequest:
    entry = Entry(Term(1), Offset(0), 1, EntryKind.DATA, bytes(data_bytes))
    return AppendRequest(Term(1), sender, receiver, Offset(-1), Term(0), (entry,), Offset(-1))


async def node(
    node_id: NodeId,
    inbox: Inbox,
    *,
    config: TransportConfig = FAST,
    cluster_id: str = "test",
    faults: FaultInjector | None = None,
    port: int = 0,
) -> tuple[PeerTransport, int]:
    transport = PeerTransport(
        node_id=node_id,
        cluster_id=cluster_id,
        config=config,
        on_messages=inbox,
        faults=faults,
        rng=random.Random(node_id),
    )
    _, bound = await transport.start("127.0.0.1", port)
    return transport, bound


async def pair(
    *, config: TransportConfig = FAST, faults: FaultInjector | None = None
) -> tuple[PeerTransport, PeerTransport, Inbox, Inbox]:
    inbox_a, inbox_b = Inbox(), Inbox()
    a, port_a = await node(A, inbox_a, config=config, faults=faults)
    b, port_b = await node(B, inbox_b, config=config)
    a.update_peers({B: ("127.0.0.1", port_b)})
    b.update_peers({A: ("127.0.0.1", port_a)})
    await a.wait_connected(B)
    await b.wait_connected(A)
    return a, b, inbox_a, inbox_b


async def closing(*transports: PeerTransport) -> None:
    await asyncio.gather(*(transport.close() for transport in transports))


class CallEnds(Protocol):
    """What a node-to-node calls object (PeerCalls, TxnMarkerCalls) gives its transport."""

    def on_frame(self, sender: NodeId, kind: codec.FrameKind, body: memoryview) -> None: ...

    def peer_disconnected(self, peer: NodeId) -> None: ...


CallsT = TypeVar("CallsT", bound=CallEnds)
# The tasks serving calls (a node supervises them: Node._spawn).
call_tasks: set[asyncio.Task[None]] = set()


def spawn_call_task(coroutine: Coroutine[Any, Any, None], name: str) -> None:
    call_tasks.add(asyncio.create_task(coroutine, name=name))


def frame_body(frame: bytes, kind: codec.FrameKind) -> memoryview:
    """The body of one framed `frame`, checking its header says `kind` and its length."""
    length, frame_kind = codec.FRAME_HEADER.unpack_from(frame)
    assert frame_kind == kind and length == len(frame) - 4
    return memoryview(frame)[codec.FRAME_HEADER.size :]


async def call_pair(
    make_calls: Callable[[Callable[[NodeId, bytes], bool]], CallsT],
    *,
    connect: bool = True,
    inbox_b: Inbox | None = None,
) -> tuple[PeerTransport, PeerTransport, CallsT, CallsT, int]:
    """Nodes A and B on loopback transports, each with the calls object `make_calls` builds
    around its transport's frame sender; returns both transports, both calls objects and
    B's port. `inbox_b` records B's Raft traffic. B knows A; A dials B here only with
    `connect`."""
    calls: dict[NodeId, CallsT] = {}
    transports: dict[NodeId, PeerTransport] = {}
    inbox_b = inbox_b if inbox_b is not None else Inbox()
    for node_id, inbox in ((A, Inbox()), (B, inbox_b)):
        transport = PeerTransport(
            node_id=node_id,
            cluster_id="test",
            config=FAST,
            on_messages=inbox,
            rng=random.Random(node_id),
            on_call_frame=lambda sender, kind, body, n=node_id: calls[n].on_frame(
                sender, kind, body
            ),
            on_peer_disconnected=lambda peer, n=node_id: calls[n].peer_disconnected(peer),
        )
        transports[node_id] = transport
        calls[node_id] = make_calls(transport.send_call_frame)
    ports = {n: (await t.start("127.0.0.1", 0))[1] for n, t in transports.items()}
    transports[B].update_peers({A: ("127.0.0.1", ports[A])})
    if connect:
        transports[A].update_peers({B: ("127.0.0.1", ports[B])})
        await transports[A].wait_connected(B)
        await transports[B].wait_connected(A)
    return transports[A], transports[B], calls[A], calls[B], ports[B]
