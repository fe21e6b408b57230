"""Node-to-node traffic with raftlog.tls contexts: encrypted on the wire, foreign certs refused.

Two real PeerTransports on loopback; a recording proxy sits on the path from A to B. The
same scenario in clear is the control that shows the wire check can fail.
"""

from __future__ import annotations

import asyncio
import random
import ssl

import pytest

from raftlog.config import TransportConfig
from raftlog.raft.types import AppendRequest, Entry, EntryKind, Message
from raftlog.rpc import codec
from raftlog.rpc.peer_transport import PeerTransport
from raftlog.tls import TlsFiles, peer_ssl_contexts
from raftlog.types import NodeId, Offset, RaftGroupId, Term
from tests.security.pki import Pki, RecordingProxy

FAST = TransportConfig(reconnect_backoff_ms_min=1, reconnect_backoff_ms_max=5)
A, B = NodeId(1), NodeId(2)
SECRET = b"SECRET-raft-entry-payload-7f3a"
HANG_GUARD_S = 30
Contexts = tuple[ssl.SSLContext, ssl.SSLContext] | tuple[None, None]


def append_with(data: bytes) -> AppendRequest:
    entry = Entry(Term(1), Offset(0), 1, EntryKind.DATA, data)
    return AppendRequest(Term(1), A, B, Offset(-1), Term(0), (entry,), Offset(-1))


class Inbox:
    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.changed = asyncio.Event()

    def __call__(self, sender: NodeId, items: list[codec.Item]) -> None:
        self.messages.extend(message for _, message in items)
        self.changed.set()


async def transport(node_id: NodeId, inbox: Inbox, contexts: Contexts) -> tuple[PeerTransport, int]:
    server, client = contexts
    peer = PeerTransport(
        node_id=node_id, cluster_id="test", config=FAST, on_messages=inbox,
        ssl_server=server, ssl_client=client, rng=random.Random(node_id),
    )  # fmt: skip
    _, port = await peer.start("127.0.0.1", 0)
    return peer, port


async def send_through_proxy(contexts: Contexts) -> tuple[bytes, list[Message]]:
    """A sends an entry holding SECRET to B through a recording proxy; returns wire, inbox."""
    inbox_b = Inbox()
    a, port_a = await transport(A, Inbox(), contexts)
    b, port_b = await transport(B, inbox_b, contexts)
    proxy = RecordingProxy(("127.0.0.1", port_b))
    try:
        a.update_peers({B: ("127.0.0.1", proxy.port)})
        b.update_peers({A: ("127.0.0.1", port_a)})
        a.send(B, RaftGroupId(7), append_with(SECRET))
        while not inbox_b.messages:
            inbox_b.changed.clear()
            await inbox_b.changed.wait()
        return proxy.wire_bytes(), inbox_b.messages
    finally:
        proxy.close()
        await asyncio.gather(a.close(), b.close())


def run(contexts: Contexts) -> tuple[bytes, list[Message]]:
    return asyncio.run(asyncio.wait_for(send_through_proxy(contexts), HANG_GUARD_S))


def test_raft_traffic_is_encrypted_on_the_wire(pki: Pki) -> None:
    wire, received = run(peer_ssl_contexts(TlsFiles(cert=pki.cert, key=pki.key, ca=pki.ca)))
    assert received == [append_with(SECRET)]
    assert len(wire) > 500 and SECRET not in wire


def test_control_in_clear_the_payload_is_visible(pki: Pki) -> None:
    wire, received = run((None, None))
    assert received == [append_with(SECRET)]
    assert SECRET in wire  # the check above would catch a transport that sends in clear


def test_a_node_with_a_foreign_certificate_never_completes_the_hello(pki: Pki) -> None:
    ours = peer_ssl_contexts(TlsFiles(cert=pki.cert, key=pki.key, ca=pki.ca))
    # An impostor that trusts our CA (so it accepts us) but holds a foreign certificate.
    theirs = peer_ssl_contexts(TlsFiles(cert=pki.foreign_cert, key=pki.foreign_key, ca=pki.ca))

    async def scenario() -> None:
        inbox_b = Inbox()
        a, _ = await transport(A, Inbox(), theirs)
        b, port_b = await transport(B, inbox_b, ours)
        a.update_peers({B: ("127.0.0.1", port_b)})
        b.update_peers({A: ("127.0.0.1", 1)})
        a.send(B, RaftGroupId(1), append_with(b"let me in"))
        while a.counters().connect_failures < 3:
            await asyncio.sleep(0)  # yield to the redial loop
        assert a.counters().connects == 0 and inbox_b.messages == []
        assert not a.is_connected(B)
        await asyncio.gather(a.close(), b.close())

    asyncio.run(asyncio.wait_for(scenario(), HANG_GUARD_S))


def test_peer_tls_requires_a_ca(pki: Pki) -> None:
    from raftlog.errors import ConfigError

    with pytest.raises(ConfigError, match="--tls-ca"):
        peer_ssl_contexts(TlsFiles(cert=pki.cert, key=pki.key))
