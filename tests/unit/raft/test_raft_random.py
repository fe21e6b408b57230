"""Randomized safety and liveness of the core under message loss, reordering, partitions and
restarts (Raft §5.4 safety properties, checked after every step; §5.2 liveness after heal).

This is a small, fast cousin of the simulator (`raftlog.sim`): it reuses the interaction
harness, picks every action from a seeded rng, and checks: at most one leader per term
(Election Safety), matching logs up to each node's commit (Log Matching / State Machine
Safety: applied entries agree at every offset), commit offsets never decrease on a running
node, and every committed entry is in every later leader's log (Leader Completeness).
"""

from __future__ import annotations

import contextlib
import random

import pytest
from raft_harness import Cluster

from raftlog.config import RaftConfig
from raftlog.errors import RaftError
from raftlog.raft.node import RaftNode
from raftlog.raft.types import Entry, Membership, Ready, Role
from raftlog.runtime.ready import complete_ready, persist_ready
from raftlog.types import NodeId, Offset, Term

STEPS = int(__import__("os").environ.get("RAFT_RANDOM_STEPS", "400"))
SEEDS = range(int(__import__("os").environ.get("RAFT_RANDOM_SEEDS", "12")))


class Checker:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.leaders: dict[Term, NodeId] = {}
        self.committed: dict[Offset, Entry] = {}  # offset -> entry, from applied entries
        self.commit_term: dict[Offset, Term] = {}  # an upper bound of the term it committed in
        self.commit: dict[NodeId, Offset] = {}

    def check(self) -> None:
        for node_id, node in self.cluster.nodes.items():
            if node.role is Role.LEADER:
                other = self.leaders.setdefault(node.term, node_id)
                assert other == node_id, f"two leaders in term {node.term}: {other}, {node_id}"
            previous = self.commit.get(node_id, Offset(-1))
            assert node.commit_offset >= previous, f"node {node_id} commit went back"
            self.commit[node_id] = node.commit_offset
            for entry in self.cluster.applied[node_id]:
                known = self.committed.setdefault(entry.offset, entry)
                assert known == entry, f"offset {entry.offset}: {known} vs {entry} on {node_id}"
                # The entry was committed in a term <= the applier's current term.
                seen = self.commit_term.get(entry.offset, node.term)
                self.commit_term[entry.offset] = min(seen, node.term)
            self.cluster.applied[node_id].clear()
            if node.role is Role.LEADER:
                self._check_leader_complete(node_id)

    def _check_leader_complete(self, node_id: NodeId) -> None:
        node = self.cluster.nodes[node_id]
        for offset, entry in self.committed.items():
            # Leader Completeness (§5.4.1) binds leaders of terms after the commit's term;
            # a deposed leader of an earlier term may not know yet.
            if offset >= node.log.first_offset() and node.term > self.commit_term[offset]:
                assert node.log.term_at(offset) == entry.term, (
                    f"leader {node_id} of term {node.term} lacks committed {entry}"
                )

    def forget(self, node_id: NodeId) -> None:
        self.commit.pop(node_id, None)


class SplitCluster(Cluster):
    """Processes each Ready in two halves, `persist_ready` now and `complete_ready` (after
    the sync) later, with other inputs stepped in between: the group-commit host's pattern.
    A crash in between loses the unsynced writes and the messages that depended on them."""

    def __init__(self, node_ids: list[NodeId], *, config: RaftConfig, rng: random.Random):
        super().__init__(node_ids, config=config)
        self.rng = rng
        self.pending: dict[NodeId, Ready] = {}

    def process(self) -> bool:
        for node_id in sorted(self.nodes):
            node = self.nodes[node_id]
            if node_id in self.pending:
                if self.rng.random() < 0.5:
                    self._complete(node_id)
            elif node.has_ready():
                ready = node.ready()
                persist_ready(
                    node,
                    ready,
                    log=self.storages[node_id],
                    hard_state_store=self.hard_state_stores[node_id],
                    send=self.send,
                    restore=lambda snapshot: None,
                )
                self.pending[node_id] = ready
        return bool(self.pending) or any(n.has_ready() for n in self.nodes.values())

    def _complete(self, node_id: NodeId) -> None:
        ready = self.pending.pop(node_id)
        if ready.must_sync:
            self.storages[node_id].sync()
        complete_ready(
            self.nodes[node_id],
            ready,
            send=self.send,
            apply=self.applied[node_id].append,
            on_read=self.read_states[node_id].append,
        )

    def crash(self, node_id: NodeId) -> None:
        self.pending.pop(node_id, None)
        super().crash(node_id)


def _step(cluster: Cluster, rng: random.Random, ids: list[NodeId]) -> None:
    action = rng.random()
    target = rng.choice(ids)
    if action < 0.35 and cluster.queue:
        index = rng.randrange(min(len(cluster.queue), 4))  # mild reordering
        message = cluster.queue[index]
        del cluster.queue[index]
        if rng.random() < 0.1:
            return  # lost
        if message.receiver in cluster.nodes:
            cluster.nodes[message.receiver].step(message)
    elif action < 0.6:
        if target in cluster.nodes:
            cluster.nodes[target].tick()
    elif action < 0.75:
        leader = cluster.leader()
        if leader is not None:
            with contextlib.suppress(RaftError):
                leader.propose(f"v{rng.randrange(1000)}".encode(), offset_count=rng.randint(1, 3))
    elif action < 0.78:
        cluster.cut.clear()
        if rng.random() < 0.7:
            cluster.partition([{target}, set(ids) - {target}])
    elif action < 0.80 and target in cluster.nodes and len(cluster.nodes) == len(ids):
        cluster.crash(target)
    elif action < 0.85 and target not in cluster.nodes:
        cluster.restart(target)
    elif action < 0.87:
        node = cluster.nodes.get(target)
        if node is not None and node.applied > node.log.first_offset() + 2:
            cluster.compact(target, node.applied)  # applied offsets end entries
    elif action < 0.89:
        leader = cluster.leader()
        if leader is not None:
            _change_membership(leader, ids, rng)
    elif action < 0.90:
        leader = cluster.leader()
        if leader is not None:
            with contextlib.suppress(RaftError):
                leader.transfer_leadership(target)
    if isinstance(cluster, SplitCluster):
        cluster.process()  # half-processed Readys stay pending across later inputs
    else:
        while cluster.process():
            pass


def _change_membership(leader: RaftNode, ids: list[NodeId], rng: random.Random) -> bool:
    """One step of full -> remove a voter -> re-add it as a learner -> promote (diss. §4);
    False when the membership is already full and nothing is to be removed."""
    current = leader.membership
    everyone = frozenset(ids)
    if current.learners:
        learner = min(current.learners)
        target = Membership(current.voters | {learner}, current.learners - {learner})
    elif current.voters != everyone:
        target = Membership(current.voters, frozenset({min(everyone - current.voters)}))
    elif rng.random() < 0.5:
        removed = rng.choice(sorted(current.voters - {leader.node_id}))
        target = Membership(current.voters - {removed})
    else:
        return False
    with contextlib.suppress(RaftError):
        leader.propose_membership(target)
    return True


def _heal_and_converge(cluster: Cluster, ids: list[NodeId], checker: Checker) -> None:
    """Liveness (Raft §5.2): with every node up and no faults, a leader emerges and every
    node commits the same offset within a bounded number of ticks."""
    cluster.cut.clear()
    for node_id in ids:
        if node_id not in cluster.nodes:
            cluster.restart(node_id)
            checker.forget(node_id)
    for _ in range(300):
        for node_id in ids:
            cluster.nodes[node_id].tick()
        cluster.stabilize()
        checker.check()
        leader = cluster.leader()
        if leader is not None and leader.membership.voters != frozenset(ids):
            _change_membership(leader, ids, random.Random(0))  # back to every node a voter
            continue
        commits = {n.commit_offset for n in cluster.nodes.values()}
        if leader is not None and len(commits) == 1 and leader.commit_offset == leader.last_offset:
            return
    raise AssertionError(f"no convergence: {cluster.status_lines()}")


@pytest.mark.parametrize("split", [False, True], ids=["whole", "split"])
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("size", [3, 5])
def test_random_faults_keep_safety_and_liveness(seed: int, size: int, split: bool) -> None:
    run_random(seed, size, split=split, steps=STEPS)


def run_random(seed: int, size: int, *, split: bool, steps: int) -> None:
    rng = random.Random(seed * 10 + size)
    ids = [NodeId(n) for n in range(1, size + 1)]
    config = RaftConfig(
        election_timeout_ticks=6,
        heartbeat_interval_ticks=2,
        pre_vote=rng.random() < 0.7,
        check_quorum=rng.random() < 0.7,
        append_bytes_max=200,
        inflight_messages_max=3,
        inflight_bytes_max=400,
    )
    if split:
        cluster: Cluster = SplitCluster(ids, config=config, rng=random.Random(seed))
    else:
        cluster = Cluster(ids, config=config)
    checker = Checker(cluster)
    for _ in range(steps):
        crashed = set(ids) - set(cluster.nodes)
        _step(cluster, rng, ids)
        for node_id in crashed - (set(ids) - set(cluster.nodes)):
            checker.forget(node_id)
        checker.check()
    _heal_and_converge(cluster, ids, checker)


@pytest.mark.slow
@pytest.mark.parametrize("split", [False, True], ids=["whole", "split"])
def test_random_faults_long_campaign(split: bool) -> None:
    """The same properties over many more seeds and steps (make test; not test-fast)."""
    for seed in range(100, 160):
        for size in (3, 5):
            run_random(seed, size, split=split, steps=1500)
