"""Transactions under SIGKILL, and the transaction metrics that show them, on one real 3-node
cluster (started with --chaos for the marker hold) and confluent-kafka clients.

- Metrics: an open transaction shows in the coordinator's gauges and in its partitions' LSO
  lag; a commit, an abort and a timeout move the counters; promtool accepts the exposition.
- SIGKILL of a partition's leader (never the controller, so it is the partition that fails,
  not the coordinator) (a) after the transaction produced to it and before EndTxn, and (b)
  after PrepareCommit and before its marker (held by the `hold_txn_markers` fault rule, so
  the kill lands there every time): the transaction ends committed on all its partitions or
  aborted on all, as read_committed and read_uncommitted readers see, and the producer learns
  which.
- A consume-transform-produce worker (tests/kafka/txn_transformer.py) killed with SIGKILL
  inside a transaction and restarted: output equals input, no duplicate, no loss.

A kill test first restarts any node an earlier one killed and waits for leadership to be back
on the preferred replicas. The longer runs (more rounds, aborts too, several kills of the
worker) are soak.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime
import importlib
import json
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from kio.schema.errors import ErrorCode
from kio.static.primitive import i8, i32, i32Timedelta

from raftlog.chaos.local_backend import send_fault_rules
from raftlog.client import Admin
from raftlog.cluster_cli import wait_for_controller
from raftlog.local_cluster import LocalCluster
from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.rpc.v1 import raftlog_pb2_grpc as pb_grpc
from tests.integration.conftest import wait_until
from tests.integration.test_metrics import scrape, value, value_or_zero
from tests.kafka.kafka_wire import create_topic, kafka_call
from tests.kafka.txn_helpers import (
    ABORTED,
    COMMITTED,
    FATAL,
    end_transaction,
    read_values,
    transactional_producer,
)

kafka = pytest.importorskip("confluent_kafka")

TOPIC = "faults"
PARTITIONS = 3
IN_TOPIC, OUT_TOPIC, OUT_PARTITIONS = "ctp-in", "ctp-out", 2
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster.create(
        tmp_path_factory.mktemp("txn-faults"), node_count=3, node_flags=("--chaos",)
    )
    cluster.start()
    try:
        wait_for_controller(cluster.bootstrap, timeout_s=60)
        create_topic(cluster, TOPIC, partitions=PARTITIONS)
        create_topic(cluster, IN_TOPIC, partitions=1)
        create_topic(cluster, OUT_TOPIC, partitions=OUT_PARTITIONS)
        yield cluster
    finally:
        cluster.stop()


# -- reading the cluster --------------------------------------------------------------------


def _texts(cluster: LocalCluster) -> dict[int, str]:
    """Each running node's exposition."""
    return {n: scrape(cluster.nodes[n]) for n in cluster.nodes if cluster.is_running(n)}


def _counter(cluster: LocalCluster, name: str) -> float:
    """A counter summed over the running nodes (it counts on whichever node coordinated)."""
    return sum(value_or_zero(text, name) for text in _texts(cluster).values())


def _controller(cluster: LocalCluster) -> int:
    controllers = [n for n, text in _texts(cluster).items() if value(text, "raftlog_controller")]
    assert len(controllers) == 1, controllers
    return controllers[0]


def _open(cluster: LocalCluster, state: str) -> float:
    """The coordinator's count of open transactions in `state`."""
    text = scrape(cluster.nodes[_controller(cluster)])
    return value(text, "raftlog_transactions_open", state=state)


def _oldest_open_age_seconds(cluster: LocalCluster) -> float:
    text = scrape(cluster.nodes[_controller(cluster)])
    return value(text, "raftlog_transaction_oldest_open_age_seconds")


def _partition_value(cluster: LocalCluster, node: int, partition: int, name: str) -> float:
    text = scrape(cluster.nodes[node])
    return value(text, name, topic=TOPIC, partition=str(partition))


def _lso_lag(cluster: LocalCluster, node: int, partition: int) -> float:
    """The LSO lag of `partition` on its leader `node`."""
    name = "raftlog_partition_last_stable_offset_lag_offsets"
    return _partition_value(cluster, node, partition, name)


def _high_watermark(cluster: LocalCluster, node: int, partition: int) -> float:
    return _partition_value(cluster, node, partition, "raftlog_partition_high_watermark")


def _fault_state(cluster: LocalCluster, node: int) -> dict[str, Any]:
    """The node's fault rules and counters (Internal.SetFaults with no rule)."""
    with grpc.insecure_channel(cluster.nodes[node].client_address) as channel:
        stub = pb_grpc.InternalStub(channel)  # type: ignore[no-untyped-call]
        reply = stub.SetFaults(pb.SetFaultsRequest(rules_json="{}"), timeout=10)
    state: dict[str, Any] = json.loads(reply.state_json)
    return state


def _leaders(cluster: LocalCluster) -> dict[int, int]:
    with Admin(cluster.bootstrap) as admin:
        return {p.id: p.leader for p in admin.describe_topic(TOPIC).partitions if p.leader}


def _victim(cluster: LocalCluster, *, controller: bool = False) -> tuple[int, int]:
    """(partition, its leader) for a partition the controller does not lead (does lead, with
    `controller`)."""
    controller_id = _controller(cluster)
    leaders = sorted(_leaders(cluster).items())
    return next((p, n) for p, n in leaders if (n == controller_id) == controller)


def _all_running(cluster: LocalCluster) -> None:
    """Start the nodes a test killed again and wait until every partition is led by its
    preferred replica, so a test finds leaders on every node. (A kill test leaves its node
    down for the next: the worker's test runs as well on two nodes, and make test saves a
    restart.)"""
    for node in cluster.nodes:
        if not cluster.is_running(node):
            cluster.start_node(node)

    def settled() -> bool:
        with Admin(cluster.bootstrap) as admin:
            return all(
                p.leader == p.replicas[0]
                for name in (TOPIC, IN_TOPIC, OUT_TOPIC)
                for p in admin.describe_topic(name).partitions
            )

    def scraped() -> bool:
        # A restarted node's metrics listener may come up after it leads again; the tests
        # read every node's metrics (`_controller`).
        try:
            _texts(cluster)
        except OSError:
            return False
        return True

    wait_until(settled, timeout_s=60, what="every node up and leading its partitions")
    wait_until(scraped, timeout_s=60, what="every node's metrics answering")


# -- transactions ---------------------------------------------------------------------------


def _produce(producer: Any, tag: str, *, flush: bool = True) -> list[str]:
    """One record `tag-<p>` to each partition of TOPIC (acknowledged, with `flush`); the
    values."""
    values = [f"{tag}-{p}" for p in range(PARTITIONS)]
    for p, record in enumerate(values):
        producer.produce(TOPIC, value=record.encode(), partition=p)
    assert not flush or producer.flush(30) == 0
    return values


def _check_all_or_nothing(cluster: LocalCluster, written: list[str], learned: str) -> None:
    """The transaction that wrote `written` (values `<tag>-...`, the tag its own) is whole or
    absent for read_committed, as the producer learned, and read_uncommitted holds what it
    committed."""
    tag = written[0].split("-")[0] + "-"
    boot = cluster.kafka_bootstrap
    expected_min = len(written) if learned == COMMITTED else 0
    seen = read_values(boot, "read_committed", {TOPIC: PARTITIONS}, expected_min, (tag,))
    assert seen in ([], sorted(written)), f"torn transaction: read_committed sees {seen}"
    if learned == COMMITTED:
        assert seen == sorted(written)
        everything = read_values(
            boot, "read_uncommitted", {TOPIC: PARTITIONS}, len(written), (tag,)
        )
        assert set(written) <= set(everything)
    elif learned == ABORTED:
        assert seen == []
    assert len(seen) == len(set(seen)), f"duplicates: {seen}"


# -- metrics --------------------------------------------------------------------------------


def test_an_open_transaction_shows_in_the_gauges_and_its_end_in_the_counters(
    cluster: LocalCluster,
) -> None:
    boot = cluster.kafka_bootstrap
    names = ("committed", "aborted", "timed_out")
    before = {n: _counter(cluster, f"raftlog_transactions_{n}_total") for n in names}

    def moved(**expected: int) -> bool:
        now = {n: _counter(cluster, f"raftlog_transactions_{n}_total") for n in names}
        return all(now[n] - before[n] == expected.get(n, 0) for n in names)

    leaders = _leaders(cluster)
    producer = transactional_producer(boot, "metrics-txn")
    producer.begin_transaction()
    _produce(producer, "metrics-open-1")
    _produce(producer, "metrics-open-2")
    assert _open(cluster, "Ongoing") == 1
    assert _oldest_open_age_seconds(cluster) > 0
    # Two records a partition past the open transaction's first offset: both above the LSO.
    assert [_lso_lag(cluster, leaders[p], p) for p in range(PARTITIONS)] == [2] * PARTITIONS
    assert end_transaction(producer, commit=True) == COMMITTED
    wait_until(lambda: moved(committed=1), timeout_s=30, what="the commit counted")
    assert _open(cluster, "Ongoing") == 0
    assert _oldest_open_age_seconds(cluster) == 0
    wait_until(
        lambda: all(_lso_lag(cluster, leaders[p], p) == 0 for p in range(PARTITIONS)),
        timeout_s=30,
        what="the markers end the LSO lag",
    )
    producer.begin_transaction()
    _produce(producer, "metrics-aborted")
    assert end_transaction(producer, commit=False) == ABORTED
    wait_until(lambda: moved(committed=1, aborted=1), timeout_s=30, what="the abort counted")
    # librdkafka's shortest transaction timeout; the coordinator aborts it and fences the producer.
    expiring = transactional_producer(boot, "metrics-timeout", **{"transaction.timeout.ms": 1000})
    expiring.begin_transaction()
    _produce(expiring, "metrics-timeout")
    wait_until(
        lambda: moved(committed=1, aborted=2, timed_out=1), timeout_s=30, what="the timeout counted"
    )
    assert end_transaction(expiring, commit=True) in (ABORTED, FATAL)
    _promtool_accepts(cluster)


def _promtool_accepts(cluster: LocalCluster) -> None:
    if shutil.which("promtool") is None:
        pytest.skip(
            "promtool not found: apt-get install prometheus (Debian package; .ci/run does it)"
        )
    for node, text in _texts(cluster).items():
        checked = subprocess.run(
            ["promtool", "check", "metrics"], input=text.encode(), capture_output=True, timeout=30
        )
        problems = (checked.stdout + checked.stderr).decode()
        assert checked.returncode == 0 and not problems.strip(), f"node {node}: {problems}"


# -- SIGKILL of a partition leader ----------------------------------------------------------


def _kill_before_end_txn(cluster: LocalCluster, round_: int, *, commit: bool) -> None:
    """(a) The transaction produced to every partition (so each was added to it); the leader of
    one is killed while a second round of batches is on its way (the producer retries it to
    the new leader, whose copy of the producer state drops a batch the old one committed); a
    third round, and the end."""
    _all_running(cluster)
    partition, victim = _victim(cluster)
    producer = transactional_producer(cluster.kafka_bootstrap, f"kill-before-end-{round_}")
    producer.begin_transaction()
    written = _produce(producer, f"a{round_}-first")
    written += _produce(producer, f"a{round_}-second", flush=False)
    cluster.kill_node(victim)
    written += _produce(producer, f"a{round_}-third")
    learned = end_transaction(producer, commit=commit)
    assert learned == (COMMITTED if commit else ABORTED), f"partition {partition}: {learned}"
    _check_all_or_nothing(cluster, written, learned)


def _kill_between_prepare_and_marker(
    cluster: LocalCluster, round_: int, *, commit: bool, coordinator_too: bool = False
) -> None:
    """(b) The victim, leader of one partition, holds its markers: EndTxn is answered once
    PrepareCommit (or PrepareAbort) is committed, the other partitions get their markers and
    this one's LSO stays behind; then the victim is killed and the new leader takes the
    marker. With `coordinator_too` the victim is the controller as well, so a new coordinator
    must finish the transaction from the replicated state."""
    _all_running(cluster)
    partition, victim = _victim(cluster, controller=coordinator_too)
    address = cluster.nodes[victim].client_address
    assert send_fault_rules(address, {"hold_txn_markers": True}, 10)
    try:
        _hold_then_kill(cluster, round_, partition, victim, commit=commit)
    finally:
        if cluster.is_running(victim):  # failed before the kill: the next tests need markers
            send_fault_rules(address, {"hold_txn_markers": False}, 10)


def _hold_then_kill(
    cluster: LocalCluster, round_: int, partition: int, victim: int, *, commit: bool
) -> None:
    producer = transactional_producer(cluster.kafka_bootstrap, f"kill-before-marker-{round_}")
    producer.begin_transaction()
    written = _produce(producer, f"b{round_}")
    learned = end_transaction(producer, commit=commit)
    assert learned == (COMMITTED if commit else ABORTED)
    state = "PrepareCommit" if commit else "PrepareAbort"
    leaders = _leaders(cluster)
    others = [p for p in range(PARTITIONS) if p != partition]
    wait_until(
        lambda: all(_lso_lag(cluster, leaders[p], p) == 0 for p in others),
        timeout_s=30,
        what="markers on the partitions whose leaders do not hold them",
    )
    assert _open(cluster, state) == 1  # decided, a marker missing
    assert _lso_lag(cluster, victim, partition) == 1  # the record waits for its marker
    # The coordinator retries the held marker, and only that one: the other partitions'
    # high watermarks stay where their one marker put them.
    high_watermarks = {p: _high_watermark(cluster, leaders[p], p) for p in others}
    wait_until(
        lambda: _fault_state(cluster, victim)["counters"]["held_txn_markers"] >= 3,
        timeout_s=30,
        what="the coordinator retrying the held marker",
    )
    assert {p: _high_watermark(cluster, leaders[p], p) for p in others} == high_watermarks
    cluster.kill_node(victim)
    _check_all_or_nothing(cluster, written, learned)
    wait_until(lambda: _open(cluster, state) == 0, timeout_s=30, what=f"{state} completed")


def test_killing_a_partition_leader_before_end_txn_leaves_the_transaction_whole(
    cluster: LocalCluster,
) -> None:
    _kill_before_end_txn(cluster, 0, commit=True)


def test_killing_a_partition_leader_before_its_marker_leaves_the_transaction_whole(
    cluster: LocalCluster,
) -> None:
    _kill_between_prepare_and_marker(cluster, 0, commit=True)


@pytest.mark.soak
@pytest.mark.parametrize("round_", range(1, 5))
def test_partition_leader_kills_soak(cluster: LocalCluster, round_: int) -> None:
    commit = round_ % 2 == 0
    _kill_before_end_txn(cluster, round_, commit=commit)
    _kill_between_prepare_and_marker(cluster, round_, commit=commit)
    _kill_between_prepare_and_marker(cluster, 10 + round_, commit=commit, coordinator_too=True)


# -- a consume-transform-produce worker killed mid-transaction -------------------------------


@contextlib.contextmanager
def _transformer(
    cluster: LocalCluster, until: int, *options: str
) -> Iterator[subprocess.Popen[str]]:
    """The worker process (killed on the way out if it still runs)."""
    command = [
        sys.executable, "-m", "tests.kafka.txn_transformer", cluster.kafka_bootstrap,
        IN_TOPIC, OUT_TOPIC, str(OUT_PARTITIONS), str(until), *options,
    ]  # fmt: skip
    with subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True) as worker:
        try:
            yield worker
        finally:
            if worker.poll() is None:
                worker.kill()


def _wait_for_line(worker: subprocess.Popen[str], prefix: str) -> str:
    assert worker.stdout is not None
    for line in worker.stdout:
        if line.startswith(prefix):
            return line
    raise AssertionError(f"the worker exited ({worker.wait()}) before printing {prefix!r}")


def _input_end(cluster: LocalCluster) -> int:
    """The high watermark of the input: the records fed so far."""
    consumer = kafka.Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": "probe"})
    try:
        return int(consumer.get_watermark_offsets(kafka.TopicPartition(IN_TOPIC, 0), 10)[1])
    finally:
        consumer.close()


def _transform_with_kills(cluster: LocalCluster, count: int, kills: int) -> None:
    """Feed `count` more records, then run the worker `kills` times to a SIGKILL inside a
    transaction (its output produced, its offsets sent) and once more to the end: the output
    holds every record fed so far once."""
    feeder = kafka.Producer({"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all"})
    first = _input_end(cluster)
    for i in range(first, first + count):
        feeder.produce(IN_TOPIC, value=f"in-{i}".encode(), partition=0)
    assert feeder.flush(30) == 0
    for kill in range(kills):
        with _transformer(cluster, first + count, "--stop-in-batch", str(2 + kill % 2)) as worker:
            _wait_for_line(worker, "mid-transaction")
            worker.send_signal(signal.SIGKILL)
    with _transformer(cluster, first + count) as worker:
        assert worker.wait(120) == 0
    expected = [f"out-{i}" for i in range(first + count)]
    seen = read_values(
        cluster.kafka_bootstrap, "read_committed", {OUT_TOPIC: OUT_PARTITIONS}, len(expected)
    )
    duplicates = [v for v, n in Counter(seen).items() if n > 1]
    assert not duplicates, f"duplicates: {duplicates}"
    assert sorted(seen) == sorted(expected), f"lost: {sorted(set(expected) - set(seen))}"
    # The killed transactions' output is in the log, aborted: read_committed had to skip it.
    everything = read_values(
        cluster.kafka_bootstrap, "read_uncommitted", {OUT_TOPIC: OUT_PARTITIONS}, len(seen) + 1
    )
    assert len(everything) > len(seen)


def test_a_killed_consume_transform_produce_worker_resumes_exactly_once(
    cluster: LocalCluster,
) -> None:
    _transform_with_kills(cluster, 40, kills=1)


@pytest.mark.soak
def test_a_consume_transform_produce_worker_killed_again_and_again(cluster: LocalCluster) -> None:
    _transform_with_kills(cluster, 200, kills=6)


def _wire(version: int, api: str) -> Any:
    return importlib.import_module(f"kio.schema.{api}.v{version}.request")


def test_the_next_transaction_waits_for_the_previous_ones_markers_instead_of_being_refused(
    cluster: LocalCluster,
) -> None:
    """A producer starts its next transaction as soon as EndTxn is answered, before the
    markers. With the marker of one partition held, its next AddPartitionsToTxn is held by
    the coordinator (where Kafka answers CONCURRENT_TRANSACTIONS and the client backs off),
    and answered NONE once the marker is written and the commit complete; the next
    transaction then commits like any other."""
    _all_running(cluster)
    partition, victim = _victim(cluster)
    address = cluster.nodes[victim].client_address
    fc, ipi = _wire(3, "find_coordinator"), _wire(4, "init_producer_id")
    ap, et = _wire(0, "add_partitions_to_txn"), _wire(1, "end_txn")
    txn_id = "held-add"
    found = kafka_call(
        cluster.kafka_bootstrap.split(",")[0],
        fc.FindCoordinatorRequest(key=txn_id, key_type=i8(1)),
    )
    coordinator = f"{found.host}:{found.port}"
    timeout = i32Timedelta.parse(datetime.timedelta(seconds=60))
    init = ipi.InitProducerIdRequest(
        transactional_id=ipi.TransactionalId(txn_id), transaction_timeout=timeout
    )
    started = kafka_call(coordinator, init)
    assert started.error_code == ErrorCode.none
    topic = ap.AddPartitionsToTxnTopic(name=ap.TopicName(TOPIC), partitions=(i32(partition),))
    add = ap.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=ap.TransactionalId(txn_id),
        v3_and_below_producer_id=started.producer_id,
        v3_and_below_producer_epoch=started.producer_epoch,
        v3_and_below_topics=(topic,),
    )
    end = et.EndTxnRequest(
        transactional_id=et.TransactionalId(txn_id),
        producer_id=started.producer_id,
        producer_epoch=started.producer_epoch,
        committed=True,
    )

    def added(response: Any) -> Any:
        return response.results_by_topic_v3_and_below[0].results_by_partition[0]

    assert added(kafka_call(coordinator, add)).partition_error_code == ErrorCode.none
    assert send_fault_rules(address, {"hold_txn_markers": True}, 10)
    try:
        assert kafka_call(coordinator, end).error_code == ErrorCode.none
        wait_until(
            lambda: _fault_state(cluster, victim)["counters"]["held_txn_markers"] >= 1,
            timeout_s=30,
            what="the coordinator writing the held marker",
        )
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            next_add = pool.submit(kafka_call, coordinator, add)
            time.sleep(0.5)  # the request reaches the coordinator while the marker is held
            assert _open(cluster, "PrepareCommit") == 1
            assert send_fault_rules(address, {"hold_txn_markers": False}, 10)
            held = added(next_add.result(timeout=30))
    finally:
        send_fault_rules(address, {"hold_txn_markers": False}, 10)
    assert held.partition_error_code == ErrorCode.none
    assert kafka_call(coordinator, end).error_code == ErrorCode.none
    wait_until(lambda: _open(cluster, "PrepareCommit") == 0, timeout_s=30, what="completed")
