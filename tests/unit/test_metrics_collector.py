"""The metrics collector renders a node snapshot; the recorder counts elections from Readys.

Both are pure: a snapshot in, Prometheus text out (parsed back with prometheus_client's own
parser); Readys in, counters out. Reading a live node is the integration test's
(tests/integration/test_metrics.py).
"""

from __future__ import annotations

import dataclasses

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from raftlog.metadata.commands import (
    AddToTransaction,
    AllocateProducerIds,
    InitTransaction,
    PrepareEndTransaction,
)
from raftlog.metadata.transactions import TxnState
from raftlog.metrics.collector import SnapshotCollector
from raftlog.metrics.events import PrometheusRecorder
from raftlog.metrics.snapshot import (
    ConsumerGroupSample,
    FollowerSample,
    NodeSnapshot,
    PartitionSample,
    TransactionsSample,
    transactions_sample,
)
from raftlog.metrics.status import NodeFigures, status_lines
from raftlog.raft.types import Ready, Role, SoftState, VoteRequest
from raftlog.runtime import recorder as metrics
from raftlog.types import NodeId, Offset, PartitionId, Term
from tests.unit.metadata.test_metadata_state import Log, create, register

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _partition(partition: int, *, leader: bool, in_sync: int = 3) -> PartitionSample:
    return PartitionSample(
        topic="orders",
        partition=partition,
        is_leader=leader,
        has_leader=True,
        leader_epoch=4,
        high_watermark=100 + partition,
        log_start_offset=10,
        log_end_offset=105 + partition,
        size_bytes=4096,
        followers=(FollowerSample(NodeId(2), 0), FollowerSample(NodeId(3), 5)) if leader else (),
        replicas=3 if leader else 0,
        in_sync_replicas=in_sync if leader else 0,
    )


def _snapshot(*, controller: bool, partitions: tuple[PartitionSample, ...]) -> NodeSnapshot:
    return NodeSnapshot(
        node_id=NodeId(1),
        is_controller=controller,
        raft_groups=len(partitions) + 1,
        raft_groups_led=sum(p.is_leader for p in partitions),
        raft_groups_awake=1,
        partitions=partitions,
        consumer_groups=(
            ConsumerGroupSample("billing", "orders", 0, 60, 40),
            ConsumerGroupSample("billing", "orders", 7, 3, None),  # not hosted here
        ),
    )


def _render(snapshot: NodeSnapshot) -> Samples:
    registry = CollectorRegistry(auto_describe=False)
    collector = SnapshotCollector()
    registry.register(collector)
    collector.set_snapshot(snapshot)
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _labels(partition: int, **extra: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"topic": "orders", "partition": str(partition), **extra}.items()))


def test_node_gauges_count_under_replicated_and_offline_partitions() -> None:
    offline = PartitionSample(
        topic="orders", partition=9, is_leader=False, has_leader=False, leader_epoch=5,
        high_watermark=0, log_start_offset=0, log_end_offset=0, size_bytes=0,
    )  # fmt: skip
    partitions = (_partition(0, leader=True), _partition(1, leader=True, in_sync=2), offline)
    samples = _render(_snapshot(controller=False, partitions=partitions))
    assert samples[("raftlog_partitions_under_replicated", ())] == 1
    assert samples[("raftlog_partitions_offline", ())] == 1
    assert samples[("raftlog_partitions", ())] == 3
    assert samples[("raftlog_raft_groups", ())] == 4
    assert samples[("raftlog_raft_groups_led", ())] == 2
    assert samples[("raftlog_controller", ())] == 0


def test_every_replica_reports_its_log_and_only_leaders_their_followers() -> None:
    partitions = (_partition(0, leader=True), _partition(1, leader=False))
    samples = _render(_snapshot(controller=False, partitions=partitions))
    for partition in (0, 1):
        labels = _labels(partition)
        assert samples[("raftlog_partition_high_watermark", labels)] == 100 + partition
        assert samples[("raftlog_partition_log_end_offset", labels)] == 105 + partition
        assert samples[("raftlog_partition_log_start_offset", labels)] == 10
        assert samples[("raftlog_partition_log_size_bytes", labels)] == 4096
        assert samples[("raftlog_partition_leader_epoch", labels)] == 4
    assert samples[("raftlog_partition_leader", _labels(0))] == 1
    assert samples[("raftlog_partition_leader", _labels(1))] == 0
    assert samples[("raftlog_partition_in_sync_replicas", _labels(0))] == 3
    assert ("raftlog_partition_in_sync_replicas", _labels(1)) not in samples
    lag = {k: v for k, v in samples.items() if k[0] == "raftlog_partition_follower_lag_offsets"}
    assert lag == {
        ("raftlog_partition_follower_lag_offsets", _labels(0, follower="2")): 0,
        ("raftlog_partition_follower_lag_offsets", _labels(0, follower="3")): 5,
    }


def test_consumer_groups_come_from_the_controller_only() -> None:
    committed = "raftlog_consumer_group_committed_offset"
    lag = "raftlog_consumer_group_lag_offsets"
    hosted = (("group", "billing"), ("partition", "0"), ("topic", "orders"))
    elsewhere = (("group", "billing"), ("partition", "7"), ("topic", "orders"))
    samples = _render(_snapshot(controller=True, partitions=(_partition(0, leader=True),)))
    assert samples[(committed, hosted)] == 60
    assert samples[(lag, hosted)] == 40
    assert samples[(committed, elsewhere)] == 3
    assert (lag, elsewhere) not in samples  # no local high watermark to subtract from
    follower = _render(_snapshot(controller=False, partitions=(_partition(0, leader=True),)))
    assert not [k for k in follower if k[0] in (committed, lag)]


def test_transactions_come_from_the_controller_and_the_lso_lag_from_leaders() -> None:
    open_by_state = (
        (TxnState.ONGOING, 2),
        (TxnState.PREPARE_COMMIT, 1),
        (TxnState.PREPARE_ABORT, 0),
    )
    transactions = TransactionsSample(open_by_state, oldest_open_age_ms=1500)
    led = PartitionSample(
        topic="orders", partition=0, is_leader=True, has_leader=True, leader_epoch=4,
        high_watermark=100, log_start_offset=0, log_end_offset=100, size_bytes=0,
        replicas=3, in_sync_replicas=3, last_stable_offset=97,
    )  # fmt: skip
    partitions = (led, _partition(1, leader=False))
    snapshot = _snapshot(controller=True, partitions=partitions)
    samples = _render(dataclasses.replace(snapshot, transactions=transactions))
    opened = "raftlog_transactions_open"
    assert samples[(opened, (("state", "Ongoing"),))] == 2
    assert samples[(opened, (("state", "PrepareCommit"),))] == 1
    assert samples[(opened, (("state", "PrepareAbort"),))] == 0
    assert samples[("raftlog_transaction_oldest_open_age_seconds", ())] == 1.5
    assert samples[("raftlog_partition_last_stable_offset", _labels(0))] == 97
    assert samples[("raftlog_partition_last_stable_offset_lag_offsets", _labels(0))] == 3
    assert ("raftlog_partition_last_stable_offset_lag_offsets", _labels(1)) not in samples
    follower = _render(_snapshot(controller=False, partitions=partitions))
    assert not [k for k in follower if k[0].startswith("raftlog_transaction")]


def test_the_transactions_sample_counts_open_states_and_the_oldest_age() -> None:
    log = Log()
    log.ok(register(1), register(2), register(3), create("orders"), AllocateProducerIds(10))
    assert transactions_sample(log.state, 5000).oldest_open_age_ms == 0
    orders = (("orders", PartitionId(0)),)
    for index, started_ms in enumerate((100, 300, 700)):
        log.ok(InitTransaction(f"tx{index}", index, 0, 60_000, 0))
        log.ok(AddToTransaction(f"tx{index}", index, 0, orders, (), started_ms))
    log.ok(PrepareEndTransaction("tx0", 0, 0, True, False, 800))
    log.ok(InitTransaction("idle", 3, 0, 60_000, 0))  # Empty: not open
    sample = transactions_sample(log.state, 5000)
    assert sample.open_by_state == (
        (TxnState.ONGOING, 2), (TxnState.PREPARE_COMMIT, 1), (TxnState.PREPARE_ABORT, 0)
    )  # fmt: skip
    assert sample.oldest_open_age_ms == 4900  # tx0, decided but not complete, is still open


def test_transaction_outcomes_are_counted() -> None:
    registry = CollectorRegistry(auto_describe=False)
    recorder = PrometheusRecorder(registry)
    recorder.on_transaction_completed(commit=True)
    recorder.on_transaction_completed(commit=False)
    recorder.on_transaction_completed(commit=False)
    recorder.on_transaction_timed_out()
    counted = {
        outcome: registry.get_sample_value(f"raftlog_transactions_{outcome}_total")
        for outcome in ("committed", "aborted", "timed_out")
    }
    assert counted == {"committed": 1, "aborted": 2, "timed_out": 1}


def test_nothing_is_rendered_before_the_first_snapshot() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector())
    assert generate_latest(registry) == b""


def _vote(*, transfer: bool) -> VoteRequest:
    return VoteRequest(Term(3), NodeId(1), NodeId(2), Offset(9), Term(2), transfer=transfer)


def _counts(recorder: PrometheusRecorder) -> tuple[float, float, float]:
    return (
        recorder.elections_started._value.get(),
        recorder.elections_won._value.get(),
        recorder.leadership_transfers._value.get(),
    )


def test_elections_and_transfers_are_derived_from_soft_states() -> None:
    recorder = PrometheusRecorder(CollectorRegistry(auto_describe=False))
    candidate = SoftState(leader_id=None, role=Role.CANDIDATE, term=Term(3))
    recorder.on_ready(Ready(soft_state=candidate, messages=(_vote(transfer=False),)))
    assert _counts(recorder) == (1, 0, 0)
    recorder.on_ready(Ready(soft_state=candidate, persisted_messages=(_vote(transfer=True),)))
    assert _counts(recorder) == (2, 0, 1)
    leader = SoftState(leader_id=NodeId(1), role=Role.LEADER, term=Term(3))
    recorder.on_ready(Ready(soft_state=leader))
    assert _counts(recorder) == (2, 1, 1)
    for role in (Role.FOLLOWER, Role.PRE_CANDIDATE, Role.LEARNER):
        recorder.on_ready(Ready(soft_state=SoftState(leader_id=None, role=role, term=Term(4))))
    recorder.on_ready(Ready())
    assert _counts(recorder) == (2, 1, 1)


def test_requests_are_counted_by_protocol_api_and_code() -> None:
    registry = CollectorRegistry(auto_describe=False)
    recorder = PrometheusRecorder(registry)
    previous = metrics.install(recorder)
    try:
        metrics.recorder().record_request(
            protocol="kafka", api="Produce", error_code=6, seconds=0.002
        )
        metrics.recorder().record_request(
            protocol="kafka", api="Produce", error_code=0, seconds=0.5
        )
    finally:
        assert metrics.install(previous) is recorder
    assert type(metrics.recorder()) is metrics.Recorder  # the no-op default is back
    labels = {"protocol": "kafka", "api": "Produce"}
    get = registry.get_sample_value
    assert get("raftlog_requests_total", {**labels, "code": "6"}) == 1
    assert get("raftlog_requests_total", {**labels, "code": "0"}) == 1
    assert get("raftlog_request_duration_seconds_count", labels) == 2
    assert get("raftlog_request_duration_seconds_bucket", {**labels, "le": "0.0025"}) == 1


def test_cluster_status_lines_sum_leaders_and_subtract_the_highest_high_watermark() -> None:
    nodes = [
        NodeFigures(1, under_replicated=2, offline=0, high_watermarks={("orders", 0): 50}),
        NodeFigures(
            2,
            under_replicated=1,
            offline=1,
            is_controller=True,
            consumer_groups={("billing", "orders", 0): 30, ("billing", "orders", 9): 1},
            high_watermarks={("orders", 0): 48},
        ),
        NodeFigures(3, error="metrics at 127.0.0.1:1 unreachable: refused"),
    ]
    assert status_lines(nodes) == [
        "replication: 3 under-replicated partitions (counted by their leaders), 1 offline "
        "(most replicas without a leader on one node)",
        "  node 1: 2 under-replicated, 0 without a leader",
        "  node 2: 1 under-replicated, 1 without a leader",
        "  node 3: metrics at 127.0.0.1:1 unreachable: refused",
        "consumer groups (from controller node 2):",
        "  billing orders-0: committed 30 lag 20",
        "  billing orders-9: committed 1 lag ?",
    ]
