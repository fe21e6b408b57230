"""Every bound of RaftConfig is honoured by the core (TigerBeetle's rule: every queue has a
limit), and the config refuses contradictory limits."""

from __future__ import annotations

import pytest
from raft_harness import Cluster
from raft_unit_helpers import Harness

from raftlog.config import RaftConfig
from raftlog.errors import ConfigError, NotLeaderError, ProposalDroppedError
from raftlog.raft.types import ENTRY_OVERHEAD_BYTES
from raftlog.types import NodeId

N1 = NodeId(1)


def _leader(config: RaftConfig) -> Cluster:
    cluster = Cluster([1, 2, 3], config=config)
    cluster.run("campaign 1")
    cluster.stabilize()
    cluster.run("partition 1 | 2 3")  # nothing commits from here on
    return cluster


def test_proposals_max_bounds_uncommitted_proposals() -> None:
    cluster = _leader(RaftConfig(proposals_max=3))
    for _ in range(3):
        cluster.nodes[N1].propose(b"x", offset_count=1)
    with pytest.raises(ProposalDroppedError, match="proposals_max"):
        cluster.nodes[N1].propose(b"x", offset_count=1)


def test_uncommitted_bytes_max_bounds_uncommitted_bytes() -> None:
    size = 100 + ENTRY_OVERHEAD_BYTES
    cluster = _leader(RaftConfig(uncommitted_bytes_max=2 * size))
    cluster.nodes[N1].propose(b"x" * 100, offset_count=1)
    cluster.nodes[N1].propose(b"x" * 100, offset_count=1)
    with pytest.raises(ProposalDroppedError, match="uncommitted_bytes_max") as caught:
        cluster.nodes[N1].propose(b"x", offset_count=1)
    assert caught.value.retriable


def test_uncommitted_bytes_are_released_by_commit() -> None:
    size = 100 + ENTRY_OVERHEAD_BYTES
    cluster = _leader(RaftConfig(uncommitted_bytes_max=size))
    cluster.nodes[N1].propose(b"x" * 100, offset_count=1)
    cluster.run("heal")
    cluster.stabilize()
    assert cluster.nodes[N1].uncommitted_bytes == 0
    cluster.nodes[N1].propose(b"x" * 100, offset_count=1)


def test_a_single_oversized_proposal_is_accepted_when_nothing_is_pending() -> None:
    """Like etcd: the bound must not make a large entry impossible forever."""
    cluster = _leader(RaftConfig(uncommitted_bytes_max=10))
    assert cluster.nodes[N1].propose(b"x" * 500, offset_count=1) == 1


def test_outbox_is_bounded_when_the_driver_stalls() -> None:
    harness = Harness(1, config=RaftConfig(outbox_messages_max=5))
    for _ in range(100):
        harness.node.tick()  # pre-votes pile up: nobody processes the Ready
    assert len(harness.node.outbox) <= 5 and harness.node.outbox_dropped_count > 0


def test_apply_bytes_max_bounds_committed_entries_per_ready() -> None:
    config = RaftConfig(apply_bytes_max=3 * (10 + ENTRY_OVERHEAD_BYTES))
    harness = Harness(1, voters=[1], config=config)
    harness.node.campaign()
    harness.drain()
    for _ in range(10):
        harness.node.propose(b"y" * 10, offset_count=1)
    sizes = []
    while harness.node.has_ready():
        ready = harness.process()
        if ready.committed_entries:
            sizes.append(sum(e.size_bytes for e in ready.committed_entries))
    assert len(sizes) >= 3 and max(sizes) <= config.apply_bytes_max
    assert harness.node.applied == 10


def test_propose_validates_its_arguments() -> None:
    harness = Harness(1)
    with pytest.raises(NotLeaderError):
        harness.node.propose(b"x", offset_count=1)
    harness = Harness(1, voters=[1])
    harness.node.campaign()
    with pytest.raises(ValueError, match="offset_count"):
        harness.node.propose(b"x", offset_count=0)


@pytest.mark.parametrize(
    "settings",
    [
        {"heartbeat_interval_ticks": 10, "election_timeout_ticks": 10},
        {"append_bytes_max": 2048, "inflight_bytes_max": 1024},
        {"inflight_messages_max": 0},
        {"outbox_messages_max": 0},
        {"planted_bugs": frozenset({"no-such-bug"})},
        {"commit_notice": "never"},
    ],
)
def test_contradictory_limits_are_refused(settings: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match=next(iter(settings))):
        RaftConfig(**settings).validate()  # type: ignore[arg-type]
