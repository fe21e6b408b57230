"""A fenced node hands its partition leaderships away at a bounded rate, on a fake clock
(raftlog.node.leadership.LeadershipMoves.step_down_fenced): no mass handoff, and every
handoff names its cause in the log. Real Raft groups of three voters, real partition
replicas; messages are delivered by hand, so transfers stay under way while counted."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

import pytest

from raftlog.metadata import ApplyResult, ErrorCode, MetadataState, RegisterNode
from raftlog.metadata.commands import encode_command
from raftlog.node.leadership import LeadershipMoves
from raftlog.partition.replica import PartitionReplica
from raftlog.raft.types import Role
from raftlog.runtime.clock import FakeMonotonicClock
from tests.unit.partition.replica_groups import LEADER, NODES, ReplicaGroups

FENCED = LEADER
PARTITIONS = 60
RATE_PER_S = 20


def _partition_led_by_node_1(partition: int) -> PartitionReplica:
    replica = ReplicaGroups(topic="t", partition=partition).replicas[FENCED]
    assert replica.group.node.role is Role.LEADER
    return replica


def _alive_metadata() -> MetadataState:
    state = MetadataState("cluster-a")
    for n in NODES:
        command = RegisterNode(n, f"n{n}:1", f"n{n}:2", 1, 1_000)
        assert state.apply(state.applied_offset + 1, encode_command(command)).ok
    return state


async def _no_submit(*args: object, **kwargs: object) -> ApplyResult:
    raise AssertionError("a fenced handoff submits nothing")


def _no_spawn(awaitable: Awaitable[None], name: str) -> None:
    raise AssertionError(f"a fenced handoff spawns nothing ({name})")


def _moves(
    clock: FakeMonotonicClock,
    submit: Callable[..., Awaitable[ApplyResult]] = _no_submit,
    spawn: Callable[[Awaitable[None], str], None] = _no_spawn,
) -> tuple[LeadershipMoves, list[PartitionReplica]]:
    replicas = [_partition_led_by_node_1(p) for p in range(PARTITIONS)]
    state = _alive_metadata()
    moves = LeadershipMoves(
        node_id=FENCED,
        metadata=lambda: state,
        replicas={(r.topic, r.partition): r for r in replicas},
        replicas_by_raft_group={r.group.raft_group_id: r for r in replicas},
        rng=random.Random(7),
        submit=submit,
        spawn=spawn,
        clock=clock,
        fenced_transfers_per_s_max=RATE_PER_S,
        reports_in_flight_max=REPORTS_IN_FLIGHT_MAX,
    )
    return moves, replicas


REPORTS_IN_FLIGHT_MAX = 4


def test_leadership_reports_in_flight_are_one_per_group_and_bounded() -> None:
    """A burst of elections reports at most the bound at once and never a group twice; a
    finished report frees its slot for the next (report_stale_leaders retries the rest)."""
    spawned: list[tuple[Awaitable[None], str]] = []
    submitted: list[object] = []

    async def submit(command: object, **kwargs: object) -> ApplyResult:
        submitted.append(command)
        return ApplyResult(ErrorCode.NONE, "")

    moves, replicas = _moves(
        FakeMonotonicClock(), submit, lambda awaitable, name: spawned.append((awaitable, name))
    )
    for _ in range(2):
        for replica in replicas:
            moves.on_leadership_change(replica.group)
    names = [name for _, name in spawned]
    assert len(names) == REPORTS_IN_FLIGHT_MAX == len(set(names)), names
    asyncio.run(spawned[0][0])  # type: ignore[arg-type]
    assert len(submitted) == 1
    for replica in replicas:  # the finished report freed a slot: one more report
        moves.on_leadership_change(replica.group)
    assert len(spawned) == REPORTS_IN_FLIGHT_MAX + 1
    assert spawned[-1][1] not in names[1:], "a group with a report in flight reported twice"
    for awaitable, _ in spawned[1:]:
        asyncio.run(awaitable)  # type: ignore[arg-type]


def _transferring(replicas: list[PartitionReplica]) -> int:
    return sum(1 for r in replicas if r.group.node.lead_transferee is not None)


def test_a_fenced_node_hands_its_leaderships_away_at_a_bounded_rate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeMonotonicClock()
    moves, replicas = _moves(clock)
    cause = "own lease timer: 120 ms past its 6000 ms lease"
    with caplog.at_level(logging.INFO, logger="raftlog.node.leadership"):
        moves.step_down_fenced(cause)
    assert _transferring(replicas) == RATE_PER_S  # one second's worth at once, no more
    handoffs = [r.getMessage() for r in caplog.records if "handing" in r.getMessage()]
    assert len(handoffs) == RATE_PER_S
    assert all(cause in line and "\n" not in line for line in handoffs), handoffs[0]
    moves.step_down_fenced(cause)
    assert _transferring(replicas) == RATE_PER_S  # the same instant: the bucket is empty
    clock.advance(0.5)
    moves.step_down_fenced(cause)
    assert _transferring(replicas) == RATE_PER_S + RATE_PER_S // 2
    # Idle for a minute: the bucket holds a second's worth again, never a minute's.
    clock.advance(60.0)
    moves.step_down_fenced(cause)
    assert _transferring(replicas) == 2 * RATE_PER_S + RATE_PER_S // 2
    clock.advance(1.0)
    moves.step_down_fenced(cause)
    assert _transferring(replicas) == PARTITIONS  # every one under way, at 20 a second
