"""Log compaction and InstallSnapshot (Raft §7)."""

from __future__ import annotations

from raft_harness import Cluster
from raft_unit_helpers import Harness, data_entry

from raftlog.raft import replication
from raftlog.raft.progress import ProgressState
from raftlog.raft.types import (
    AppendResponse,
    HardState,
    Membership,
    Snapshot,
    SnapshotMeta,
    SnapshotRequest,
)
from raftlog.types import NodeId, Offset, Term

N1, N2, N3 = NodeId(1), NodeId(2), NodeId(3)


def _behind(cluster: Cluster) -> Cluster:
    cluster.run("campaign 1")
    cluster.stabilize()
    cluster.run("partition 3 | 1 2")
    for n in range(5):
        cluster.run(f"propose 1 v{n} 2")
    cluster.stabilize()
    cluster.compact(N1, Offset(10))
    return cluster


def test_follower_behind_the_first_offset_gets_the_snapshot() -> None:
    """§7: the leader sends InstallSnapshot when the entries a follower needs are gone."""
    cluster = _behind(Cluster([1, 2, 3]))
    cluster.history.clear()
    cluster.run("heal")
    for _ in range(3):
        cluster.run("tick 1 x2")
        cluster.stabilize()
    snapshots = [m for m in cluster.history if isinstance(m, SnapshotRequest)]
    assert [m.receiver for m in snapshots] == [N3]
    follower = cluster.nodes[N3]
    assert follower.log.first_offset() == 11 and follower.commit_offset == 10
    assert cluster.storages[N3].snapshot() == cluster.storages[N1].snapshot()


def test_replication_continues_after_the_snapshot() -> None:
    cluster = _behind(Cluster([1, 2, 3]))
    cluster.run("heal")
    cluster.run("tick 1 x2")
    cluster.stabilize()
    cluster.run("propose 1 after")
    cluster.stabilize()
    assert cluster.nodes[N3].commit_offset == cluster.nodes[N1].commit_offset == 11
    assert cluster.nodes[N1].progress[N3].state is ProgressState.REPLICATE


def test_lost_snapshot_is_retried_after_an_election_timeout() -> None:
    cluster = _behind(Cluster([1, 2, 3]))
    cluster.run("heal")
    for _ in range(20):
        if any(isinstance(m, SnapshotRequest) for m in cluster.queue):
            break
        cluster.run("tick 1")
        cluster.run("deliver")
    cluster.run("drop")  # the snapshot is lost
    assert cluster.nodes[N1].progress[N3].state is ProgressState.SNAPSHOT
    for _ in range(8):
        cluster.run("tick 1 x2")
        cluster.stabilize()
    assert cluster.nodes[N3].commit_offset == 10


def _snapshot_request(offset: int, term: int) -> SnapshotRequest:
    meta = SnapshotMeta(Offset(offset), Term(term), Membership(frozenset({N1, N2, N3})))
    return SnapshotRequest(Term(3), N2, N1, Snapshot(meta))


def test_follower_restores_and_restarts_its_log_after_the_snapshot() -> None:
    follower = Harness(
        1, entries=[data_entry(1, 0), data_entry(2, 1)], hard_state=HardState(Term(3))
    )
    sent = follower.step(_snapshot_request(20, 3))
    assert sent == [AppendResponse(Term(3), N1, N2, True, Offset(20))]
    assert follower.storage.first_offset() == 21 and follower.storage.last_offset() == 20
    assert follower.node.commit_offset == 20 and follower.node.applied == 20


def test_follower_ignores_a_snapshot_it_has_committed_past() -> None:
    entries = [data_entry(1, n) for n in range(6)]
    follower = Harness(1, entries=entries, hard_state=HardState(Term(3)))
    follower.node.commit = follower.node.applied = Offset(5)
    sent = follower.step(_snapshot_request(3, 1))
    assert sent == [AppendResponse(Term(3), N1, N2, True, Offset(5))]
    assert follower.storage.first_offset() == 0


def test_follower_holding_the_snapshot_entry_keeps_its_log() -> None:
    """etcd's rule: if the log already has the snapshot's last entry, only commit moves."""
    entries = [data_entry(1, n) for n in range(6)]
    follower = Harness(1, entries=entries, hard_state=HardState(Term(3)))
    follower.step(_snapshot_request(3, 1))
    assert follower.storage.first_offset() == 0 and follower.node.commit_offset == 3


def test_rejection_of_a_probe_sent_before_compaction_leads_to_the_snapshot() -> None:
    """§7: the leader compacted between sending a probe and reading its rejection."""
    cluster = Cluster([1, 2, 3])
    cluster.run("campaign 1")
    cluster.stabilize()
    cluster.run("partition 3 | 1 2")
    for n in range(5):
        cluster.run(f"propose 1 v{n} 2")
    cluster.stabilize()
    cluster.run("heal")
    leader = cluster.nodes[N1]
    leader.progress[N3].become_probe(next_offset=Offset(5))  # entries are 1-2, 3-4, 5-6, ...
    replication.send_append(leader, N3)
    cluster.process()
    cluster.run("deliver")  # 3 (log ends at 0) rejects prev=4
    cluster.compact(N1, Offset(10))
    cluster.history.clear()
    cluster.run("deliver")
    assert [type(m).__name__ for m in cluster.history] == ["SnapshotRequest"]
    cluster.stabilize()
    assert cluster.nodes[N3].commit_offset == 10
