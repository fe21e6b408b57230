"""Run benchmark suites, print a table and write DIR/results.json.

    python benchmarks/run.py --suite storage --out DIR    # one suite (benchmarks/suites/storage.py)
    python benchmarks/run.py --suite quick --out DIR      # every suite, quick=True
    python benchmarks/run.py --suite full --out DIR       # every suite, quick=False
    python benchmarks/run.py --suite latency --quick --out DIR   # one suite, quick=True

A suite is a module `benchmarks/suites/<name>.py` exposing
`run(out_dir: pathlib.Path, *, quick: bool) -> dict[str, float]`. results.json is one flat
JSON object, metric name -> number; when two suites report the same name, the later one is
written as `<suite>.<metric>`. A suite that raises is reported and makes the exit status 1,
but the others still run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import sys
import time
import traceback
from collections.abc import Callable
from types import ModuleType

SUITES_DIR = pathlib.Path(__file__).resolve().parent / "suites"
SuiteRun = Callable[..., dict[str, float]]


def discover() -> dict[str, pathlib.Path]:
    return {p.stem: p for p in sorted(SUITES_DIR.glob("*.py")) if not p.stem.startswith("_")}


def load(name: str, path: pathlib.Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"benchmark_suites.{name}", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def run_suite(
    name: str, path: pathlib.Path, out_dir: pathlib.Path, quick: bool
) -> dict[str, float]:
    print(f"== suite {name} (quick={quick})", flush=True)
    started = time.perf_counter()
    run: SuiteRun = load(name, path).run
    metrics = run(out_dir, quick=quick)
    assert all(isinstance(v, int | float) for v in metrics.values()), metrics
    print(f"== suite {name} done in {time.perf_counter() - started:.1f} s", flush=True)
    return {k: float(v) for k, v in metrics.items()}


def print_table(rows: list[tuple[str, str, float]]) -> None:
    width = max((len(metric) for _, metric, _ in rows), default=6)
    print(f"\n{'suite':<12} {'metric':<{width}} {'value':>14}")
    for suite, metric, value in rows:
        print(f"{suite:<12} {metric:<{width}} {value:>14.4g}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", required=True, help="a suite name, 'quick' or 'full'")
    parser.add_argument("--out", required=True, type=pathlib.Path, help="output directory")
    parser.add_argument("--quick", action="store_true", help="a named suite at its quick size")
    args = parser.parse_args(argv)
    suites = discover()
    args.suite = args.suite.replace("-", "_")  # scale-pressure is suites/scale_pressure.py
    if args.suite in ("quick", "full"):
        chosen, quick = list(suites), args.suite == "quick"
    elif args.suite in suites:
        chosen, quick = [args.suite], args.quick
    else:
        parser.error(f"unknown suite {args.suite!r}; known: {', '.join(suites)}, quick, full")
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, float] = {}
    rows: list[tuple[str, str, float]] = []
    failed = []
    for name in chosen:
        try:
            metrics = run_suite(name, suites[name], args.out, quick)
        except Exception:
            traceback.print_exc()
            failed.append(name)
            continue
        for metric, value in metrics.items():
            key = metric if metric not in results else f"{name}.{metric}"
            results[key] = value
            rows.append((name, key, value))
    (args.out / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print_table(rows)
    print(f"\nwrote {args.out / 'results.json'}")
    if failed:
        print(f"FAILED suites: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
