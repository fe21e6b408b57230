"""A replica whose storage lost synced entries abstains until a leader refilled it
(`raftlog.raft.repair`): the scenario of one damaged disk in three, at the level of the core.

Node 3 lags behind a partition while nodes 1 and 2 commit entries; then 1 and 2 stop, and
1 comes back having lost the end of its log to its disk. Trusting that shorter log, 1 and 3
would elect a leader without the committed entries (the planted bug shows it happens);
abstaining, 1 waits until 2 returns, and the leader 2 and 3 elect refills it.
"""

from __future__ import annotations

import random

import pytest
from raft_harness import Cluster

from raftlog.config import RaftConfig
from raftlog.raft.memory import MemoryStorage
from raftlog.raft.node import RaftNode
from raftlog.raft.types import Role, VoteRequest
from raftlog.types import NodeId, Offset, Term

N1, N2, N3 = NodeId(1), NodeId(2), NodeId(3)


def _elapse(cluster: Cluster, ticks: int) -> None:
    """Tick every node, delivering every message between ticks."""
    for _ in range(ticks):
        cluster.run("tick all")
        cluster.stabilize()


def _committed_without_node_3(cluster: Cluster) -> Offset:
    cluster.run("campaign 1")
    cluster.stabilize()
    cluster.run("partition 1 2 | 3")
    for value in ("a", "b", "c", "d"):
        cluster.run(f"propose 1 {value}")
    cluster.stabilize()
    leader = cluster.nodes[N1]
    assert leader.commit_offset == 4 and cluster.nodes[N3].last_offset == 0
    return leader.commit_offset


def _restart_damaged(cluster: Cluster, node_id: NodeId, keep: int, config: RaftConfig) -> None:
    """Restart `node_id` with only its first `keep` entries, as recovery leaves a log whose
    synced tail a disk lost; `repair_offset` (the end it had reached) as the storage layer
    reports it."""
    old = cluster.storages[node_id]
    damaged = MemoryStorage()
    damaged.append(list(old.entries(Offset(0), bytes_max=10**9))[:keep])
    damaged.sync()
    cluster.storages[node_id] = damaged
    cluster.applied[node_id] = []
    cluster.read_states[node_id] = []
    cluster.nodes[node_id] = RaftNode(
        node_id=node_id,
        config=config,
        storage=damaged,
        hard_state=cluster.hard_state_stores[node_id].load(),
        rng=random.Random(node_id),
        bootstrap_membership=cluster.bootstraps[node_id],
        repair_offset=old.last_offset(),
    )


def _scenario(config: RaftConfig) -> tuple[Cluster, Offset]:
    cluster = Cluster([1, 2, 3], config=config)
    committed = _committed_without_node_3(cluster)
    cluster.crash(N1)
    cluster.crash(N2)
    _restart_damaged(cluster, N1, keep=2, config=config)
    cluster.run("heal")
    _elapse(cluster, 60)
    return cluster, committed


@pytest.mark.parametrize("pre_vote", [True, False])
def test_a_damaged_replica_abstains_until_the_honest_majority_refills_it(pre_vote: bool) -> None:
    config = RaftConfig(pre_vote=pre_vote)
    cluster, committed = _scenario(config)
    # Node 3 alone cannot win, and node 1 neither campaigns nor votes.
    assert cluster.leader() is None
    assert cluster.nodes[N1].repairing and cluster.nodes[N1].role is Role.FOLLOWER
    refused = [m for m in cluster.history if isinstance(m, VoteRequest) and m.receiver == N1]
    assert refused, "node 3 asked node 1 for its vote"
    cluster.run("restart 2")
    _elapse(cluster, 60)
    leader = cluster.leader()
    assert leader is not None and leader.node_id == N2
    assert not cluster.nodes[N1].repairing
    for node in cluster.nodes.values():
        assert node.commit_offset >= committed
        assert [e.data for e in cluster.storages[node.node_id].entries(Offset(1), bytes_max=10**9)][
            :4
        ] == [b"a", b"b", b"c", b"d"]


def test_the_planted_bug_that_trusts_the_damaged_log_loses_committed_entries() -> None:
    config = RaftConfig(planted_bugs=frozenset({"trust-damaged-log"}))
    cluster, committed = _scenario(config)
    leader = cluster.leader()
    assert leader is not None and leader.node_id in (N1, N3)
    assert leader.last_offset < committed or leader.log.term_at(committed) != Term(1)


def test_a_repairing_node_ignores_a_leadership_transfer_and_campaign() -> None:
    config = RaftConfig()
    cluster = Cluster([1, 2, 3], config=config)
    cluster.run("campaign 1")
    cluster.stabilize()
    cluster.crash(N3)
    _restart_damaged(cluster, N3, keep=1, config=config)
    cluster.run("campaign 3")
    assert cluster.nodes[N3].role is Role.FOLLOWER and cluster.nodes[N3].term == 1
    cluster.run("transfer 1 3")
    _elapse(cluster, 40)
    assert cluster.leader() is cluster.nodes[N1]
    # The leader's next commit in its term ends the repair.
    cluster.run("propose 1 e")
    cluster.stabilize()
    assert not cluster.nodes[N3].repairing
