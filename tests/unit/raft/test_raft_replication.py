"""Log replication and the matching property (Raft §5.3), commitment (§5.4.2), the
durability rules of Ready (§5.1, §5.3), and the replication bounds from RaftConfig."""

from __future__ import annotations

from raft_harness import Cluster
from raft_unit_helpers import Harness, data_entry

from raftlog.config import RaftConfig
from raftlog.raft.memory import MemoryHardStateStore, MemoryStorage
from raftlog.raft.progress import ProgressState
from raftlog.raft.types import AppendRequest, AppendResponse, HardState, Role, VoteResponse
from raftlog.types import NodeId, Offset, Term

N1, N2, N3 = NodeId(1), NodeId(2), NodeId(3)


def _append(term: int, prev: int, prev_term: int, entries: list, commit: int) -> AppendRequest:  # type: ignore[type-arg]
    return AppendRequest(
        Term(term), N2, N1, Offset(prev), Term(prev_term), tuple(entries), Offset(commit)
    )


def _follower(entries: list, term: int = 3) -> Harness:  # type: ignore[type-arg]
    return Harness(1, entries=entries, hard_state=HardState(Term(term)))


def test_follower_rejects_when_prev_does_not_match() -> None:
    """§5.3: the consistency check; the answer carries the conflict hints."""
    follower = _follower([data_entry(1, 0), data_entry(1, 1, count=2), data_entry(2, 3)])
    sent = follower.step(_append(3, 3, 3, [data_entry(3, 4)], 0))
    assert sent == [
        AppendResponse(
            Term(3),
            N1,
            N2,
            False,
            Offset(3),
            Offset(3),
            conflict_term=Term(2),
            conflict_offset=Offset(3),
        )
    ]
    assert follower.node.last_offset == 3


def test_follower_truncates_a_conflicting_suffix() -> None:
    """§5.3: an existing entry that conflicts with a new one is deleted with all that
    follow it; the driver's append drops them from storage."""
    follower = _follower([data_entry(1, 0), data_entry(2, 1, count=3), data_entry(2, 4)])
    sent = follower.step(_append(3, 0, 1, [data_entry(3, 1, count=2)], 0))
    assert sent == [AppendResponse(Term(3), N1, N2, True, Offset(2))]
    assert follower.storage.last_offset() == 2
    assert follower.storage.term_at(Offset(1)) == 3 and follower.storage.term_at(Offset(4)) is None


def test_follower_keeps_matching_entries_on_a_stale_append() -> None:
    """§5.3: "if an existing entry conflicts ..." — only a conflict truncates; a delayed
    append whose entries this log already holds must not drop the entries after them."""
    log = [data_entry(1, 0), data_entry(3, 1), data_entry(3, 2), data_entry(3, 3)]
    follower = _follower(log)
    sent = follower.step(_append(3, 0, 1, [data_entry(3, 1)], -1))
    assert sent == [AppendResponse(Term(3), N1, N2, True, Offset(1))]
    assert follower.storage.last_offset() == 3


def test_planted_bug_truncate_matching_drops_acknowledged_entries() -> None:
    config = RaftConfig(planted_bugs=frozenset({"truncate-matching"}))
    log = [data_entry(1, 0), data_entry(3, 1), data_entry(3, 2), data_entry(3, 3)]
    follower = Harness(1, entries=log, hard_state=HardState(Term(3)), config=config)
    follower.step(_append(3, 0, 1, [data_entry(3, 1)], -1))
    assert follower.storage.last_offset() == 1


def test_follower_commit_is_capped_by_what_it_matched() -> None:
    """§5.3: commitIndex = min(leaderCommit, index of last new entry)."""
    follower = _follower([data_entry(1, 0), data_entry(2, 1)])
    follower.step(_append(3, 0, 1, [], 50))
    assert follower.node.commit_offset == 0  # offset 1 (term 2) was not matched yet
    follower.step(_append(3, 0, 1, [data_entry(3, 1, count=5)], 50))
    assert follower.node.commit_offset == 5


def test_acknowledgement_waits_for_durability() -> None:
    """§5.3: a leader counts a replica, so the ack leaves only after the entries synced."""
    follower = _follower([])
    follower.node.step(_append(3, -1, 0, [data_entry(3, 0)], -1))
    ready = follower.node.ready()
    assert ready.entries and ready.must_sync and ready.messages == ()
    assert ready.persisted_messages == (AppendResponse(Term(3), N1, N2, True, Offset(0)),)


def test_planted_bug_ack_before_durable() -> None:
    config = RaftConfig(planted_bugs=frozenset({"ack-before-durable"}))
    follower = Harness(1, hard_state=HardState(Term(3)), config=config)
    follower.node.step(_append(3, -1, 0, [data_entry(3, 0)], -1))
    assert follower.node.ready().messages == (AppendResponse(Term(3), N1, N2, True, Offset(0)),)


def test_leader_counts_itself_only_once_durable() -> None:
    """etcd's rule behind §5.3: the leader's own entry counts after advance() says durable."""
    harness = Harness(1, voters=[1])
    harness.node.campaign()
    harness.drain()
    harness.node.propose(b"a", offset_count=1)
    assert harness.node.commit_offset == 0
    ready = harness.node.ready()
    assert ready.entries and ready.commit_offset == 0
    harness.storage.append(ready.entries)
    harness.node.advance(ready)
    assert harness.node.commit_offset == 1


def test_backtracking_skips_a_whole_conflicting_term_per_round_trip() -> None:
    """Raft §5.3 optimisation: with conflict-term hints the leader needs one round
    trip per conflicting term, not one per entry. The follower holds 30 entries of term 3
    that the leader (20 entries of term 2) does not have."""
    config = RaftConfig(pre_vote=False)
    leader_log = [data_entry(1, 0)] + [data_entry(2, n) for n in range(1, 21)]
    follower_log = [data_entry(1, 0)] + [data_entry(3, n) for n in range(1, 31)]
    term = HardState(Term(3))
    leader = Harness(2, voters=[1, 2], entries=leader_log, hard_state=term, config=config)
    follower = Harness(1, voters=[1, 2], entries=follower_log, hard_state=term)
    leader.node.campaign()
    leader.drain()
    in_flight = leader.step(VoteResponse(Term(4), N1, N2, True))
    assert leader.node.role is Role.LEADER
    rejections = 0
    for _ in range(20):
        if not in_flight:
            break
        to_leader = [r for m in in_flight for r in follower.step(m)]
        rejections += sum(1 for m in to_leader if isinstance(m, AppendResponse) and not m.success)
        in_flight = [r for m in to_leader for r in leader.step(m)]
    assert rejections == 1
    assert follower.storage.entries(Offset(0), bytes_max=10**6) == leader.storage.entries(
        Offset(0), bytes_max=10**6
    )


def test_append_bytes_max_bounds_each_append_but_sends_at_least_one_entry() -> None:
    config = RaftConfig(append_bytes_max=200, inflight_bytes_max=10_000)
    cluster = Cluster([1, 2, 3], config=config)
    cluster.run("campaign 1")
    cluster.stabilize()
    cluster.run("partition 1 | 2 3")
    for n in range(10):
        cluster.run(f"propose 1 {'y' * 50}{n}")
    cluster.run(f"propose 1 {'z' * 500}")  # larger than append_bytes_max on its own
    cluster.run("heal")
    cluster.history.clear()
    for _ in range(3):
        cluster.run("tick 1 x2")
        cluster.stabilize()
    appends = [m for m in cluster.history if isinstance(m, AppendRequest) and m.entries]
    assert appends
    for append in appends:
        size_bytes = sum(entry.size_bytes for entry in append.entries)
        assert size_bytes <= 200 or len(append.entries) == 1, append
    assert cluster.nodes[N2].last_offset == cluster.nodes[N1].last_offset


def test_inflight_window_is_bounded_by_count_and_bytes() -> None:
    """Pipelining: at most inflight_messages_max appends (and inflight_bytes_max bytes) are
    outstanding to a follower that does not answer."""
    config = RaftConfig(inflight_messages_max=3, append_bytes_max=100, inflight_bytes_max=100_000)
    cluster = Cluster([1, 2, 3], config=config)
    cluster.run("campaign 1")
    cluster.stabilize()
    cluster.run("partition 1 | 2 3")
    for n in range(20):
        cluster.run(f"propose 1 v{n}")
    progress = cluster.nodes[N1].progress[N2]
    assert progress.state is ProgressState.REPLICATE
    assert len(progress.inflights) == 3
    assert progress.next <= 4  # three one-entry appends after offset 0
    config = RaftConfig(inflight_messages_max=100, append_bytes_max=100, inflight_bytes_max=200)
    cluster = Cluster([1, 2, 3], config=config)
    cluster.run("campaign 1")
    cluster.stabilize()
    cluster.run("partition 1 | 2 3")
    for n in range(20):
        cluster.run(f"propose 1 v{n}")
    progress = cluster.nodes[N1].progress[N2]
    assert progress.inflight_bytes <= 200 + 100  # the window closes once it is reached
    assert len(progress.inflights) < 20


def test_lost_appends_in_replicate_state_are_resent() -> None:
    """Liveness: a stalled pipeline falls back to probing on heartbeat answers."""
    cluster = Cluster([1, 2, 3])
    cluster.run("campaign 1")
    cluster.stabilize()
    cluster.run("propose 1 a")
    cluster.run("drop")
    for _ in range(4):
        cluster.run("tick 1 x2")
        cluster.stabilize()
    assert {node.commit_offset for node in cluster.nodes.values()} == {1}


def _wipe_and_restart(cluster: Cluster, node_id: NodeId) -> None:
    cluster.crash(node_id)
    cluster.storages[node_id] = MemoryStorage()
    cluster.hard_state_stores[node_id] = MemoryHardStateStore()
    cluster.restart(node_id)


def test_a_follower_that_lost_its_log_is_probed_again_at_its_first_rejection() -> None:
    """Raft assumes logs survive restarts (§5.1), but a disk can lose entries
    (raftlog.raft.repair): a rejection whose follower log ends below what it acknowledged
    makes the leader forget its progress and probe it from scratch, so it catches up even
    without the transport's restart notice (`forget_peer_log`)."""
    cluster = Cluster([1, 2, 3])
    cluster.run("campaign 1")
    cluster.stabilize()
    for n in range(5):
        cluster.run(f"propose 1 before{n}")
    cluster.stabilize()
    leader_log = cluster.storages[N1].last_offset()
    _wipe_and_restart(cluster, N3)
    cluster.run("propose 1 after")
    cluster.stabilize()
    for _ in range(3):
        cluster.run("tick 1 x2")
        cluster.stabilize()
    assert cluster.storages[N3].last_offset() == cluster.storages[N1].last_offset() > leader_log
    assert cluster.nodes[N1].progress[N3].match == cluster.storages[N1].last_offset()


def test_forget_peer_log_is_a_no_op_on_followers_and_for_oneself() -> None:
    cluster = Cluster([1, 2, 3])
    cluster.run("campaign 1")
    cluster.stabilize()
    cluster.nodes[N2].forget_peer_log(N3)
    cluster.nodes[N1].forget_peer_log(N1)
    assert cluster.nodes[N1].progress[N1].match >= 0
