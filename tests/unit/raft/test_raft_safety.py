"""Safety (Raft §5.4): the commitment rule of §5.4.2 in the Figure 8 scenario, with and
without the planted bug, and the invariants the core asserts on itself."""

from __future__ import annotations

from raft_harness import Cluster

from raftlog.config import RaftConfig
from raftlog.raft.types import Role
from raftlog.types import NodeId, Offset

N1, N3, N5 = NodeId(1), NodeId(3), NodeId(5)


def _figure8(bugs: frozenset[str]) -> Cluster:
    """Figure 8 (a)-(c): X (term 1, offset 1) ends up on 1, 2 and 3 under leader 1 of term 3,
    whose own NOOP (offset 2) reached 2 but not 3."""
    config = RaftConfig(pre_vote=False, check_quorum=False, append_bytes_max=1, planted_bugs=bugs)
    cluster = Cluster([1, 2, 3, 4, 5], config=config)
    script = """campaign 1; stabilize; partition 1 2 | 3 4 5; propose 1 X; stabilize
        campaign 5; deliver; deliver; crash 5
        partition 1 2 3 | 4; crash 1; restart 1; campaign 1; stabilize; campaign 1
        deliver; deliver; deliver 1->3; deliver 3->1; deliver 1->3; deliver 3->1
        drop 1->3; deliver 1->2; deliver 2->1"""
    for command in script.replace("\n", ";").split(";"):
        cluster.run(command.strip())
    leader = cluster.nodes[N1]
    assert leader.role is Role.LEADER and leader.term == 3
    assert {n: p.match for n, p in leader.progress.items() if n != N1}[N3] == 1
    return cluster


def _overwrite_x(cluster: Cluster) -> None:
    """Figure 8 (d): 1 crashes, 5 wins term 4 with 3 and 4 and overwrites offset 1 on 3."""
    for command in ["crash 1", "restart 5", "partition 2 | 3 4 5", "campaign 5", "stabilize"]:
        cluster.run(command)
    cluster.run("campaign 5")
    cluster.stabilize()
    assert cluster.nodes[N5].role is Role.LEADER


def test_figure8_old_term_entry_is_not_committed_by_counting_replicas() -> None:
    """§5.4.2: X is on a majority but of term 1; leader 1 (term 3) must not commit it."""
    cluster = _figure8(frozenset())
    assert cluster.nodes[N1].commit_offset == -1
    applied_x = [e for e in cluster.applied[N1] if e.offset == 1]
    _overwrite_x(cluster)
    assert applied_x == []
    assert cluster.nodes[N3].log.term_at(Offset(1)) == 2  # X overwritten, safely


def test_figure8_planted_bug_commits_an_entry_that_is_later_overwritten() -> None:
    """The planted bug "commit-old-term" breaks State Machine Safety in the same scenario."""
    cluster = _figure8(frozenset({"commit-old-term"}))
    assert cluster.nodes[N1].commit_offset == 1
    x = next(e for e in cluster.applied[N1] if e.offset == 1)
    _overwrite_x(cluster)
    on_3 = next(e for e in cluster.applied[N3] if e.offset == 1)
    assert on_3 != x  # two different batches applied at offset 1: a lost write


def test_old_term_entries_commit_indirectly_with_the_leaders_noop() -> None:
    """§5.4.2: once an entry of the current term commits, all before it are committed."""
    cluster = _figure8(frozenset())
    cluster.run("heal")
    cluster.run("restart 5")
    cluster.run("tick 1 x2")
    cluster.stabilize()
    assert all(node.commit_offset >= 2 for node in cluster.nodes.values())
    assert cluster.nodes[N3].log.term_at(Offset(1)) == 1  # X survived and is committed
