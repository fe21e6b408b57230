"""The Ready contract and the shared ready processor (raftlog.runtime.ready): the order of
effects is etcd raft's (persist before acknowledging, Raft §5.1/§5.3), checked with
recording ports rather than mocks."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from raft_unit_helpers import Harness, data_entry

from raftlog.config import RaftConfig
from raftlog.raft.memory import MemoryHardStateStore, MemoryStorage
from raftlog.raft.node import RaftNode
from raftlog.raft.types import (
    AppendRequest,
    AppendResponse,
    Entry,
    HardState,
    Membership,
    Message,
    ReadState,
    Snapshot,
    SnapshotMeta,
    SnapshotRequest,
    VoteResponse,
)
from raftlog.runtime.ready import process_ready
from raftlog.types import NodeId, Offset, Term

N1, N2 = NodeId(1), NodeId(2)


class RecordingLog(MemoryStorage):
    """A MemoryStorage that records the order of writes into a shared event list."""

    def __init__(self, events: list[str]) -> None:
        super().__init__()
        self.events = events

    def append(self, entries: Sequence[Entry]) -> None:
        self.events.append(f"append {entries[0].offset}..{entries[-1].last_offset}")
        super().append(entries)

    def install_snapshot(self, snapshot: Snapshot) -> None:
        self.events.append(f"install {snapshot.meta.offset}")
        super().install_snapshot(snapshot)

    def sync(self) -> None:
        self.events.append("sync")
        super().sync()


class RecordingStore(MemoryHardStateStore):
    def __init__(self, events: list[str]) -> None:
        super().__init__()
        self.events = events

    def save(self, hard_state: HardState) -> None:
        self.events.append(f"save term={hard_state.term}")
        super().save(hard_state)


def _run(node: RaftNode, log: RecordingLog, store: RecordingStore, events: list[str]) -> None:
    def send(message: Message) -> None:
        events.append(f"send {type(message).__name__}")

    def apply(entry: Entry) -> None:
        events.append(f"apply {entry.offset}")

    def restore(snapshot: Snapshot) -> None:
        events.append(f"restore {snapshot.meta.offset}")

    def on_read(read_state: ReadState) -> None:
        events.append(f"read {read_state.request_id}")

    process_ready(
        node,
        log=log,
        hard_state_store=store,
        send=send,
        apply=apply,
        restore=restore,
        on_read=on_read,
    )
    events.append("advanced")


def _follower(events: list[str]) -> tuple[RaftNode, RecordingLog, RecordingStore]:
    log, store = RecordingLog(events), RecordingStore(events)
    node = RaftNode(
        node_id=N1,
        config=RaftConfig(),
        storage=log,
        hard_state=HardState(),
        rng=random.Random(1),
        bootstrap_membership=Membership(frozenset({N1, N2, NodeId(3)})),
    )
    return node, log, store


def test_follower_persists_then_acknowledges_then_applies() -> None:
    events: list[str] = []
    node, log, store = _follower(events)
    _run(node, log, store, events)  # initial soft state
    events.clear()
    entries = (data_entry(1, 0), data_entry(1, 1, 2))
    node.step(AppendRequest(Term(1), N2, N1, Offset(-1), Term(0), entries, Offset(2)))
    _run(node, log, store, events)
    # A follower commits only what is durable here, so the entries apply one Ready later.
    assert node.has_ready()
    _run(node, log, store, events)
    assert events == [
        "append 0..2",
        "save term=1",
        "sync",
        "send AppendResponse",
        "advanced",
        "apply 0",
        "apply 1",
        "advanced",
    ]


def test_snapshot_is_installed_before_entries_and_restored_before_applying() -> None:
    events: list[str] = []
    node, log, store = _follower(events)
    _run(node, log, store, events)
    events.clear()
    meta = SnapshotMeta(Offset(9), Term(1), Membership(frozenset({N1, N2, NodeId(3)})))
    node.step(SnapshotRequest(Term(1), N2, N1, Snapshot(meta)))
    node.step(AppendRequest(Term(1), N2, N1, Offset(9), Term(1), (data_entry(1, 10),), Offset(10)))
    _run(node, log, store, events)
    _run(node, log, store, events)
    assert events == [
        "install 9",
        "restore 9",
        "append 10..10",
        "save term=1",
        "sync",
        "send AppendResponse",
        "send AppendResponse",
        "advanced",
        "apply 10",
        "advanced",
    ]
    assert log.first_offset() == 10 and node.applied == 10


def test_leader_sends_appends_before_its_own_write() -> None:
    """Ready step 1: a leader's appends vouch for nothing local, so they go out first."""
    harness = Harness(1, voters=[1, 2], config=RaftConfig(pre_vote=False))
    harness.node.campaign()
    harness.drain()
    ready = harness.node.ready()
    harness.node.advance(ready)
    harness.node.step(VoteResponse(Term(1), N2, N1, True))
    ready = harness.node.ready()
    assert ready.entries and any(isinstance(m, AppendRequest) for m in ready.messages)
    assert ready.persisted_messages == ()


def test_has_ready_is_false_when_idle_and_ready_needs_advance() -> None:
    harness = Harness(1)
    harness.drain()
    assert not harness.node.has_ready()
    harness.node.tick()
    harness.node.ready()
    with pytest.raises(AssertionError, match="without advance"):
        harness.node.ready()


def _leader(events: list[str], *voters: int) -> tuple[RaftNode, RecordingLog, RecordingStore]:
    """Node 1 leading `voters` in term 1, its no-op (offset 0) durable, not committed."""
    log, store = RecordingLog(events), RecordingStore(events)
    node = RaftNode(
        node_id=N1,
        config=RaftConfig(pre_vote=False),
        storage=log,
        hard_state=HardState(),
        rng=random.Random(1),
        bootstrap_membership=Membership(frozenset(NodeId(voter) for voter in voters)),
    )
    node.campaign()
    while node.has_ready():
        _run(node, log, store, events)
    node.step(VoteResponse(Term(1), N2, N1, True))
    while node.has_ready():
        _run(node, log, store, events)
    assert node.log.durable_last_offset() == 0 and node.commit < 0
    return node, log, store


def test_entries_durable_before_a_ready_apply_before_its_writes() -> None:
    """Committed entries below a Ready's new entries were fsynced by an earlier Ready: they
    are applied first, not after the new entries' fsync (their producers wait for them)."""
    events: list[str] = []
    node, log, store = _leader(events, 1, 2)
    node.step(AppendResponse(Term(1), N2, N1, True, Offset(0)))  # commits the no-op
    node.propose(b"x", offset_count=2)  # offsets 1..2, not yet written
    events.clear()
    _run(node, log, store, events)
    assert events[:2] == ["apply 0", "send AppendRequest"], events
    assert events[-3:] == ["append 1..2", "sync", "advanced"], events
    assert node.applied == 0


def test_entries_committed_before_their_local_write_apply_after_its_fsync() -> None:
    """Two followers of three make a majority before the leader's own write: the entries
    committed so are applied only after their local fsync (Raft order), the durable ones
    before it (Raft §5.4.2: both are of the leader's term)."""
    events: list[str] = []
    node, log, store = _leader(events, 1, 2, 3)
    node.propose(b"x", offset_count=1)  # offset 1, only in the leader's unstable log
    for follower in (N2, NodeId(3)):
        node.step(AppendResponse(Term(1), follower, N1, True, Offset(1)))
    assert node.commit == 1
    events.clear()
    _run(node, log, store, events)
    assert events[0] == "apply 0", events
    assert events.index("sync") < events.index("apply 1") < events.index("advanced"), events
    assert node.applied == 1
