"""`python -m raftlog.sim`: run deterministic simulator seeds against the real Raft core.

    python -m raftlog.sim --seed 42 -v          one seed, options printed first, live trace
    python -m raftlog.sim --seeds 1-2000        the CI default, 3 and 5 nodes alternating
    python -m raftlog.sim --seeds 1-100000 --jobs 8 --quiet   a long campaign
    python -m raftlog.sim --bug commit-old-term --seeds 1-200 --first-failure
    python -m raftlog.sim --list-bugs

Exit status 0 only when every seed passed. A failing seed prints its options, the violated
invariant, the last events and every node's state; rerunning that seed replays it exactly.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

from raftlog.config import PLANTED_BUGS
from raftlog.errors import ConfigError
from raftlog.sim.options import PROFILES, parse_seed_range
from raftlog.sim.runner import DEFAULT_STEPS, run_seed, run_seeds

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m raftlog.sim",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--seed", type=int, help="run one seed and print its report")
    which.add_argument("--seeds", default="1-2000", help="a range A-B (default 1-2000)")
    parser.add_argument(
        "--nodes",
        type=int,
        choices=(3, 5),
        help="cluster size (default: 5 for even seeds, 3 for odd)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=DEFAULT_STEPS,
        help=f"chaos steps per seed before healing (default {DEFAULT_STEPS})",
    )
    parser.add_argument(
        "--bug",
        action="append",
        default=[],
        choices=sorted(PLANTED_BUGS),
        help="switch on a planted bug in the core (repeatable)",
    )
    parser.add_argument(
        "--end-to-end",
        action="store_true",
        help="skip the protocol-rule checks (durable replies, current-term commit): only "
        "end-to-end invariants decide",
    )
    parser.add_argument(
        "--profile",
        choices=PROFILES,
        help="force a fault profile (default: drawn from each seed)",
    )
    parser.add_argument("--list-bugs", action="store_true", help="list the planted bugs")
    parser.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="worker processes for a seed range (default: all cores)",
    )
    parser.add_argument(
        "--first-failure", action="store_true", help="stop a seed range at its first failing seed"
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="live trace (one seed) or full reports of failing seeds",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="summary and failures only")
    return parser


def _run_one(seed: int, args: argparse.Namespace) -> int:
    result = run_seed(
        seed,
        nodes=args.nodes,
        steps=args.steps,
        bugs=frozenset(args.bug),
        protocol_checks=not args.end_to_end,
        profile=args.profile,
        verbose=args.verbose,
        out=sys.stdout,
    )
    print(result.report())
    return 0 if result.ok else 1


def _run_range(seeds: range, args: argparse.Namespace) -> int:
    started = time.perf_counter()
    failed: list[int] = []
    ran = 0
    for result in run_seeds(
        seeds,
        nodes=args.nodes,
        steps=args.steps,
        bugs=frozenset(args.bug),
        protocol_checks=not args.end_to_end,
        profile=args.profile,
        jobs=max(1, args.jobs),
    ):
        ran += 1
        if not result.ok:
            failed.append(result.seed)
            print(result.report() if args.verbose else result.summary(), flush=True)
            if args.first_failure:
                break
        elif not args.quiet and ran % 500 == 0:
            print(f"... {ran} seeds, {len(failed)} failed", flush=True)
    elapsed_seconds = time.perf_counter() - started
    print(
        f"{ran} seeds ({seeds.start}-{seeds.start + ran - 1}): {ran - len(failed)} passed, "
        f"{len(failed)} failed in {elapsed_seconds:.1f} s "
        f"({ran / max(elapsed_seconds, 1e-9):.1f} seeds/s)"
        + (f"; failing seeds: {' '.join(map(str, failed[:50]))}" if failed else "")
    )
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.list_bugs:
        for name, description in sorted(PLANTED_BUGS.items()):
            print(f"{name:22s} {description}")
        return 0
    try:
        if args.seed is not None:
            return _run_one(args.seed, args)
        return _run_range(parse_seed_range(args.seeds), args)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
