"""Route proxies: a cut link holds one direction of a connection; healing lets it through."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftlog.chaos.jetstream_cluster import nats_server_binary
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


@pytest.mark.skipif(nats_server_binary() is None, reason="no nats-server binary")
def test_the_backend_turns_the_nemesis_block_rules_into_directed_cuts(tmp_path: Path) -> None:
    from raftlog.chaos.jetstream_backend import JetStreamBackend

    backend = JetStreamBackend(
        tmp_path, node_count=3, topic="chaos", sync_interval=None, trace_io=False
    )  # configs only: no server runs in this test
    proxies = backend._proxies
    assert backend.set_faults(1, {"block": [2, 3], "direction": "outgoing"})
    assert backend.set_faults(3, {"block": [2], "direction": "incoming"})
    assert proxies.cut_links == {(1, 2), (1, 3), (2, 3)}
    assert backend.set_faults(1, {"heal": True})
    assert proxies.cut_links == {(2, 3)}
    assert not backend.set_faults(2, {"link": {"peer": None, "drop_probability": 0.1}})
    assert not backend.set_faults(2, {"clock": {"offset_ms": 60_000}})
    configs = [(tmp_path / "jetstream" / f"node{n}" / "nats.conf").read_text() for n in (1, 2, 3)]
    proxy_ports = {str(port) for port in backend._cluster.proxy_ports.values()}
    for config in configs:  # every route goes through a proxy, none straight to a server
        routes = config.split("routes: [")[1].split("]")[0]
        assert {r.rsplit(":", 1)[1].rstrip('"') for r in routes.split(", ")} <= proxy_ports
