"""Route proxies: a cut link holds one direction of a connection; healing lets it through."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from raftlog.chaos.jetstream_proxy import RouteProxies
from raftlog.local_cluster import free_port_base


@pytest.fixture
def wired() -> Iterator[tuple[RouteProxies, socket.socket, socket.socket]]:
    """Node 1 dials node 2 through the proxy for (1, 2): (proxies, node 1's end, node 2's)."""
    base = free_port_base(2)
    server = socket.create_server(("127.0.0.1", base + 2))
    proxies = RouteProxies({(1, 2): (base + 1, base + 2)})
    proxies.start()
    dialer = socket.create_connection(("127.0.0.1", base + 1), timeout=5)
    server.settimeout(5)
    accepted, _ = server.accept()
    accepted.settimeout(5)
    try:
        yield proxies, dialer, accepted
    finally:
        proxies.stop()
        for sock in (dialer, accepted, server):
            sock.close()


def _nothing_arrives(sock: socket.socket) -> bool:
    """Nothing within half a second (a held direction delivers nothing at all until healed,
    so this cannot pass by luck on a slow machine; it could only miss a leak)."""
    sock.settimeout(0.5)
    try:
        sock.recv(16)
    except TimeoutError:
        return True
    finally:
        sock.settimeout(5)
    return False


def test_a_cut_link_holds_its_direction_until_healed(
    wired: tuple[RouteProxies, socket.socket, socket.socket],
) -> None:
    proxies, node1, node2 = wired
    node1.sendall(b"hello")
    assert node2.recv(16) == b"hello"
    proxies.cut([(1, 2)])
    node1.sendall(b"held")
    node2.sendall(b"back")  # the other direction still flows
    assert node1.recv(16) == b"back"
    assert _nothing_arrives(node2)
    proxies.heal(2)
    assert node2.recv(16) == b"held"
    assert proxies.cut_links == frozenset()


def test_a_one_way_cut_from_the_dialed_side_holds_only_the_replies(
    wired: tuple[RouteProxies, socket.socket, socket.socket],
) -> None:
    proxies, node1, node2 = wired
    proxies.cut([(2, 1)])
    node1.sendall(b"ping")
    assert node2.recv(16) == b"ping"
    node2.sendall(b"pong")
    assert _nothing_arrives(node1)
    proxies.heal(1)
    assert node1.recv(16) == b"pong"
