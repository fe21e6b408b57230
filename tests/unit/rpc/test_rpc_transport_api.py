"""Pins the public API of the node-to-node transport modules: changing it is a decision."""

from __future__ import annotations

import inspect

from raftlog.rpc import codec, faults, peer_transport


def test_public_names() -> None:
    assert sorted(peer_transport.__all__) == [
        "OnCallFrame",
        "OnMessages",
        "PeerTransport",
        "TransportCounters",
    ]
    assert sorted(faults.__all__) == [
        "ChaosClock",  # the node's movable wall clock (issue 8)
        "DELIVER",
        "Direction",
        "FaultCounters",
        "FaultInjector",
        "FaultState",
        "FrameFate",
        "LinkFaults",
    ]
    assert "encode_messages" in codec.__all__ and "decode_messages" in codec.__all__


def test_transport_signatures() -> None:
    init = inspect.signature(peer_transport.PeerTransport.__init__)
    assert [p.name for p in init.parameters.values() if p.kind is p.KEYWORD_ONLY] == [
        "node_id",
        "cluster_id",
        "config",
        "on_messages",
        "ssl_server",
        "ssl_client",
        "faults",
        "rng",
        "incarnation",
        "on_peer_restart",
        "on_peer_liveness",
        "on_call_frame",
        "on_peer_disconnected",
    ]
    send = inspect.signature(peer_transport.PeerTransport.send)
    assert list(send.parameters) == ["self", "peer", "group", "message"]
    for name in ("start", "close", "wait_connected", "wait_queue_below"):
        assert inspect.iscoroutinefunction(getattr(peer_transport.PeerTransport, name)), name
    send_call_frame = inspect.signature(peer_transport.PeerTransport.send_call_frame)
    assert list(send_call_frame.parameters) == ["self", "peer", "frame"]
    for name in ("update_peers", "counters", "is_connected", "queued_bytes", "send_call_frame"):
        assert not inspect.iscoroutinefunction(getattr(peer_transport.PeerTransport, name)), name
