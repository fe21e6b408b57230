"""Nemeses: faults planned as data, injected and healed through a `ClusterControl` port.

Theory of operation. A fault is decided in two steps. `plan_fault` is pure: from the nemesis
name, the node ids, the current leaders and a seeded `random.Random` it picks a concrete
`Fault` (which nodes to kill or pause, which directed links to cut). `Nemesis.start` then
injects it through the backend and `Nemesis.stop` heals exactly what it injected, so faults
can be tested without processes and replayed from the seed.

Network faults are sets of directed links `(src, dst)`: frames from src to dst are dropped.
Each cut is installed on both ends (outgoing on src, incoming on dst) so a frame already on
the wire is dropped too. The partitions, as Jepsen names them:

    halves            a random minority against the majority, both ways
    isolate-leader    the leader of a partition against everyone, both ways
    isolate-controller the metadata quorum's leader against everyone
    ring              each node reaches a majority but no two the same majority (5 nodes:
                      neighbours on a shuffled ring; 3 nodes: a directed ring)
    bridge            two halves joined only through one node
    one-way           a random half's frames to the other half vanish, the reverse flows

Process faults: kill (SIGKILL of a random node, of a partition leader, or of all nodes at
once; healed by restarting) and pause (SIGSTOP of a random node or a leader; SIGCONT).
`slow` stalls a random node or a leader again and again for 50-500 ms at a time until
healed (`raftlog.chaos.slow`): a node that is alive but slow must cost no more elections
than the stalls long enough to remove a leader, and no fence.
`kill-leader`, `pause-leader` and `isolate-leader` always aim at a partition's leader, which
is where acks=1 loses writes.
`flaky` makes every link drop, duplicate, delay and reorder frames.

Loss of unsynced writes: `lose-unsynced` SIGKILLs nodes (a random one, a partition leader, or
all at once) and then cuts each one's data files back to what it had fsynced, as a power loss
would (`ClusterControl.lose_unsynced`; the node's --chaos file port keeps the manifest, see
`raftlog.storage.chaos_file_system.ChaosFileSystem`); healed by restarting. With every node's fsync
honest, acks=all must lose nothing; a node started with --chaos-skip-fsync loses everything.

Storage damage: `corrupt` SIGKILLs a node of a fixed minority (the highest node ids; its
partition leader when it is one of them, half the time), then damages one of its data files
on disk (`ClusterControl.corrupt`, `raftlog.chaos.corrupt`: bytes flipped, the file
truncated or deleted) and restarts it at heal. The minority is fixed so that damage never
reaches a majority of any group, raftlog's promise (docs/storage-faults.md): the damaged
node must find the damage, stay out of elections and be refilled by the others.

Clock faults move nodes' wall clocks through the SetFaults hook (`{"clock": {"offset_ms":
N}}`; the Raft core runs on ticks, so only the node's wall-clock uses see it: leases and
heartbeats in the metadata, record and segment timestamps, retention): `clock-jump` moves one
node's clock forward or back by minutes, `clock-skew` gives every node a different offset of
up to two minutes either way. Both are healed by putting every clock back.

Membership: `move-replica` reassigns one partition (`Internal.SubmitMetadata` with a
ReassignPartition, as `raftlog cluster reassign` does): one replica, the leader half of the
time, is replaced by a node outside the replica set, which the partition leader carries out by
single-node Raft membership changes under the load; with no node outside the set (3 nodes,
3 replicas) the same replicas in another order move the preferred leader instead. A move is
not undone at heal: it completes on its own, under whatever faults follow.
`add-node` starts a new observer (a node outside the metadata quorum's voters, joining
through --bootstrap) under the load; the controller's automatic rebalancing then moves
replicas onto it one move at a time. `remove-node` decommissions an observer
(`Admin.DecommissionNode`): its replicas move to the other nodes one at a time, it leaves
the metadata quorum; the nemesis waits for the decommissioned state (up to
`REMOVE_NODE_WAIT_S`), then stops the process for good. With no observer it does nothing
(metadata voters are fixed at bootstrap and cannot be decommissioned). Neither is undone at
heal: a cluster grows and shrinks for the rest of the run.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from raftlog.chaos.slow import Staller

__all__ = [
    "LOCAL_ONLY_NEMESES",
    "NEMESES",
    "NODE_HOOK_NEMESES",
    "OBSERVERS_MAX",
    "ClusterControl",
    "Fault",
    "Nemesis",
    "partition_links",
    "plan_fault",
]

NEMESES = (
    "kill",
    "pause",
    "slow",
    "partition",
    "flaky",
    "kill-leader",
    "pause-leader",
    "isolate-leader",
    "lose-unsynced",
    "corrupt",
    "clock-jump",
    "clock-skew",
    "move-replica",
    "add-node",
    "remove-node",
)
# Nemeses that need the node-side hooks of --chaos, the cluster's reassignment or the nodes'
# files (a backend without them refuses these).
NODE_HOOK_NEMESES = (
    "corrupt",
    "partition",
    "flaky",
    "isolate-leader",
    "lose-unsynced",
    "clock-jump",
    "clock-skew",
    "move-replica",
    "add-node",
    "remove-node",
)
# Nemeses that change the set of node processes: only the local backend does.
LOCAL_ONLY_NEMESES = ("lose-unsynced", "add-node", "remove-node")
# Observers a local run may start with (`--observers`), remove-node's candidates.
OBSERVERS_MAX = 2
# How long remove-node waits for a decommission to finish before it gives up (and leaves
# the node running: it still hosts replicas).
REMOVE_NODE_WAIT_S = 60.0
# Targeted variants: always the leader of a partition, to aim at the acks=1 loss window.
TARGETED = {
    "kill-leader": ("kill", "leader"),
    "pause-leader": ("pause", "leader"),
    "isolate-leader": ("partition", "isolate-leader"),
}
PARTITIONS = ("halves", "isolate-leader", "isolate-controller", "ring", "bridge", "one-way")
Link = tuple[int, int]
FLAKY_LINK = {
    "drop_probability": 0.05,
    "duplicate_probability": 0.05,
    "reorder_probability": 0.1,
    "reorder_window_ms": 50,
    "delay_ms": 5,
    "delay_jitter_ms": 20,
}


class ClusterControl(Protocol):
    """What a backend offers the nemesis. Every call is bounded in time and never raises for
    an unreachable node: it returns False (the nemesis logs it; a fault may land partially)."""

    node_ids: Sequence[int]

    def kill(self, node: int) -> bool:
        """SIGKILL `node` (or the backend's equivalent); False if that could not be done."""
        ...

    def restart(self, node: int) -> bool:
        """Start `node` again on its own data if it is down (True if it runs already); False if it
        cannot be."""
        ...

    def pause(self, node: int) -> bool:
        """Freeze `node`'s process (SIGSTOP or the like); False if it is not running."""
        ...

    def resume(self, node: int) -> bool:
        """Let a frozen `node` run again; False if it is not running."""
        ...

    def set_faults(self, node: int, rules: dict[str, Any]) -> bool:
        """Send fault `rules` (Internal.SetFaults JSON: block, link, clock or heal) to `node`; False
        if it did not take them."""
        ...

    def lose_unsynced(self, node: int) -> dict[str, Any] | None:
        """Cut the files of `node`, already killed, back to what it fsynced; what was cut,
        or None when the backend cannot."""
        ...

    def corrupt(self, node: int, rng: random.Random) -> dict[str, Any] | None:
        """Damage one data file of `node`, already killed (`raftlog.chaos.corrupt`); what
        was done, or None when the backend cannot or found no file."""
        ...

    def reassign(self, partition: int, replicas: Sequence[int]) -> str | None:
        """Start moving `partition` to `replicas`: None once the controller took the move,
        else why not (refused, no controller in time)."""
        ...

    def partition_replicas(self, partition: int) -> tuple[int, ...] | None:
        """The partition's replicas, preferred leader first; None when unknown."""
        ...

    def add_node(self) -> int | str:
        """Start a new observer node: its id, or why not."""
        ...

    def remove_node(self, node: int, timeout_s: float) -> str | None:
        """Decommission observer `node`, wait up to `timeout_s` until it is, then stop it for
        good (it leaves `node_ids`): None when done, else why not."""
        ...

    def observers(self) -> tuple[int, ...]:
        """Running nodes outside the metadata quorum's voters (remove-node's candidates)."""
        ...

    def partition_leader(self, partition: int) -> int | None:
        """The partition's leader now; None when unknown or not answered in time."""
        ...

    def controller(self) -> int | None:
        """The metadata quorum's leader now; None when unknown or not answered in time."""
        ...


@dataclass(frozen=True, slots=True)
class Fault:
    nemesis: str
    kind: str
    nodes: tuple[int, ...] = ()
    links: frozenset[Link] = field(default_factory=frozenset)
    clock_offsets_ms: tuple[tuple[int, int], ...] = ()  # (node, offset) for clock faults
    partition: int | None = None  # move-replica: the partition and its new replicas
    replicas: tuple[int, ...] = ()
    damage_seed: int = 0  # corrupt: what to damage is drawn from this when injected
    stalls_seed: int = 0  # slow: the lengths of stalls and gaps are drawn from this

    def describe(self) -> dict[str, Any]:
        """The fault as JSON-ready data for the history: nemesis, kind, nodes and links, plus the
        clock offsets or the move when it has them."""
        described: dict[str, Any] = {
            "fault": self.nemesis,
            "kind": self.kind,
            "nodes": list(self.nodes),
            "links": sorted([list(link) for link in self.links]),
        }
        if self.clock_offsets_ms:
            described["clock_offsets_ms"] = {str(n): o for n, o in self.clock_offsets_ms}
        if self.partition is not None:
            described["partition"] = self.partition
            described["replicas"] = list(self.replicas)
        return described


# Clock faults: a jump is one to ten minutes either way; a skew spreads nodes over two minutes
# either way in 15-second steps, so no two nodes share an offset.
CLOCK_JUMP_MS = (60_000, 600_000)
CLOCK_SKEW_STEP_MS = 15_000
CLOCK_SKEW_STEPS = 8


def _both_ways(a: Sequence[int], b: Sequence[int]) -> frozenset[Link]:
    return frozenset({(x, y) for x in a for y in b} | {(y, x) for x in a for y in b})


def partition_links(
    kind: str, nodes: Sequence[int], rng: random.Random, target: int
) -> frozenset[Link]:
    """The directed links a partition of `kind` cuts; `target` is the node to isolate."""
    assert len(nodes) >= 2 and len(set(nodes)) == len(nodes)
    order = list(nodes)
    rng.shuffle(order)
    half = len(order) // 2
    if kind in ("isolate-leader", "isolate-controller"):
        links = _both_ways([target], [n for n in nodes if n != target])
    elif kind == "halves":
        links = _both_ways(order[:half], order[half:])
    elif kind == "one-way":
        links = frozenset((x, y) for x in order[:half] for y in order[half:])
    elif kind == "bridge":
        links = _both_ways(order[:half], order[half + 1 :])
    elif kind == "ring" and len(order) >= 5:
        ring = len(order)
        far = [(i, j) for i, j in itertools.permutations(range(ring), 2)]
        links = frozenset(
            (order[i], order[j]) for i, j in far if min((i - j) % ring, (j - i) % ring) > 1
        )
    elif kind == "ring":
        # Three nodes: each sends only to its successor, so each hears exactly one peer.
        links = frozenset((order[i], order[i - 1]) for i in range(len(order)))
    else:
        raise ValueError(f"unknown partition kind {kind!r}; expected one of {PARTITIONS}")
    assert all(a != b and a in nodes and b in nodes for a, b in links)
    return links


def plan_fault(
    nemesis: str,
    nodes: Sequence[int],
    rng: random.Random,
    *,
    leader: int | None,
    controller: int | None,
    partition: int | None = None,
    replicas: Sequence[int] | None = None,
    observers: Sequence[int] = (),
) -> Fault:
    """A concrete fault for `nemesis`; the leader and controller may be None when unknown.
    `leader` leads `partition`, whose current `replicas` move-replica needs (None: unknown,
    and then that fault does nothing); `observers` are remove-node's candidates."""
    if nemesis not in NEMESES:
        raise ValueError(f"unknown nemesis {nemesis!r}; expected one of {NEMESES}")
    someone = rng.choice(list(nodes))
    if nemesis in TARGETED:
        base, kind = TARGETED[nemesis]
        target = leader or someone
        if base == "partition":
            return Fault(base, kind, (), partition_links(kind, nodes, rng, target))
        return Fault(base, kind, (target,))
    if nemesis in ("kill", "lose-unsynced"):
        kind = rng.choice(("random-node", "leader", "all-nodes"))
        if kind == "all-nodes":
            return Fault(nemesis, kind, tuple(nodes))
        return Fault(nemesis, kind, (leader if kind == "leader" and leader else someone,))
    if nemesis == "corrupt":
        return _plan_corrupt(nodes, rng, leader)
    if nemesis == "pause":
        kind = rng.choice(("random-node", "leader"))
        return Fault(nemesis, kind, (leader if kind == "leader" and leader else someone,))
    if nemesis == "slow":
        kind = rng.choice(("random-node", "leader"))
        target = leader if kind == "leader" and leader else someone
        return Fault(nemesis, kind, (target,), stalls_seed=rng.getrandbits(32))
    if nemesis == "flaky":
        return Fault(nemesis, "links", tuple(nodes))
    if nemesis == "clock-jump":
        kind = rng.choice(("random-node", "controller"))
        target = controller if kind == "controller" and controller else someone
        offset_ms = rng.randrange(*CLOCK_JUMP_MS) * rng.choice((-1, 1))
        return Fault(nemesis, kind, (target,), clock_offsets_ms=((target, offset_ms),))
    if nemesis == "move-replica":
        if partition is None or not replicas:
            return Fault(nemesis, "unknown-replicas")
        return _plan_move(nodes, rng, partition, tuple(replicas), leader)
    if nemesis == "add-node":
        return Fault(nemesis, "observer")
    if nemesis == "remove-node":
        if not observers:
            return Fault(nemesis, "no-observer")
        return Fault(nemesis, "observer", (rng.choice(sorted(observers)),))
    if nemesis == "clock-skew":
        steps = rng.sample(range(-CLOCK_SKEW_STEPS, CLOCK_SKEW_STEPS + 1), len(nodes))
        offsets = tuple(
            (n, step * CLOCK_SKEW_STEP_MS) for n, step in zip(nodes, steps, strict=True)
        )
        return Fault(nemesis, "every-node", tuple(nodes), clock_offsets_ms=offsets)
    kind = rng.choice(PARTITIONS)
    target = {"isolate-leader": leader, "isolate-controller": controller}.get(kind) or someone
    return Fault(nemesis, kind, (), partition_links(kind, nodes, rng, target))


def corruptible_nodes(nodes: Sequence[int]) -> tuple[int, ...]:
    """The fixed minority `corrupt` may damage: the highest node ids."""
    count = (len(nodes) - 1) // 2
    return tuple(sorted(nodes)[len(nodes) - count :]) if count else ()


def _plan_corrupt(nodes: Sequence[int], rng: random.Random, leader: int | None) -> Fault:
    minority = corruptible_nodes(nodes)
    if not minority:
        return Fault("corrupt", "no-minority")
    kind = rng.choice(("leader", "random-node"))
    target = leader if kind == "leader" and leader in minority else rng.choice(minority)
    return Fault("corrupt", kind, (target,), damage_seed=rng.getrandbits(32))


def _plan_move(
    nodes: Sequence[int],
    rng: random.Random,
    partition: int,
    replicas: tuple[int, ...],
    leader: int | None,
) -> Fault:
    outside = [n for n in nodes if n not in replicas]
    if not outside:
        order = list(replicas)
        while order == list(replicas) and len(order) > 1:
            rng.shuffle(order)
        return Fault("move-replica", "reorder", (), partition=partition, replicas=tuple(order))
    kind = rng.choice(("replace-leader", "replace-follower"))
    followers = [n for n in replicas if n != leader]
    if kind == "replace-leader" and leader in replicas:
        leaving = leader
    else:
        kind, leaving = "replace-follower", rng.choice(followers)
    joining = rng.choice(outside)
    target = tuple(joining if n == leaving else n for n in replicas)
    assert len(set(target)) == len(replicas) and joining in target and leaving not in target
    return Fault("move-replica", kind, (leaving, joining), partition=partition, replicas=target)


class Nemesis:
    """Injects and heals faults on a backend; remembers what it did so heal is exact."""

    def __init__(self, control: ClusterControl) -> None:
        self._control = control
        self._stallers: list[Staller] = []

    def start(self, fault: Fault) -> dict[str, Any]:
        """Inject `fault`; returns what the backend reported doing beyond the plan (the bytes
        a lose-unsynced cut), for the history."""
        control = self._control
        if fault.nemesis == "kill":
            for node in fault.nodes:
                control.kill(node)
        elif fault.nemesis == "lose-unsynced":
            # Every node dies before any is cut: with all-nodes, none may restart in between.
            for node in fault.nodes:
                control.kill(node)
            cuts = {str(node): control.lose_unsynced(node) for node in fault.nodes}
            return {"cuts": cuts}
        elif fault.nemesis == "corrupt":
            rng = random.Random(fault.damage_seed)
            for node in fault.nodes:
                control.kill(node)
            return {"damage": {str(node): control.corrupt(node, rng) for node in fault.nodes}}
        elif fault.nemesis == "move-replica":
            if fault.partition is None:
                return {"reassign": "skipped: the partition's replicas were not known"}
            refused = control.reassign(fault.partition, fault.replicas)
            return {"reassign": "accepted" if refused is None else refused}
        elif fault.nemesis == "add-node":
            added = control.add_node()
            return {"added": added} if isinstance(added, int) else {"add": added}
        elif fault.nemesis == "remove-node":
            if not fault.nodes:
                return {"remove": "skipped: no observer to decommission"}
            (node,) = fault.nodes
            # Waits here, under the load, for the replicas to move off (bounded).
            refused = control.remove_node(node, REMOVE_NODE_WAIT_S)
            return {"removed": node} if refused is None else {"remove": refused}
        elif fault.clock_offsets_ms:
            clocks_set = {
                str(node): control.set_faults(node, {"clock": {"offset_ms": offset_ms}})
                for node, offset_ms in fault.clock_offsets_ms
            }
            return {"clocks_set": clocks_set}
        elif fault.nemesis == "pause":
            for node in fault.nodes:
                control.pause(node)
        elif fault.nemesis == "slow":
            for node in fault.nodes:
                staller = Staller(control, node, fault.stalls_seed + node)
                self._stallers.append(staller)
                staller.start()
        elif fault.nemesis == "flaky":
            for node in fault.nodes:
                control.set_faults(node, {"link": {"peer": None, **FLAKY_LINK}})
        else:
            for node in control.node_ids:
                outgoing = sorted(dst for src, dst in fault.links if src == node)
                incoming = sorted(src for src, dst in fault.links if dst == node)
                if outgoing:
                    control.set_faults(node, {"block": outgoing, "direction": "outgoing"})
                if incoming:
                    control.set_faults(node, {"block": incoming, "direction": "incoming"})
        return {}

    def stop(self, fault: Fault) -> dict[str, Any]:
        """Heal `fault`; returns what happened during it that the plan could not say (the
        stalls `slow` made, measured), for the history."""
        control = self._control
        if fault.nemesis == "slow":
            stallers, self._stallers = self._stallers, []
            return {"stalls": [staller.stop() for staller in stallers]}
        if fault.nemesis in ("kill", "lose-unsynced", "corrupt"):
            for node in fault.nodes:
                control.restart(node)
        elif fault.nemesis in ("move-replica", "add-node", "remove-node"):
            pass  # membership changes are not undone: they complete on their own
        elif fault.nemesis == "pause":
            for node in fault.nodes:
                control.resume(node)
        else:
            for node in control.node_ids:
                control.set_faults(node, {"heal": True})
        return {}

    def heal_all(self) -> None:
        """Before the final read: every node running, resumed and fully connected."""
        for staller in self._stallers:
            staller.stop()
        self._stallers = []
        for node in self._control.node_ids:
            self._control.resume(node)
            self._control.restart(node)
            self._control.set_faults(node, {"heal": True})
