"""The recorder that turns the node's events into `prometheus_client` counters and histograms.

Every metric here has a fixed label set or none: requests are labelled by protocol, API
(the gRPC method or Kafka request name, a fixed set per protocol) and outcome code, never by
client, topic or partition, so the series stay bounded whatever the load.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.metrics_core import HistogramMetricFamily

from raftlog.raft.types import Ready, Role, VoteRequest
from raftlog.runtime.produce_trace import STAGES
from raftlog.runtime.recorder import Recorder

__all__ = ["ProduceStageHistograms", "PrometheusRecorder"]

# Seconds. Flushes: a page-cache write and an fdatasync, 0.1 ms on fast NVMe to seconds
# on a stalled disk; requests: a metadata read to a produce that waits out its timeout.
FLUSH_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                   0.5, 1.0, 2.5)  # fmt: skip
REQUEST_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                     2.5, 5.0, 10.0, 30.0)  # fmt: skip
# Produce stages: from a few microseconds of bookkeeping to a leader's fsync on a stalled disk;
# finer than REQUEST_BUCKETS_S below a millisecond, where most stages lie.
STAGE_BUCKETS_S = (0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02,
                   0.05, 0.1, 0.25, 0.5, 1.0, 2.5)  # fmt: skip
# raftlog_transactions_<outcome>_total, counted by the coordinator (the controller).
TRANSACTION_COUNTERS = (
    ("committed", "Transactions this node as coordinator completed with a commit"),
    ("aborted", "Transactions this node as coordinator completed with an abort (timeouts too)"),
    ("timed_out", "Transactions this node as coordinator aborted for passing their timeout"),
)  # fmt: skip
LOOP_LAG_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class PrometheusRecorder(Recorder):
    traces_produce = True

    def __init__(self, registry: CollectorRegistry) -> None:
        self.elections_started = Counter(
            "raftlog_raft_elections_started",
            "Elections this node started as a candidate (Raft §5.2; pre-votes not counted)",
            registry=registry,
        )
        self.elections_won = Counter(
            "raftlog_raft_elections_won",
            "Elections this node won: times it became leader of a Raft group",
            registry=registry,
        )
        self.leadership_transfers = Counter(
            "raftlog_raft_leadership_transfers",
            "Leaderships this node took over at the leader's request (TimeoutNow, Raft §3.10)",
            registry=registry,
        )
        self.flush_seconds = Histogram(
            "raftlog_log_flush_duration_seconds",
            "One group commit: write and fsync of every log a pass appended to",
            buckets=FLUSH_BUCKETS_S,
            registry=registry,
        )
        self.appended_bytes = Counter(
            "raftlog_log_appended_bytes",
            "Batch bytes written and fsynced to the logs of this node's replicas",
            registry=registry,
        )
        self.produced_bytes = Counter(
            "raftlog_produce_bytes",
            "Batch bytes of produce requests answered by this node as partition leader",
            registry=registry,
        )
        self.fetched_bytes = Counter(
            "raftlog_fetch_bytes",
            "Batch bytes returned by fetches from this node",
            registry=registry,
        )
        self.loop_lag_seconds = Histogram(
            "raftlog_event_loop_lag_seconds",
            "How late the event loop ran a periodic timer (time the loop was busy elsewhere)",
            buckets=LOOP_LAG_BUCKETS_S,
            registry=registry,
        )
        self.requests = Counter(
            "raftlog_requests",
            "Requests answered, by protocol, API and outcome code",
            ("protocol", "api", "code"),
            registry=registry,
        )
        self.request_seconds = Histogram(
            "raftlog_request_duration_seconds",
            "Time to answer a request, by protocol and API",
            ("protocol", "api"),
            buckets=REQUEST_BUCKETS_S,
            registry=registry,
        )
        self.transactions = {
            outcome: Counter(f"raftlog_transactions_{outcome}", documentation, registry=registry)
            for outcome, documentation in TRANSACTION_COUNTERS
        }

        self.produce_stages = ProduceStageHistograms()
        registry.register(self.produce_stages)

    def on_log_flush(self, size_bytes: int, seconds: float) -> None:
        self.flush_seconds.observe(seconds)
        self.appended_bytes.inc(size_bytes)

    def on_ready(self, ready: Ready) -> None:
        soft_state = ready.soft_state
        if soft_state is None:
            return
        if soft_state.role is Role.LEADER:
            self.elections_won.inc()
        elif soft_state.role is Role.CANDIDATE:
            # A soft state is reported when it changed: a candidate's is a new term, so a
            # new election. One asked for by a leader's TimeoutNow sends transfer votes.
            self.elections_started.inc()
            messages = (*ready.messages, *ready.persisted_messages)
            if any(isinstance(m, VoteRequest) and m.transfer for m in messages):
                self.leadership_transfers.inc()

    def on_produce(self, size_bytes: int) -> None:
        self.produced_bytes.inc(size_bytes)

    def on_fetch(self, size_bytes: int) -> None:
        self.fetched_bytes.inc(size_bytes)

    def on_loop_lag(self, seconds: float) -> None:
        self.loop_lag_seconds.observe(seconds)

    def on_produce_stages(self, protocol: str, seconds: Sequence[float]) -> None:
        self.produce_stages.observe(protocol, seconds)

    def on_transaction_completed(self, *, commit: bool) -> None:
        self.transactions["committed" if commit else "aborted"].inc()

    def on_transaction_timed_out(self) -> None:
        self.transactions["timed_out"].inc()

    def record_request(
        self, *, protocol: str, api: str, error_code: int | str, seconds: float
    ) -> None:
        assert seconds >= 0, seconds
        self.requests.labels(protocol, api, str(error_code)).inc()
        self.request_seconds.labels(protocol, api).observe(seconds)


class ProduceStageHistograms:
    """`raftlog_produce_stage_duration_seconds{protocol,stage}`, kept by hand.

    Ten observations a produce through `prometheus_client.Histogram` cost ~40 us here (a
    lock and a linear bucket walk each); these are plain counts bumped on the event loop
    (a bisect and two additions a stage, ~5 us a produce in all), read by a scrape as a
    collector. A scrape renders on a worker thread while the loop may add a sample: a
    sample can then show in a bucket before the count, one scrape only.
    """

    name = "raftlog_produce_stage_duration_seconds"
    documentation = (
        "Where a produce request's time goes on its partition leader, one sample per batch: "
        "stage by stage (raftlog.runtime.produce_trace), by protocol"
    )

    def __init__(self) -> None:
        # protocol -> per stage: counts per bucket of STAGE_BUCKETS_S, then +Inf, then the sum.
        self._rows: dict[str, list[list[float]]] = {}

    def observe(self, protocol: str, seconds: Sequence[float]) -> None:
        rows = self._rows.get(protocol)
        if rows is None:
            rows = [[0.0] * (len(STAGE_BUCKETS_S) + 2) for _ in STAGES]
            self._rows[protocol] = rows
        assert len(seconds) == len(rows), seconds
        bounds = STAGE_BUCKETS_S
        for row, value in zip(rows, seconds, strict=True):
            # Prometheus buckets are upper bounds, inclusive: the first bound >= value.
            row[bisect.bisect_left(bounds, value)] += 1
            row[-1] += value

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=("protocol", "stage"))
        for protocol, rows in list(self._rows.items()):
            for stage, row in zip(STAGES, rows, strict=True):
                counts, sum_s = row[:-1], row[-1]
                cumulative, buckets = 0.0, []
                for bound, count in zip((*STAGE_BUCKETS_S, float("inf")), counts, strict=True):
                    cumulative += count
                    buckets.append((_bound_text(bound), cumulative))
                family.add_metric((protocol, stage), buckets, sum_s)
        yield family

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=("protocol", "stage"))


def _bound_text(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)
