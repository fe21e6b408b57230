"""Checker self-test: hand-made bad states must fail it, and legal ones must not (Raft §5.4)."""

from __future__ import annotations

from contextlib import AbstractContextManager

import pytest

from raftlog.raft.types import (
    AppendResponse,
    Entry,
    EntryKind,
    HardState,
    Membership,
    Role,
    Snapshot,
    SnapshotMeta,
    VoteResponse,
)
from raftlog.sim.checker import Checker, InvariantViolation
from raftlog.types import NodeId, Offset, Term

N1, N2, N3 = NodeId(1), NodeId(2), NodeId(3)


def _entry(offset: int, term: int, data: bytes = b"x", count: int = 1) -> Entry:
    return Entry(Term(term), Offset(offset), count, EntryKind.DATA, data)


class _Log:
    """A hand-made log view: entries by base offset, optionally behind a snapshot."""

    def __init__(self, *entries: Entry, snapshot_offset: int | None = None) -> None:
        self._entries = {e.offset: e for e in entries}
        self._snapshot = None
        if snapshot_offset is not None:
            meta = SnapshotMeta(Offset(snapshot_offset), Term(1), Membership(frozenset({N1})))
            self._snapshot = Snapshot(meta)

    def entry_at(self, offset: Offset) -> Entry | None:
        return self._entries.get(offset)

    def snapshot(self) -> Snapshot | None:
        return self._snapshot


def _violated(invariant: str) -> AbstractContextManager[pytest.ExceptionInfo[InvariantViolation]]:
    return pytest.raises(InvariantViolation, match=f"^{invariant}")


def test_two_leaders_in_one_term_fail_election_safety() -> None:  # Raft §5.2
    checker = Checker()
    checker.on_role(N1, Role.LEADER, Term(3))
    checker.on_role(N2, Role.LEADER, Term(4))
    checker.on_role(N1, Role.LEADER, Term(3))  # the same leader seen again is fine
    with _violated("election safety"):
        checker.on_role(N3, Role.LEADER, Term(3))


def test_two_entries_at_one_offset_and_term_fail_log_matching() -> None:  # Raft §5.3
    checker = Checker()
    checker.on_append(N1, _entry(0, 1, b"a"), Term(0))
    checker.on_append(N2, _entry(0, 1, b"a"), Term(0))
    with _violated("log matching"):
        checker.on_append(N3, _entry(0, 1, b"b"), Term(0))


def test_the_same_entry_after_different_terms_fails_log_matching() -> None:
    checker = Checker()
    checker.on_append(N1, _entry(5, 3), Term(2))
    with _violated("log matching"):
        checker.on_append(N2, _entry(5, 3), Term(1))


def test_diverging_committed_entries_fail_state_machine_safety() -> None:  # Raft §5.4.3
    checker = Checker()
    checker.on_apply(N1, _entry(0, 1, b"a"), Term(1))
    checker.on_apply(N2, _entry(0, 1, b"a"), Term(1))
    with _violated("state machine safety"):
        checker.on_apply(N3, _entry(0, 2, b"b"), Term(2))


def test_overlapping_committed_batches_fail_state_machine_safety() -> None:
    checker = Checker()
    checker.on_apply(N1, _entry(0, 1, b"a", count=3), Term(1))
    with _violated("state machine safety"):
        checker.on_apply(N2, _entry(2, 1, b"b"), Term(1))


def test_a_lost_acknowledged_entry_fails_leader_completeness() -> None:  # Raft §5.4.1
    checker = Checker()
    acked = _entry(0, 1, b"acked")
    checker.on_apply(N1, acked, Term(1))
    checker.on_ack(acked)
    checker.check_leader_complete(N2, 1, Term(2), _Log(acked))
    with _violated("leader completeness"):
        checker.check_leader_complete(N3, 1, Term(2), _Log(_entry(0, 2, b"other")))
    with _violated("acknowledged durability"):
        checker.check_acked_held(N3, _Log())


def test_a_stale_leader_need_not_hold_entries_committed_after_its_term() -> None:
    checker = Checker()
    checker.on_apply(N1, _entry(0, 5), Term(5))
    checker.check_leader_complete(N2, 1, Term(4), _Log())  # an older leader: no false alarm
    checker.check_leader_complete(N2, 1, Term(6), _Log(snapshot_offset=0))  # snapshot covers it


def test_acknowledging_an_uncommitted_entry_fails() -> None:
    with _violated("acknowledged durability"):
        Checker().on_ack(_entry(0, 1))


def test_a_node_committing_past_an_entry_it_lost_fails_node_completeness() -> None:
    checker = Checker()
    for offset in range(3):
        checker.on_apply(N1, _entry(offset, 1), Term(1))
    log = _Log(_entry(0, 1), _entry(1, 1), _entry(2, 1))
    checker.check_holds_committed(N2, 1, log, Offset(2), None)
    truncated = _Log(_entry(0, 1))  # entries 1..2 truncated away while commit stayed at 2
    with _violated("node completeness"):
        checker.check_holds_committed(N2, 1, truncated, Offset(2), Offset(1))


def test_a_commit_offset_moving_back_fails_within_one_incarnation_only() -> None:
    checker = Checker()
    checker.on_commit(N1, 1, Offset(7))
    checker.on_commit(N1, 2, Offset(3))  # a restart may start lower
    with _violated("commit monotonicity"):
        checker.on_commit(N1, 2, Offset(2))


def test_a_read_below_an_earlier_acknowledgement_fails() -> None:  # Raft §6.4
    checker = Checker()
    checker.on_read(N1, Offset(4), Offset(4))
    with _violated("linearizable read"):
        checker.on_read(N1, Offset(3), Offset(4))


def test_a_snapshot_that_ends_mid_batch_or_beyond_commit_fails() -> None:
    checker = Checker()
    checker.on_apply(N1, _entry(0, 1, count=3), Term(1))
    membership = Membership(frozenset({N1}))
    checker.on_restore(N2, Snapshot(SnapshotMeta(Offset(2), Term(1), membership)))
    for offset, term in ((1, 1), (2, 2), (9, 1)):
        with _violated("snapshot safety"):
            checker.on_restore(N2, Snapshot(SnapshotMeta(Offset(offset), Term(term), membership)))


def test_one_vote_per_term_across_restarts_fails_election_safety() -> None:  # Raft §5.2
    checker = Checker()
    checker.on_vote_granted(N1, Term(2), N2)
    checker.on_vote_granted(N1, Term(2), N2)  # a resent vote for the same candidate is fine
    checker.on_vote_granted(N1, Term(3), N3)
    with _violated("election safety"):
        checker.on_vote_granted(N1, Term(2), N3)


def test_a_vote_or_ack_sent_before_it_is_durable_fails() -> None:  # Raft §5.1, §5.3
    checker = Checker()
    vote = VoteResponse(Term(2), N1, N2, True)
    checker.on_vote_sent(N1, vote, HardState(Term(2), N2))
    checker.on_vote_sent(N1, VoteResponse(Term(2), N1, N3, False), HardState(Term(1)))
    with _violated("vote durability"):
        checker.on_vote_sent(N1, vote, HardState(Term(1), N2))
    ack = AppendResponse(Term(2), N1, N2, True, Offset(9))
    checker.on_ack_sent(N1, ack, Offset(9))
    with _violated("append durability"):
        checker.on_ack_sent(N1, ack, Offset(8))


def test_a_leader_committing_an_old_term_entry_fails() -> None:  # Raft §5.4.2, Figure 8
    checker = Checker()
    checker.on_leader_commit(N1, Term(4), Offset(7), Term(4))
    with _violated("current-term commit"):
        checker.on_leader_commit(N1, Term(4), Offset(5), Term(2))
