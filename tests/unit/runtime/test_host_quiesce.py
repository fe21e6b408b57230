"""RaftGroupHost with quiescence: three in-process hosts of many groups on one loop, the core's
messages passed between them. Idle groups stop ticking and passing; a proposal wakes its
group; a leader node reported unreachable is replaced. (The asyncio host drives the same core
the unit tests drive by hand: raftlog.runtime.host.)"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from raftlog.config import RaftConfig
from raftlog.raft.memory import MemoryStorage
from raftlog.raft.types import Message, Role
from raftlog.runtime.host import RaftGroupHost
from raftlog.types import Commitment, NodeId, RaftGroupId
from tests.unit.runtime.hosted_groups import add_group

NODES = (NodeId(1), NodeId(2), NodeId(3))
GROUPS = 12
HANG_GUARD_S = 60
CONFIG = RaftConfig(election_timeout_ticks=10, heartbeat_interval_ticks=2)


class _Cluster:
    def __init__(self) -> None:
        self.cut: set[NodeId] = set()  # nodes whose traffic is dropped both ways
        self.hosts: dict[NodeId, RaftGroupHost] = {
            node_id: RaftGroupHost(node_id=node_id, tick_interval_ms=2, send=self._sender(node_id))
            for node_id in NODES
        }
        for node_id, host in self.hosts.items():
            for index in range(GROUPS):
                add_group(
                    host, RaftGroupId(index), MemoryStorage(), config=CONFIG, voters=NODES,
                    seed=node_id * 1000 + index,
                )  # fmt: skip
            for peer in NODES:
                host.set_peer_reachable(peer, reachable=peer != node_id)

    def _sender(self, sender: NodeId) -> Callable[[NodeId, RaftGroupId, Message], None]:
        def send(receiver: NodeId, group: RaftGroupId, message: Message) -> None:
            if sender in self.cut or receiver in self.cut:
                return
            host = self.hosts[receiver]
            asyncio.get_running_loop().call_soon(host.deliver, sender, [(group, message)])

        return send

    def leaders(self) -> dict[RaftGroupId, NodeId]:
        result: dict[RaftGroupId, NodeId] = {}
        for node_id, host in self.hosts.items():
            if node_id in self.cut:
                continue
            for group in host.groups():
                if group.node.role is Role.LEADER:
                    result[group.raft_group_id] = node_id
        return result

    def all_quiet(self) -> bool:
        return all(host.awake_count() == 0 for host in self.hosts.values())


async def _wait(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.005)


def _run(scenario: Callable[[_Cluster], object]) -> None:
    async def main() -> None:
        cluster = _Cluster()
        tasks = [asyncio.create_task(host.run()) for host in cluster.hosts.values()]
        try:
            await asyncio.wait_for(scenario(cluster), HANG_GUARD_S)  # type: ignore[arg-type]
        finally:
            for host in cluster.hosts.values():
                host.close()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())


def test_idle_groups_quiesce_stop_ticking_and_wake_on_a_proposal() -> None:
    async def scenario(cluster: _Cluster) -> None:
        await _wait(lambda: len(cluster.leaders()) == GROUPS and cluster.all_quiet())
        host = cluster.hosts[NodeId(1)]
        ticks, passes, rounds = host.ticks, host.passes, host.tick_rounds
        await _wait(lambda: host.tick_rounds >= rounds + 50)
        assert (host.ticks, host.passes) == (ticks, passes), "quiet groups cost no tick or pass"
        leader_id = cluster.leaders()[RaftGroupId(3)]
        group = cluster.hosts[leader_id].get(RaftGroupId(3))
        assert group is not None
        _, committed = group.propose(b"hello", offset_count=1, commitment=Commitment.QUORUM)
        await committed
        assert cluster.hosts[leader_id].awake_count() >= 1
        await _wait(cluster.all_quiet)
        assert cluster.leaders()[RaftGroupId(3)] == leader_id

    _run(scenario)


def test_a_leader_node_reported_unreachable_is_replaced_in_every_group() -> None:
    async def scenario(cluster: _Cluster) -> None:
        await _wait(lambda: len(cluster.leaders()) == GROUPS and cluster.all_quiet())
        gone = NodeId(1)
        led_by_gone = {g for g, n in cluster.leaders().items() if n == gone}
        terms = {g.raft_group_id: g.node.term for g in cluster.hosts[NodeId(2)].groups()}
        cluster.cut.add(gone)
        for node_id in (NodeId(2), NodeId(3)):
            cluster.hosts[node_id].set_peer_reachable(gone, reachable=False)
        await _wait(lambda: len(cluster.leaders()) == GROUPS)
        leaders = cluster.leaders()
        assert gone not in leaders.values()
        for group in cluster.hosts[NodeId(2)].groups():
            moved = group.raft_group_id in led_by_gone
            assert (group.node.term > terms[group.raft_group_id]) == moved, group.raft_group_id

    _run(scenario)
