"""Simulated network: seeded loss, duplication, delay (hence reordering) and partitions.

Theory of operation. `send` stamps each message with a delivery step `now + 1 + d`, d drawn
in `[0, delay_ticks_max - 1]`, and keeps it in a heap ordered by (delivery step, sequence
number); different delays reorder messages, a second copy with its own delay duplicates one.
A partition is a set of blocked directed links `(sender, receiver)`: it is consulted both when
a message is sent and when it is delivered, so cutting a link also loses what was in flight
on it. Symmetric splits block both directions, one-way partitions one direction, and bridge
partitions leave one node connected to two sides that cannot talk to each other (the shape
behind the "disruptive server" and check-quorum scenarios).

The heap holds at most `messages_in_flight_max` messages; beyond it new ones are dropped, as a
full socket buffer would.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

from raftlog.raft.types import Message
from raftlog.types import NodeId

__all__ = ["Link", "NetworkFaults", "SimNetwork", "random_partition"]

Link = tuple[NodeId, NodeId]  # (sender, receiver), blocked in that direction


@dataclass(frozen=True, slots=True)
class NetworkFaults:
    drop_rate: float = 0.0
    duplicate_rate: float = 0.0
    delay_ticks_max: int = 1

    def __post_init__(self) -> None:
        assert 0.0 <= self.drop_rate <= 1.0 and 0.0 <= self.duplicate_rate <= 1.0, self
        assert self.delay_ticks_max >= 1, self


class SimNetwork:
    def __init__(
        self, *, rng: random.Random, faults: NetworkFaults, messages_in_flight_max: int
    ) -> None:
        assert messages_in_flight_max > 0
        self.faults = faults
        self.blocked: frozenset[Link] = frozenset()
        self.now = 0
        self.dropped_count = 0
        self._rng = rng
        self._in_flight: list[tuple[int, int, Message]] = []
        self._sequence = 0
        self._in_flight_max = messages_in_flight_max

    def send(self, message: Message) -> None:
        faults = self.faults
        if (message.sender, message.receiver) in self.blocked or (
            faults.drop_rate and self._rng.random() < faults.drop_rate
        ):
            self.dropped_count += 1
            return
        self._enqueue(message)
        if faults.duplicate_rate and self._rng.random() < faults.duplicate_rate:
            self._enqueue(message)

    def _enqueue(self, message: Message) -> None:
        if len(self._in_flight) >= self._in_flight_max:
            self.dropped_count += 1
            return
        delay = 1 + (self._rng.randrange(self.faults.delay_ticks_max))
        self._sequence += 1
        heapq.heappush(self._in_flight, (self.now + delay, self._sequence, message))

    def deliverable(self) -> list[Message]:
        """Pop every message due by `now` whose link is still open, in delivery order."""
        due: list[Message] = []
        while self._in_flight and self._in_flight[0][0] <= self.now:
            message = heapq.heappop(self._in_flight)[2]
            if (message.sender, message.receiver) in self.blocked:
                self.dropped_count += 1
                continue
            due.append(message)
        return due

    def in_flight_count(self) -> int:
        return len(self._in_flight)

    def heal(self) -> None:
        """A good network: no partition, loss or duplication, and one-step delivery, since
        Raft's liveness needs messages much faster than an election timeout (§5.6)."""
        self.blocked = frozenset()
        self.faults = NetworkFaults(delay_ticks_max=1)


def _both_ways(side_a: list[NodeId], side_b: list[NodeId]) -> set[Link]:
    return {(a, b) for a in side_a for b in side_b} | {(b, a) for a in side_a for b in side_b}


def random_partition(rng: random.Random, node_ids: list[NodeId]) -> tuple[str, frozenset[Link]]:
    """Draw one partition shape over `node_ids`; returns (description, blocked links)."""
    assert len(node_ids) >= 3, node_ids
    nodes = list(node_ids)
    rng.shuffle(nodes)
    kind = rng.choice(("heal", "split", "isolate", "one-way", "bridge"))
    if kind == "heal":
        return "heal", frozenset()
    if kind == "split":
        cut = rng.randint(1, len(nodes) - 1)
        side_a, side_b = nodes[:cut], nodes[cut:]
        return f"split {sorted(side_a)} | {sorted(side_b)}", frozenset(_both_ways(side_a, side_b))
    if kind == "isolate":
        return f"isolate {nodes[0]}", frozenset(_both_ways(nodes[:1], nodes[1:]))
    if kind == "one-way":
        count = rng.randint(1, len(nodes))
        links = {(rng.choice(nodes), rng.choice(nodes)) for _ in range(count)}
        links = {(a, b) for a, b in links if a != b}
        return f"one-way {sorted(links)}", frozenset(links)
    bridge, rest = nodes[0], nodes[1:]
    cut = rng.randint(1, len(rest) - 1)
    side_a, side_b = rest[:cut], rest[cut:]
    description = f"bridge {bridge} between {sorted(side_a)} | {sorted(side_b)}"
    return description, frozenset(_both_ways(side_a, side_b))
