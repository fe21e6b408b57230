"""RaftGroupHost: liveness work before bulk work within a pass. One pass holds a vote for the
metadata group, a vote for a partition group, and a partition append with a commit to
apply; the trace of what the host did (sends, writes, syncs, applies) must show both
votes durable and sent, and the metadata group's entry applied, before the partition's
append is written. Ordering only: no clock, no sleep."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from raftlog.config import RaftConfig
from raftlog.raft.memory import MemoryHardStateStore, MemoryStorage
from raftlog.raft.types import (
    AppendRequest,
    Entry,
    EntryKind,
    HardState,
    Membership,
    Message,
    Snapshot,
    VoteRequest,
)
from raftlog.runtime.group import RaftGroup
from raftlog.runtime.host import RaftGroupHost
from raftlog.types import NodeId, Offset, RaftGroupId, Term
from tests.unit.runtime.hosted_groups import add_group

ME, LEADER, CANDIDATE = NodeId(1), NodeId(2), NodeId(3)
METADATA, VOTING, APPENDING = RaftGroupId(0), RaftGroupId(7), RaftGroupId(8)
CONFIG = RaftConfig(election_timeout_ticks=10, heartbeat_interval_ticks=2)
MEMBERSHIP = Membership(voters=frozenset({ME, LEADER, CANDIDATE}))
Trace = list[tuple[str, RaftGroupId]]


class TracedStorage(MemoryStorage):
    def __init__(self, trace: Trace, group: RaftGroupId) -> None:
        super().__init__()
        self._trace, self._group = trace, group

    def append(self, entries: Sequence[Entry]) -> None:
        self._trace.append(("write", self._group))
        super().append(entries)

    def sync(self) -> None:
        self._trace.append(("sync", self._group))
        super().sync()


class TracedHardState(MemoryHardStateStore):
    def __init__(self, trace: Trace, group: RaftGroupId) -> None:
        super().__init__()
        self._trace, self._group = trace, group

    def save(self, hard_state: HardState) -> None:
        self._trace.append(("save", self._group))
        super().save(hard_state)


class TracedMachine:
    def __init__(self, trace: Trace, group: RaftGroupId) -> None:
        self._trace, self._group = trace, group

    def apply(self, entry: Entry) -> None:
        self._trace.append(("apply", self._group))

    def restore(self, snapshot: Snapshot) -> None:
        raise AssertionError("no snapshots here")


def _add_group(host: RaftGroupHost, trace: Trace, raft_group_id: RaftGroupId) -> RaftGroup:
    return add_group(
        host,
        raft_group_id,
        TracedStorage(trace, raft_group_id),
        config=CONFIG,
        voters=tuple(MEMBERSHIP.voters),
        seed=raft_group_id,
        hard_state_store=TracedHardState(trace, raft_group_id),
        state_machine=TracedMachine(trace, raft_group_id),
    )


def _append(term: int, offset: int, commit: int) -> AppendRequest:
    entry = Entry(Term(term), Offset(offset), 1, EntryKind.DATA, b"record")
    previous = offset - 1
    return AppendRequest(
        Term(term), LEADER, ME, Offset(previous), Term(term if previous >= 0 else 0),
        (entry,), Offset(commit),
    )  # fmt: skip


def _vote(term: int) -> VoteRequest:
    return VoteRequest(Term(term), CANDIDATE, ME, Offset(-1), Term(0))


async def _one_pass(host: RaftGroupHost, items: list[tuple[NodeId, RaftGroupId, Message]]) -> None:
    for sender, raft_group_id, message in items:
        host.deliver(sender, [(raft_group_id, message)])
    await host.process_pass()


def test_votes_and_the_metadata_group_go_before_partition_appends_and_applies() -> None:
    trace: Trace = []

    def send(receiver: NodeId, raft_group_id: RaftGroupId, message: Message) -> None:
        trace.append((type(message).__name__, raft_group_id))

    async def scenario() -> None:
        host = RaftGroupHost(
            node_id=ME, tick_interval_ms=50, send=send, urgent_groups=frozenset({METADATA})
        )
        for raft_group_id in (METADATA, VOTING, APPENDING):
            _add_group(host, trace, raft_group_id)
        await host.process_pass()  # the groups' first Readys (nothing to do yet)
        # The metadata group and the appending group each hold entry 0 from leader 2.
        await _one_pass(host, [(LEADER, g, _append(1, 0, -1)) for g in (METADATA, APPENDING)])
        trace.clear()
        # One pass: the metadata group commits and applies entry 0 and takes entry 1; the
        # partition group takes a big append and commits entry 0; another is asked to vote.
        await _one_pass(
            host,
            [
                (LEADER, APPENDING, _append(1, 1, 0)),
                (LEADER, METADATA, _append(1, 1, 0)),
                (CANDIDATE, VOTING, _vote(2)),
            ],
        )

    asyncio.run(scenario())
    bulk_starts = trace.index(("write", APPENDING))
    liveness = trace[:bulk_starts]
    assert ("save", VOTING) in liveness and ("VoteResponse", VOTING) in liveness, trace
    assert ("apply", METADATA) in liveness and ("AppendResponse", METADATA) in liveness, trace
    assert ("sync", METADATA) in liveness and ("apply", APPENDING) not in liveness[:-1], trace
    assert trace[bulk_starts - 1 :] == [
        ("apply", APPENDING),  # durable before the pass: applied before its own write
        ("write", APPENDING),
        ("sync", APPENDING),
        ("AppendResponse", APPENDING),
    ], trace


def test_a_pass_of_one_kind_is_one_sync_as_before() -> None:
    trace: Trace = []

    async def scenario() -> None:
        host = RaftGroupHost(node_id=ME, tick_interval_ms=50, send=lambda *_: None)
        for raft_group_id in (VOTING, APPENDING):
            _add_group(host, trace, raft_group_id)
        await host.process_pass()
        trace.clear()
        await _one_pass(host, [(LEADER, g, _append(1, 0, -1)) for g in (VOTING, APPENDING)])

    asyncio.run(scenario())
    writes = [event for event in trace if event[0] == "write"]
    syncs = [event for event in trace if event[0] == "sync"]
    assert len(writes) == 2 and len(syncs) == 2
    # Both syncs come after both writes: the two groups shared one group-commit.
    assert trace.index(syncs[0]) > trace.index(writes[1]), trace
