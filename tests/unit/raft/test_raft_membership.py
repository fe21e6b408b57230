"""Single-server membership changes with learners (Raft dissertation §4)."""

from __future__ import annotations

import pytest
from raft_harness import Cluster
from raft_unit_helpers import Harness, ids

from raftlog.config import RaftConfig
from raftlog.errors import MembershipChangeError, NotLeaderError
from raftlog.raft.membership import ConfigHistory, validate_change
from raftlog.raft.types import Entry, EntryKind, Membership, Role
from raftlog.types import NodeId, Offset, Term

N1, N2, N3, N4 = NodeId(1), NodeId(2), NodeId(3), NodeId(4)


def _elected(cluster: Cluster) -> Cluster:
    cluster.run("campaign 1")
    cluster.stabilize()
    return cluster


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (Membership(ids(1, 2, 3)), Membership(ids(1, 2, 3, 4))),  # add a voter
        (Membership(ids(1, 2, 3)), Membership(ids(1, 2, 3), ids(4))),  # add a learner
        (Membership(ids(1, 2, 3), ids(4)), Membership(ids(1, 2, 3, 4))),  # promote
        (Membership(ids(1, 2, 3)), Membership(ids(1, 2))),  # remove a voter
        (Membership(ids(1, 2, 3)), Membership(ids(1, 2), ids(3))),  # demote
    ],
)
def test_one_node_changes_are_allowed(old: Membership, new: Membership) -> None:
    validate_change(old, new)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (Membership(ids(1, 2, 3)), Membership(ids(1, 2, 3, 4, 5))),  # two voters at once
        (Membership(ids(1, 2, 3)), Membership(ids(1, 4, 5))),
        (Membership(ids(1, 2, 3)), Membership(ids(1, 2, 3))),  # no change
        (Membership(ids(1)), Membership(frozenset())),  # no voters left
    ],
)
def test_other_changes_are_refused(old: Membership, new: Membership) -> None:
    """§4.2: changing two voters at once could allow two disjoint majorities."""
    with pytest.raises(MembershipChangeError):
        validate_change(old, new)


def test_change_waits_for_the_leader_to_commit_in_its_term() -> None:
    """The 2015 fix: a leader proposes no change before committing an entry of its term."""
    harness = Harness(1, voters=[1, 2, 3], config=RaftConfig(pre_vote=False))
    with pytest.raises(NotLeaderError):
        harness.node.propose_membership(Membership(ids(1, 2, 3, 4)))
    cluster = Cluster([1, 2, 3])
    cluster.run("campaign 1")
    for _ in range(4):
        cluster.run("deliver")
    assert cluster.nodes[N1].role is Role.LEADER and cluster.nodes[N1].commit_offset < 0
    with pytest.raises(MembershipChangeError, match="not committed an entry of its term"):
        cluster.nodes[N1].propose_membership(Membership(ids(1, 2, 3, 4)))


def test_only_one_uncommitted_change_at_a_time() -> None:
    """§4.1: a second change waits until the first is committed."""
    cluster = _elected(Cluster([1, 2, 3]))
    leader = cluster.nodes[N1]
    leader.propose_membership(Membership(ids(1, 2, 3), ids(4)))
    with pytest.raises(MembershipChangeError, match="not committed yet") as caught:
        leader.propose_membership(Membership(ids(1, 2, 3, 4)))
    assert caught.value.retriable


def test_config_takes_effect_when_appended_and_reverts_when_truncated() -> None:
    """§4.1: servers use the latest configuration in their log, committed or not."""
    history = ConfigHistory(Membership(ids(1, 2, 3)), Offset(-1))
    entry = Entry(Term(2), Offset(5), 1, EntryKind.CONFIG, Membership(ids(1, 2)).encode())
    assert history.on_append([entry])
    assert history.current == Membership(ids(1, 2))
    assert history.on_truncate(Offset(5))
    assert history.current == Membership(ids(1, 2, 3))
    history.on_append([entry])
    history.on_commit(Offset(5))
    assert history.base == Membership(ids(1, 2)) and history.uncommitted == []


def test_a_truncated_config_entry_is_undone() -> None:
    """§4.1: the old leader's uncommitted change took effect on it alone; when the new
    leader overwrites that entry, its membership reverts."""
    cluster = _elected(Cluster([1, 2, 3]))
    cluster.run("partition 1 | 2 3")
    cluster.run("propose-membership 1 1,2")
    assert cluster.nodes[N1].membership == Membership(ids(1, 2))
    for command in ["tick 3 x10", "tick 2 x10", "campaign 2", "stabilize"]:
        cluster.run(command)
    assert cluster.nodes[N2].role is Role.LEADER
    cluster.run("heal")
    cluster.run("tick 2 x2")
    cluster.stabilize()
    assert cluster.nodes[N1].role is Role.FOLLOWER
    assert cluster.nodes[N1].membership == Membership(ids(1, 2, 3))
    assert cluster.nodes[N1].log.term_at(Offset(1)) == 2


def test_learner_receives_entries_but_does_not_count_for_commit() -> None:
    """§4.2.1: learners replicate but never count towards a majority."""
    config = RaftConfig()
    cluster = Cluster([1, 2], config=config)
    cluster.add_node(N3)
    _elected(cluster)
    cluster.run("propose-membership 1 1,2 3")
    cluster.stabilize()
    assert cluster.nodes[N3].role is Role.LEARNER
    cluster.run("partition 1 3 | 2")
    cluster.run("propose 1 x")
    cluster.stabilize()
    assert cluster.nodes[N3].last_offset == cluster.nodes[N1].last_offset
    assert cluster.nodes[N1].commit_offset < cluster.nodes[N1].last_offset


def test_learner_is_promoted_and_then_counts() -> None:
    cluster = Cluster([1, 2])
    cluster.add_node(N3)
    _elected(cluster)
    cluster.run("propose-membership 1 1,2 3")
    cluster.stabilize()
    cluster.run("propose-membership 1 1,2,3")
    cluster.stabilize()
    assert cluster.nodes[N3].role is Role.FOLLOWER
    cluster.run("partition 1 3 | 2")
    cluster.run("propose 1 x")
    cluster.stabilize()
    assert cluster.nodes[N1].commit_offset == cluster.nodes[N1].last_offset


def test_removed_leader_steps_down_once_the_change_commits() -> None:
    """§4.2.2: the leader manages the cluster until its removal commits, then steps down."""
    cluster = _elected(Cluster([1, 2, 3]))
    cluster.run("propose-membership 1 2,3")
    assert cluster.nodes[N1].role is Role.LEADER
    cluster.stabilize()
    assert cluster.nodes[N1].role is Role.FOLLOWER
    assert all(node.commit_offset == 1 for node in cluster.nodes.values())
    cluster.run("tick 1 x100")
    assert cluster.nodes[N1].role is Role.FOLLOWER  # a removed node never campaigns


def test_new_node_catches_up_from_an_empty_log() -> None:
    cluster = _elected(Cluster([1, 2, 3]))
    for n in range(5):
        cluster.run(f"propose 1 v{n}")
    cluster.stabilize()
    cluster.add_node(N4)
    cluster.run("propose-membership 1 1,2,3 4")
    cluster.stabilize()
    assert cluster.nodes[N4].commit_offset == cluster.nodes[N1].commit_offset
    assert cluster.nodes[N4].membership == Membership(ids(1, 2, 3), ids(4))


def test_a_voter_joins_only_once_caught_up() -> None:
    """§4.2.1: promoting a learner that is behind would stall commitment; refused."""
    cluster = _elected(Cluster([1, 2, 3]))
    cluster.add_node(N4)
    cluster.run("partition 4 | 1 2 3")
    cluster.run("propose-membership 1 1,2,3 4")
    cluster.stabilize()
    with pytest.raises(MembershipChangeError, match="catch up as a learner") as caught:
        cluster.nodes[N1].propose_membership(Membership(ids(1, 2, 3, 4)))
    assert caught.value.retriable
    with pytest.raises(MembershipChangeError, match="catch up"):
        cluster.nodes[N1].propose_membership(Membership(ids(1, 2, 3, 5), ids(4)))
    cluster.run("heal")
    cluster.run("tick 1 x2")
    cluster.stabilize()
    cluster.nodes[N1].propose_membership(Membership(ids(1, 2, 3, 4)))
