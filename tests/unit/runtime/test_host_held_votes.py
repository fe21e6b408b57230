"""A vote request for a group this node does not host yet is held for one election timeout
and stepped into the group when it is added (raftlog.runtime.host): a new topic's preferred
replica campaigns the moment it creates its group, before the other replicas have, and its
first election must not depend on which timer fires first. Three hosts driven by hand, the
clock faked: no sleep."""

from __future__ import annotations

import asyncio

from raftlog.config import RaftConfig
from raftlog.raft.memory import MemoryStorage
from raftlog.raft.types import HeartbeatRequest, Message, Role, VoteRequest
from raftlog.runtime.clock import FakeMonotonicClock
from raftlog.runtime.group import RaftGroup
from raftlog.runtime.host import RaftGroupHost
from raftlog.types import NodeId, Offset, RaftGroupId, Term
from tests.unit.runtime.hosted_groups import add_group

NODES = (NodeId(1), NodeId(2), NodeId(3))
GROUP = RaftGroupId(7)
CONFIG = RaftConfig(election_timeout_ticks=10, heartbeat_interval_ticks=2)
HOLD_MS = 500
Outbox = list[tuple[NodeId, NodeId, RaftGroupId, Message]]


class _Cluster:
    """Three hosts; only node 1 hosts GROUP at first."""

    def __init__(self, *, held_max: int) -> None:
        self.clock = FakeMonotonicClock()
        self.outbox: Outbox = []
        self.hosts: dict[NodeId, RaftGroupHost] = {}
        for node_id in NODES:

            def send(
                receiver: NodeId, group: RaftGroupId, message: Message, me: NodeId = node_id
            ) -> None:
                self.outbox.append((me, receiver, group, message))

            self.hosts[node_id] = RaftGroupHost(
                node_id=node_id,
                tick_interval_ms=50,
                send=send,
                clock=self.clock,
                vote_requests_held_max=held_max,
                vote_request_hold_ms=HOLD_MS,
            )
        self.candidate = self.add(NODES[0])

    def add(self, node_id: NodeId) -> RaftGroup:
        return add_group(
            self.hosts[node_id], GROUP, MemoryStorage(), config=CONFIG, voters=NODES, seed=node_id
        )

    async def settle(self) -> None:
        for _ in range(50):
            for host in self.hosts.values():
                await host.process_pass()
            if not self.outbox and not any(
                group.node.has_ready() for host in self.hosts.values() for group in host.groups()
            ):
                return
            queued, self.outbox[:] = list(self.outbox), []
            for sender, receiver, group, message in queued:
                self.hosts[receiver].deliver(sender, [(group, message)])
        raise AssertionError("the hosts did not settle")

    async def campaign(self) -> None:
        """Node 1 campaigns; its pre-vote reaches nodes 2 and 3, which do not host GROUP."""
        self.candidate.node.campaign()
        self.hosts[NODES[0]].notify()
        await self.settle()
        assert self.candidate.node.role is Role.PRE_CANDIDATE


def test_a_pre_vote_that_arrives_before_the_group_is_created_wins_the_first_election() -> None:
    async def scenario() -> None:
        cluster = _Cluster(held_max=16)
        await cluster.campaign()
        cluster.clock.advance(HOLD_MS / 1000 / 2)
        for node_id in NODES[1:]:
            cluster.hosts[node_id].tick_round()  # within the hold time: kept
            cluster.add(node_id)
        await cluster.settle()
        assert cluster.candidate.node.role is Role.LEADER
        for node_id in NODES[1:]:
            assert cluster.hosts[node_id].vote_requests_held == 1
            assert cluster.hosts[node_id].dropped_for_unknown_group == 0
        groups = [host.get(GROUP) for host in cluster.hosts.values()]
        assert {group.node.current_leader for group in groups if group is not None} == {NODES[0]}

    asyncio.run(scenario())


def test_a_held_vote_request_expires_after_the_hold_time() -> None:
    async def scenario() -> None:
        cluster = _Cluster(held_max=16)
        await cluster.campaign()
        cluster.clock.advance(HOLD_MS / 1000 + 0.001)
        for node_id in NODES[1:]:
            host = cluster.hosts[node_id]
            host.tick_round()
            assert host.dropped_for_unknown_group == 1
            cluster.add(node_id)
        await cluster.settle()
        # Nothing reached the new groups: the candidate waits for its timer to campaign again.
        assert cluster.candidate.node.role is Role.PRE_CANDIDATE

    asyncio.run(scenario())


def test_only_vote_requests_are_held_and_at_most_the_bound() -> None:
    cluster = _Cluster(held_max=1)
    host = cluster.hosts[NODES[1]]
    vote = VoteRequest(Term(1), NODES[0], NODES[1], Offset(-1), Term(0), pre_vote=True)
    heartbeat = HeartbeatRequest(Term(1), NODES[0], NODES[1], Offset(-1))
    host.deliver(NODES[0], [(GROUP, heartbeat), (GROUP, vote), (RaftGroupId(8), vote)])
    assert (host.vote_requests_held, host.dropped_for_unknown_group) == (1, 2)
