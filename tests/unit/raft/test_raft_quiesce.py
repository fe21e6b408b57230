"""Quiescence (raftlog.raft.quiesce): idle groups go quiet, anything wakes them, node
liveness replaces the election timer of a quiesced follower."""

from __future__ import annotations

from raft_harness import Cluster

from raftlog.config import RaftConfig
from raftlog.raft.node import RaftNode
from raftlog.raft.types import HeartbeatRequest, HeartbeatResponse, Role, VoteRequest
from raftlog.types import NodeId, Offset, Term

N1, N2, N3 = NodeId(1), NodeId(2), NodeId(3)
NODES = (N1, N2, N3)


def _all_reachable(cluster: Cluster) -> None:
    for node in cluster.nodes.values():
        for peer in NODES:
            node.set_peer_reachable(peer, reachable=True)


def _quiesced_cluster(config: RaftConfig | None = None) -> Cluster:
    """Node 1 leads, every node reports the others alive, and the group went quiet."""
    cluster = Cluster([1, 2, 3], config=config)
    _all_reachable(cluster)
    cluster.run("campaign 1")
    cluster.stabilize()
    cluster.run("tick 1 x2")  # one heartbeat interval
    cluster.stabilize()
    assert all(node.quiesced for node in cluster.nodes.values()), _states(cluster)
    return cluster


def _states(cluster: Cluster) -> list[tuple[int, str, int, bool]]:
    return [(i, n.role.value, n.term, n.quiesced) for i, n in sorted(cluster.nodes.items())]


def _tick_and_deliver(cluster: Cluster, ticks: int) -> None:
    for _ in range(ticks):
        cluster.run("tick all")
        cluster.stabilize()


def _sent_since(cluster: Cluster, mark: int) -> list[object]:
    return cluster.history[mark:]


def test_idle_group_quiesces_with_one_final_heartbeat() -> None:
    cluster = _quiesced_cluster()
    notices = [m for m in cluster.history if isinstance(m, HeartbeatRequest) and m.quiesce]
    assert sorted(m.receiver for m in notices) == [N2, N3]
    assert all(m.commit_offset == cluster.nodes[N1].commit_offset for m in notices)
    mark = len(cluster.history)
    cluster.run("tick all x100")  # far beyond every election timeout
    cluster.stabilize()
    assert _sent_since(cluster, mark) == [], "a quiesced group sends nothing"
    assert [n.role for n in cluster.nodes.values()] == [Role.LEADER, Role.FOLLOWER, Role.FOLLOWER]
    assert {n.term for n in cluster.nodes.values()} == {1}


def test_no_quiescence_without_node_liveness() -> None:
    """Without the host's liveness input a follower has no replacement for its timer."""
    cluster = Cluster([1, 2, 3])
    cluster.run("campaign 1")
    cluster.stabilize()
    cluster.run("tick 1 x20")
    cluster.stabilize()
    assert not any(node.quiesced for node in cluster.nodes.values())


def test_no_quiescence_while_a_follower_lags() -> None:
    cluster = Cluster([1, 2, 3])
    _all_reachable(cluster)
    cluster.run("campaign 1")
    cluster.stabilize()
    cluster.run("partition 1 2 | 3")
    cluster.run("propose 1 a")
    cluster.stabilize()
    cluster.run("tick 1 x4")
    cluster.stabilize()
    leader = cluster.nodes[N1]
    assert leader.progress[N3].match < leader.last_offset and not leader.quiesced


def test_proposal_wakes_the_group_and_it_quiesces_again() -> None:
    cluster = _quiesced_cluster()
    cluster.run("propose 1 hello")
    cluster.stabilize()
    leader = cluster.nodes[N1]
    assert not leader.quiesced
    assert all(n.commit_offset == leader.last_offset for n in cluster.nodes.values())
    assert not cluster.nodes[N2].quiesced  # the append woke the followers too
    cluster.run("tick 1 x2")
    cluster.stabilize()
    assert all(node.quiesced for node in cluster.nodes.values()), _states(cluster)


def test_read_index_wakes_the_leader_and_confirms_with_a_quorum() -> None:
    cluster = _quiesced_cluster()
    cluster.run("read-index 1 7")
    cluster.stabilize()
    assert [r.request_id for r in cluster.read_states[N1]] == [7]
    assert not cluster.nodes[N1].quiesced


def test_leader_node_unreachable_wakes_followers_who_elect() -> None:
    cluster = _quiesced_cluster()
    cluster.crash(N1)
    for follower in (N2, N3):
        cluster.nodes[follower].set_peer_reachable(N1, reachable=False)
        assert not cluster.nodes[follower].quiesced
    _tick_and_deliver(cluster, 40)
    leader = cluster.leader()
    assert leader is not None and leader.node_id in (N2, N3) and leader.term == 2


def test_other_peer_unreachable_does_not_wake_a_follower() -> None:
    cluster = _quiesced_cluster()
    cluster.nodes[N2].set_peer_reachable(N3, reachable=False)
    assert cluster.nodes[N2].quiesced


def test_quiesced_leader_wakes_when_a_peer_is_unreachable_and_steps_down_alone() -> None:
    """A partitioned quiesced leader resumes check-quorum and steps down (§6.2)."""
    cluster = _quiesced_cluster()
    cluster.run("partition 1 | 2 3")
    leader = cluster.nodes[N1]
    leader.set_peer_reachable(N2, reachable=False)
    leader.set_peer_reachable(N3, reachable=False)
    assert not leader.quiesced
    _tick_and_deliver(cluster, 30)
    assert leader.role is Role.FOLLOWER and leader.term == 1


def test_pre_vote_wakes_a_quiesced_leader_which_rejects_it_in_lease() -> None:
    cluster = _quiesced_cluster()
    leader = cluster.nodes[N1]
    request = VoteRequest(Term(2), N3, N1, Offset(leader.last_offset), Term(1), pre_vote=True)
    leader.step(request)
    assert not leader.quiesced and leader.role is Role.LEADER and leader.term == 1
    reply = [m for m in leader.ready().messages if m.receiver == N3]
    assert reply and not getattr(reply[0], "granted", True)


def test_woken_follower_wakes_its_leader() -> None:
    """A follower woken by a stranger's message tells its leader, which heartbeats again
    before the follower's election timer can run out (no spurious election)."""
    cluster = _quiesced_cluster()
    follower = cluster.nodes[N2]
    stale = HeartbeatResponse(Term(1), N3, N2)
    follower.step(stale)
    assert not follower.quiesced
    cluster.stabilize()
    assert not cluster.nodes[N1].quiesced
    _tick_and_deliver(cluster, 60)
    assert {n.term for n in cluster.nodes.values()} == {1}
    assert cluster.nodes[N1].role is Role.LEADER
    assert all(node.quiesced for node in cluster.nodes.values()), _states(cluster)


def test_lost_quiesce_notice_costs_a_pre_vote_not_a_term() -> None:
    cluster = Cluster([1, 2, 3])
    _all_reachable(cluster)
    cluster.run("campaign 1")
    cluster.stabilize()
    cluster.run("tick 1 x2")
    cluster.process()
    cluster.drop((N1, N3))  # node 3 never hears that the group went quiet
    cluster.stabilize()
    assert cluster.nodes[N1].quiesced and not cluster.nodes[N3].quiesced
    _tick_and_deliver(cluster, 60)
    assert {n.term for n in cluster.nodes.values()} == {1}
    assert cluster.nodes[N1].role is Role.LEADER


def test_duplicate_quiesce_notice_keeps_a_follower_quiet() -> None:
    cluster = _quiesced_cluster()
    follower = cluster.nodes[N2]
    notice = HeartbeatRequest(Term(1), N1, N2, follower.commit_offset, quiesce=True)
    follower.step(notice)
    assert follower.quiesced
    assert not follower.ready().messages, "a notice is never answered"


def test_quiesce_switch_off() -> None:
    cluster = Cluster([1, 2, 3], config=RaftConfig(quiesce=False))
    _all_reachable(cluster)
    cluster.run("campaign 1")
    cluster.stabilize()
    cluster.run("tick 1 x10")
    cluster.stabilize()
    assert not any(node.quiesced for node in cluster.nodes.values())


def test_quiesced_follower_ignores_ticks_but_campaign_wakes_it() -> None:
    cluster = _quiesced_cluster()
    node: RaftNode = cluster.nodes[N3]
    node.tick()
    assert node.quiesced and node.election_elapsed_ticks == 0
    node.campaign()
    assert not node.quiesced and node.role is Role.PRE_CANDIDATE


def test_voters_count_for_a_new_leaders_first_check_quorum() -> None:
    """A new leader whose followers are slow to answer its first appends is not deposed
    at the first check-quorum: the votes it won were heard within that timeout."""
    cluster = Cluster([1, 2, 3], config=RaftConfig(election_timeout_ticks=10))
    cluster.run("campaign 1")
    for _ in range(4):  # pre-vote, pre-vote answers, vote, vote answers
        cluster.process()
        cluster.deliver()
    cluster.process()
    leader = cluster.nodes[N1]
    assert leader.role is Role.LEADER
    cluster.queue.clear()  # the followers' answers to its appends are lost (or very late)
    for _ in range(10):
        leader.tick()
    assert leader.role is Role.LEADER, "the first check passes on the votes"
    for _ in range(10):
        leader.tick()
    leader.ready()
    assert leader.role is Role.FOLLOWER, "the second check needs fresh answers"
