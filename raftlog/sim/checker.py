"""The simulator's safety checker: Raft's invariants, checked incrementally after every step.

Theory of operation. The checker never looks inside the core; it is fed observations
(`on_*`) and asked to check log views (`check_*`), so its self-test can feed it hand-made bad
states. Each violated invariant raises `InvariantViolation` naming the invariant and the
offending node, offset, term and entries.

Invariants (Raft §5.2-§5.4, Figure 3):
- election safety: at most one leader per term (`on_role`), and each server votes for at most
  one candidate per term, across restarts (`on_vote_granted`, from the votes it sends);
- log matching: one leader creates each offset once per term, so two entries with the same
  (offset, term) are identical and follow the same term (`on_append`; by induction the whole
  prefixes match);
- state machine safety: one committed entry per offset, and committed entries never overlap
  (`on_apply` keeps the global map offset -> committed entry);
- commit monotonicity: a node's commit offset never goes backward within one incarnation;
- node completeness: a node whose commit offset passed a committed entry holds it, or a
  snapshot covering it (`check_holds_committed`);
- leader completeness: an entry committed in term T is held by every leader of a term > T
  (`check_leader_complete`). The checker records for each committed entry the term of the
  first node seen applying it: never below the term the entry really committed in, so a
  stale leader of an older term is never accused wrongly;
- protocol rules, checked where they apply: a granted vote leaves only once the vote is
  durable, an append acknowledgement only once the acknowledged entries are (Raft §5.1, §5.3;
  `on_vote_sent`, `on_ack_sent`, at the moment the driver hands the message over), and a
  leader advances its commit offset only onto an entry of its own term (§5.4.2,
  `on_leader_commit`). These catch a broken rule directly; the end-to-end invariants catch
  its consequences, and `protocol_checks=False` leaves only those, to show they can;
- durability of acknowledgements: an acknowledged batch is committed at its offset and stays
  so; a linearizable read (ReadIndex) covers every batch acknowledged before it was asked.

Checks are incremental: each (node, incarnation) keeps a watermark of the committed offsets it
was verified against, lowered again when its log is truncated below it.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from raftlog.raft.types import (
    NO_OFFSET,
    AppendResponse,
    Entry,
    HardState,
    Role,
    Snapshot,
    VoteResponse,
)
from raftlog.types import NodeId, Offset, Term

__all__ = ["Checker", "InvariantViolation", "LogView"]

Incarnation = tuple[NodeId, int]  # a node and how many times it has restarted


class InvariantViolation(Exception):
    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"{invariant}: {detail}")
        self.invariant = invariant
        self.detail = detail


class LogView(Protocol):
    def entry_at(self, offset: Offset) -> Entry | None: ...

    def snapshot(self) -> Snapshot | None: ...


@dataclass(frozen=True, slots=True)
class _Committed:
    entry: Entry
    commit_term: Term  # term of the first node seen applying it (>= the real commit term)
    node_id: NodeId


def _short(entry: Entry) -> str:
    return (
        f"Entry(offset={entry.offset}, count={entry.offset_count}, term={entry.term}, "
        f"kind={entry.kind.name}, data={entry.data[:24]!r})"
    )


def _covered(log: LogView, offset: Offset) -> bool:
    snapshot = log.snapshot()
    return snapshot is not None and offset <= snapshot.meta.offset


class Checker:
    def __init__(self) -> None:
        self.leaders: dict[Term, NodeId] = {}
        self.committed: dict[Offset, _Committed] = {}
        self.committed_order: list[Offset] = []  # base offsets of committed entries, sorted
        self.acked: dict[Offset, Entry] = {}
        self.acked_offset_max: Offset = NO_OFFSET
        self._votes: dict[tuple[NodeId, Term], NodeId] = {}
        self._by_key: dict[tuple[Offset, Term], tuple[Entry, Term | None]] = {}
        self._commit_seen: dict[Incarnation, Offset] = {}
        self._held_upto: dict[Incarnation, Offset] = {}
        self._leader_upto: dict[tuple[NodeId, int, Term], Offset] = {}

    @staticmethod
    def fail(invariant: str, detail: str) -> InvariantViolation:
        return InvariantViolation(invariant, detail)

    def on_role(self, node_id: NodeId, role: Role, term: Term) -> None:
        if role != Role.LEADER:
            return
        holder = self.leaders.setdefault(term, node_id)
        if holder != node_id:
            raise self.fail("election safety", f"nodes {holder} and {node_id} both led term {term}")

    def on_vote_granted(self, voter: NodeId, term: Term, candidate: NodeId) -> None:
        holder = self._votes.setdefault((voter, term), candidate)
        if holder != candidate:
            raise self.fail(
                "election safety",
                f"node {voter} voted for both node {holder} and node {candidate} in term {term}",
            )

    def on_append(self, node_id: NodeId, entry: Entry, prev_term: Term | None) -> None:
        key = (entry.offset, entry.term)
        known = self._by_key.setdefault(key, (entry, prev_term))
        if known[0] != entry:
            raise self.fail(
                "log matching",
                f"node {node_id} appended {_short(entry)} but another log holds "
                f"{_short(known[0])} at the same offset and term",
            )
        if prev_term is not None and known[1] is not None and known[1] != prev_term:
            raise self.fail(
                "log matching",
                f"node {node_id} holds {_short(entry)} after term {prev_term}, another log "
                f"holds it after term {known[1]}: the prefixes differ",
            )

    def on_apply(self, node_id: NodeId, entry: Entry, term: Term) -> None:
        known = self.committed.get(entry.offset)
        if known is not None:
            if known.entry != entry:
                raise self.fail(
                    "state machine safety",
                    f"node {node_id} applied {_short(entry)} but node {known.node_id} "
                    f"applied {_short(known.entry)} at offset {entry.offset}",
                )
            return
        self._check_no_overlap(node_id, entry)
        self.committed[entry.offset] = _Committed(entry, term, node_id)
        bisect.insort(self.committed_order, entry.offset)

    def _check_no_overlap(self, node_id: NodeId, entry: Entry) -> None:
        i = bisect.bisect_left(self.committed_order, entry.offset)
        neighbours = self.committed_order[max(0, i - 1) : i + 1]
        for offset in neighbours:
            other = self.committed[offset].entry
            if other.offset <= entry.last_offset and entry.offset <= other.last_offset:
                raise self.fail(
                    "state machine safety",
                    f"node {node_id} applied {_short(entry)} overlapping committed {_short(other)}",
                )

    def on_commit(self, node_id: NodeId, incarnation: int, commit_offset: Offset) -> None:
        key = (node_id, incarnation)
        before = self._commit_seen.get(key, NO_OFFSET)
        if commit_offset < before:
            raise self.fail(
                "commit monotonicity",
                f"node {node_id} (incarnation {incarnation}) moved its commit offset back "
                f"from {before} to {commit_offset}",
            )
        self._commit_seen[key] = commit_offset

    def on_restore(self, node_id: NodeId, snapshot: Snapshot) -> None:
        """A node installed `snapshot`: it must end exactly at a committed entry."""
        offset = snapshot.meta.offset
        i = bisect.bisect_right(self.committed_order, offset) - 1
        known = self.committed[self.committed_order[i]].entry if i >= 0 else None
        if known is None or known.last_offset != offset or known.term != snapshot.meta.term:
            raise self.fail(
                "snapshot safety",
                f"node {node_id} restored a snapshot to offset {offset} term "
                f"{snapshot.meta.term}, but the committed entry there is "
                f"{_short(known) if known else 'none'}",
            )

    def on_ack(self, entry: Entry) -> None:
        known = self.committed.get(entry.offset)
        if known is None or known.entry != entry:
            raise self.fail(
                "acknowledged durability", f"acknowledged {_short(entry)} is not committed"
            )
        self.acked[entry.offset] = entry
        self.acked_offset_max = max(self.acked_offset_max, entry.last_offset)

    def on_vote_sent(self, node_id: NodeId, reply: VoteResponse, durable: HardState) -> None:
        if not reply.granted or reply.pre_vote:
            return
        if durable.term != reply.term or durable.vote != reply.receiver:
            raise self.fail(
                "vote durability",
                f"node {node_id} granted node {reply.receiver} its vote in term {reply.term} "
                f"while its durable hard state is {durable}",
            )

    def on_ack_sent(self, node_id: NodeId, reply: AppendResponse, durable_through: Offset) -> None:
        if reply.success and reply.last_offset > durable_through:
            raise self.fail(
                "append durability",
                f"node {node_id} acknowledged offsets through {reply.last_offset} to node "
                f"{reply.receiver} (term {reply.term}) but only {durable_through} is durable",
            )

    def on_leader_commit(
        self, node_id: NodeId, term: Term, commit_offset: Offset, term_at_commit: Term | None
    ) -> None:
        """A leader of `term` advanced its commit offset to `commit_offset` by counting."""
        if term_at_commit != term:
            raise self.fail(
                "current-term commit",
                f"leader {node_id} of term {term} advanced its commit offset to "
                f"{commit_offset}, an entry of term {term_at_commit} (Raft §5.4.2)",
            )

    def on_read(self, node_id: NodeId, commit_offset: Offset, required_offset: Offset) -> None:
        if commit_offset < required_offset:
            raise self.fail(
                "linearizable read",
                f"node {node_id} answered a ReadIndex with commit offset {commit_offset}, "
                f"below batches acknowledged (to offset {required_offset}) before it was asked",
            )

    def check_holds_committed(
        self,
        node_id: NodeId,
        incarnation: int,
        log: LogView,
        commit_offset: Offset,
        truncated_from: Offset | None,
    ) -> None:
        """Every committed entry at or below `commit_offset` is in `log` (or its snapshot)."""
        key = (node_id, incarnation)
        upto = self._held_upto.get(key, NO_OFFSET)
        if truncated_from is not None:
            upto = min(upto, Offset(truncated_from - 1))
        self._held_upto[key] = self._scan(
            upto, commit_offset, lambda c: self._require_held(node_id, "node completeness", log, c)
        )

    def check_leader_complete(
        self, node_id: NodeId, incarnation: int, term: Term, log: LogView
    ) -> None:
        """A leader of `term` holds every entry committed in an earlier term (Raft §5.4.1)."""
        key = (node_id, incarnation, term)

        def check(committed: _Committed) -> None:
            if committed.commit_term < term:
                self._require_held(node_id, f"leader completeness (term {term})", log, committed)

        upto = self._leader_upto.get(key, NO_OFFSET)
        self._leader_upto[key] = self._scan(upto, None, check)

    def check_acked_held(self, node_id: NodeId, log: LogView) -> None:
        for entry in self.acked.values():
            self._require_held(
                node_id, "acknowledged durability", log, self.committed[entry.offset]
            )

    def _scan(
        self, after: Offset, until: Offset | None, check: Callable[[_Committed], None]
    ) -> Offset:
        """Run `check` on committed entries with base offset in (after, until]; new watermark."""
        order = self.committed_order
        i = bisect.bisect_right(order, after)
        while i < len(order) and (until is None or order[i] <= until):
            check(self.committed[order[i]])
            after = order[i]
            i += 1
        return after

    def _require_held(self, node_id: NodeId, invariant: str, log: LogView, c: _Committed) -> None:
        if _covered(log, c.entry.last_offset):
            return
        held = log.entry_at(c.entry.offset)
        if held != c.entry:
            raise self.fail(
                invariant,
                f"node {node_id} lacks committed {_short(c.entry)} (committed in term "
                f"{c.commit_term}); it holds {_short(held) if held else 'nothing'} there",
            )
