"""Elections and fences of a run, read from the node logs, against the faults that explain them.

Theory of operation. Every node logs each role change of each of its groups at INFO with its
cause (`raftlog.node.leadership`, `raftlog.node.node`), and the controller logs each fence:

    2026-11-26 06:10:01,234 INFO raftlog.node.leadership: node 2: t-0 is now pre-candidate
        in term 4 (leader None); cause: election timer: no leader heard for 11 ticks ...
    ... node 1: metadata quorum: now leader in term 3 (controller 1); cause: won the election ...
    ... node 1: fencing node 3: lease timer: silent 6100 ms of loop time, ...

An *election* is a term won by a campaign its election timer started; a term won after a
leadership transfer (TimeoutNow: the preferred leader taking its partition back, a fenced
node handing over) is deliberate and counted apart. Only lines inside the load window (plus
`TAIL_S`, for the election a late fault finishes) count, so the elections that set the
cluster up do not. Rates are per minute of that window.

The same lines give each group's leader over time, so the elections a run's faults explain
can be counted: a fault that removed node N for longer than an election timeout explains
one election of every group N led when it began (`explained_elections`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from raftlog.chaos.history import NEMESIS, Event
from raftlog.chaos.slow import removes_leader

__all__ = ["LeaderRemoval", "RoleLine", "election_stats", "explained_elections", "read_lines"]
__all__ += ["leader_removals"]

# After the load window: an election a fault near its end started finishes in here.
TAIL_S = 2.0
_ROLE = re.compile(
    r"^(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ \S+: node (?P<node>\d+): "
    r"(?:(?P<group>\S+) is now|metadata quorum: now) (?P<role>[\w-]+) in term \d+ "
    r".*?; cause: (?P<cause>.*)$"
)
_FENCE = re.compile(r"^(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ \S+: node \d+: fencing ")
_CAMPAIGN_ROLES = ("pre-candidate", "candidate")


@dataclass(frozen=True, slots=True)
class RoleLine:
    time_s: float  # seconds since the epoch
    node: int
    group: str
    role: str
    cause: str


@dataclass(frozen=True, slots=True)
class LeaderRemoval:
    """A fault that kept `node` from leading for longer than an election timeout."""

    node: int
    start_s: float  # seconds since the epoch


# Nemeses whose every fault keeps its nodes out for its whole hold (two seconds or more, far
# past an election timeout). Network faults are not counted: which leaders a cut removes
# depends on the links, so their elections stay unexplained (the count is a lower bound).
_PROCESS_FAULTS = ("kill", "pause", "lose-unsynced", "corrupt")


def leader_removals(
    events: Iterable[Event],
    *,
    wall_origin_s: float,
    election_timeout_ms: int,
    heartbeat_interval_ms: int,
) -> list[LeaderRemoval]:
    """The faults of a history that removed a node for longer than an election timeout:
    process faults, and the stalls of `slow` long enough (`removes_leader`). An event's
    time is `wall_origin_s` plus its time in the history."""
    removals: list[LeaderRemoval] = []
    for event in events:
        if event.process != NEMESIS or not isinstance(event.value, dict):
            continue
        if event.f == "start" and event.value.get("fault") in _PROCESS_FAULTS:
            at_s = wall_origin_s + event.time / 1e9
            removals += [LeaderRemoval(int(node), at_s) for node in event.value["nodes"]]
        for staller in event.value.get("stalls", []) if event.f == "effects" else []:
            removals += [
                LeaderRemoval(int(staller["node"]), stall["at_s"])
                for stall in staller["stalls"]
                if removes_leader(
                    stall["ms"],
                    election_timeout_ms=election_timeout_ms,
                    heartbeat_interval_ms=heartbeat_interval_ms,
                )
            ]
    return removals


def _epoch_s(stamp: str) -> float:
    # logging's asctime is local time, as time.mktime reads it.
    parsed = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f")
    return time.mktime(parsed.timetuple()) + parsed.microsecond / 1e6


def read_lines(log_paths: Iterable[str]) -> tuple[list[RoleLine], list[float]]:
    """Every role line and the time of every fence in the logs, each sorted by time."""
    roles: list[RoleLine] = []
    fences: list[float] = []
    for log_path in log_paths:
        try:
            text = Path(log_path).read_text(errors="replace")
        except OSError:
            continue  # a node that never started has no log
        for line in text.splitlines():
            if (match := _ROLE.match(line)) is not None:
                group = match["group"] or "metadata"
                roles.append(
                    RoleLine(
                        _epoch_s(match["time"]), int(match["node"]), group, match["role"],
                        match["cause"],
                    )
                )  # fmt: skip
            elif (fence := _FENCE.match(line)) is not None:
                fences.append(_epoch_s(fence["time"]))
    roles.sort(key=lambda r: r.time_s)
    fences.sort()
    return roles, fences


def _wins(roles: Sequence[RoleLine]) -> list[tuple[RoleLine, bool]]:
    """Every term won, with whether its election timer started the campaign."""
    campaign_by_timer: dict[tuple[int, str], bool] = {}
    wins: list[tuple[RoleLine, bool]] = []
    for line in roles:
        key = (line.node, line.group)
        if line.role in _CAMPAIGN_ROLES and key not in campaign_by_timer:
            campaign_by_timer[key] = line.cause.startswith("election timer")
        elif line.role == "leader":
            # A win with no campaign line (a one-voter group) is no timer's doing either.
            wins.append((line, campaign_by_timer.pop(key, False)))
        elif line.role not in _CAMPAIGN_ROLES:
            campaign_by_timer.pop(key, None)
    return wins


def explained_elections(roles: Sequence[RoleLine], removals: Sequence[LeaderRemoval]) -> int:
    """Elections the removals explain: one per group its node led when each began."""
    leader_of: dict[str, int | None] = {}
    explained = 0
    pending = sorted(removals, key=lambda r: r.start_s)
    index = 0
    for line in [*roles, None]:
        while index < len(pending) and (line is None or pending[index].start_s < line.time_s):
            node = pending[index].node
            explained += sum(1 for leader in leader_of.values() if leader == node)
            index += 1
        if line is None:
            break
        if line.role == "leader":
            leader_of[line.group] = line.node
        elif leader_of.get(line.group) == line.node:
            leader_of[line.group] = None
    assert index == len(pending)
    return explained


def election_stats(
    log_paths: Sequence[str],
    *,
    window_s: tuple[float, float],
    removals: Sequence[LeaderRemoval] = (),
) -> dict[str, Any]:
    """Elections, transfers and fences in the load window `window_s` (epoch seconds)."""
    start_s, end_s = window_s
    assert start_s <= end_s
    roles, fences = read_lines(log_paths)

    def inside(at_s: float) -> bool:
        """Whether `at_s` falls in the load window, or within TAIL_S after it."""
        return start_s <= at_s <= end_s + TAIL_S

    wins = [(line, by_timer) for line, by_timer in _wins(roles) if inside(line.time_s)]
    elections = sum(1 for _, by_timer in wins if by_timer)
    fenced = sum(1 for at_s in fences if inside(at_s))
    minutes = max(end_s - start_s, 1.0) / 60
    return {
        "elections": elections,
        "transfers": len(wins) - elections,
        "fences": fenced,
        "elections_per_minute": round(elections / minutes, 2),
        "fences_per_minute": round(fenced / minutes, 2),
        "leader_removing_faults": len(removals),
        "elections_explained_by_faults": explained_elections(roles, removals),
        "window_s": round(end_s - start_s, 1),
    }
