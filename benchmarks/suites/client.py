"""Benchmark: the producer's CPU per record against a real 3-node cluster.

Theory of operation. One Python producer process cannot reach the produce goals when its own
work per record eats the CPU the nodes need (2 cores, the nodes beside it), so this suite
measures the client's cost directly: process CPU seconds (every thread: the caller's and the
sender's share one GIL, so moving work between them saves nothing) divided by records sent,
acks=all, the cluster suite's producer settings (`cluster.produce`), for 100-byte and
1 KiB records. Each run is its own process (`_client_worker.py`), so no run warms another's
caches or leaves threads behind.

Metrics (medians over the runs; `_min`/`_max` give the range):
- `client_cpu_us_per_record_100b`, `client_cpu_us_per_record_1kib`;
- `client_records_s_100b`, `client_mb_s_1kib`: throughput of the same runs (noisier: the
  nodes share the machine).

A/B against another commit (the way to judge a client change; the machine is shared, so the
two versions alternate in one run against one cluster and medians are compared):

    .venv/bin/python benchmarks/suites/client.py --baseline HEAD~3 --runs 5 --out /tmp/ab

extracts that commit with `git archive` into the output folder, builds its `raftlog`
namespace view (its own `tools/typecheck_view.py`) and runs its producer from there.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile

from raftlog.client import Admin

SUITES_DIR = pathlib.Path(__file__).resolve().parent
REPO_DIR = SUITES_DIR.parent.parent
sys.path[:0] = [str(SUITES_DIR)]
from _harness import KIB, MIB, create_topic, running_cluster  # noqa: E402

TOPIC = "client-cpu"
PARTITIONS = 3
# Record size -> (metric suffix, bytes per run): about 100k records of 100 B and 64k of 1 KiB.
SHAPES = {100: ("100b", 10 * MIB), KIB: ("1kib", 64 * MIB)}
WORKER_TIMEOUT_S = 600
CURRENT = "-"  # the worker's name for the installed tree


def run_worker(tree: str, bootstrap: str, record_bytes: int, total_bytes: int) -> dict[str, float]:
    argv = [sys.executable, str(SUITES_DIR / "_client_worker.py"), tree, bootstrap, TOPIC]
    argv += [str(record_bytes), str(total_bytes)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"client worker {argv} failed:\n{done.stderr[-4000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["records"] > 0, result
    return result


def baseline_tree(revision: str, out_dir: pathlib.Path) -> str:
    """A `raftlog` namespace view of `revision`, built from `git archive` under `out_dir`."""
    source = out_dir / "baseline-src"
    shutil.rmtree(source, ignore_errors=True)
    with tempfile.TemporaryFile() as archive:
        subprocess.run(
            ["git", "-C", str(REPO_DIR), "archive", revision], stdout=archive, check=True
        )
        archive.seek(0)
        with tarfile.open(fileobj=archive) as tar:
            tar.extractall(source, filter="data")
    view = source / "build" / "view"
    subprocess.run(
        [sys.executable, str(source / "tools" / "typecheck_view.py"), str(view)], check=True
    )
    return str(view)


def measure(
    bootstrap: str, trees: dict[str, str], *, runs: int
) -> dict[str, dict[int, list[dict[str, float]]]]:
    """`runs` rounds; in each every tree runs every shape, trees alternating in turn."""
    samples: dict[str, dict[int, list[dict[str, float]]]] = {
        name: {size: [] for size in SHAPES} for name in trees
    }
    names = list(trees)
    for round_index in range(runs):
        order = names if round_index % 2 == 0 else names[::-1]
        for record_bytes, (_, total_bytes) in SHAPES.items():
            for name in order:
                result = run_worker(trees[name], bootstrap, record_bytes, total_bytes)
                samples[name][record_bytes].append(result)
                print(f"   {name:>8} {record_bytes:>5} B: {describe(result)}", flush=True)
    return samples


def describe(result: dict[str, float]) -> str:
    us = result["cpu_s"] / result["records"] * 1e6
    records_s = result["records"] / result["elapsed_s"]
    mb_s = result["value_bytes"] / result["elapsed_s"] / 1e6
    return f"{us:6.2f} us/record CPU, {records_s:9.0f} records/s, {mb_s:6.1f} MB/s"


def summarize(samples: dict[int, list[dict[str, float]]], prefix: str = "") -> dict[str, float]:
    metrics: dict[str, float] = {}
    for record_bytes, results in samples.items():
        suffix = SHAPES[record_bytes][0]
        cpu_us = [r["cpu_s"] / r["records"] * 1e6 for r in results]
        if record_bytes < KIB:
            rate_name, rates = "records_s", [r["records"] / r["elapsed_s"] for r in results]
        else:
            rate_name, rates = "mb_s", [r["value_bytes"] / r["elapsed_s"] / 1e6 for r in results]
        for name, values in (
            (f"cpu_us_per_record_{suffix}", cpu_us),
            (f"{rate_name}_{suffix}", rates),
        ):
            metrics[f"{prefix}client_{name}"] = statistics.median(values)
            metrics[f"{prefix}client_{name}_min"] = min(values)
            metrics[f"{prefix}client_{name}_max"] = max(values)
    return metrics


def measure_trees(out_dir: pathlib.Path, trees: dict[str, str], *, runs: int) -> dict[str, float]:
    with running_cluster(out_dir / "client-work") as cluster, Admin(cluster.bootstrap) as admin:
        create_topic(admin, TOPIC, partitions=PARTITIONS)
        samples = measure(cluster.bootstrap, trees, runs=runs)
    metrics: dict[str, float] = {}
    for name in trees:
        metrics.update(summarize(samples[name], prefix="" if name == "current" else f"{name}_"))
    return metrics


def run(out_dir: pathlib.Path, *, quick: bool) -> dict[str, float]:
    return measure_trees(out_dir, {"current": CURRENT}, runs=3 if quick else 5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=pathlib.Path, help="output directory")
    parser.add_argument("--baseline", help="a git revision to run side by side (A/B)")
    parser.add_argument("--runs", type=int, default=5, help="rounds of every shape and tree")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, got {args.runs}")
    args.out.mkdir(parents=True, exist_ok=True)
    trees = {"current": CURRENT}
    if args.baseline:
        trees = {"baseline": baseline_tree(args.baseline, args.out), **trees}
    metrics = measure_trees(args.out, trees, runs=args.runs)
    for name, value in sorted(metrics.items()):
        print(f"{name:<45} {value:12.2f}")


if __name__ == "__main__":
    main()
