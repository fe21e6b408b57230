"""Single-server membership changes with learners (Raft dissertation §4).

Theory of operation. A CONFIG entry takes effect on a node as soon as it is in its log
(appended, not committed: dissertation §4.1), and is undone if a leader truncates it. Changing
one voter at a time keeps every majority of the old voters overlapping every majority of the
new ones (§4.2), so two leaders can never be elected in one term. A leader proposes a change
only after it has committed an entry of its own term and while no other change is
uncommitted: the 2015 fix to the single-server algorithm (Ongaro, raft-dev "bug in
single-server membership changes").

Learners (§4.2.1) receive entries but never vote or count for a quorum; a learner becomes a
voter only through a change that promotes it.

`ConfigHistory` keeps the CONFIG entries of the log that may still be truncated, plus the
membership in force before them, so that truncation reverts exactly. It is bounded: entries
at or below the commit offset are folded into the base.
"""

from __future__ import annotations

from collections.abc import Iterable

from raftlog.errors import MembershipChangeError
from raftlog.raft.ports import LogStorage
from raftlog.raft.types import Entry, EntryKind, Membership
from raftlog.types import NodeId, Offset

__all__ = ["ConfigHistory", "membership_at", "validate_change"]


def membership_at(storage: LogStorage, offset: Offset, bootstrap: Membership) -> Membership:
    """The membership in force at `offset` of `storage`, for a snapshot taken there (§7):
    the last CONFIG entry at or before it, else the snapshot's, else the group's bootstrap."""
    configs = [e for e in storage.config_entries() if e.offset <= offset]
    if configs:
        return Membership.decode(configs[-1].data)
    snapshot = storage.snapshot()
    return snapshot.meta.membership if snapshot is not None else bootstrap


def _changed_nodes(old: Membership, new: Membership) -> set[NodeId]:
    changed = set(old.voters ^ new.voters) | set(old.learners ^ new.learners)
    return changed


def validate_change(old: Membership, new: Membership) -> None:
    """Refuse anything but a change of one node (add, remove, promote or demote)."""
    if not new.voters:
        raise MembershipChangeError(f"{new} has no voters")
    changed = _changed_nodes(old, new)
    if not changed:
        raise MembershipChangeError(f"{new} is the current membership")
    if len(changed) > 1:
        raise MembershipChangeError(
            f"change from {sorted(old.voters)}+{sorted(old.learners)} to "
            f"{sorted(new.voters)}+{sorted(new.learners)} touches nodes {sorted(changed)}; "
            "only one node may change at a time (dissertation §4.2)"
        )
    assert len(old.voters ^ new.voters) <= 1


class ConfigHistory:
    """The membership in force at the end of the log, revertible by truncation."""

    __slots__ = ("base", "base_offset", "uncommitted")

    def __init__(self, base: Membership, base_offset: Offset) -> None:
        self.base = base
        self.base_offset = base_offset  # offset of the entry (or snapshot) that set `base`
        self.uncommitted: list[tuple[Offset, Membership]] = []

    @property
    def current(self) -> Membership:
        return self.uncommitted[-1][1] if self.uncommitted else self.base

    @property
    def last_offset(self) -> Offset:
        """Offset of the latest CONFIG entry (or of whatever set the base membership)."""
        return self.uncommitted[-1][0] if self.uncommitted else self.base_offset

    def on_append(self, entries: Iterable[Entry]) -> bool:
        """Drop CONFIG entries at or after the first appended offset, then add the new
        ones; True when the membership in force changed."""
        entries = list(entries)
        if not entries:
            return False
        before = self.current
        changed = self.on_truncate(entries[0].offset)
        for entry in entries:
            if entry.kind is EntryKind.CONFIG:
                assert not self.uncommitted or self.uncommitted[-1][0] < entry.offset
                self.uncommitted.append((entry.offset, Membership.decode(entry.data)))
        return changed or self.current != before

    def on_truncate(self, offset: Offset) -> bool:
        """Undo CONFIG entries at offsets >= `offset`; True if the membership changed."""
        assert offset > self.base_offset, (
            f"truncating at {offset} undoes committed {self.base_offset}"
        )
        before = self.current
        while self.uncommitted and self.uncommitted[-1][0] >= offset:
            self.uncommitted.pop()
        return self.current != before

    def on_commit(self, commit_offset: Offset) -> None:
        """Fold committed CONFIG entries into the base: they can never be truncated."""
        while self.uncommitted and self.uncommitted[0][0] <= commit_offset:
            self.base_offset, self.base = self.uncommitted.pop(0)
        assert all(offset > commit_offset for offset, _ in self.uncommitted)

    def on_restore(self, membership: Membership, snapshot_offset: Offset) -> None:
        assert snapshot_offset >= self.base_offset, (snapshot_offset, self.base_offset)
        self.base = membership
        self.base_offset = snapshot_offset
        self.uncommitted = []
