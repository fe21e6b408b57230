"""The latency suite's breakdown arithmetic: the nodes' produce-stage histograms
(`raftlog_produce_stage_duration_seconds{protocol,stage}`, raftlog.runtime.produce_trace)
scraped before and after a run, summed over the nodes, subtracted, and read as mean and
quantiles per stage. Pure functions over the Prometheus text format, so a unit test checks
them without a cluster (tests/unit/test_latency_breakdown.py)."""

from __future__ import annotations

import math
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

STAGE_METRIC = "raftlog_produce_stage_duration_seconds"
SCRAPE_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class StageHistogram:
    """One stage's cumulative bucket counts (by upper bound, seconds), sum and count."""

    buckets: tuple[tuple[float, float], ...]
    sum_s: float
    count: float

    def minus(self, earlier: StageHistogram) -> StageHistogram:
        assert [b for b, _ in self.buckets] == [b for b, _ in earlier.buckets]
        buckets = tuple(
            (bound, now - then)
            for (bound, now), (_, then) in zip(self.buckets, earlier.buckets, strict=True)
        )
        return StageHistogram(buckets, self.sum_s - earlier.sum_s, self.count - earlier.count)

    def plus(self, other: StageHistogram) -> StageHistogram:
        if not self.buckets:
            return other
        buckets = tuple(
            (bound, a + b) for (bound, a), (_, b) in zip(self.buckets, other.buckets, strict=True)
        )
        return StageHistogram(buckets, self.sum_s + other.sum_s, self.count + other.count)

    def mean_s(self) -> float:
        return self.sum_s / self.count if self.count else math.nan

    def quantile_s(self, fraction: float) -> float:
        """Prometheus's histogram_quantile: linear inside the bucket that holds the rank."""
        assert 0 < fraction < 1, fraction
        if not self.count:
            return math.nan
        rank = fraction * self.count
        lower_bound, lower_count = 0.0, 0.0
        for bound, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(bound):
                    return lower_bound  # past the last finite bucket: its bound, as Prometheus
                inside = cumulative - lower_count
                return lower_bound + (bound - lower_bound) * (rank - lower_count) / inside
            lower_bound, lower_count = bound, cumulative
        return lower_bound


EMPTY = StageHistogram((), 0.0, 0.0)
Stages = dict[tuple[str, str], StageHistogram]  # (protocol, stage) -> histogram


def parse_stages(text: str) -> Stages:
    """The stage histograms in one scrape's text."""
    found: dict[tuple[str, str], dict[str, object]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != STAGE_METRIC:
            continue
        for sample in family.samples:
            key = (sample.labels["protocol"], sample.labels["stage"])
            entry = found.setdefault(key, {"buckets": []})
            if sample.name.endswith("_bucket"):
                entry["buckets"].append((float(sample.labels["le"]), sample.value))  # type: ignore[attr-defined]
            elif sample.name.endswith("_sum"):
                entry["sum"] = sample.value
            elif sample.name.endswith("_count"):
                entry["count"] = sample.value
    return {
        key: StageHistogram(
            tuple(sorted(entry["buckets"])),  # type: ignore[call-overload]
            float(entry["sum"]),  # type: ignore[arg-type]
            float(entry["count"]),  # type: ignore[arg-type]
        )
        for key, entry in found.items()
    }


def add_nodes(scrapes: Iterable[Stages]) -> Stages:
    """The histograms of every node added up (only the partition leader records any)."""
    total: Stages = {}
    for stages in scrapes:
        for key, histogram in stages.items():
            total[key] = total.get(key, EMPTY).plus(histogram)
    return total


def delta(after: Stages, before: Stages) -> Stages:
    return {key: h.minus(before[key]) if key in before else h for key, h in after.items()}


def scrape_stages(metrics_addresses: Iterable[str]) -> Stages:
    """Every node's stage histograms, added up."""
    texts = []
    for address in metrics_addresses:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=SCRAPE_TIMEOUT_S) as r:
            texts.append(r.read().decode())
    return add_nodes(parse_stages(text) for text in texts)


def breakdown_rows(
    stages: Stages, protocol: str, order: Iterable[str]
) -> list[tuple[str, float, float, float, float]]:
    """(stage, samples, mean ms, p50 ms, p99 ms) per stage of `protocol`, in `order`."""
    rows = []
    for stage in order:
        h = stages.get((protocol, stage))
        if h is None or not h.count:
            continue
        rows.append(
            (stage, h.count, h.mean_s() * 1e3, h.quantile_s(0.5) * 1e3, h.quantile_s(0.99) * 1e3)
        )
    return rows
