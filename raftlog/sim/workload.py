"""Clients and operators of the simulated cluster: proposals, reads, membership, compaction.

Theory of operation. A client proposes a batch with a unique payload at a random node (and,
told `NotLeaderError`, once more at the hinted leader). The leader returns the base offset it
assigned; the proposal is *acknowledged* when that same incarnation of that node applies an
entry at that offset carrying that payload (so it was committed at the proposing leader), and
*lost* when it applies something else there. Acknowledged batches are what the checker
guards forever.

A read asks `read_index` and remembers the highest acknowledged offset at that moment; the
answer must cover it (Raft §6.4). Operators move the membership through the cycle
full -> one voter removed -> it comes back as a learner -> promoted once caught up
(dissertation §4.2, one server at a time), compact logs at an applied batch end, transfer
leadership and force campaigns. Every refusal the core may give (`RaftError`) is expected and
only traced: the API is called as is, nothing is feature-detected.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from raftlog.errors import NotLeaderError, RaftError
from raftlog.raft.membership import membership_at
from raftlog.raft.types import Entry, EntryKind, Membership, Snapshot, SnapshotMeta
from raftlog.sim.checker import Checker
from raftlog.sim.options import PROPOSAL_OFFSETS_MAX
from raftlog.sim.trace import Trace
from raftlog.types import NodeId, Offset, Term

if TYPE_CHECKING:
    from raftlog.sim.cluster import SimNode

__all__ = ["Proposal", "Workload"]


@dataclass(frozen=True, slots=True)
class Proposal:
    payload: bytes
    node_id: NodeId
    incarnation: int
    offset: Offset
    term: Term


class Workload:
    def __init__(self, *, rng: random.Random, checker: Checker, trace: Trace) -> None:
        self._rng = rng
        self._checker = checker
        self._trace = trace
        self._counter = 0
        self.pending: dict[tuple[NodeId, int, Offset], Proposal] = {}
        self.acked_count = 0
        self.lost_count = 0
        self.proposed_count = 0
        self._reads: dict[tuple[NodeId, int, int], Offset] = {}
        # What the run exercised (membership changes, compactions, transfers, reads, ...).
        self.counts: Counter[str] = Counter()

    # --- proposals ---

    def propose(self, node: SimNode, nodes: dict[NodeId, SimNode]) -> None:
        assert node.raft is not None
        self._counter += 1
        payload = b"batch-%d" % self._counter
        offset_count = self._rng.randint(1, PROPOSAL_OFFSETS_MAX)
        try:
            self._propose_at(node, payload, offset_count)
        except NotLeaderError as error:
            hinted = nodes.get(NodeId(error.leader_hint)) if error.leader_hint is not None else None
            if hinted is not None and hinted.raft is not None and hinted is not node:
                try:
                    self._propose_at(hinted, payload, offset_count)
                except RaftError as again:
                    self._trace.add(f"propose {payload!r} refused at {hinted.node_id}", again)
        except RaftError as error:
            self._trace.add(f"propose {payload!r} refused at {node.node_id}", error)

    def _propose_at(self, node: SimNode, payload: bytes, offset_count: int) -> None:
        assert node.raft is not None
        offset = node.raft.propose(payload, offset_count=offset_count)
        proposal = Proposal(payload, node.node_id, node.incarnation, offset, node.raft.term)
        assert offset >= 0, offset
        self.pending[(node.node_id, node.incarnation, offset)] = proposal
        self.proposed_count += 1
        self._trace.add(f"propose at {node.node_id}", proposal)

    def on_apply(self, node: SimNode, entry: Entry) -> None:
        proposal = self.pending.pop((node.node_id, node.incarnation, entry.offset), None)
        if proposal is None:
            return
        if entry.kind == EntryKind.DATA and entry.data == proposal.payload:
            assert entry.term == proposal.term, (entry, proposal)
            self.acked_count += 1
            self._checker.on_ack(entry)
            self._trace.add("ack", proposal.payload)
        else:
            self.lost_count += 1

    def forget(self, node: SimNode) -> None:
        """A crashed incarnation answers no client: its proposals are neither acked nor lost."""
        for key in [k for k in self.pending if k[:2] == (node.node_id, node.incarnation)]:
            del self.pending[key]

    # --- reads (Raft §6.4) ---

    def read(self, node: SimNode) -> None:
        assert node.raft is not None
        self._counter += 1
        request_id = self._counter
        try:
            node.raft.read_index(request_id)
        except RaftError as error:
            self._trace.add(f"read refused at {node.node_id}", error)
            return
        self._reads[(node.node_id, node.incarnation, request_id)] = self._checker.acked_offset_max

    def on_read(self, node: SimNode, request_id: int, commit_offset: Offset) -> None:
        required = self._reads.pop((node.node_id, node.incarnation, request_id), None)
        if required is not None:
            self._checker.on_read(node.node_id, commit_offset, required)
            self.counts["reads"] += 1

    # --- operators ---

    def change_membership(
        self, leader: SimNode, nodes: dict[NodeId, SimNode], *, may_remove: bool
    ) -> None:
        """One step of full -> remove a voter -> re-add as learner -> promote (§4.2)."""
        assert leader.raft is not None
        current = leader.raft.membership
        everyone = frozenset(nodes)
        target: Membership | None = None
        if current.learners:
            learner = nodes[min(current.learners)]
            if learner.raft is not None and learner.raft.last_offset >= leader.raft.commit_offset:
                target = Membership(
                    voters=current.voters | {learner.node_id},
                    learners=current.learners - {learner.node_id},
                )
        elif current.voters != everyone:
            missing = min(everyone - current.voters)
            target = Membership(voters=current.voters, learners=frozenset({missing}))
        elif may_remove:
            candidates = sorted(current.voters - {leader.node_id})
            target = Membership(voters=current.voters - {self._rng.choice(candidates)})
        if target is None:
            return
        try:
            leader.raft.propose_membership(target)
            self._trace.add(f"membership at {leader.node_id}", target)
            self.counts["membership changes"] += 1
        except RaftError as error:
            self._trace.add(f"membership refused at {leader.node_id}", error)

    def compact(self, node: SimNode, bootstrap: Membership) -> None:
        """Snapshot a random applied prefix of `node`'s log and drop it (durable, atomic)."""
        log = node.log
        first = log.first_offset()
        if log.has_pending() or node.applied_offset < first:
            return
        entry = log.entry_containing(Offset(self._rng.randint(first, node.applied_offset)))
        assert entry is not None and entry.last_offset <= node.applied_offset, entry
        snapshot = Snapshot(
            SnapshotMeta(
                entry.last_offset, entry.term, membership_at(node.log, entry.last_offset, bootstrap)
            )
        )
        log.compact(snapshot)
        self._trace.add(f"compact {node.node_id} to", entry.last_offset)
        self.counts["compactions"] += 1

    def transfer(self, leader: SimNode, to: NodeId) -> None:
        assert leader.raft is not None and to != leader.node_id
        try:
            leader.raft.transfer_leadership(to)
            self._trace.add(f"transfer {leader.node_id} ->", to)
            self.counts["transfers"] += 1
        except RaftError as error:
            self._trace.add(f"transfer refused at {leader.node_id}", error)
