"""RaftGroupHost answers a producer in the turn that learns the quorum (`_apply_now`): the
follower's acknowledgement that commits an entry, stepped by `deliver`, applies the entry
and resolves the proposal's waiter before `deliver` returns, with no pass in between; a
group with entries still to write applies in its pass (the ready processor's order: write,
sync, then apply), and the metadata group keeps to its passes. Three hosts driven by hand,
messages queued and delivered by the test: ordering only, no clock, no sleep."""

from __future__ import annotations

import asyncio

from raftlog.config import RaftConfig
from raftlog.raft.memory import MemoryStorage
from raftlog.raft.types import Message, Role
from raftlog.runtime.group import RaftGroup
from raftlog.runtime.host import RaftGroupHost
from raftlog.types import Commitment, NodeId, Offset, RaftGroupId
from tests.unit.runtime.hosted_groups import Applied, add_group

NODES = (NodeId(1), NodeId(2), NodeId(3))
GROUP = RaftGroupId(5)
CONFIG = RaftConfig(election_timeout_ticks=10, heartbeat_interval_ticks=2)
Outbox = list[tuple[NodeId, NodeId, RaftGroupId, Message]]


def _hosts(outbox: Outbox, *, urgent: bool) -> dict[NodeId, RaftGroupHost]:
    hosts = {}
    for node_id in NODES:

        def send(
            receiver: NodeId, group: RaftGroupId, message: Message, me: NodeId = node_id
        ) -> None:
            outbox.append((me, receiver, group, message))

        host = RaftGroupHost(
            node_id=node_id,
            tick_interval_ms=10,
            send=send,
            urgent_groups=frozenset({GROUP}) if urgent else frozenset(),
        )
        add_group(host, GROUP, MemoryStorage(), config=CONFIG, voters=NODES, seed=node_id)
        hosts[node_id] = host
    return hosts


def _deliver(
    hosts: dict[NodeId, RaftGroupHost], outbox: Outbox, *, to: NodeId | None = None
) -> None:
    """Deliver the queued messages (only those to `to` when given), in the order queued;
    what they cause is queued for a later call."""
    queued, outbox[:] = list(outbox), []
    for sender, receiver, group, message in queued:
        if to is None or receiver == to:
            hosts[receiver].deliver(sender, [(group, message)])
        else:
            outbox.append((sender, receiver, group, message))


async def _settle(hosts: dict[NodeId, RaftGroupHost], outbox: Outbox) -> None:
    for _ in range(50):
        for host in hosts.values():
            await host.process_pass()
        if not outbox and not any(
            group.node.has_ready() for host in hosts.values() for group in host.groups()
        ):
            return
        _deliver(hosts, outbox)
    raise AssertionError("the hosts did not settle")


async def _leader(hosts: dict[NodeId, RaftGroupHost], outbox: Outbox) -> RaftGroup:
    group = hosts[NODES[0]].get(GROUP)
    assert group is not None
    group.node.campaign()
    hosts[NODES[0]].notify()
    await _settle(hosts, outbox)
    assert group.node.role is Role.LEADER
    return group


class _Proposed:
    """Three hosts with a leader whose proposal of b"record" the followers have written:
    their acknowledgements wait in `outbox`, undelivered."""

    leader: RaftGroup
    answered: asyncio.Future[Offset]

    def __init__(self, hosts: dict[NodeId, RaftGroupHost], outbox: Outbox) -> None:
        self.hosts, self.outbox = hosts, outbox

    @classmethod
    async def start(cls, *, urgent: bool) -> _Proposed:
        outbox: Outbox = []
        proposed = cls(_hosts(outbox, urgent=urgent), outbox)
        hosts = proposed.hosts
        proposed.leader = await _leader(hosts, outbox)
        _, proposed.answered = proposed.leader.propose(
            b"record", offset_count=1, commitment=Commitment.QUORUM
        )
        await hosts[NODES[0]].process_pass()  # appends sent, the leader's own copy synced
        for follower in NODES[1:]:
            _deliver(hosts, outbox, to=follower)
            await hosts[follower].process_pass()
        assert all(receiver == NODES[0] for _, receiver, _, _ in outbox), outbox
        return proposed


def test_the_acknowledgement_that_commits_answers_the_producer_in_the_same_turn() -> None:
    async def scenario() -> None:
        proposed = await _Proposed.start(urgent=False)
        hosts, outbox, leader, answered = (
            proposed.hosts, proposed.outbox, proposed.leader, proposed.answered
        )  # fmt: skip
        passes = hosts[NODES[0]].passes
        sender, receiver, group, acknowledgement = outbox.pop(0)
        hosts[receiver].deliver(sender, [(group, acknowledgement)])
        # No pass ran on the leader, and the producer has its answer.
        assert hosts[NODES[0]].passes == passes
        assert answered.done() and answered.result() >= 0
        machine = leader.state_machine
        assert isinstance(machine, Applied) and machine.entries[-1].data == b"record"
        assert leader.node.applied == leader.node.commit
        await _settle(hosts, outbox)

    asyncio.run(scenario())


def test_a_group_with_entries_to_write_applies_in_its_pass() -> None:
    async def scenario() -> None:
        proposed = await _Proposed.start(urgent=False)
        hosts, outbox, leader, answered = (
            proposed.hosts, proposed.outbox, proposed.leader, proposed.answered
        )  # fmt: skip
        # A second proposal, not yet written by the leader: the followers' acknowledgements
        # commit the first entry, but the leader's next Ready must write the second before
        # it applies anything, so both wait for the pass.
        _, second = leader.propose(b"second", offset_count=1, commitment=Commitment.QUORUM)
        _deliver(hosts, outbox, to=NODES[0])
        assert not answered.done() and not second.done()
        await _settle(hosts, outbox)
        assert answered.done() and second.done()

    asyncio.run(scenario())


def test_an_urgent_group_keeps_to_its_passes() -> None:
    async def scenario() -> None:
        proposed = await _Proposed.start(urgent=True)
        hosts, outbox, answered = proposed.hosts, proposed.outbox, proposed.answered
        _deliver(hosts, outbox, to=NODES[0])
        assert not answered.done()
        await hosts[NODES[0]].process_pass()
        assert answered.done()

    asyncio.run(scenario())
