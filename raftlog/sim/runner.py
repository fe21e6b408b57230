"""Run simulator seeds: one seed in-process, many seeds over worker processes.

Theory of operation. `run_seed` is a pure function of its arguments: it derives the options
from the seed, builds a `Cluster`, runs the chaos steps and the heal phase, and turns the
outcome into a `SeedResult` (never raises for a failing seed). An `InvariantViolation` is a
failure of the checked invariant; any other exception escaping the core (an assertion, a
storage error from a misused port) is a failure named `core raised <type>`, with the end of
its traceback. `run_seeds` maps seeds over a process pool (seeds are independent and the
machine's cores are the only way past one Python thread) and yields results in seed order.
"""

from __future__ import annotations

import multiprocessing
import traceback
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TextIO

from raftlog.sim.checker import InvariantViolation
from raftlog.sim.cluster import Cluster, RunStats
from raftlog.sim.options import SimOptions, derive_options
from raftlog.sim.trace import Trace

__all__ = ["SeedResult", "run_seed", "run_seeds"]

DEFAULT_STEPS = 300
TRACEBACK_LINES_MAX = 12


@dataclass(frozen=True, slots=True)
class SeedResult:
    seed: int
    options: SimOptions
    stats: RunStats | None  # None when the seed failed
    invariant: str | None = None
    detail: str = ""
    trace: tuple[str, ...] = ()
    node_states: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.invariant is None

    def summary(self) -> str:
        head = f"seed {self.seed} (nodes={self.options.nodes}, profile={self.options.profile})"
        if self.ok:
            assert self.stats is not None
            s = self.stats
            return (
                f"{head}: ok: {s.proposed} proposed, {s.acked} acked, {s.lost} lost, "
                f"{s.crashes} crashes, {s.messages_delivered} messages, last offset "
                f"{s.last_offset}, healed in {s.heal_steps} steps"
                + "".join(f", {count} {what}" for what, count in s.exercised)
            )
        first_line = self.detail.splitlines()[0] if self.detail else ""
        return f"{head}: FAILED {self.invariant}: {first_line[:400]}"

    def report(self) -> str:
        lines = [self.summary()]
        if not self.ok:
            lines.extend(self.detail.splitlines()[1:])
            lines.append(f"options: {self.options.describe()}")
            lines.append("last events:")
            lines.extend(self.trace)
            lines.append("nodes:")
            lines.extend(f"  {state}" for state in self.node_states)
        return "\n".join(lines)


def run_seed(
    seed: int,
    *,
    nodes: int | None = None,
    steps: int = DEFAULT_STEPS,
    bugs: frozenset[str] = frozenset(),
    protocol_checks: bool = True,
    profile: str | None = None,
    verbose: bool = False,
    out: TextIO | None = None,
) -> SeedResult:
    """Run one seed to completion and say how it went (a failing seed is a result, not a raise)."""
    options, rng = derive_options(
        seed,
        nodes=nodes,
        steps=steps,
        bugs=bugs,
        protocol_checks=protocol_checks,
        profile=profile,
    )
    if out is not None:
        print(f"seed {seed}: {options.describe()}", file=out)
    trace = Trace(events_max=options.trace_events_max, verbose=verbose, out=out)
    cluster: Cluster | None = None
    try:
        cluster = Cluster(options, rng, trace)
        stats = cluster.run()
    except InvariantViolation as violation:
        return _failed(seed, options, trace, cluster, violation.invariant, violation.detail)
    except Exception as error:  # anything else escaping the core fails the seed, with context
        frame = traceback.extract_tb(error.__traceback__)[-1]
        where = f"{frame.filename.rsplit('/raftlog/', 1)[-1]}:{frame.lineno} in {frame.name}"
        lines = traceback.format_exception(error)[-TRACEBACK_LINES_MAX:]
        detail = f"{error!r} at {where}\n" + "".join(lines).rstrip()
        return _failed(seed, options, trace, cluster, f"core raised {type(error).__name__}", detail)
    assert stats.steps == steps
    return SeedResult(seed, options, stats)


def _failed(
    seed: int,
    options: SimOptions,
    trace: Trace,
    cluster: Cluster | None,
    invariant: str,
    detail: str,
) -> SeedResult:
    states: tuple[str, ...] = ()
    if cluster is not None:
        states = tuple(node.describe() for node in cluster.nodes.values())
    return SeedResult(seed, options, None, invariant, detail, tuple(trace.lines()), states)


@dataclass(frozen=True, slots=True)
class _Job:
    nodes: int | None
    steps: int
    bugs: frozenset[str]
    protocol_checks: bool
    profile: str | None

    def __call__(self, seed: int) -> SeedResult:
        return run_seed(
            seed,
            nodes=self.nodes,
            steps=self.steps,
            bugs=self.bugs,
            protocol_checks=self.protocol_checks,
            profile=self.profile,
        )


def run_seeds(
    seeds: Iterable[int],
    *,
    nodes: int | None = None,
    steps: int = DEFAULT_STEPS,
    bugs: frozenset[str] = frozenset(),
    protocol_checks: bool = True,
    profile: str | None = None,
    jobs: int = 1,
) -> Iterator[SeedResult]:
    """Yield each seed's result, in seed order, running `jobs` seeds at a time."""
    assert jobs >= 1, jobs
    job = _Job(nodes, steps, bugs, protocol_checks, profile)
    if jobs == 1:
        yield from map(job, seeds)
        return
    # Workers are spawned, not forked: a fork copies whatever the caller holds (a test
    # process has run gRPC clients and their threads by then), and a forked worker was seen
    # spinning for ever in Thread.join under the core's code. Spawned ones start clean.
    with multiprocessing.get_context("spawn").Pool(jobs) as pool:
        yield from pool.imap(job, seeds, chunksize=4)
