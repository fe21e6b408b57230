"""Fault planning, the fault schedule, the stats and outcome classification, without processes.

The nemesis is tested against a recording `ClusterControl` fake (a plain class implementing
the port, not a patch): each fault must be injected and then healed exactly.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.chaos.clients import DefiniteSendFailure, send_outcome
from raftlog.chaos.generator import RateLimiter, fault_schedule
from raftlog.chaos.history import (
    Event,
    HistoryError,
    HistoryRecorder,
    Op,
    load_history,
    pair_operations,
)
from raftlog.chaos.nemesis import PARTITIONS, Nemesis, partition_links, plan_fault
from raftlog.chaos.stats import availability, fault_windows, latency_percentiles, percentile
from raftlog.client.errors import DeliveryFailedError, RequestTimedOutError, ServerError


def _reachable(nodes: list[int], links: frozenset[tuple[int, int]], src: int) -> set[int]:
    return {dst for dst in nodes if dst != src and (src, dst) not in links}


@pytest.mark.parametrize("count", [3, 5])
@pytest.mark.parametrize("kind", PARTITIONS)
def test_each_partition_kind_cuts_something_and_only_between_nodes(kind: str, count: int) -> None:
    nodes = list(range(1, count + 1))
    links = partition_links(kind, nodes, random.Random(1), target=2)
    assert links, kind
    assert all(a in nodes and b in nodes and a != b for a, b in links)


def test_isolating_a_node_cuts_it_both_ways_and_nothing_else() -> None:
    links = partition_links("isolate-leader", [1, 2, 3, 4, 5], random.Random(0), target=4)
    assert links == {(4, n) for n in (1, 2, 3, 5)} | {(n, 4) for n in (1, 2, 3, 5)}


@given(st.integers(0, 1000))
@settings(max_examples=50, deadline=None)
def test_ring_gives_every_node_a_majority_but_no_common_one(seed: int) -> None:
    nodes = [1, 2, 3, 4, 5]
    links = partition_links("ring", nodes, random.Random(seed), target=1)
    views = {n: _reachable(nodes, links, n) | {n} for n in nodes}
    assert all(len(view) == 3 for view in views.values())
    assert len({frozenset(v) for v in views.values()}) == 5  # no two share a majority


@given(st.integers(0, 1000))
@settings(max_examples=50, deadline=None)
def test_bridge_keeps_one_node_connected_to_all(seed: int) -> None:
    nodes = [1, 2, 3, 4, 5]
    links = partition_links("bridge", nodes, random.Random(seed), target=1)
    bridges = [n for n in nodes if len(_reachable(nodes, links, n)) == 4]
    assert len(bridges) == 1
    assert all(len(_reachable(nodes, links, n)) == 2 for n in nodes if n not in bridges)


def test_one_way_cuts_only_one_direction() -> None:
    links = partition_links("one-way", [1, 2, 3], random.Random(5), target=1)
    assert not any((b, a) in links for a, b in links)


def test_a_kill_of_the_leader_targets_the_leader() -> None:
    rng = random.Random(0)
    faults = [plan_fault("kill", [1, 2, 3], rng, leader=3, controller=1) for _ in range(50)]
    kinds = {f.kind for f in faults}
    assert kinds == {"random-node", "leader", "all-nodes"}
    assert all(f.nodes == (3,) for f in faults if f.kind == "leader")
    assert all(f.nodes == (1, 2, 3) for f in faults if f.kind == "all-nodes")


def test_an_unknown_nemesis_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="clock"):
        plan_fault("clock", [1, 2, 3], random.Random(0), leader=None, controller=None)


class RecordingControl:
    """A ClusterControl that records each call (a fake implementing the port)."""

    def __init__(self, nodes: list[int]) -> None:
        self.node_ids = nodes
        self.calls: list[tuple[Any, ...]] = []
        self._observers: list[int] = []

    def kill(self, node: int) -> bool:
        self.calls.append(("kill", node))
        return True

    def restart(self, node: int) -> bool:
        self.calls.append(("restart", node))
        return True

    def pause(self, node: int) -> bool:
        self.calls.append(("pause", node))
        return True

    def resume(self, node: int) -> bool:
        self.calls.append(("resume", node))
        return True

    def set_faults(self, node: int, rules: dict[str, Any]) -> bool:
        self.calls.append(("faults", node, rules))
        return True

    def lose_unsynced(self, node: int) -> dict[str, Any] | None:
        self.calls.append(("cut", node))
        return {"bytes_cut": node}

    def corrupt(self, node: int, rng: random.Random) -> dict[str, Any] | None:
        self.calls.append(("corrupt", node))
        return {"file": "x", "damage": rng.choice(("flip", "truncate", "delete"))}

    def reassign(self, partition: int, replicas: Sequence[int]) -> str | None:
        self.calls.append(("reassign", partition, tuple(replicas)))
        return None

    def partition_replicas(self, partition: int) -> tuple[int, ...] | None:
        return (1, 2, 3)

    def add_node(self) -> int | str:
        self.calls.append(("add",))
        added = max(self.node_ids) + 1
        self.node_ids = [*self.node_ids, added]
        self._observers.append(added)
        return added

    def remove_node(self, node: int, timeout_s: float) -> str | None:
        self.calls.append(("remove", node))
        if node not in self._observers:
            return f"node {node} is not an observer"
        self._observers.remove(node)
        self.node_ids = [n for n in self.node_ids if n != node]
        return None

    def observers(self) -> tuple[int, ...]:
        return tuple(self._observers)

    def partition_leader(self, partition: int) -> int | None:
        return 1

    def controller(self) -> int | None:
        return 1


def test_a_partition_is_installed_on_both_ends_and_healed_on_every_node() -> None:
    control = RecordingControl([1, 2, 3])
    fault = plan_fault("partition", [1, 2, 3], random.Random(2), leader=1, controller=1)
    nemesis = Nemesis(control)
    nemesis.start(fault)
    for src, dst in fault.links:
        assert ("faults", src, {"block": [dst], "direction": "outgoing"}) in control.calls or any(
            c[0] == "faults" and c[1] == src and dst in c[2]["block"] for c in control.calls
        )
        assert any(
            c[1] == dst and c[2]["direction"] == "incoming" and src in c[2]["block"]
            for c in control.calls
        )
    control.calls.clear()
    nemesis.stop(fault)
    assert control.calls == [("faults", n, {"heal": True}) for n in (1, 2, 3)]


def test_a_kill_is_healed_by_restarting_the_same_nodes() -> None:
    control = RecordingControl([1, 2, 3])
    nemesis = Nemesis(control)
    fault = plan_fault("kill", [1, 2, 3], random.Random(4), leader=2, controller=1)
    nemesis.start(fault)
    nemesis.stop(fault)
    killed = [c[1] for c in control.calls if c[0] == "kill"]
    assert killed == list(fault.nodes)
    assert [c[1] for c in control.calls if c[0] == "restart"] == killed


@pytest.mark.parametrize("seed", range(6))
def test_lose_unsynced_kills_every_target_before_cutting_any_then_restarts_them(seed: int) -> None:
    control = RecordingControl([1, 2, 3])
    nemesis = Nemesis(control)
    fault = plan_fault("lose-unsynced", [1, 2, 3], random.Random(seed), leader=2, controller=1)
    effects = nemesis.start(fault)
    kinds = [c[0] for c in control.calls]
    assert kinds == ["kill"] * len(fault.nodes) + ["cut"] * len(fault.nodes), control.calls
    assert [c[1] for c in control.calls if c[0] == "cut"] == list(fault.nodes)
    assert effects == {"cuts": {str(n): {"bytes_cut": n} for n in fault.nodes}}
    control.calls.clear()
    nemesis.stop(fault)
    assert control.calls == [("restart", n) for n in fault.nodes]


def test_lose_unsynced_of_the_leader_targets_the_leader() -> None:
    kinds = set()
    for seed in range(30):
        fault = plan_fault("lose-unsynced", [1, 2, 3], random.Random(seed), leader=3, controller=1)
        kinds.add(fault.kind)
        if fault.kind == "leader":
            assert fault.nodes == (3,)
        if fault.kind == "all-nodes":
            assert fault.nodes == (1, 2, 3)
    assert kinds == {"random-node", "leader", "all-nodes"}


@pytest.mark.parametrize("seed", range(20))
def test_a_clock_jump_moves_one_clock_by_minutes_and_heal_puts_it_back(seed: int) -> None:
    control = RecordingControl([1, 2, 3])
    nemesis = Nemesis(control)
    fault = plan_fault("clock-jump", [1, 2, 3], random.Random(seed), leader=2, controller=3)
    ((node, offset_ms),) = fault.clock_offsets_ms
    assert fault.nodes == (node,)
    assert 60_000 <= abs(offset_ms) < 600_000
    if fault.kind == "controller":
        assert node == 3
    assert nemesis.start(fault) == {"clocks_set": {str(node): True}}
    assert control.calls == [("faults", node, {"clock": {"offset_ms": offset_ms}})]
    assert fault.describe()["clock_offsets_ms"] == {str(node): offset_ms}
    control.calls.clear()
    nemesis.stop(fault)
    assert control.calls == [("faults", n, {"heal": True}) for n in (1, 2, 3)]


@pytest.mark.parametrize("seed", range(20))
def test_a_move_replaces_one_replica_by_a_node_outside_the_set(seed: int) -> None:
    nodes, replicas = [1, 2, 3, 4, 5], (1, 2, 3)
    fault = plan_fault(
        "move-replica", nodes, random.Random(seed), leader=2, controller=1, partition=1,
        replicas=replicas,
    )  # fmt: skip
    leaving, joining = fault.nodes
    assert fault.partition == 1 and len(fault.replicas) == 3
    assert leaving in replicas and joining in (4, 5)
    assert fault.replicas == tuple(joining if n == leaving else n for n in replicas)
    assert (fault.kind == "replace-leader") == (leaving == 2)


def test_moves_aim_at_the_leader_and_at_followers() -> None:
    kinds = {
        plan_fault(
            "move-replica", [1, 2, 3, 4, 5], random.Random(seed), leader=2, controller=1,
            partition=0, replicas=(1, 2, 3),
        ).kind
        for seed in range(30)
    }  # fmt: skip
    assert kinds == {"replace-leader", "replace-follower"}


def test_with_no_node_outside_the_replicas_a_move_reorders_them() -> None:
    for seed in range(10):
        fault = plan_fault(
            "move-replica", [1, 2, 3], random.Random(seed), leader=1, controller=1,
            partition=2, replicas=(1, 2, 3),
        )  # fmt: skip
        assert fault.kind == "reorder"
        assert sorted(fault.replicas) == [1, 2, 3] and fault.replicas != (1, 2, 3)


def test_a_move_is_submitted_once_and_not_undone() -> None:
    control = RecordingControl([1, 2, 3])
    nemesis = Nemesis(control)
    fault = plan_fault(
        "move-replica", [1, 2, 3], random.Random(0), leader=1, controller=1, partition=2,
        replicas=(1, 2, 3),
    )  # fmt: skip
    assert nemesis.start(fault) == {"reassign": "accepted"}
    assert control.calls == [("reassign", 2, fault.replicas)]
    assert fault.describe()["replicas"] == list(fault.replicas)
    control.calls.clear()
    nemesis.stop(fault)
    assert control.calls == []


def test_add_node_starts_an_observer_and_remove_node_decommissions_one() -> None:
    control = RecordingControl([1, 2, 3])
    nemesis = Nemesis(control)
    add = plan_fault("add-node", control.node_ids, random.Random(0), leader=1, controller=1)
    assert (add.nemesis, add.kind, add.nodes) == ("add-node", "observer", ())
    assert nemesis.start(add) == {"added": 4}
    nemesis.stop(add)  # not undone: the node stays
    assert control.calls == [("add",)] and control.node_ids == [1, 2, 3, 4]

    control.calls.clear()
    remove = plan_fault(
        "remove-node", control.node_ids, random.Random(0), leader=1, controller=1,
        observers=control.observers(),
    )  # fmt: skip
    assert (remove.kind, remove.nodes) == ("observer", (4,))
    assert remove.describe()["nodes"] == [4]
    assert nemesis.start(remove) == {"removed": 4}
    nemesis.stop(remove)
    assert control.calls == [("remove", 4)] and control.node_ids == [1, 2, 3]
    # Healing never brings a removed node back.
    control.calls.clear()
    nemesis.heal_all()
    assert {c[1] for c in control.calls} == {1, 2, 3}


@pytest.mark.parametrize("seed", range(10))
def test_remove_node_only_ever_picks_an_observer(seed: int) -> None:
    fault = plan_fault(
        "remove-node", [1, 2, 3, 4, 5], random.Random(seed), leader=4, controller=1,
        observers=(4, 5),
    )  # fmt: skip
    assert fault.nodes in ((4,), (5,))
    nobody = plan_fault("remove-node", [1, 2, 3], random.Random(seed), leader=1, controller=1)
    assert nobody.kind == "no-observer" and nobody.nodes == ()
    control = RecordingControl([1, 2, 3])
    assert "skipped" in Nemesis(control).start(nobody)["remove"]
    assert control.calls == []


def test_a_refused_removal_is_reported() -> None:
    control = RecordingControl([1, 2, 3])
    fault = plan_fault(
        "remove-node", [1, 2, 3], random.Random(0), leader=1, controller=1, observers=(2,)
    )
    assert "not an observer" in Nemesis(control).start(fault)["remove"]
    assert control.node_ids == [1, 2, 3]


def test_a_move_with_unknown_replicas_does_nothing() -> None:
    control = RecordingControl([1, 2, 3])
    fault = plan_fault("move-replica", [1, 2, 3], random.Random(0), leader=None, controller=None)
    assert fault.kind == "unknown-replicas"
    assert "skipped" in Nemesis(control).start(fault)["reassign"]
    assert control.calls == []


@pytest.mark.parametrize("count", [3, 5])
def test_a_clock_skew_gives_every_node_its_own_offset(count: int) -> None:
    nodes = list(range(1, count + 1))
    for seed in range(20):
        fault = plan_fault("clock-skew", nodes, random.Random(seed), leader=1, controller=1)
        offsets = dict(fault.clock_offsets_ms)
        assert sorted(offsets) == nodes
        assert len(set(offsets.values())) == count, "no two nodes share an offset"
        assert all(abs(o) <= 120_000 for o in offsets.values())


@given(st.integers(0, 10_000), st.floats(5, 300))
@settings(max_examples=100, deadline=None)
def test_the_schedule_heals_every_fault_before_the_end(seed: int, duration_s: float) -> None:
    schedule = fault_schedule(random.Random(seed), ["kill", "pause"], duration_s=duration_s)
    assert all(0 < f.start_s < f.stop_s < duration_s for f in schedule)
    assert all(a.stop_s < b.start_s for a, b in itertools.pairwise(schedule))
    again = fault_schedule(random.Random(seed), ["kill", "pause"], duration_s=duration_s)
    assert schedule == again  # replays from its seed


def test_no_nemesis_means_no_faults() -> None:
    assert fault_schedule(random.Random(1), [], duration_s=60) == []


def test_the_rate_limiter_spaces_calls_on_its_clock() -> None:
    now = [0.0]
    limiter = RateLimiter(10, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    for _ in range(5):
        limiter.wait()
    assert now[0] == pytest.approx(0.4)


def _server_error(code: str) -> ServerError:
    return ServerError(code, "refused", concerning="produce", retriable=False)


def _delivery(attempts: int, cause: Exception) -> DeliveryFailedError:
    error = DeliveryFailedError("t", 0, str(cause), attempts=attempts)
    error.__cause__ = cause
    return error


def test_only_certain_refusals_count_as_fail() -> None:
    timeout = RequestTimedOutError("produce", address="a", timeout_ms=1)
    assert send_outcome(_delivery(0, timeout)) == "fail"  # never sent
    assert send_outcome(_delivery(1, _server_error("CORRUPT_BATCH"))) == "fail"
    assert send_outcome(_delivery(1, _server_error("NOT_LEADER"))) == "info"
    assert send_outcome(_delivery(2, _server_error("CORRUPT_BATCH"))) == "info"  # a retry
    assert send_outcome(_delivery(1, timeout)) == "info"
    assert send_outcome(TimeoutError()) == "info"
    assert send_outcome(DefiniteSendFailure("no node")) == "fail"


def _ops(*events: tuple[Any, str, str, Any, int]) -> list[Op]:
    return list(pair_operations(Event(*e) for e in events))


def test_availability_counts_outcomes_and_the_longest_write_gap() -> None:
    ops = _ops(
        (0, "invoke", "send", {"value": "0-1"}, 0),
        (0, "ok", "send", {"value": "0-1"}, 1_000_000_000),
        (0, "invoke", "send", {"value": "0-2"}, 1_000_000_000),
        (0, "info", "send", {"value": "0-2"}, 5_000_000_000),
        (0, "invoke", "send", {"value": "0-3"}, 5_000_000_000),
        (0, "ok", "send", {"value": "0-3"}, 6_000_000_000),
    )
    result = availability(ops, end_ns=7_000_000_000)
    assert result["operations"]["send"] == {"ok": 2, "fail": 0, "info": 1}
    assert result["longest_window_without_ok_send_s"] == 5.0
    latency = latency_percentiles(ops)["send"]
    assert latency["count"] == 2 and latency["max_ms"] == 1000.0


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile([3.0], 0.9) == 3.0


def test_fault_windows_pair_start_and_stop_and_close_open_ones_at_the_end() -> None:
    events = [
        Event("nemesis", "info", "start", {"id": 0, "fault": "kill"}, 10),
        Event("nemesis", "info", "stop", {"id": 0, "fault": "kill"}, 20),
        Event("nemesis", "info", "start", {"id": 1, "fault": "pause"}, 30),
    ]
    windows = fault_windows(events, end_ns=99)
    assert [(w.fault, w.start_ns, w.stop_ns) for w in windows] == [
        ("kill", 10, 20),
        ("pause", 30, 99),
    ]


def test_history_round_trips_through_json_lines(tmp_path: Path) -> None:
    clock = iter(range(0, 10_000, 7))
    with (tmp_path / "h.jsonl").open("w") as sink:
        recorder = HistoryRecorder(lambda: next(clock), sink)
        recorder.record(0, "invoke", "send", {"topic": "t", "partition": 0, "value": "0-1"})
        recorder.record(
            0, "ok", "send", {"topic": "t", "partition": 0, "value": "0-1", "offset": 1}
        )
        recorder.close()
        recorder.record(0, "info", "poll", None)  # after close: not recorded
    loaded = load_history(tmp_path / "h.jsonl")
    assert loaded == recorder.events
    assert [e.type for e in loaded] == ["invoke", "ok"]
    assert all(a.time <= b.time for a, b in itertools.pairwise(loaded))


def test_a_bad_history_line_is_refused_with_its_number(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text(
        '{"process": 0, "type": "invoke", "f": "poll", "value": null, "time": 1}\n{oops\n'
    )
    with pytest.raises(HistoryError, match="line 2"):
        load_history(path)


def test_a_completion_without_invoke_is_refused() -> None:
    with pytest.raises(HistoryError, match="without invoke"):
        list(pair_operations([Event(0, "ok", "poll", {}, 5)]))


def test_the_public_api_is_pinned() -> None:
    import raftlog.chaos

    assert sorted(raftlog.chaos.__all__) == sorted(
        ["ANOMALIES", "NEMESES", "Backend", "CheckResult", "ClusterControl", "Event", "Fault",
         "HistoryRecorder", "LogClients", "Nemesis", "Op", "RaftlogClients", "RunOptions",
         "WorkloadOptions", "check", "load_history", "pair_operations", "plan_fault", "run",
         "send_outcome"]
    )  # fmt: skip
    assert all(hasattr(raftlog.chaos, name) for name in raftlog.chaos.__all__)
