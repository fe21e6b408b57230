"""Node liveness in PeerTransport: one heartbeat frame per node pair per interval, reported
as reachable/unreachable transitions (what quiesced Raft groups rely on)."""

from __future__ import annotations

import asyncio
import random

from loopback import FAST, A, B, Inbox, closing, heartbeat, run

from raftlog.config import TransportConfig
from raftlog.errors import ConfigError
from raftlog.rpc.faults import FaultInjector
from raftlog.rpc.peer_transport import PeerTransport
from raftlog.types import NodeId, RaftGroupId

LIVENESS = TransportConfig(
    reconnect_backoff_ms_min=1,
    reconnect_backoff_ms_max=5,
    node_heartbeat_interval_ms=10,
    node_liveness_timeout_ms=100,
)


class Changes:
    """Records liveness reports; tests wait for a given one."""

    def __init__(self) -> None:
        self.reports: list[tuple[NodeId, bool]] = []
        self.changed = asyncio.Event()

    def __call__(self, peer: NodeId, reachable: bool) -> None:
        self.reports.append((peer, reachable))
        self.changed.set()

    async def wait_for(self, report: tuple[NodeId, bool]) -> None:
        while not self.reports or self.reports[-1] != report:
            self.changed.clear()
            await self.changed.wait()


async def _node(
    node_id: NodeId, inbox: Inbox, changes: Changes, faults: FaultInjector | None = None
) -> tuple[PeerTransport, int]:
    transport = PeerTransport(
        node_id=node_id,
        cluster_id="test",
        config=LIVENESS,
        on_messages=inbox,
        rng=random.Random(node_id),
        on_peer_liveness=changes,
        faults=faults,
    )
    _, port = await transport.start("127.0.0.1", 0)
    return transport, port


def test_idle_peers_stay_reachable_on_heartbeat_frames_alone() -> None:
    async def scenario() -> None:
        inbox_a, inbox_b, changes_a, changes_b = Inbox(), Inbox(), Changes(), Changes()
        a, port_a = await _node(A, inbox_a, changes_a)
        b, port_b = await _node(B, inbox_b, changes_b)
        a.update_peers({B: ("127.0.0.1", port_b)})
        b.update_peers({A: ("127.0.0.1", port_a)})
        await changes_a.wait_for((B, True))
        await changes_b.wait_for((A, True))
        # Many liveness timeouts without any Raft traffic: still reachable, no messages.
        while b.counters().heartbeats_sent < 30:
            await asyncio.sleep(0.01)
        assert changes_a.reports == [(B, True)] and a.is_reachable(B)
        assert inbox_a.items == [] and inbox_a.frames == 0
        assert a.counters().frames_received >= 10
        await closing(a, b)

    run(scenario)


def test_a_closed_peer_is_unreachable_at_once_and_reachable_when_back() -> None:
    async def scenario() -> None:
        inbox_a, changes_a = Inbox(), Changes()
        a, port_a = await _node(A, inbox_a, changes_a)
        b, port_b = await _node(B, Inbox(), Changes())
        a.update_peers({B: ("127.0.0.1", port_b)})
        b.update_peers({A: ("127.0.0.1", port_a)})
        await changes_a.wait_for((B, True))
        await b.close()
        await changes_a.wait_for((B, False))
        assert not a.is_reachable(B) and a.counters().peers_unreachable == 1
        b2, _ = await _node(B, Inbox(), Changes())
        b2.update_peers({A: ("127.0.0.1", port_a)})
        await changes_a.wait_for((B, True))
        a.send(B, RaftGroupId(1), heartbeat(A, B, 1))
        await closing(a, b2)

    run(scenario)


def test_a_silent_but_connected_peer_expires_after_the_timeout() -> None:
    """A blocked link (a partition: the connection stays up, nothing arrives) expires."""

    async def scenario() -> None:
        faults_a = FaultInjector(rng=random.Random(1))
        inbox_a, changes_a = Inbox(), Changes()
        a, port_a = await _node(A, inbox_a, changes_a, faults=faults_a)
        b, port_b = await _node(B, Inbox(), Changes())
        a.update_peers({B: ("127.0.0.1", port_b)})
        b.update_peers({A: ("127.0.0.1", port_a)})
        await changes_a.wait_for((B, True))
        faults_a.block(B)
        await changes_a.wait_for((B, False))
        assert a.counters().frames_blocked_incoming > 0
        await closing(a, b)

    run(scenario)


def test_liveness_timeout_must_cover_several_heartbeats() -> None:
    bad = TransportConfig(node_heartbeat_interval_ms=100, node_liveness_timeout_ms=200)
    try:
        bad.validate()
    except ConfigError as error:
        assert "node_liveness_timeout_ms" in str(error)
    else:
        raise AssertionError("validate() accepted a timeout of two heartbeat intervals")
    assert FAST.validate().node_liveness_timeout_ms >= 3 * FAST.node_heartbeat_interval_ms
