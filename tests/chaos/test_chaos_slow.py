"""The `slow` nemesis and the election count, without processes: a stall on a fake control
and a fake clock, the log lines of elections, transfers and fences, and the faults that
explain elections."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from raftlog.chaos.elections import LeaderRemoval, election_stats, leader_removals, read_lines
from raftlog.chaos.history import Event
from raftlog.chaos.nemesis import plan_fault
from raftlog.chaos.slow import GAP_MS, STALL_MS, Staller, removes_leader


class PauseRecorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def pause(self, node: int) -> bool:
        self.calls.append(("pause", node))
        return True

    def resume(self, node: int) -> bool:
        self.calls.append(("resume", node))
        return True


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 100.0
        self.slept_s: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept_s.append(seconds)
        self.now_s += seconds

    def monotonic(self) -> float:
        return self.now_s


def _staller(control: PauseRecorder, clock: FakeClock, seed: int) -> Staller:
    return Staller(
        control, 2, seed, sleep=clock.sleep, monotonic=clock.monotonic, wall=clock.monotonic
    )


@pytest.mark.parametrize("seed", range(5))
def test_each_stall_pauses_the_node_within_bounds_then_resumes_it(seed: int) -> None:
    control, clock = PauseRecorder(), FakeClock()
    staller = _staller(control, clock, seed)
    gaps_s = [staller.stall_once() for _ in range(4)]
    assert control.calls == [("pause", 2), ("resume", 2)] * 4
    assert all(STALL_MS[0] / 1000 <= s <= STALL_MS[1] / 1000 for s in clock.slept_s)
    assert all(GAP_MS[0] / 1000 <= g <= GAP_MS[1] / 1000 for g in gaps_s)
    # What is recorded is the measured stall (here the fake clock's), from its start.
    assert [round(ms) for _, ms in staller.stalls] == [round(s * 1000) for s in clock.slept_s]
    replay = _staller(PauseRecorder(), FakeClock(), seed)
    assert [replay.stall_once() for _ in range(4)] == gaps_s, "the seed decides the lengths"


def test_slow_aims_at_the_leader_or_a_random_node_with_a_seed_of_its_own() -> None:
    kinds = set()
    for seed in range(20):
        fault = plan_fault("slow", [1, 2, 3], random.Random(seed), leader=3, controller=1)
        kinds.add(fault.kind)
        assert len(fault.nodes) == 1 and not fault.links
        if fault.kind == "leader":
            assert fault.nodes == (3,)
    assert kinds == {"random-node", "leader"}


def test_a_stall_removes_a_leader_only_past_an_election_timeout_less_a_heartbeat() -> None:
    # Election timeout 500 ms, heartbeats every 100 ms: followers heard the leader at most
    # 100 ms before it stalled, so 400 ms of stall leaves them within their timeout.
    assert not removes_leader(400, election_timeout_ms=500, heartbeat_interval_ms=100)
    assert removes_leader(401, election_timeout_ms=500, heartbeat_interval_ms=100)


PREFIX = "2026-11-26 06:00:{second:02d},000 INFO raftlog.node.leadership: node {node}: "


def _line(second: int, node: int, text: str) -> str:
    return PREFIX.format(second=second, node=node) + text


def _role(second: int, node: int, role: str, cause: str, group: str = "t-0") -> str:
    return _line(second, node, f"{group} is now {role} in term 2 (leader None); cause: {cause}")


TIMER = "election timer: no leader heard for 11 ticks (randomized timeout 11 ticks)"
LOGS = {
    1: [
        _role(1, 1, "leader", "won the election of term 1, votes [1, 2]"),  # setup: before
        _line(12, 1, "metadata quorum: now leader in term 3 (controller 1); cause: won x"),
        _line(20, 1, "fencing node 3: lease timer: silent 6100 ms of loop time"),
    ],
    2: [
        _role(11, 2, "pre-candidate", TIMER),
        _role(11, 2, "candidate", TIMER),
        _role(11, 2, "leader", "won the election of term 2, votes [2, 3]"),
        _role(14, 2, "candidate", "TimeoutNow from node 1 (leadership transfer)", "t-1"),
        _role(14, 2, "leader", "won the election of term 3, votes [2, 3]", "t-1"),
        _role(15, 2, "pre-candidate", TIMER, "t-2"),
        _role(15, 2, "follower", "lost the pre-vote of term 2, refused by [1, 3]", "t-2"),
    ],
}


def _write_logs(tmp_path: Path) -> list[str]:
    paths = []
    for node, lines in LOGS.items():
        path = tmp_path / f"node-{node}.log"
        path.write_text("\n".join([*lines, "unrelated line"]) + "\n")
        paths.append(str(path))
    return paths


def test_only_timer_elections_in_the_window_count_as_elections(tmp_path: Path) -> None:
    paths = _write_logs(tmp_path)
    roles, fences = read_lines(paths)
    start_s = roles[0].time_s + 9  # 06:00:10
    stats = election_stats(paths, window_s=(start_s, start_s + 30))
    # t-0 by timer: an election; t-1 by TimeoutNow and the metadata win with no campaign
    # line: transfers; t-2's lost pre-vote won nothing; the setup win is before the window.
    assert (stats["elections"], stats["transfers"], stats["fences"]) == (1, 2, 1)
    assert stats["elections_per_minute"] == 2.0 and len(fences) == 1


def test_a_removal_explains_one_election_per_group_its_node_led(tmp_path: Path) -> None:
    roles, _ = read_lines(_write_logs(tmp_path))
    at_s = roles[0].time_s  # 06:00:01, when node 1 leads t-0
    removals = [LeaderRemoval(1, at_s + 5), LeaderRemoval(2, at_s + 5)]
    stats = election_stats([], window_s=(at_s, at_s + 1), removals=removals)
    assert stats["elections_explained_by_faults"] == 0, "no log, no leaders known"
    paths = _write_logs(tmp_path)
    stats = election_stats(paths, window_s=(at_s, at_s + 30), removals=removals)
    assert stats["elections_explained_by_faults"] == 1  # node 1 led t-0; node 2 led nothing
    late = [LeaderRemoval(2, at_s + 20)]  # node 2 then leads t-0 and t-1
    assert (
        election_stats(paths, window_s=(at_s, at_s + 30), removals=late)[
            "elections_explained_by_faults"
        ]
        == 2
    )


def test_removals_are_process_faults_and_long_enough_stalls() -> None:
    events = [
        Event("nemesis", "info", "start", {"id": 0, "fault": "pause", "nodes": [3]}, 2 * 10**9),
        Event("nemesis", "info", "start", {"id": 1, "fault": "partition", "nodes": []}, 10**9),
        Event(
            "nemesis",
            "info",
            "effects",
            {"id": 2, "stalls": [{"node": 1, "stalls": [{"at_s": 7.0, "ms": 450.0}]}]},
            10**9,
        ),
        Event(
            "nemesis",
            "info",
            "effects",
            {"id": 3, "stalls": [{"node": 2, "stalls": [{"at_s": 8.0, "ms": 120.0}]}]},
            10**9,
        ),
    ]
    removals = leader_removals(
        events, wall_origin_s=1000.0, election_timeout_ms=500, heartbeat_interval_ms=100
    )
    assert removals == [LeaderRemoval(3, 1002.0), LeaderRemoval(1, 7.0)]
