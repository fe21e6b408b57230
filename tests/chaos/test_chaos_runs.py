"""Whole chaos runs: real node processes and real faults, the pysyncobj baseline, planted bugs.

The unmarked local run is the 40-50 s smoke test with one fault of each network nemesis (beside
a CPU hog); the 60 s CI-sized run, the acks=1 and acks=0 unsafe-config loss runs and the
skip-fsync run are `soak` (out of `make test`, run by `make soak`; the planted-bug runs keep
showing in `make test` that the checker catches loss). A run
that finds nothing proves little on its own, so the pipeline (workers, history, checker) is
also run against a log with a planted bug, which it must catch.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from raftlog.chaos.cli import main
from raftlog.chaos.clients import ChaosConsumer, ChaosProducer, FinalRead, LogClients
from raftlog.chaos.history import load_history
from raftlog.chaos.local_backend import LocalBackend
from raftlog.chaos.runner import RunOptions, run
from raftlog.chaos.syncobj_log import SyncObjBackend
from raftlog.chaos.workload import WorkloadOptions


def _results(out: Path) -> dict[str, Any]:
    results: dict[str, Any] = json.loads((out / "results.json").read_text())
    return results


def test_a_short_local_run_under_every_network_nemesis_beside_a_cpu_hog_is_valid(
    tmp_path: Path,
) -> None:
    # Seed 412 over 25 s plans one fault of each nemesis (kill, pause, flaky, partition): the
    # schedule depends on the seed and the duration only. On a busy machine this run once
    # found an idempotent producer's records out of order (send_reorder): a process spinning
    # on one core beside it keeps that case in make test. tools/chaos_sweep.py runs many
    # seeds this way (docs/chaos.md).
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        out = tmp_path / "run"
        argv = ["run", "--backend", "local", "--nodes", "3"]
        argv += ["--nemesis", "kill,partition,pause,flaky", "--duration", "25", "--seed", "412"]
        code = main([*argv, "--out", str(out)])
    finally:
        hog.kill()
        hog.wait()
    results = _results(out)
    assert code == 0, (results["anomaly_counts"], results["unchecked"])
    assert results["valid"] is True
    assert results["availability"]["operations"]["send"]["ok"] > 50
    assert load_history(out / "history.jsonl"), "the history is written as JSON lines"
    assert {f["fault"] for f in results["faults"]} == {"kill", "partition", "pause", "flaky"}
    assert {"latency.png", "throughput.png", "report.md"} <= {p.name for p in out.iterdir()}


def _group_ops(out: Path) -> dict[str, int]:
    found: dict[str, int] = {}
    for event in load_history(out / "history.jsonl"):
        if event.type == "ok" and event.f in ("assign", "revoke", "commit", "committed"):
            found[event.f] = found.get(event.f, 0) + 1
    return found


def test_a_short_kafka_consumer_group_run_is_valid(tmp_path: Path) -> None:
    # confluent-kafka producers and classic-protocol group members on the Kafka listeners.
    pytest.importorskip("confluent_kafka")
    out = tmp_path / "run"
    argv = ["run", "--backend", "local", "--client", "kafka", "--consumer-mode", "group"]
    argv += ["--nemesis", "kill,pause", "--consumers", "2", "--duration", "8", "--seed", "3"]
    code = main([*argv, "--out", str(out)])
    results = _results(out)
    assert code == 0, (results["anomaly_counts"], results["unchecked"])
    assert results["options"]["client"] == "kafka"
    assert results["availability"]["operations"]["send"]["ok"] > 50
    seen = _group_ops(out)
    assert seen.get("assign", 0) > 0 and seen.get("commit", 0) > 0, seen


def test_a_short_run_with_a_raftlog_consumer_group_is_valid(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = ["run", "--backend", "local", "--nemesis", "kill,partition", "--consumers", "2"]
    argv += ["--consumer-mode", "group", "--duration", "6", "--seed", "5", "--out", str(out)]
    code = main(argv)
    results = _results(out)
    assert code == 0, (results["anomaly_counts"], results["unchecked"])
    seen = _group_ops(out)
    assert seen.get("assign", 0) > 0 and seen.get("committed", 0) > 0, seen


def test_a_keyed_run_on_a_compacted_topic_keeps_the_latest_value_of_every_key(
    tmp_path: Path,
) -> None:
    """The keyed workload's checker (lost_latest, value_reappears) over a topic whose
    cleaner runs many times within the run, under kills."""
    out = tmp_path / "run"
    argv = ["run", "--backend", "local", "--nemesis", "kill", "--keys", "20", "--partitions", "1"]
    argv += ["--duration", "6", "--seed", "5", "--rate", "80", "--out", str(out)]
    code = main(argv)
    results = _results(out)
    assert code == 0, (results["anomaly_counts"], results["unchecked"])
    sends_ok = results["availability"]["operations"]["send"]["ok"]
    events = load_history(out / "history.jsonl")
    final = [e for e in events if e.f == "final_read" and e.type == "ok"]
    kept = sum(len(e.value["records"]) for e in final)
    assert 0 < kept < sends_ok, "the cleaner removed superseded values during the run"


def test_a_slow_node_costs_no_election_its_stalls_do_not_explain_and_no_fence(
    tmp_path: Path,
) -> None:
    """The `slow` nemesis stalls a node's whole process for 50-500 ms at a time under acks=all
    load. Only a stall longer than an election timeout less one heartbeat interval may rightly
    cost the groups its node led an election (raftlog.chaos.slow); no other slowness may, and
    no stall comes near a lease. Seed 8 stalls one node for 5.8 s of the 10."""
    out = tmp_path / "run"
    argv = ["run", "--backend", "local", "--nemesis", "slow", "--acks", "all"]
    argv += ["--duration", "10", "--seed", "8", "--out", str(out)]
    code = main(argv)
    results = _results(out)
    assert code == 0, (results["anomaly_counts"], results["unchecked"])
    stalls = [s for e in _nemesis_effects(out) for n in e.get("stalls", []) for s in n["stalls"]]
    assert stalls and all(s["ms"] >= 50 for s in stalls), stalls
    elections = results["elections"]
    assert elections["elections"] <= elections["elections_explained_by_faults"], elections
    assert elections["fences"] == 0, elections
    assert "## Elections and fences" in (out / "report.md").read_text()


@pytest.mark.soak
def test_a_ci_sized_local_run_with_every_network_nemesis_is_valid(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = ["run", "--backend", "local", "--nemesis", "kill,partition,pause,flaky"]
    argv += ["--duration", "60", "--seed", "21", "--out", str(out)]
    assert main(argv) == 0, _results(out)["anomalies"]


@pytest.mark.soak
@pytest.mark.parametrize("acks", ["1", "0"])
def test_acks_below_all_lose_acknowledged_writes_when_the_leader_is_cut_off(
    tmp_path: Path, acks: str
) -> None:
    # The unsafe configuration: a leader cut off from its followers keeps acknowledging
    # acks=1/0 writes until it steps down; the majority elects a new leader and truncates them.
    out = tmp_path / "run"
    argv = ["run", "--backend", "local", "--nemesis", "isolate-leader", "--acks", acks]
    argv += ["--duration", "25", "--seed", "6", "--out", str(out), "--rate", "100"]
    assert main(argv) == 1
    assert _results(out)["anomaly_counts"]["lost"] > 0


@pytest.mark.slow
def test_acks_all_keeps_every_acknowledged_write_when_leaders_are_targeted(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = ["run", "--backend", "local", "--nemesis", "isolate-leader,kill-leader,pause-leader"]
    # Seed 16 plans each of the three within 20 s (the schedule depends on the seed and the
    # duration only).
    argv += ["--duration", "20", "--seed", "16", "--out", str(out), "--rate", "100"]
    assert main(argv) == 0, _results(out)["anomalies"]
    started = {
        (e.value["fault"], e.value["kind"])
        for e in load_history(out / "history.jsonl")
        if e.process == "nemesis" and e.f == "start" and isinstance(e.value, dict)
    }
    assert len(started) == 3, started


def _nemesis_effects(out: Path) -> list[dict[str, Any]]:
    return [
        e.value
        for e in load_history(out / "history.jsonl")
        if e.process == "nemesis" and e.f == "effects" and isinstance(e.value, dict)
    ]


def test_acks_all_keeps_every_acknowledged_write_when_unsynced_writes_are_lost(
    tmp_path: Path,
) -> None:
    # Seed 3 plans lose-unsynced of all nodes at once, twice (the schedule depends on the seed
    # and the duration only).
    out = tmp_path / "run"
    argv = ["run", "--backend", "local", "--nemesis", "lose-unsynced", "--acks", "all"]
    argv += ["--duration", "20", "--seed", "3", "--out", str(out)]
    code = main(argv)
    results = _results(out)
    assert code == 0, (results["anomaly_counts"], results["unchecked"])
    cuts = [cut for e in _nemesis_effects(out) for cut in e["cuts"].values()]
    assert cuts and all(cut is not None for cut in cuts), "every killed node was cut"


def test_acks_all_keeps_every_acknowledged_write_when_a_minority_disk_is_damaged(
    tmp_path: Path,
) -> None:
    """The `corrupt` nemesis with leader kills and partitions: damaged files on a minority
    of nodes, found and repaired, and nothing acknowledged is lost (docs/storage-faults.md)."""
    out = tmp_path / "run"
    argv = ["run", "--backend", "local", "--nemesis", "corrupt,kill-leader,partition"]
    argv += ["--acks", "all", "--duration", "20", "--seed", "1", "--out", str(out)]
    code = main(argv)
    results = _results(out)
    assert code == 0, (results["anomaly_counts"], results["unchecked"])
    storage = results["storage"]
    assert storage["damage"] and all(d["node"] == "3" for d in storage["damage"]), storage
    assert storage["damage_found"] > 0 and storage["repairs_finished"] > 0, storage
    assert "## Storage damage" in (out / "report.md").read_text()


@pytest.mark.soak
def test_nodes_that_skip_fsync_are_caught_and_never_serve_a_shortened_log(
    tmp_path: Path,
) -> None:
    # The deliberately unsafe configuration: every node's partition logs acknowledge before
    # any fsync, and the same lose-unsynced schedule as above (all nodes at once) throws
    # those writes away. Each log's durable mark shows the loss, so every replica refuses to
    # serve or vote with its shortened log (docs/storage-faults.md): the partitions stay
    # unavailable rather than silently shorter, and the run is invalid (nothing can be read
    # back). Without the mark the same run loses acknowledged writes.
    out = tmp_path / "run"
    argv = ["run", "--backend", "local", "--nemesis", "lose-unsynced", "--acks", "all"]
    argv += ["--duration", "20", "--seed", "3", "--out", str(out), "--unsafe-skip-fsync"]
    argv += ["--recovery-timeout", "10"]  # the partitions are expected to stay unavailable
    assert main(argv) == 1
    results = _results(out)
    assert results["anomaly_counts"]["lost"] > 0 or results["unchecked"], results
    assert results["storage"]["damage_found"] > 0, results["storage"]
    assert sum(cut["bytes_cut"] for e in _nemesis_effects(out) for cut in e["cuts"].values()) > 0


@pytest.mark.slow
def test_clock_faults_lose_nothing_and_reach_every_node(tmp_path: Path) -> None:
    # Both clock nemeses in one run: seed 32's schedule over 20 s is skew, jump, skew (the
    # schedule depends on the seed and the duration only); the soak twin runs each alone.
    _clock_run(tmp_path, "clock-jump,clock-skew", seed=32, kinds={"clock-jump", "clock-skew"})


@pytest.mark.soak
@pytest.mark.parametrize("nemesis", ["clock-jump", "clock-skew"])
def test_each_clock_fault_alone_loses_nothing(tmp_path: Path, nemesis: str) -> None:
    _clock_run(tmp_path, nemesis, seed=5, kinds={nemesis})


def _clock_run(tmp_path: Path, nemeses: str, *, seed: int, kinds: set[str]) -> None:
    out = tmp_path / "run"
    argv = ["run", "--backend", "local", "--nemesis", nemeses, "--duration", "20"]
    argv += ["--seed", str(seed), "--out", str(out)]
    code = main(argv)
    results = _results(out)
    assert code == 0, (results["anomaly_counts"], results["unchecked"])
    applied = [ok for e in _nemesis_effects(out) for ok in e["clocks_set"].values()]
    assert applied and all(applied), "every clock rule was taken by its node"
    started = {
        e.value["fault"]
        for e in load_history(out / "history.jsonl")
        if e.process == "nemesis" and e.f == "start" and isinstance(e.value, dict)
    }
    assert started == kinds, started
    # Leases are measured on each node's monotonic clock: no clock fault may cost writes.
    assert results["availability"]["ok_fraction"]["send"] > 0.95, results["availability"]


@pytest.mark.slow
def test_replica_moves_under_load_lose_nothing(tmp_path: Path) -> None:
    # 5 nodes, 3 replicas: each move replaces one replica (the leader or a follower) by a node
    # that held nothing, through learner, promotion and removal under the producers.
    out = tmp_path / "run"
    argv = ["run", "--backend", "local", "--nodes", "5", "--nemesis", "move-replica"]
    argv += ["--duration", "20", "--seed", "1", "--out", str(out)]
    code = main(argv)
    results = _results(out)
    assert code == 0, (results["anomaly_counts"], results["unchecked"])
    outcomes = [e["reassign"] for e in _nemesis_effects(out)]
    assert "accepted" in outcomes, outcomes


def _node_log_lines(out: Path) -> list[str]:
    return [
        line for path in sorted((out / "cluster").glob("node-*.log"))
        for line in path.read_text().splitlines()
    ]  # fmt: skip


@pytest.mark.slow
def test_added_nodes_get_replicas_by_rebalancing_under_load(tmp_path: Path) -> None:
    # 3 voters, then observers started under the load; the controller's automatic
    # rebalancing (grace shortened for the run) moves replicas onto them one at a time.
    out = tmp_path / "run"
    argv = ["run", "--backend", "local", "--nodes", "3", "--nemesis", "add-node"]
    argv += ["--duration", "20", "--seed", "1", "--out", str(out)]
    code = main(argv)
    results = _results(out)
    assert code == 0, (results["anomaly_counts"], results["unchecked"])
    added = [e["added"] for e in _nemesis_effects(out) if "added" in e]
    assert added, _nemesis_effects(out)
    moves_onto_added = [
        line
        for line in _node_log_lines(out)
        if "rebalancing:" in line and any(f"{n}" in line.split("->")[-1] for n in added)
    ]
    assert moves_onto_added, "no replica was moved onto an added node"


@pytest.mark.slow
def test_removed_nodes_hand_their_replicas_over_under_load(tmp_path: Path) -> None:
    # 3 voters and 1 observer holding replicas of the run's topic: remove-node decommissions
    # the observer under the load (its replicas move to the voters), then stops it.
    out = tmp_path / "run"
    argv = ["run", "--backend", "local", "--nodes", "3", "--observers", "1"]
    argv += ["--nemesis", "remove-node", "--duration", "20", "--seed", "1", "--out", str(out)]
    code = main(argv)
    results = _results(out)
    assert code == 0, (results["anomaly_counts"], results["unchecked"])
    effects = _nemesis_effects(out)
    assert any(e.get("removed") == 4 for e in effects), effects
    lines = _node_log_lines(out)
    assert any("decommissioning: chaos" in line for line in lines), "no replica moved off"
    assert any("node 4 is decommissioned" in line for line in lines)


class _LossyProducer:
    """Planted bug: every 7th send is acknowledged at a made-up offset and never written."""

    def __init__(self, inner: ChaosProducer) -> None:
        self._inner = inner
        self._count = 0
        self._lock = threading.Lock()

    def send(self, topic: str, partition: int, value: str, key: str | None = None) -> Future[int]:
        with self._lock:
            self._count += 1
            drop = self._count % 7 == 0
        if not drop:
            return self._inner.send(topic, partition, value, key)
        fake: Future[int] = Future()
        fake.set_result(10**9 + self._count)
        return fake

    def close(self, timeout_s: float) -> None:
        self._inner.close(timeout_s)


class _LossyBackend(SyncObjBackend):
    def start(self, *, timeout_s: float = 60.0) -> SyncObjBackend:
        super().start(timeout_s=timeout_s)
        return self

    def producer(self, *, acks: str, idempotence: bool) -> ChaosProducer:
        return _LossyProducer(super().producer(acks=acks, idempotence=idempotence))


def _short_options(out: Path, *, nemeses: tuple[str, ...] = ()) -> RunOptions:
    workload = WorkloadOptions(partitions=2, producers=2, send_rate_per_s=30)
    return RunOptions(
        out_dir=out, seed=3, duration_s=6, nemeses=nemeses, workload=workload, gap_s=(1, 2),
        hold_s=(1, 2), progress_interval_s=2,
    )  # fmt: skip


def test_the_pipeline_catches_a_planted_lossy_log(tmp_path: Path) -> None:
    lines: list[str] = []
    results = run(_short_options(tmp_path), _LossyBackend(tmp_path, node_count=3), say=lines.append)
    assert results["valid"] is False
    assert results["anomaly_counts"]["lost"] > 0
    assert lines[0].startswith("chaos run seed=3"), "the seed is printed first"


def test_the_pysyncobj_baseline_runs_under_kill_and_pause(tmp_path: Path) -> None:
    results = run(
        _short_options(tmp_path, nemeses=("kill", "pause")),
        SyncObjBackend(tmp_path, node_count=3),
        say=lambda _: None,
    )
    assert results["availability"]["operations"]["send"]["ok"] > 0
    # Its verdict is reported, not asserted: see docs/chaos.md for what it showed.
    assert set(results["anomaly_counts"]) >= {"lost", "duplicate", "send_reorder"}


@pytest.mark.parametrize(
    "nemesis",
    ["partition", "lose-unsynced", "clock-jump", "move-replica", "add-node", "remove-node"],
)
def test_node_hook_nemeses_are_refused_where_there_is_no_hook(tmp_path: Path, nemesis: str) -> None:
    argv = ["run", "--backend", "pysyncobj", "--nemesis", nemesis, "--out", str(tmp_path)]
    assert main(argv) == 2


@pytest.mark.parametrize("nemesis", ["lose-unsynced", "add-node", "remove-node"])
def test_process_set_nemeses_are_refused_on_docker(
    tmp_path: Path, nemesis: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", "--backend", "docker", "--nemesis", nemesis, "--out", str(tmp_path)]
    assert main(argv) == 2
    assert nemesis in capsys.readouterr().err


def test_observers_need_the_local_backend(tmp_path: Path) -> None:
    argv = ["run", "--backend", "pysyncobj", "--observers", "1", "--nemesis", "kill"]
    assert main([*argv, "--out", str(tmp_path)]) == 2


def test_the_unsafe_node_is_refused_outside_the_local_backend(tmp_path: Path) -> None:
    argv = ["run", "--backend", "pysyncobj", "--unsafe-skip-fsync", "--out", str(tmp_path)]
    assert main(argv) == 2


class _Unused:
    """Type check that the backends satisfy the ports (no runtime effect)."""

    def clients(self, backend: LocalBackend) -> LogClients:
        return backend.start()

    def consumer(self, clients: LogClients, partitions: Sequence[int]) -> ChaosConsumer:
        return clients.consumer("t", partitions)

    def final(self, clients: LogClients) -> FinalRead:
        return clients.final_read("t", 0, timeout_s=1)
