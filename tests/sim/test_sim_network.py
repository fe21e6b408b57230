"""The simulated network: delay and reordering, loss, duplication, partitions, its bound."""

from __future__ import annotations

import random

from raftlog.raft.types import HeartbeatRequest, Message
from raftlog.sim.network import NetworkFaults, SimNetwork, random_partition
from raftlog.types import NodeId, Offset, Term


def _message(sender: int, receiver: int, commit: int = 0) -> Message:
    return HeartbeatRequest(Term(1), NodeId(sender), NodeId(receiver), Offset(commit))


def _network(faults: NetworkFaults, *, seed: int = 0, in_flight_max: int = 100) -> SimNetwork:
    return SimNetwork(rng=random.Random(seed), faults=faults, messages_in_flight_max=in_flight_max)


def _drain(network: SimNetwork, steps: int) -> list[Message]:
    delivered: list[Message] = []
    for _ in range(steps):
        network.now += 1
        delivered += network.deliverable()
    return delivered


def test_messages_arrive_within_the_delay_bound_and_can_be_reordered() -> None:
    network = _network(NetworkFaults(delay_ticks_max=5), seed=1)
    sent = [_message(1, 2, commit) for commit in range(50)]
    for message in sent:
        network.send(message)
    assert network.deliverable() == []  # nothing arrives in the step it was sent
    delivered = _drain(network, 5)
    assert sorted(delivered, key=lambda m: m.commit_offset) == sent  # type: ignore[union-attr]
    assert delivered != sent  # with 50 messages over 5 delays, some order changed


def test_drop_and_duplicate_rates_of_one_are_total() -> None:
    dropping = _network(NetworkFaults(drop_rate=1.0))
    dropping.send(_message(1, 2))
    assert _drain(dropping, 2) == [] and dropping.dropped_count == 1
    doubling = _network(NetworkFaults(duplicate_rate=1.0))
    doubling.send(_message(1, 2))
    assert _drain(doubling, 2) == [_message(1, 2)] * 2


def test_a_blocked_link_loses_messages_sent_on_it_and_in_flight_on_it() -> None:
    network = _network(NetworkFaults(delay_ticks_max=3))
    network.send(_message(1, 2))
    network.blocked = frozenset({(NodeId(1), NodeId(2))})
    network.send(_message(1, 2))
    network.send(_message(2, 1))  # one-way: the other direction still works
    assert _drain(network, 3) == [_message(2, 1)]
    assert network.dropped_count == 2


def test_the_in_flight_bound_drops_the_excess() -> None:
    network = _network(NetworkFaults(delay_ticks_max=2), in_flight_max=3)
    for commit in range(5):
        network.send(_message(1, 2, commit))
    assert network.in_flight_count() == 3 and network.dropped_count == 2


def test_partitions_have_the_promised_shapes() -> None:
    nodes = [NodeId(n) for n in range(1, 6)]
    seen = set()
    for seed in range(200):
        description, blocked = random_partition(random.Random(seed), nodes)
        kind = description.split()[0]
        seen.add(kind)
        assert all(a != b for a, b in blocked)
        if kind == "bridge":
            bridge = NodeId(int(description.split()[1]))
            assert not any(bridge in link for link in blocked)  # talks to both sides
            assert blocked  # the sides cannot talk to each other
        if kind in ("split", "isolate", "bridge"):
            assert all((b, a) in blocked for a, b in blocked)  # symmetric
    assert seen == {"heal", "split", "isolate", "one-way", "bridge"}


def test_the_same_seed_gives_the_same_schedule() -> None:
    def schedule(seed: int) -> list[Message]:
        network = _network(
            NetworkFaults(drop_rate=0.3, duplicate_rate=0.3, delay_ticks_max=4), seed=seed
        )
        for commit in range(30):
            network.send(_message(1, 2, commit))
        return _drain(network, 4)

    assert schedule(7) == schedule(7)
    assert schedule(7) != schedule(8)
