"""RaftGroupHost bounds the campaigns its groups' election timers start: at most
`campaigns_per_s_max` a second, a second's worth at once, on a fake clock (no sleeps).
Twenty follower groups that never hear a leader all time out together; the host lets five
campaign, and five more each second after."""

from __future__ import annotations

import random

import pytest

from raftlog.config import ConfigError, NodeConfig, RaftConfig
from raftlog.raft.memory import MemoryHardStateStore, MemoryStorage
from raftlog.raft.node import RaftNode
from raftlog.raft.types import Membership, Role, Snapshot
from raftlog.runtime.clock import FakeMonotonicClock
from raftlog.runtime.group import RaftGroup
from raftlog.runtime.host import RaftGroupHost
from raftlog.types import NodeId, RaftGroupId

ME = NodeId(1)
GROUPS = 20
BUDGET_PER_S = 5
CONFIG = RaftConfig(election_timeout_ticks=10, heartbeat_interval_ticks=2)
MEMBERSHIP = Membership(voters=frozenset({ME, NodeId(2), NodeId(3)}))


class _Nothing:
    def apply(self, entry: object) -> None:
        raise AssertionError("nothing commits here")

    def restore(self, snapshot: Snapshot) -> None:
        raise AssertionError("no snapshots here")


def _host(clock: FakeMonotonicClock) -> RaftGroupHost:
    host = RaftGroupHost(
        node_id=ME,
        tick_interval_ms=50,
        send=lambda *_: None,
        campaigns_per_s_max=BUDGET_PER_S,
        clock=clock,
    )
    for index in range(GROUPS):
        storage = MemoryStorage()
        node = RaftNode(
            node_id=ME,
            config=CONFIG,
            storage=storage,
            hard_state=MemoryHardStateStore().load(),
            rng=random.Random(index),
            bootstrap_membership=MEMBERSHIP,
        )
        host.add(
            RaftGroup(
                raft_group_id=RaftGroupId(index),
                node=node,
                log=storage,
                hard_state_store=MemoryHardStateStore(),
                state_machine=_Nothing(),
                config=CONFIG,
                bootstrap_membership=MEMBERSHIP,
            )
        )
    return host


def _campaigning(host: RaftGroupHost) -> int:
    return sum(1 for group in host.groups() if group.node.role is not Role.FOLLOWER)


def test_timer_campaigns_are_bounded_per_second_and_postponed_ones_follow() -> None:
    clock = FakeMonotonicClock()
    host = _host(clock)
    # Every randomized timeout is below 2 election timeouts: all timers have fired by now,
    # and none of the campaigns started has timed out again (that takes a full timeout).
    for _ in range(2 * CONFIG.election_timeout_ticks - 1):
        host.tick_round()
    assert host.campaigns_started == BUDGET_PER_S == _campaigning(host)
    assert host.campaigns_postponed > 0
    clock.advance(1.0)
    host.tick_round()
    assert host.campaigns_started == 2 * BUDGET_PER_S == _campaigning(host)
    # A quiet spell earns no more than a second's worth (a campaign that timed out and
    # started again counts as well).
    clock.advance(30.0)
    host.tick_round()
    assert host.campaigns_started == 3 * BUDGET_PER_S
    for _ in range(GROUPS):
        started = host.campaigns_started
        clock.advance(1.0)
        host.tick_round()
        assert host.campaigns_started - started <= BUDGET_PER_S
    assert _campaigning(host) == GROUPS, "every postponed group campaigned in the end"


def test_a_group_that_may_not_campaign_only_misses_ticks() -> None:
    clock = FakeMonotonicClock()
    host = _host(clock)
    for _ in range(2 * CONFIG.election_timeout_ticks - 1):
        host.tick_round()
    waiting = [g for g in host.groups() if g.node.role is Role.FOLLOWER]
    assert waiting and all(g.node.campaigns_on_next_tick() for g in waiting)
    assert all(g.node.term == 0 for g in waiting), "a postponed group changes nothing"


def test_the_bound_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="campaigns_per_s_max"):
        NodeConfig(campaigns_per_s_max=0).validate()
