"""Raft's Figure 8, scripted on the simulator: committing an old-term entry loses it (§5.4.2).

Three nodes, no random faults; the script only partitions, campaigns and proposes:

1. node 1 leads term 1, its no-op reaches everyone;
2. node 1 is cut off and takes four proposals x1..x4 (term 1, from offset 1) that reach no one;
3. node 3 wins term 2 with node 2's vote, is cut off before its no-op leaves, and takes four
   proposals y1..y4 (term 2, from offset 2) that reach no one;
4. node 1 rejoins node 2, learns of term 2, wins term 3 and catches node 2 up. Appends are
   small (256 bytes), so the first one carries some of x1..x4 without node 1's term-3 no-op.
   The moment node 2 holds them, the link 1 -> 2 is cut (one-way): node 2's acknowledgement
   still arrives, but the next append, carrying the no-op, does not;
5. node 1 is cut off; node 3 rejoins node 2 and, its last term (2) beating node 2's (1), wins.

With the planted bug, node 1 committed those x entries in step 4 by counting replicas; node 3 then
leads without them and the leader-completeness check fires. The correct core never commits
them (no entry of term 3 reached a majority), so node 3 overwriting them is legal and the
whole run, healed, passes.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from raftlog.raft.types import Role
from raftlog.sim.checker import InvariantViolation
from raftlog.sim.cluster import Cluster, SimNode
from raftlog.sim.network import Link
from raftlog.sim.options import scripted_options
from raftlog.sim.trace import Trace
from raftlog.types import NodeId, Offset, Term

STEPS_MAX = 20  # per phase; well under the election timeout, so no one campaigns unasked
N1, N2, N3 = NodeId(1), NodeId(2), NodeId(3)


def _cut(*pairs: tuple[int, int]) -> frozenset[Link]:
    """Both directions of each pair."""
    return frozenset((NodeId(a), NodeId(b)) for x, y in pairs for a, b in ((x, y), (y, x)))


def _run_until(cluster: Cluster, done: Callable[[], bool]) -> None:
    for _ in range(STEPS_MAX):
        if done():
            return
        cluster.step(chaos=False)
    raise AssertionError(
        "scenario stuck: " + "; ".join(n.describe() for n in cluster.nodes.values())
    )


def _leads(node: SimNode) -> bool:
    return node.raft is not None and node.raft.role == Role.LEADER


def _propose(cluster: Cluster, node: SimNode, count: int) -> None:
    for _ in range(count):
        cluster.workload.propose(node, cluster.nodes)
    cluster.step(chaos=False)


def _figure8(bugs: frozenset[str], *, protocol_checks: bool = True) -> Cluster:
    options = scripted_options(bugs=bugs, protocol_checks=protocol_checks)
    cluster = Cluster(options, random.Random(8), Trace(events_max=40))
    node1, node2, node3 = (cluster.nodes[n] for n in (N1, N2, N3))
    assert node1.raft and node2.raft and node3.raft
    node1.raft.campaign()  # 1.
    _run_until(cluster, lambda: all(n.applied_offset >= 0 for n in (node1, node2, node3)))
    cluster.network.blocked = _cut((1, 2), (1, 3))  # 2.
    _propose(cluster, node1, 4)
    node3.raft.campaign()  # 3.
    _run_until(cluster, lambda: _leads(node3))
    cluster.network.blocked = _cut((1, 2), (1, 3), (2, 3))
    _propose(cluster, node3, 4)
    cluster.network.blocked = _cut((1, 3), (2, 3))  # 4.
    _run_until(cluster, lambda: node1.raft is not None and node1.raft.term >= 2)
    node1.raft.campaign()
    _run_until(cluster, lambda: node2.log.last_offset() >= 1)
    # Only the first small append arrived: some of x, none of the term-3 no-op.
    last = node2.log.last_offset()
    assert node2.log.term_at(last) == Term(1) and last < node1.raft.last_offset, last
    cluster.network.blocked = _cut((1, 3), (2, 3)) | {(N1, N2)}
    cluster.step(chaos=False)
    cluster.step(chaos=False)
    cluster.network.blocked = _cut((1, 2), (1, 3))  # 5.
    _run_until(cluster, lambda: node3.raft is not None and node3.raft.term >= 3)
    node3.raft.campaign()
    _run_until(cluster, lambda: _leads(node3) and node3.raft is not None and node3.raft.term >= 4)
    return cluster


def test_the_correct_core_survives_figure_8_and_heals() -> None:
    cluster = _figure8(frozenset())
    assert not cluster.checker.committed.keys() - {Offset(0)}  # no x was ever committed
    cluster.heal()


def test_committing_an_old_term_entry_loses_it_in_figure_8() -> None:
    bug = frozenset({"commit-old-term"})
    with pytest.raises(InvariantViolation, match=r"^leader completeness \(term 4\): node 3 lacks"):
        _figure8(bug, protocol_checks=False)  # the consequence, end to end
    with pytest.raises(InvariantViolation, match=r"^current-term commit: leader 1 of term 3"):
        _figure8(bug)  # the broken rule itself, the moment it is broken
