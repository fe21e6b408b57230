"""Whole simulator runs on the real core: a fixed seed range passes, seeds replay exactly."""

from __future__ import annotations

import io
from dataclasses import fields

import pytest

from raftlog.config import PLANTED_BUGS
from raftlog.errors import ConfigError
from raftlog.sim.__main__ import main
from raftlog.sim.options import derive_options, parse_seed_range
from raftlog.sim.runner import run_seed, run_seeds

FIXED_SEEDS = range(1, 101)


def _failures(seeds: range, *, jobs: int = 1, steps: int = 300) -> list[str]:
    return [r.report() for r in run_seeds(seeds, steps=steps, jobs=jobs) if not r.ok]


def test_the_unmodified_core_passes_a_fixed_seed_range() -> None:
    failures = _failures(FIXED_SEEDS)
    assert not failures, "\n\n".join(failures[:3])


@pytest.mark.slow
def test_the_unmodified_core_passes_a_thousand_seeds_over_3_and_5_nodes() -> None:
    failures = _failures(range(1, 1001), jobs=2)
    assert not failures, f"{len(failures)} seeds failed; first:\n" + "\n\n".join(failures[:3])


@pytest.mark.soak
def test_the_unmodified_core_passes_five_thousand_seeds_over_3_and_5_nodes() -> None:
    failures = _failures(range(1, 5001), jobs=2)
    assert not failures, f"{len(failures)} seeds failed; first:\n" + "\n\n".join(failures[:3])


def test_a_seed_replays_exactly() -> None:
    def replay() -> tuple[str, str]:
        out = io.StringIO()
        result = run_seed(12, steps=120, verbose=True, out=out)
        return result.summary(), out.getvalue()

    first = replay()
    assert first == replay()
    assert first[1].count("deliver") > 50  # the trace really recorded the run


def test_options_come_from_the_seed_and_are_all_printed() -> None:
    options, _ = derive_options(5, nodes=None, steps=10)
    again, _ = derive_options(5, nodes=None, steps=10)
    assert options == again and options.nodes == 3  # odd seeds run 3 nodes by default
    assert derive_options(6, nodes=None, steps=10)[0].nodes == 5
    described = options.describe()
    assert all(f"{f.name}=" in described for f in fields(options))
    with pytest.raises(ConfigError, match="bugs"):
        derive_options(5, nodes=3, steps=10, bugs=frozenset({"no-such-bug"}))
    forced, _ = derive_options(5, nodes=None, steps=10, profile="churn")
    assert (
        forced.profile == "churn"
        and forced.election_timeout_ticks == options.election_timeout_ticks
    )
    with pytest.raises(ConfigError, match="profile"):
        derive_options(5, nodes=None, steps=10, profile="stormy")


def test_seed_ranges_parse_and_reject_nonsense() -> None:
    assert parse_seed_range("7") == range(7, 8)
    assert parse_seed_range("1-2000") == range(1, 2001)
    for text in ("x", "5-1", "-3"):
        with pytest.raises(ConfigError, match="--seeds"):
            parse_seed_range(text)


def test_the_command_line_lists_bugs_and_exits_by_outcome(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--list-bugs"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in PLANTED_BUGS)
    assert main(["--seed", "3", "--steps", "60"]) == 0
    assert "seed=3" in capsys.readouterr().out  # options printed first
    assert main(["--seeds", "1-2", "--steps", "60", "--bug", "ack-before-durable", "-q"]) == 1
    assert "FAILED" in capsys.readouterr().out
    assert main(["--seeds", "nonsense"]) == 2


def test_the_public_api_is_pinned() -> None:
    import raftlog.sim

    assert raftlog.sim.__all__ == [
        "Checker",
        "InvariantViolation",
        "SeedResult",
        "SimOptions",
        "derive_options",
        "run_seed",
        "run_seeds",
        "scripted_options",
    ]
