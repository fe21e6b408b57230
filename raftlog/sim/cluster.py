"""A simulated cluster: the real Raft core driven step by step on simulated ports.

Theory of operation. One step is one unit of virtual time. In it, in this order: the nemesis
may change the partition, crash a node or force a campaign; crashed nodes due back restart
from what their disk kept; every up node receives the ticks its own clock rate owes it (uneven
clocks); every message due is delivered; clients and operators act; then the checker runs.
After *every* input to a node (tick, step, propose, ...) the node's Ready is processed with
`raftlog.runtime.ready.process_ready`, the same code the server runs, so the simulator tests
the real order of sending, persisting and applying. A disk call may raise `SimCrash` inside
that processing: the node dies right there, messages already handed to the network stay in
flight, and whatever was not synced is lost (or torn). After each input the checker also sees
the node's role, term, commit offset and every entry it appended.

`heal()` ends the chaos: no partitions, loss or crashes, every node up. Within
`heal_ticks_max` steps a leader must emerge, the membership must be back to all nodes as
voters, one new proposal must be acknowledged and every node must hold, commit and apply the
leader's whole log (liveness). Otherwise the run fails with the state of every node.

Every random choice comes from the run's one generator, in a fixed order; node iteration is in
sorted or seeded-shuffled order, never hash order, so a seed replays exactly.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass

from raftlog.raft.node import RaftNode
from raftlog.raft.types import (
    NO_OFFSET,
    AppendResponse,
    Entry,
    Membership,
    Message,
    ReadState,
    Role,
    Snapshot,
    VoteResponse,
)
from raftlog.runtime.ready import process_ready
from raftlog.sim.checker import Checker, InvariantViolation
from raftlog.sim.disk import CrashSwitch, SimCrash, SimHardStateStore, SimLog
from raftlog.sim.network import NetworkFaults, SimNetwork, random_partition
from raftlog.sim.options import READY_ROUNDS_MAX, SimOptions
from raftlog.sim.trace import Trace
from raftlog.sim.workload import Workload
from raftlog.types import NodeId, Offset, Term

__all__ = ["Cluster", "RunStats", "SimNode"]


def _unbound(_: object) -> None:
    raise AssertionError("a node's ports are bound when it starts")


_DAMAGE_SEED_SALT = 0x5D15C


class SimNode:
    """One server: a disk that survives crashes and, while up, a RaftNode incarnation."""

    def __init__(
        self, node_id: NodeId, *, log: SimLog, hard_state_store: SimHardStateStore, tick_rate: float
    ) -> None:
        assert tick_rate > 0, tick_rate
        self.node_id = node_id
        self.log = log
        self.hard_state_store = hard_state_store
        self.raft: RaftNode | None = None
        self.incarnation = 0
        self.applied_offset = NO_OFFSET
        self.applied_checkpoint = NO_OFFSET  # durably applied; survives crashes
        self.tick_rate = tick_rate
        self.tick_credit = 0.0
        self.restart_at: int | None = None
        self.led: tuple[Term, Offset] | None = None  # (term, commit offset) last seen leading
        # Node-level liveness, as the transport's node-pair heartbeats give it: the step each
        # peer was last heard in this incarnation, and what the core was last told.
        self.heard_at: dict[NodeId, int] = {}
        self.reachable: dict[NodeId, bool] = {}
        # Each peer's incarnation as this node last heard it: a new one is a restarted
        # process, whose log its leaders re-probe (the transport's HELLO, forget_peer_log).
        self.peer_incarnations: dict[NodeId, int] = {}
        self.was_quiesced = False
        # The callbacks process_ready gets (send, apply, restore, on_read), bound to this node.
        self.ports: tuple[
            Callable[[Message], None],
            Callable[[Entry], None],
            Callable[[Snapshot], None],
            Callable[[ReadState], None],
        ] = (_unbound, _unbound, _unbound, _unbound)

    def describe(self) -> str:
        raft = self.raft
        if raft is None:
            return f"node {self.node_id}: down (restart at step {self.restart_at})"
        return (
            f"node {self.node_id}#{self.incarnation}: {raft.role.value} term={raft.term} "
            f"leader={raft.leader_id} commit={raft.commit_offset} applied={self.applied_offset} "
            f"last={raft.last_offset} first={self.log.first_offset()} "
            f"voters={sorted(raft.membership.voters)} learners={sorted(raft.membership.learners)}"
        )


@dataclass(frozen=True, slots=True)
class RunStats:
    steps: int
    heal_steps: int
    proposed: int
    acked: int
    lost: int
    crashes: int
    messages_delivered: int
    last_offset: Offset
    exercised: tuple[tuple[str, int], ...]  # feature -> times, for coverage reports


class Cluster:
    def __init__(self, options: SimOptions, rng: random.Random, trace: Trace) -> None:
        self.options = options
        self.trace = trace
        self.checker = Checker()
        self.now = 0
        self.crashes = 0
        self.delivered = 0
        # Acknowledged count when healing began; -1 while chaos lasts (no ack is demanded).
        self._heal_acked_before = -1
        self._rng = rng
        # Storage faults draw from their own generator: switching them on or off shifts no
        # other draw of a seed.
        self._damage_rng = random.Random(options.seed ^ _DAMAGE_SEED_SALT)
        self.damages = 0
        self.workload = Workload(rng=rng, checker=self.checker, trace=trace)
        self.crash_switch = CrashSwitch(rng, options.io_crash_rate)
        self.save_crash_switch = CrashSwitch(rng, options.save_crash_rate)
        faults = NetworkFaults(
            drop_rate=options.drop_rate,
            duplicate_rate=options.duplicate_rate,
            delay_ticks_max=options.delay_ticks_max,
        )
        self.network = SimNetwork(
            rng=rng, faults=faults, messages_in_flight_max=options.messages_in_flight_max
        )
        self.config = options.raft_config()
        ids = [NodeId(i) for i in range(1, options.nodes + 1)]
        self.bootstrap = Membership(voters=frozenset(ids))
        self.nodes: dict[NodeId, SimNode] = {}
        for node_id, tick_rate in zip(ids, options.tick_rates, strict=True):
            log = SimLog(crash_switch=self.crash_switch, rng=rng, torn_writes=options.torn_writes)
            store = SimHardStateStore(crash_switch=self.save_crash_switch)
            self.nodes[node_id] = SimNode(
                node_id, log=log, hard_state_store=store, tick_rate=tick_rate
            )
        for node in self.nodes.values():
            self._start(node)

    # --- lifecycle ---

    def _start(self, node: SimNode) -> None:
        assert node.raft is None
        repair_offset = node.log.recover()
        applied = node.applied_checkpoint if self.options.checkpoint_applied else NO_OFFSET
        if applied > node.log.last_offset():
            # The checkpoint describes entries the damaged disk lost: apply again from the
            # snapshot, as a partition replica does with a checkpoint its log cannot match.
            applied = node.applied_checkpoint = NO_OFFSET
        node.incarnation += 1
        node.restart_at = None
        node.tick_credit = 0.0
        node.raft = RaftNode(
            node_id=node.node_id,
            config=self.config,
            storage=node.log,
            hard_state=node.hard_state_store.load(),
            rng=random.Random(self._rng.getrandbits(64)),
            bootstrap_membership=self.bootstrap,
            applied_offset=applied,
            repair_offset=repair_offset,
        )
        node.ports = (
            functools.partial(self._send, node),
            functools.partial(self._apply, node),
            functools.partial(self._restore, node),
            functools.partial(self._on_read, node),
        )
        snapshot = node.log.snapshot()
        node.applied_offset = max(applied, snapshot.meta.offset if snapshot else NO_OFFSET)
        node.log.truncated_from = None
        node.heard_at = {}
        node.reachable = {}
        note = f" (repairing to {repair_offset})" if repair_offset is not None else ""
        self.trace.add(f"start {node.node_id}#{node.incarnation}{note}", node.describe())
        self._observe(node)

    def _crash(self, node: SimNode, point: str) -> None:
        assert node.raft is not None
        self._drain_appends(node)
        self.workload.forget(node)
        node.raft = None
        node.led = None
        kept = node.log.crash()
        node.restart_at = self.now + self._rng.randint(1, self.options.restart_delay_ticks_max)
        self.crashes += 1
        self.trace.add(f"crash {node.node_id} at {point}", f"kept {kept} unsynced entries")

    def _restart_due(self) -> None:
        for node in self.nodes.values():
            if node.raft is None and node.restart_at is not None and node.restart_at <= self.now:
                self._maybe_damage(node)
                self._start(node)

    def _maybe_damage(self, node: SimNode) -> None:
        """A fault on synced data of a stopped node, on a minority of the voters at most
        (counting those still repairing): the fault model the repair tolerates."""
        rate = self.options.storage_fault_rate
        if not rate or self._damage_rng.random() >= rate:
            return
        # The workload's membership cycle takes one voter out at a time: count the fewest.
        voters = len(self.bootstrap.voters) - (1 if self.options.membership_rate else 0)
        faults_max = (voters - 1) // 2
        repairing = sum(1 for other in self.nodes.values() if other.log.repairing)
        if repairing + 1 > faults_max:
            return
        lost = node.log.damage(self._damage_rng)
        if lost is not None:
            self.damages += 1
            self.trace.add(f"damage {node.node_id}", lost)

    # --- driving one node ---

    def _process(self, node: SimNode) -> None:
        """Process Readys until none is left (bounded), as the server's loop does."""
        raft = node.raft
        assert raft is not None
        if not raft.has_ready():
            return  # nothing changed that a Ready would not report: nothing new to check
        for _ in range(READY_ROUNDS_MAX):
            if not raft.has_ready():
                break
            try:
                process_ready(
                    raft,
                    log=node.log,
                    hard_state_store=node.hard_state_store,
                    send=node.ports[0],
                    apply=node.ports[1],
                    restore=node.ports[2],
                    on_read=node.ports[3],
                )
            except SimCrash as crash:
                self._crash(node, crash.point)
                return
            if not node.log.has_pending():
                node.applied_checkpoint = min(node.applied_offset, node.log.durable_last_offset)
            if node.log.repairing and not raft.repairing:
                node.log.finish_repair()  # what the host records in the durable mark
                self.trace.add(f"repaired {node.node_id}", node.describe())
        self._observe(node)

    def _send(self, node: SimNode, message: Message) -> None:
        if isinstance(message, VoteResponse) and message.granted and not message.pre_vote:
            self.checker.on_vote_granted(message.sender, message.term, message.receiver)
            if self.options.protocol_checks:
                durable = node.hard_state_store.load()
                self.checker.on_vote_sent(node.node_id, message, durable)
        elif isinstance(message, AppendResponse) and self.options.protocol_checks:
            self.checker.on_ack_sent(node.node_id, message, node.log.durable_through())
        self.network.send(message)

    def _apply(self, node: SimNode, entry: Entry) -> None:
        assert node.raft is not None
        if entry.offset != node.applied_offset + 1:
            raise InvariantViolation(
                "apply order",
                f"node {node.node_id} applied offset {entry.offset} after {node.applied_offset}",
            )
        node.applied_offset = entry.last_offset
        self.checker.on_apply(node.node_id, entry, node.raft.term)
        self.workload.on_apply(node, entry)

    def _restore(self, node: SimNode, snapshot: Snapshot) -> None:
        self.checker.on_restore(node.node_id, snapshot)
        node.applied_offset = snapshot.meta.offset
        self.trace.add(f"restore {node.node_id} to", snapshot.meta.offset)
        self.workload.counts["snapshots installed"] += 1

    def _on_read(self, node: SimNode, read_state: ReadState) -> None:
        self.workload.on_read(node, read_state.request_id, read_state.commit_offset)

    def _drain_appends(self, node: SimNode) -> None:
        for entry, prev_term in node.log.appended:
            self.checker.on_append(node.node_id, entry, prev_term)
        node.log.appended.clear()

    def _observe(self, node: SimNode) -> None:
        raft = node.raft
        assert raft is not None
        self._drain_appends(node)
        self.checker.on_role(node.node_id, raft.role, raft.term)
        self.checker.on_commit(node.node_id, node.incarnation, raft.commit_offset)
        if raft.quiesced and not node.was_quiesced:
            self.workload.counts["quiesced"] += 1
        node.was_quiesced = raft.quiesced
        if raft.role != Role.LEADER:
            node.led = None
            return
        led = node.led
        if (
            self.options.protocol_checks
            and led is not None
            and led[0] == raft.term
            and raft.commit_offset > led[1]
        ):
            term_at_commit = node.log.term_at(raft.commit_offset)
            self.checker.on_leader_commit(
                node.node_id, raft.term, raft.commit_offset, term_at_commit
            )
        node.led = (raft.term, raft.commit_offset)

    # --- one step ---

    def step(self, *, chaos: bool) -> None:
        self.now += 1
        self.network.now = self.now
        self.trace.now = self.now
        if chaos:
            self._nemesis()
        self._restart_due()
        self._update_liveness()
        self._tick_all()
        self._deliver()
        self._operate(chaos=chaos)
        self._check_all()

    def up_nodes(self) -> list[SimNode]:
        return [node for node in self.nodes.values() if node.raft is not None]

    def leader(self) -> SimNode | None:
        leaders = [n for n in self.up_nodes() if n.raft is not None and n.raft.role == Role.LEADER]
        return max(leaders, key=lambda n: n.raft.term if n.raft else 0, default=None)

    def _update_liveness(self) -> None:
        """One node-pair heartbeat each way per step, blocked by partitions (not by message
        loss: it stands for a TCP connection); a peer unheard for the liveness timeout is
        reported unreachable to the core, and reachable again once heard."""
        timeout = self.options.liveness_timeout_ticks()
        up = self.up_nodes()
        restarted: list[tuple[SimNode, NodeId]] = []
        for node in up:
            for peer in up:
                if peer is not node and (peer.node_id, node.node_id) not in self.network.blocked:
                    node.heard_at[peer.node_id] = self.now
                    known = node.peer_incarnations.get(peer.node_id)
                    if known is not None and known != peer.incarnation:
                        restarted.append((node, peer.node_id))
                    node.peer_incarnations[peer.node_id] = peer.incarnation
        for node, peer_id in restarted:
            if node.raft is not None:
                node.raft.forget_peer_log(peer_id)
                self._process(node)
        up = self.up_nodes()
        for node in up:
            raft = node.raft
            assert raft is not None
            for peer_id in sorted(self.nodes):
                if peer_id == node.node_id:
                    continue
                heard = node.heard_at.get(peer_id)
                reachable = heard is not None and self.now - heard <= timeout
                if node.reachable.get(peer_id) != reachable:
                    node.reachable[peer_id] = reachable
                    self.trace.add(f"liveness {node.node_id}: {peer_id} reachable", reachable)
                    raft.set_peer_reachable(peer_id, reachable=reachable)
                    self._process(node)
                    if node.raft is None:
                        break  # crashed while processing

    def _tick_all(self) -> None:
        up = self.up_nodes()
        self._rng.shuffle(up)
        for node in up:
            node.tick_credit += node.tick_rate
            while node.tick_credit >= 1.0 and node.raft is not None:
                node.tick_credit -= 1.0
                node.raft.tick()
                self._process(node)

    def _deliver(self) -> None:
        for message in self.network.deliverable():
            node = self.nodes[message.receiver]
            if node.raft is None:
                continue
            self.trace.add("deliver", message)
            self.delivered += 1
            node.raft.step(message)
            self._process(node)

    def _nemesis(self) -> None:
        options, rng = self.options, self._rng
        if options.partition_rate and rng.random() < options.partition_rate:
            description, self.network.blocked = random_partition(rng, sorted(self.nodes))
            self.trace.add("partition", description)
        up = self.up_nodes()
        if up and options.crash_rate and rng.random() < options.crash_rate:
            self._crash(rng.choice(up), "between steps")
        leader = self.leader()
        if leader is not None and rng.random() < options.leader_crash_rate:
            self._crash(leader, "leader crash")
        if options.power_failure_rate and rng.random() < options.power_failure_rate:
            for node in self.up_nodes():
                self._crash(node, "power failure")
        up = self.up_nodes()
        if up and options.campaign_rate and rng.random() < options.campaign_rate:
            node = rng.choice(up)
            assert node.raft is not None
            self.trace.add(f"campaign {node.node_id}")
            node.raft.campaign()
            self._process(node)

    def _operate(self, *, chaos: bool) -> None:
        options, rng = self.options, self._rng
        up = self.up_nodes()
        if not up:
            return
        leader = self.leader()
        if chaos and rng.random() < options.propose_rate:
            self.workload.propose(rng.choice(up), self.nodes)
        elif not chaos and leader is not None and self._heal_needs_ack() and rng.random() < 0.2:
            self.workload.propose(leader, self.nodes)
        if leader is not None and (not chaos or rng.random() < options.membership_rate):
            self.workload.change_membership(leader, self.nodes, may_remove=chaos)
        if options.compaction_rate and rng.random() < options.compaction_rate:
            self.workload.compact(rng.choice(up), self.bootstrap)
        if chaos and leader is not None and rng.random() < options.transfer_rate:
            self.workload.transfer(
                leader, rng.choice([n for n in self.nodes if n != leader.node_id])
            )
        if options.read_rate and rng.random() < options.read_rate:
            self.workload.read(rng.choice(up))
        for node in up:
            if node.raft is not None:
                self._process(node)

    def _check_all(self) -> None:
        for node in self.nodes.values():
            raft = node.raft
            if raft is None:
                continue
            log = node.log
            self.checker.check_holds_committed(
                node.node_id, node.incarnation, log, raft.commit_offset, log.truncated_from
            )
            log.truncated_from = None
            if raft.role == Role.LEADER:
                self.checker.check_leader_complete(node.node_id, node.incarnation, raft.term, log)

    # --- the run ---

    def _heal_needs_ack(self) -> bool:
        return self.workload.acked_count <= self._heal_acked_before

    def run(self) -> RunStats:
        for _ in range(self.options.steps):
            self.step(chaos=True)
        heal_steps = self.heal()
        leader = self.leader()
        return RunStats(
            steps=self.options.steps,
            heal_steps=heal_steps,
            proposed=self.workload.proposed_count,
            acked=self.workload.acked_count,
            lost=self.workload.lost_count,
            crashes=self.crashes,
            messages_delivered=self.delivered,
            last_offset=leader.raft.last_offset if leader and leader.raft else NO_OFFSET,
            exercised=tuple(sorted(self.workload.counts.items())),
        )

    def heal(self) -> int:
        """Stop every fault and demand progress within `heal_ticks_max` steps (liveness)."""
        self.trace.add("heal")
        self.network.heal()
        self.crash_switch.rate = 0.0
        self.save_crash_switch.rate = 0.0
        for node in self.nodes.values():
            if node.raft is None:
                self._start(node)
        self._heal_acked_before = self.workload.acked_count
        for heal_step in range(1, self.options.heal_ticks_max + 1):
            self.step(chaos=False)
            if self._converged():
                self._final_checks()
                return heal_step
        states = "; ".join(node.describe() for node in self.nodes.values())
        raise InvariantViolation(
            "liveness",
            f"no convergence {self.options.heal_ticks_max} steps after healing: {states}",
        )

    def _converged(self) -> bool:
        leader = self.leader()
        if leader is None or leader.raft is None or self._heal_needs_ack():
            return False
        target = leader.raft.last_offset
        if leader.raft.membership != self.bootstrap or leader.raft.commit_offset != target:
            return False
        return all(
            node.raft is not None
            and node.raft.last_offset == target
            and node.raft.commit_offset == target
            and node.applied_offset == target
            for node in self.nodes.values()
        )

    def _final_checks(self) -> None:
        for node in self.nodes.values():
            self.checker.check_acked_held(node.node_id, node.log)
