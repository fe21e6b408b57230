"""raftlog's own node-to-node transport as a candidate of the transport benchmark
(`transport.py`): a PeerTransport sender pacing 1 MiB appends over 100 groups to a receiver
that counts entry bytes, and the seeded payloads every candidate sends."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

from raftlog.config import TransportConfig
from raftlog.raft.types import AppendRequest, AppendResponse, Entry, EntryKind, Message
from raftlog.rpc.peer_transport import PeerTransport
from raftlog.types import NodeId, Offset, RaftGroupId, Term

SEED = 20261122
KIB = 1024
MIB = 1024 * KIB


def payloads(size_bytes: int, count: int = 16) -> list[bytes]:
    """The same seeded random payloads for every candidate."""
    rng = random.Random(SEED + size_bytes)
    return [rng.randbytes(size_bytes) for _ in range(count)]


SENDER, RECEIVER = NodeId(1), NodeId(2)


async def serve_raft_append() -> tuple[int, PeerTransport]:
    """A PeerTransport that counts entry bytes and answers an empty append with the count."""
    totals = {"bytes": 0}

    def on_messages(sender: NodeId, items: list[tuple[RaftGroupId, Message]]) -> None:
        for group, message in items:
            if not isinstance(message, AppendRequest):
                continue
            if not message.entries:  # the end marker
                answer = AppendResponse(Term(1), RECEIVER, sender, True, Offset(totals["bytes"]))
                receiver.send(sender, group, answer)
                totals["bytes"] = 0
            totals["bytes"] += sum(len(entry.data) for entry in message.entries)

    receiver = PeerTransport(
        node_id=RECEIVER, cluster_id="bench", config=TransportConfig(), on_messages=on_messages
    )
    _, port = await receiver.start("127.0.0.1", 0)
    return port, receiver


def append_request(entries: tuple[Entry, ...]) -> AppendRequest:
    return AppendRequest(Term(1), SENDER, RECEIVER, Offset(-1), Term(0), entries, Offset(0))


async def send_raft_append(
    port: int, volume_bytes: int, announce: Callable[[int], None], *, entry_bytes: int = KIB
) -> tuple[int, float]:
    """Bytes of entry data per second through codec + PeerTransport, 1 MiB appends made of
    `entry_bytes` entries, spread over 100 groups; the sender paces with wait_queue_below."""
    entries = tuple(
        Entry(Term(1), Offset(i), 1, EntryKind.DATA, data)
        for i, data in enumerate(payloads(entry_bytes, count=MIB // entry_bytes))
    )
    request, end = append_request(entries), append_request(())
    answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def on_messages(sender: NodeId, items: list[tuple[RaftGroupId, Message]]) -> None:
        for _, message in items:
            if isinstance(message, AppendResponse) and not answer.done():
                answer.set_result(message.last_offset)

    sender = PeerTransport(
        node_id=SENDER, cluster_id="bench", config=TransportConfig(), on_messages=on_messages
    )
    _, own_port = await sender.start("127.0.0.1", 0)
    announce(own_port)
    sender.update_peers({RECEIVER: ("127.0.0.1", port)})
    await sender.wait_connected(RECEIVER)
    sent = 0
    start = time.perf_counter()
    while sent < volume_bytes:
        await sender.wait_queue_below(RECEIVER, 32 * MIB)
        sender.send(RECEIVER, RaftGroupId(sent // MIB % 100), request)
        sent += MIB
    sender.send(RECEIVER, RaftGroupId(0), end)
    received = await answer
    elapsed = time.perf_counter() - start
    await sender.close()
    dropped = sender.counters().messages_dropped_queue_full
    assert received == sent and dropped == 0, (received, sent, dropped)
    return sent, elapsed
