"""Benchmark suites: each module here exposes `run(out_dir, *, quick) -> dict[str, float]`.

`benchmarks/run.py` discovers them by file name; a suite returns a flat mapping of metric
name (units last: `_mb_s`, `_s`, ratios named `_vs_`) to number, measured side by side in
one run so ratios compare like with like.
"""
