"""Run the chaos suite's network-nemesis run over many seeds, optionally beside a CPU hog.

A run that fails only on a busy machine has found a bug: this is how to look for one. Each
seed is one `raftlog chaos run` (local backend, 3 nodes, kill/partition/pause/flaky) in its
own process; the summary prints, per client, the runs that were valid and the anomaly
counts summed over all runs, and saves them as JSON.

    python tools/chaos_sweep.py --seeds 1-50 --client grpc,kafka --hog --out sweep-out
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

NEMESES = "kill,partition,pause,flaky"


def _seeds(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


@contextlib.contextmanager
def cpu_hog(enabled: bool) -> Iterator[None]:
    """One process spinning on one core for as long as the block runs."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if enabled else None
    try:
        yield
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()


def run_one(client: str, seed: int, duration_s: float, out: Path) -> dict[str, Any]:
    command = [sys.executable, "-m", "raftlog", "chaos", "run", "--backend", "local"]
    command += ["--nodes", "3", "--nemesis", NEMESES, "--client", client]
    command += ["--duration", str(duration_s), "--seed", str(seed), "--out", str(out)]
    started = time.monotonic()
    finished = subprocess.run(command, capture_output=True, text=True, check=False)
    results_file = out / "results.json"
    if not results_file.exists():
        return {"seed": seed, "valid": False, "error": finished.stderr[-2000:], "anomalies": {}}
    results = json.loads(results_file.read_text())
    return {
        "seed": seed,
        "valid": bool(results["valid"]) and finished.returncode == 0,
        "anomalies": results.get("anomaly_counts", {}),
        "sends_ok": results["availability"]["operations"]["send"]["ok"],
        "wall_s": round(time.monotonic() - started, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=_seeds, default=_seeds("1-50"))
    parser.add_argument("--client", default="grpc,kafka", help="grpc, kafka or both")
    parser.add_argument("--duration", type=float, default=25.0, help="seconds of faults")
    parser.add_argument("--hog", action="store_true", help="a one-core CPU hog beside")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"hog": args.hog, "duration_s": args.duration, "clients": {}}
    with cpu_hog(args.hog):
        for client in args.client.split(","):
            runs = []
            for seed in args.seeds:
                run = run_one(client, seed, args.duration, args.out / f"{client}-{seed}")
                runs.append(run)
                print(json.dumps({"client": client, **run}), flush=True)
            anomalies: Counter[str] = Counter()
            for run in runs:
                anomalies.update(run["anomalies"])
            summary["clients"][client] = {
                "runs": len(runs),
                "valid": sum(run["valid"] for run in runs),
                "invalid_seeds": [run["seed"] for run in runs if not run["valid"]],
                "anomaly_counts": dict(anomalies),
                "runs_detail": runs,
            }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    for client, result in summary["clients"].items():
        print(
            f"{client}: {result['valid']}/{result['runs']} valid; anomalies "
            f"{result['anomaly_counts'] or 'none'}; invalid seeds {result['invalid_seeds']}"
        )
    return 0 if all(r["valid"] == r["runs"] for r in summary["clients"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
