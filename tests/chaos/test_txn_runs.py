"""Whole transactional chaos runs (`--workload txn`): confluent-kafka transactional producers on
a real 3-node cluster's Kafka listeners, read_committed readers, the txn checker.

In make test: one short run under kill, partition and pause (and the txn-delay nemesis) with
the KIP-890 check on, which must be valid, and the same delay with the check switched off
(`--set kafka.txn_verification=false`), which the checker must catch (aborted records made
visible, torn transactions). Longer runs over several seeds are `soak`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from raftlog.chaos.cli import main

pytest.importorskip("confluent_kafka")


def _run(out: Path, *argv: str) -> tuple[int, dict[str, Any]]:
    code = main(["run", "--workload", "txn", "--nodes", "3", "--out", str(out), *argv])
    results: dict[str, Any] = json.loads((out / "results.json").read_text())
    return code, results


def _found(results: dict[str, Any]) -> dict[str, int]:
    return {name: n for name, n in results["anomaly_counts"].items() if n}


def test_a_short_txn_run_under_kill_partition_pause_and_delays_is_valid(tmp_path: Path) -> None:
    # Seed 16 over 20 s plans a partition, a pause and a kill (the schedule depends on the
    # seed and the duration only). On a loaded machine it once found committed records hidden
    # from read_committed readers (a marker dropped while its partition's leader restarted;
    # docs/chaos.md).
    code, results = _run(
        tmp_path / "run", "--nemesis", "kill,partition,pause,txn-delay-produce",
        "--duration", "20", "--seed", "16",
    )  # fmt: skip
    assert code == 0, (_found(results), results["unchecked"])
    assert results["transactions"]["committed"] > 10
    assert results["transactions"]["aborted"] > 0
    assert {f["fault"] for f in results["faults"]} >= {"kill", "partition", "pause"}
    assert results["delays"] > 0, "the txn-delay nemesis held at least one request"


def test_with_the_kip_890_check_off_delayed_produces_of_aborted_transactions_are_caught(
    tmp_path: Path,
) -> None:
    # Whether a late batch lands in its window (after the abort's marker, before the victim's
    # next batch to that partition) is a race: a run catches it most of the time (docs/chaos.md
    # has the counts), so a second seed runs only when the first found nothing.
    for seed in ("2", "4"):
        code, results = _run(
            tmp_path / seed, "--nemesis", "txn-delay-produce",
            "--set", "kafka.txn_verification=false", "--duration", "14", "--seed", seed,
        )  # fmt: skip
        assert results["delays"] > 0
        if code == 1:
            break
    found = _found(results)
    assert code == 1, found
    assert set(found) <= {"aborted_read", "torn_txn", "lost_committed"}, found


@pytest.mark.soak
@pytest.mark.parametrize("seed", [11, 12, 13])
def test_longer_txn_runs_under_every_process_and_network_nemesis_are_valid(
    tmp_path: Path, seed: int
) -> None:
    code, results = _run(
        tmp_path / "run", "--nemesis", "kill,partition,pause,flaky,txn-delay-produce",
        "--duration", "60", "--seed", str(seed),
    )  # fmt: skip
    assert code == 0, (_found(results), results["unchecked"])


@pytest.mark.soak
@pytest.mark.parametrize("seed", [21, 22, 23])
def test_longer_runs_with_the_kip_890_check_off_are_caught(tmp_path: Path, seed: int) -> None:
    code, results = _run(
        tmp_path / "run", "--nemesis", "txn-delay-produce", "--set", "kafka.txn_verification=false",
        "--duration", "40", "--seed", str(seed),
    )  # fmt: skip
    assert code == 1, _found(results)
