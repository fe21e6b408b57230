"""The machine-limit helpers of the benchmark harness (benchmarks/suites/_harness.py) measure
what they say: the loopback pair moves every byte to another process before the clock stops.
No timing is checked."""

from __future__ import annotations

import importlib.util
import math
import pathlib
import sys
from types import ModuleType

import pytest

SUITES = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "suites"
MIB = 1024 * 1024


def load_harness() -> ModuleType:
    name = "benchmark_suites._harness"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SUITES / "_harness.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_loopback_moves_every_byte_to_the_receiver() -> None:
    harness = load_harness()
    mb_s = harness.loopback_mb_s(4 * MIB)
    assert math.isfinite(mb_s) and mb_s > 0


def test_loopback_refuses_less_than_one_chunk() -> None:
    with pytest.raises(AssertionError):
        load_harness().loopback_mb_s(MIB - 1)


def test_percentile_is_nearest_rank() -> None:
    percentile = load_harness().percentile
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 1.0) == 100.0
    assert percentile([7.0], 0.999) == 7.0
