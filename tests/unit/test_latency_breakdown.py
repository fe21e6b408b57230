"""The latency suite's breakdown arithmetic (benchmarks/suites/_stages.py): stage histograms
parsed from the nodes' exposition text, added over the nodes, subtracted over a run, and
read as a mean and as Prometheus's histogram_quantile would. The suite's cluster runs are
too slow for the test run (~50 s quick); this checks what it computes from them."""

from __future__ import annotations

import importlib.util
import math
import pathlib
import sys
from types import ModuleType

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from raftlog.metrics.events import PrometheusRecorder
from raftlog.runtime.produce_trace import STAGES

SUITES = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "suites"


def _load_stages() -> ModuleType:
    name = "benchmark_suites._stages"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SUITES / "_stages.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _node_text(samples: list[tuple[str, float]]) -> str:
    """A node's exposition text after it recorded `samples` (protocol, seconds for every
    stage)."""
    registry = CollectorRegistry(auto_describe=False)
    recorder = PrometheusRecorder(registry)
    for protocol, seconds in samples:
        recorder.on_produce_stages(protocol, [seconds] * len(STAGES))
    return generate_latest(registry).decode()


def test_a_run_is_the_difference_of_two_scrapes_added_over_the_nodes() -> None:
    stages = _load_stages()
    before = stages.add_nodes(
        [stages.parse_stages(_node_text([("grpc", 0.5)])), stages.parse_stages(_node_text([]))]
    )
    leader = [("grpc", 0.5), ("grpc", 0.0015), ("grpc", 0.0015), ("kafka", 0.003)]
    other = [("grpc", 0.0015), ("grpc", 0.004)]
    after = stages.add_nodes(
        [stages.parse_stages(_node_text(leader)), stages.parse_stages(_node_text(other))]
    )
    run = stages.delta(after, before)
    grpc_total = run[("grpc", "total")]
    assert grpc_total.count == 4
    assert grpc_total.mean_s() == pytest.approx((3 * 0.0015 + 0.004) / 4)
    # Three samples in (0.001, 0.002], one in (0.002, 0.005]: the median's rank 2 lies 2/3
    # into the first of those buckets, the p99's rank 3.96 near the top of the second.
    assert grpc_total.quantile_s(0.5) == pytest.approx(0.001 + 0.001 * 2 / 3)
    assert grpc_total.quantile_s(0.99) == pytest.approx(0.002 + 0.003 * 0.96)
    assert run[("kafka", "queue")].count == 1
    rows = stages.breakdown_rows(run, "grpc", STAGES)
    assert [row[0] for row in rows] == list(STAGES)
    assert rows[0][1] == 4 and rows[0][2] == pytest.approx(grpc_total.mean_s() * 1e3)


def test_an_empty_run_has_no_figures() -> None:
    stages = _load_stages()
    text = stages.parse_stages(_node_text([("grpc", 0.001)]))
    run = stages.delta(text, text)
    assert run[("grpc", "total")].count == 0
    assert math.isnan(run[("grpc", "total")].mean_s())
    assert stages.breakdown_rows(run, "grpc", STAGES) == []
