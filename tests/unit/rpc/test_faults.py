"""The fault hook: each rule is observable on real loopback traffic, replays from its seed, and
costs nothing when off. Seeded rngs only; no timing thresholds (delays are either far longer
than the test or only checked for delivery)."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
from loopback import FAST, A, B, C, Inbox, closing, heartbeat, node, run

from raftlog.errors import ConfigError
from raftlog.raft.types import HeartbeatRequest, Message
from raftlog.rpc.admin_servicer import apply_fault_rules, fault_state_json
from raftlog.rpc.faults import DELIVER, Direction, FaultInjector, FrameFate, LinkFaults
from raftlog.rpc.peer_transport import PeerTransport
from raftlog.types import NodeId, Offset, RaftGroupId, Term


class CountingInjector(FaultInjector):
    """Records how often the transport consulted it."""

    def __init__(self, *, rng: random.Random) -> None:
        super().__init__(rng=rng)
        self.outgoing_calls = 0

    def outgoing(self, peer: NodeId) -> FrameFate:
        self.outgoing_calls += 1
        return super().outgoing(peer)


async def faulty_pair(
    seed: int = 7,
) -> tuple[PeerTransport, PeerTransport, CountingInjector, CountingInjector, Inbox]:
    faults_a, faults_b = (
        CountingInjector(rng=random.Random(seed)),
        CountingInjector(rng=random.Random(seed + 1)),
    )
    inbox_b = Inbox()
    a, port_a = await node(A, Inbox(), config=FAST, faults=faults_a)
    b, port_b = await node(B, inbox_b, config=FAST, faults=faults_b)
    a.update_peers({B: ("127.0.0.1", port_b)})
    b.update_peers({A: ("127.0.0.1", port_a)})
    await a.wait_connected(B)
    return a, b, faults_a, faults_b, inbox_b


async def send_one(a: PeerTransport, n: int) -> Message:
    """Send one heartbeat and yield once so it is sealed into its own frame (and fated)."""
    message = heartbeat(A, B, n)
    a.send(B, RaftGroupId(n % 3), message)
    await asyncio.sleep(0)
    return message


def test_outgoing_block_drops_frames_until_healed() -> None:
    async def scenario() -> None:
        a, b, faults, _, inbox = await faulty_pair()
        faults.block(B, direction=Direction.OUTGOING)
        await send_one(a, 1)
        faults.heal()
        last = await send_one(a, 2)
        await inbox.wait_for(1)
        # One connection, in order: had the first frame gone out it would have come first.
        assert inbox.messages() == [last]
        assert faults.counters.blocked_outgoing == 1 and a.counters().frames_dropped_fault == 1
        await closing(a, b)

    run(scenario)


def test_incoming_block_makes_a_one_way_partition() -> None:
    async def scenario() -> None:
        a, b, _, faults_b, inbox = await faulty_pair()
        faults_b.block(A, direction=Direction.INCOMING)
        await send_one(a, 1)
        while b.counters().frames_blocked_incoming < 1:
            await asyncio.sleep(0)  # yield until B has read and discarded the frame
        faults_b.unblock(A)
        last = await send_one(a, 2)
        await inbox.wait_for(1)
        assert inbox.messages() == [last]
        assert faults_b.counters.blocked_incoming == 1
        # Incoming-only: B still reaches A.
        assert faults_b.state().blocked_outgoing == frozenset()
        await closing(a, b)

    run(scenario)


def test_random_loss_drops_exactly_what_the_seeded_rng_says() -> None:
    async def scenario() -> None:
        a, b, faults, _, inbox = await faulty_pair(seed=11)
        faults.set_link(B, LinkFaults(drop_probability=0.5))
        sent = [await send_one(a, n) for n in range(40)]
        faults.heal()
        marker = await send_one(a, 99)
        dropped = faults.counters.dropped
        await inbox.wait_for(40 - dropped + 1)
        assert 0 < dropped < 40
        assert inbox.messages()[-1] == marker
        assert set(inbox.messages()[:-1]) < set(sent)
        assert a.counters().frames_dropped_fault == dropped
        await closing(a, b)

    run(scenario)


def test_duplication_delivers_a_frame_twice() -> None:
    async def scenario() -> None:
        a, b, faults, _, inbox = await faulty_pair()
        faults.set_link(None, LinkFaults(duplicate_probability=1.0))
        first = await send_one(a, 1)
        faults.heal()
        last = await send_one(a, 2)
        await inbox.wait_for(3)
        assert inbox.messages() == [first, first, last]
        assert faults.counters.duplicated == 1
        await closing(a, b)

    run(scenario)


def test_reordering_sends_a_held_frame_after_the_next() -> None:
    async def scenario() -> None:
        a, b, faults, _, inbox = await faulty_pair()
        faults.set_link(B, LinkFaults(reorder_probability=1.0, reorder_window_ms=60_000))
        first = await send_one(a, 1)
        second = await send_one(a, 2)
        faults.heal()
        third = await send_one(a, 3)
        await inbox.wait_for(3)
        assert inbox.messages() == [second, first, third]
        await closing(a, b)

    run(scenario)


def test_a_held_frame_goes_out_alone_when_the_window_closes() -> None:
    async def scenario() -> None:
        a, b, faults, _, inbox = await faulty_pair()
        faults.set_link(B, LinkFaults(reorder_probability=1.0, reorder_window_ms=1))
        only = await send_one(a, 1)
        await inbox.wait_for(1)
        assert inbox.messages() == [only] and faults.counters.reordered == 1
        await closing(a, b)

    run(scenario)


def test_delay_holds_a_frame_back_while_later_ones_pass() -> None:
    async def scenario() -> None:
        a, b, faults, _, inbox = await faulty_pair()
        faults.set_link(B, LinkFaults(delay_ms=60_000))
        await send_one(a, 1)  # delayed far beyond this test
        faults.set_link(B, LinkFaults(delay_ms=1, delay_jitter_ms=2))
        delayed_briefly = await send_one(a, 2)
        await inbox.wait_for(1)
        assert inbox.messages() == [delayed_briefly]
        assert faults.counters.delayed == 2
        await closing(a, b)

    run(scenario)


def test_an_idle_injector_is_never_consulted() -> None:
    async def scenario() -> None:
        a, b, faults, _, inbox = await faulty_pair()
        for n in range(5):
            await send_one(a, n)
        faults.block(C)  # a rule about another node makes it active...
        await send_one(a, 5)
        faults.heal()  # ...and healing makes it idle again
        await send_one(a, 6)
        await inbox.wait_for(7)
        assert faults.outgoing_calls == 1
        await closing(a, b)

    run(scenario)


def test_fates_replay_from_the_seed() -> None:
    link = LinkFaults(
        drop_probability=0.3,
        duplicate_probability=0.3,
        reorder_probability=0.3,
        delay_ms=5,
        delay_jitter_ms=10,
    )

    def fates(seed: int) -> list[FrameFate]:
        injector = FaultInjector(rng=random.Random(seed))
        injector.set_link(None, link)
        return [injector.outgoing(NodeId(n % 3)) for n in range(200)]

    assert fates(5) == fates(5)
    assert fates(5) != fates(6)
    kinds = {(fate.copies, fate.hold_back_s is not None) for fate in fates(5)}
    assert kinds == {(0, False), (1, False), (1, True), (2, False), (2, True)}


def test_rules_per_peer_override_the_default_and_heal_clears_all() -> None:
    injector = FaultInjector(rng=random.Random(1))
    assert not injector.active and injector.outgoing(B) == DELIVER
    injector.set_link(None, LinkFaults(drop_probability=1.0))
    injector.set_link(B, LinkFaults())
    assert injector.outgoing(B) == DELIVER and injector.outgoing(C).copies == 0
    injector.block(A)
    state = injector.state()
    assert state.blocked_outgoing == state.blocked_incoming == frozenset({A})
    assert not injector.allow_incoming(A) and injector.allow_incoming(B)
    injector.heal()
    assert not injector.active and injector.outgoing(C) == DELIVER


@pytest.mark.parametrize(
    "settings",
    [{"drop_probability": 1.5}, {"duplicate_probability": -0.1}, {"delay_ms": -1}],
)
def test_link_faults_are_validated(settings: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match="must"):
        LinkFaults(**settings)  # type: ignore[arg-type]


def test_heartbeat_helper_is_what_arrives() -> None:
    # Guards the helpers the scenarios above compare against.
    assert heartbeat(A, B, 3) == HeartbeatRequest(Term(1), A, B, Offset(3), read_context=3)


def test_the_marker_hold_is_set_by_its_rule_and_lifted_by_heal() -> None:
    injector = FaultInjector(rng=random.Random(1))
    apply_fault_rules(injector, {"hold_txn_markers": True})
    assert injector.holds_txn_markers and not injector.active  # frames are not touched
    assert json.loads(fault_state_json(injector))["hold_txn_markers"] is True
    apply_fault_rules(injector, {"hold_txn_markers": False})
    assert not injector.holds_txn_markers
    apply_fault_rules(injector, {"hold_txn_markers": True})
    injector.heal()
    assert not injector.holds_txn_markers
    with pytest.raises(ValueError, match="hold_txn_markers"):
        apply_fault_rules(injector, {"hold_txn_markers": "yes"})
