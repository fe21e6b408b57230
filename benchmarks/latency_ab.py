"""A/B of acks=all latency on fresh clusters: this tree against another commit.

    .venv/bin/python benchmarks/latency_ab.py --baseline HEAD~1 --rounds 4 --out /tmp/lat

Theory of operation. The machine is shared and noisy, and the cluster suite's latency point
runs after minutes of load on one long-lived cluster, so a change to the nodes or the
producer is judged here instead: each round runs every tree once, in alternating order, each
in its own process (`suites/_latency_worker.py`) that starts a fresh 3-node cluster running
that tree's code, creates a 3-partition topic, times sequential single records (the idle
round trip) and then paced acks=all load at linger 0 at each `--rates` point (records/s of
1 KiB; 37,000 is about 30% of the acks=all maximum measured here). It prints every run and
then the median of each figure per tree. The baseline is extracted with `git archive` and
given a `raftlog` namespace view (`suites/client.py`'s `baseline_tree`).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence

BENCHMARKS_DIR = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(BENCHMARKS_DIR / "suites")]
from client import baseline_tree  # noqa: E402

WORKER_TIMEOUT_S = 900
CURRENT = "-"


def run_worker(
    tree: str, work: pathlib.Path, rates: str, duration_s: float, sequential: int,
    *, kafka_sequential: int = 0, throughput_mib: int = 0, node_sets: Sequence[str] = (),
) -> dict[str, float]:  # fmt: skip
    argv = [sys.executable, str(BENCHMARKS_DIR / "suites" / "_latency_worker.py"), tree]
    argv += [str(work), rates, str(duration_s), str(sequential)]
    argv += [str(kafka_sequential), str(throughput_mib), *node_sets]
    return json_worker(argv, timeout_s=WORKER_TIMEOUT_S)


def json_worker(argv: list[str], *, timeout_s: float) -> dict[str, float]:
    """Run a worker process; its figures are the last line of its output, as JSON."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"worker {argv} failed:\n{done.stderr[-4000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=pathlib.Path, help="output directory")
    parser.add_argument("--baseline", help="a git revision to run side by side")
    parser.add_argument("--rounds", type=int, default=4, help="runs of every tree")
    parser.add_argument("--rates", default="13000,37000", help="records/s, comma separated")
    parser.add_argument("--duration-s", type=float, default=6.0, help="seconds per rate")
    parser.add_argument("--sequential", type=int, default=300, help="single records, one by one")
    parser.add_argument(
        "--kafka-sequential",
        type=int,
        default=0,
        help="single records one by one through confluent-kafka on the Kafka listener",
    )
    parser.add_argument(
        "--throughput-mib",
        type=int,
        default=0,
        help="MiB of 1 KiB records for the acks=all throughput (the cluster suite's producer)",
    )
    parser.add_argument(
        "--node-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a node setting for both trees (`raftlog serve --set`), e.g. "
        "sync_on_loop_slow_ms=45 to keep syncs on the loop on a slow disk; repeatable",
    )
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.duration_s <= 0:
        parser.error(f"--duration-s must be positive, got {args.duration_s}")
    try:
        if not all(float(rate) > 0 for rate in args.rates.split(",")):
            raise ValueError
    except ValueError:
        parser.error(f"--rates must be positive numbers separated by commas, got {args.rates!r}")
    args.out.mkdir(parents=True, exist_ok=True)
    trees = {"current": CURRENT}
    if args.baseline:
        trees = {"baseline": baseline_tree(args.baseline, args.out), **trees}

    def run(tree: str) -> dict[str, float]:
        return run_worker(
            tree, args.out / "work", args.rates, args.duration_s, args.sequential,
            kafka_sequential=args.kafka_sequential, throughput_mib=args.throughput_mib,
            node_sets=args.node_set,
        )  # fmt: skip

    samples = alternate(trees, args.rounds, run)
    (args.out / "latency-ab.json").write_text(json.dumps(samples, indent=2))
    print_medians(samples)


def alternate(
    trees: dict[str, str], rounds: int, run: Callable[[str], dict[str, float]]
) -> dict[str, list[dict[str, float]]]:
    """Run every tree once per round, the order reversed every other round; print each run."""
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    names = list(trees)
    for round_index in range(rounds):
        for name in names if round_index % 2 == 0 else names[::-1]:
            result = run(trees[name])
            samples[name].append(result)
            shown = " ".join(f"{k}={v:.2f}" for k, v in sorted(result.items()))
            print(f"   round {round_index} {name:>8}: {shown}", flush=True)
    return samples


def print_medians(samples: dict[str, list[dict[str, float]]]) -> None:
    for name, results in samples.items():
        print(f"{name} (medians of {len(results)}):")
        for key in sorted(results[0]):
            values = [r[key] for r in results]
            median, low, high = statistics.median(values), min(values), max(values)
            print(f"   {key:<22} {median:8.2f}  ({low:.2f} - {high:.2f})")


if __name__ == "__main__":
    main()
