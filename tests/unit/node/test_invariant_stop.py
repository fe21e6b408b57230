"""A failed assertion outside the node's tasks stops the node: a transport callback steps
Raft groups (RaftGroupHost.deliver), and asyncio answers a callback that raised by closing the
connection and logging, which would let the node limp on past a broken invariant."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from raftlog.config import NodeConfig, TransportConfig
from raftlog.node.node import Node
from raftlog.raft.types import HeartbeatRequest
from raftlog.rpc.codec import Item
from raftlog.rpc.peer_transport import PeerTransport
from raftlog.settings import NodeSettings
from raftlog.types import NodeId, Offset, RaftGroupId, Term

A, B = NodeId(1), NodeId(2)
FAST = TransportConfig(reconnect_backoff_ms_min=1, reconnect_backoff_ms_max=5)


def _node(data_dir: Path) -> Node:
    address = ("127.0.0.1", 1)
    settings = NodeSettings(
        node_id=A,
        data_dir=data_dir,
        listen=address,
        raft_listen=address,
        peers={A: address},
        config=NodeConfig(),
    )
    return Node(settings)


def _broken_invariant(sender: NodeId, items: list[Item]) -> None:
    raise AssertionError(f"an invariant broke on {len(items)} messages of node {sender}")


def _ignored(sender: NodeId, items: list[Item]) -> None:
    del sender, items


async def _deliver_to(on_messages_b: object, node: Node) -> None:
    """Node A sends node B one heartbeat; B's `on_messages` is `on_messages_b`; the loop's
    exception handler is the broker's, as `Node.start` installs it."""
    loop = asyncio.get_running_loop()
    node.failed = loop.create_future()
    loop.set_exception_handler(node._on_loop_exception)
    a = PeerTransport(node_id=A, cluster_id="t", config=FAST, on_messages=_ignored)
    b = PeerTransport(
        node_id=B, cluster_id="t", config=FAST, on_messages=on_messages_b, rng=random.Random(2)
    )  # type: ignore[arg-type]
    _, port_a = await a.start("127.0.0.1", 0)
    _, port_b = await b.start("127.0.0.1", 0)
    a.update_peers({B: ("127.0.0.1", port_b)})
    b.update_peers({A: ("127.0.0.1", port_a)})
    await a.wait_connected(B)
    a.send(B, RaftGroupId(1), HeartbeatRequest(Term(1), A, B, Offset(0), read_context=0))
    try:
        await asyncio.wait_for(asyncio.shield(node.failed), 2.0)
    except (TimeoutError, AssertionError):
        pass
    finally:
        await asyncio.gather(a.close(), b.close())


def test_a_failed_assertion_in_a_transport_callback_stops_the_node(tmp_path: Path) -> None:
    node = _node(tmp_path)
    asyncio.run(_deliver_to(_broken_invariant, node))
    assert node.failed is not None and node.failed.done()
    error = node.failed.exception()
    assert isinstance(error, AssertionError) and "an invariant broke" in str(error)


def test_other_errors_in_callbacks_are_logged_without_stopping_the_node(tmp_path: Path) -> None:
    def refused(sender: NodeId, items: list[Item]) -> None:
        raise ValueError("not an invariant: asyncio logs it and closes the connection")

    node = _node(tmp_path)
    asyncio.run(_deliver_to(refused, node))
    assert node.failed is not None and not node.failed.done()
