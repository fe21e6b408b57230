"""Kafka transactions end to end with confluent-kafka (librdkafka): commit and abort across three
partitions of two topics seen by read_committed and read_uncommitted consumers, zombie fencing
of an older instance of a transactional id, and send_offsets_to_transaction in a
consume-transform-produce loop; kafka-python's and aiokafka's transactional producers commit
and abort across the same partitions. One cluster for the module."""

from __future__ import annotations

import asyncio
import datetime
import importlib
import io
import itertools
import json
import socket
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kio.index import load_response_schema
from kio.schema.describe_producers.v0 import request as dp
from kio.schema.errors import ErrorCode
from kio.schema.list_offsets.v6 import request as lo
from kio.schema.types import BrokerId, TopicName
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i8, i16, i32, i32Timedelta, i64

from raftlog.chaos.history import HistoryRecorder
from raftlog.chaos.txn_workload import TxnOptions, final_txn_read
from raftlog.cli import main as cli_main
from raftlog.client import Admin, Consumer, Producer
from raftlog.client.errors import ProducerFencedError, TransactionError
from raftlog.cluster_cli import wait_for_controller
from raftlog.local_cluster import LocalCluster
from raftlog.storage.records import RecordInput, encode_batch
from tests.kafka.kafka_wire import create_topic, kafka_call, produce_request, read_exactly
from tests.kafka.txn_helpers import read_values as _read
from tests.kafka.txn_helpers import transactional_producer as _producer

kafka = pytest.importorskip("confluent_kafka")
kafka_python = pytest.importorskip("kafka")
aiokafka = pytest.importorskip("aiokafka")

TOPICS = {"txn-a": 2, "txn-b": 1}  # three partitions over two topics


@pytest.fixture(scope="module")
def txn_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster.create(tmp_path_factory.mktemp("txn"), node_count=3)
    cluster.start()
    try:
        wait_for_controller(cluster.bootstrap, timeout_s=60)
        for name, partitions in TOPICS.items():
            create_topic(cluster, name, partitions=partitions)
        create_topic(cluster, "txn-in", partitions=1)
        create_topic(cluster, "txn-out", partitions=1)
        create_topic(cluster, "txn-final", partitions=1)  # before a test kills a node
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def boot(txn_cluster: LocalCluster) -> str:
    return txn_cluster.kafka_bootstrap


def _send_everywhere(producer: object, tag: str) -> None:
    for name, partitions in TOPICS.items():
        for partition in range(partitions):
            value = f"{tag}-{name}-{partition}".encode()
            producer.produce(name, value=value, partition=partition)  # type: ignore[attr-defined]


def test_commit_and_abort_across_partitions(boot: str) -> None:
    producer = _producer(boot, "txn-commit-abort")
    producer.begin_transaction()  # type: ignore[attr-defined]
    _send_everywhere(producer, "committed")
    producer.commit_transaction(30)  # type: ignore[attr-defined]
    producer.begin_transaction()  # type: ignore[attr-defined]
    _send_everywhere(producer, "aborted")
    producer.flush(30)  # type: ignore[attr-defined]
    producer.abort_transaction(30)  # type: ignore[attr-defined]
    committed = sorted(
        f"committed-{n}-{p}" for n, partitions in TOPICS.items() for p in range(partitions)
    )
    aborted = [v.replace("committed", "aborted") for v in committed]
    tags = ("committed-", "aborted-")
    assert _read(boot, "read_committed", TOPICS, 3, tags) == committed
    assert _read(boot, "read_uncommitted", TOPICS, 6, tags) == sorted(committed + aborted)


def test_an_older_instance_is_fenced_and_its_writes_never_visible(boot: str) -> None:
    topics = {"txn-b": 1}
    older = _producer(boot, "txn-zombie")
    older.begin_transaction()  # type: ignore[attr-defined]
    older.produce("txn-b", value=b"zombie-1", partition=0)  # type: ignore[attr-defined]
    older.flush(30)  # type: ignore[attr-defined]
    newer = _producer(boot, "txn-zombie")  # aborts the older one's transaction
    older.produce("txn-b", value=b"zombie-2", partition=0)  # type: ignore[attr-defined]
    with pytest.raises(kafka.KafkaException) as raised:
        # The partition refuses the late batch (its epoch is older than the abort marker's,
        # INVALID_PRODUCER_EPOCH), which librdkafka raises as fatal _FENCED from flush
        # already; otherwise the commit fails.
        older.flush(10)  # type: ignore[attr-defined]
        older.commit_transaction(10)  # type: ignore[attr-defined]
    assert raised.value.args[0].fatal() or raised.value.args[0].txn_requires_abort()
    newer.begin_transaction()  # type: ignore[attr-defined]
    newer.produce("txn-b", value=b"newer", partition=0)  # type: ignore[attr-defined]
    newer.commit_transaction(30)  # type: ignore[attr-defined]
    seen = _read(boot, "read_committed", topics, 1)
    assert "newer" in seen
    assert not [v for v in seen if v.startswith("zombie")], seen


def test_consume_transform_produce_commits_offsets_with_the_output(boot: str) -> None:
    feeder = kafka.Producer({"bootstrap.servers": boot, "acks": "all"})
    for i in range(10):
        feeder.produce("txn-in", value=f"in-{i}".encode(), partition=0)
    assert feeder.flush(30) == 0
    group = "txn-transformer"
    consumer = kafka.Consumer(
        {
            "bootstrap.servers": boot,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign([kafka.TopicPartition("txn-in", 0, kafka.OFFSET_BEGINNING)])
    producer = _producer(boot, "txn-transformer")
    taken: list[object] = []
    deadline = time.monotonic() + 30
    while len(taken) < 10 and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            taken.append(message)
    assert len(taken) == 10
    for aborting, batch in ((True, taken[:5]), (False, taken[:5]), (False, taken[5:])):
        producer.begin_transaction()  # type: ignore[attr-defined]
        for message in batch:
            value = message.value().decode().replace("in", "out")  # type: ignore[attr-defined]
            producer.produce("txn-out", value=value.encode(), partition=0)  # type: ignore[attr-defined]
        last = batch[-1].offset()  # type: ignore[attr-defined]
        offsets = [kafka.TopicPartition("txn-in", 0, last + 1)]
        producer.send_offsets_to_transaction(  # type: ignore[attr-defined]
            offsets, consumer.consumer_group_metadata(), 30
        )
        if aborting:
            producer.abort_transaction(30)  # type: ignore[attr-defined]
            committed = consumer.committed([kafka.TopicPartition("txn-in", 0)], 10)
            assert committed[0].offset < 0  # nothing committed by the aborted transaction
        else:
            producer.commit_transaction(30)  # type: ignore[attr-defined]
    consumer.close()
    assert _read(boot, "read_committed", {"txn-out": 1}, 10) == sorted(
        f"out-{i}" for i in range(10)
    )
    checker = kafka.Consumer({"bootstrap.servers": boot, "group.id": group})
    committed = checker.committed([kafka.TopicPartition("txn-in", 0)], 10)
    checker.close()
    assert committed[0].offset == 10


def _expected(tag: str) -> tuple[list[str], list[str]]:
    """The values `_send_everywhere` writes for `tag`-committed and `tag`-aborted."""
    committed = sorted(
        f"{tag}-committed-{n}-{p}" for n, partitions in TOPICS.items() for p in range(partitions)
    )
    return committed, [v.replace("-committed-", "-aborted-") for v in committed]


def _check_readers(boot: str, tag: str) -> None:
    committed, aborted = _expected(tag)
    assert _read(boot, "read_committed", TOPICS, 3, (f"{tag}-",)) == committed
    assert _read(boot, "read_uncommitted", TOPICS, 6, (f"{tag}-",)) == sorted(committed + aborted)


def test_kafka_python_transactions_commit_and_abort(boot: str) -> None:
    producer = kafka_python.KafkaProducer(
        bootstrap_servers=boot, transactional_id="txn-kafka-python"
    )
    try:
        producer.init_transactions()
        for outcome in ("committed", "aborted"):
            producer.begin_transaction()
            for name, partitions in TOPICS.items():
                for partition in range(partitions):
                    value = f"kp-{outcome}-{name}-{partition}".encode()
                    producer.send(name, value=value, partition=partition)
            if outcome == "committed":
                producer.commit_transaction()
            else:
                producer.flush()
                producer.abort_transaction()
    finally:
        producer.close(timeout=10)
    _check_readers(boot, "kp")


async def _aiokafka_transactions(boot: str) -> None:
    producer = aiokafka.AIOKafkaProducer(bootstrap_servers=boot, transactional_id="txn-aiokafka")
    await producer.start()
    try:
        for outcome in ("committed", "aborted"):
            await producer.begin_transaction()
            sent = [
                await producer.send(
                    name, value=f"aio-{outcome}-{name}-{partition}".encode(), partition=partition
                )
                for name, partitions in TOPICS.items()
                for partition in range(partitions)
            ]
            await asyncio.gather(*sent)
            if outcome == "committed":
                await producer.commit_transaction()
            else:
                await producer.abort_transaction()
    finally:
        await producer.stop()


def test_aiokafka_transactions_commit_and_abort(boot: str) -> None:
    asyncio.run(_aiokafka_transactions(boot))
    _check_readers(boot, "aio")


def _wire(version: int, api: str) -> Any:
    return importlib.import_module(f"kio.schema.{api}.v{version}.request")


def test_refused_requests_get_kafkas_codes_and_write_nothing(boot: str) -> None:
    """Raw requests to the coordinator: a member that is not in the group, a producer id that
    is not the id's, a fenced epoch; a second InitProducerId aborts the open transaction
    (CONCURRENT_TRANSACTIONS until done) and its transactional offsets never commit."""
    fc = _wire(3, "find_coordinator")
    found = kafka_call(
        boot.split(",")[0], fc.FindCoordinatorRequest(key="txn-wire", key_type=i8(1))
    )
    assert found.error_code == ErrorCode.none
    address = f"{found.host}:{found.port}"
    ipi = _wire(4, "init_producer_id")

    def init() -> Any:
        request = ipi.InitProducerIdRequest(
            transactional_id=ipi.TransactionalId("txn-wire"),
            transaction_timeout=i32Timedelta.parse(datetime.timedelta(seconds=60)),
        )
        return kafka_call(address, request)

    first = init()
    pid, epoch = first.producer_id, first.producer_epoch
    ao = _wire(3, "add_offsets_to_txn")
    added = kafka_call(
        address,
        ao.AddOffsetsToTxnRequest(
            transactional_id=ao.TransactionalId("txn-wire"),
            producer_id=pid,
            producer_epoch=epoch,
            group_id=ao.GroupId("g-wire"),
        ),
    )
    assert added.error_code == ErrorCode.none
    # A partition added but never written to: its ABORT marker below ends nothing, and must
    # not stall the abort. v5 verify_only (the brokers' KIP-890 check) sees only that one.
    ap3, ap5 = _wire(3, "add_partitions_to_txn"), _wire(5, "add_partitions_to_txn")
    added = kafka_call(
        address,
        ap3.AddPartitionsToTxnRequest(
            v3_and_below_transactional_id=ap3.TransactionalId("txn-wire"),
            v3_and_below_producer_id=pid,
            v3_and_below_producer_epoch=epoch,
            v3_and_below_topics=(
                ap3.AddPartitionsToTxnTopic(name=ap3.TopicName("txn-a"), partitions=(i32(0),)),
            ),
        ),
    )
    assert added.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == (
        ErrorCode.none
    )
    verified = kafka_call(
        address,
        ap5.AddPartitionsToTxnRequest(
            transactions=(
                ap5.AddPartitionsToTxnTransaction(
                    transactional_id=ap5.TransactionalId("txn-wire"),
                    producer_id=pid,
                    producer_epoch=epoch,
                    verify_only=True,
                    topics=(
                        ap5.AddPartitionsToTxnTopic(
                            name=ap5.TopicName("txn-a"), partitions=(i32(0), i32(1))
                        ),
                    ),
                ),
            )
        ),
    )
    codes = [
        r.partition_error_code
        for r in verified.results_by_transaction[0].topic_results[0].results_by_partition
    ]
    assert codes == [ErrorCode.none, ErrorCode.invalid_txn_state]
    to = _wire(3, "txn_offset_commit")

    def commit_offset(producer_epoch: int, member_id: str, generation: int) -> Any:
        partition = to.TxnOffsetCommitRequestPartition(
            partition_index=i32(0), committed_offset=i64(5), committed_metadata=None
        )
        request = to.TxnOffsetCommitRequest(
            transactional_id=to.TransactionalId("txn-wire"),
            group_id=to.GroupId("g-wire"),
            producer_id=pid,
            producer_epoch=i16(producer_epoch),
            generation_id=i32(generation),
            member_id=member_id,
            topics=(
                to.TxnOffsetCommitRequestTopic(
                    name=to.TopicName("txn-in"), partitions=(partition,)
                ),
            ),
        )
        return kafka_call(address, request).topics[0].partitions[0].error_code

    assert commit_offset(epoch, "ghost", 3) == ErrorCode.unknown_member_id
    assert commit_offset(epoch + 1, "", -1) == ErrorCode.invalid_producer_epoch
    assert commit_offset(epoch, "", -1) == ErrorCode.none
    to0 = _wire(0, "txn_offset_commit")  # no leader epoch before v2 (aiokafka sends v0)
    partition0 = to0.TxnOffsetCommitRequestPartition(
        partition_index=i32(0), committed_offset=i64(6), committed_metadata=None
    )
    answer0 = kafka_call(
        address,
        to0.TxnOffsetCommitRequest(
            transactional_id=to0.TransactionalId("txn-wire"),
            group_id=to0.GroupId("g-wire"),
            producer_id=pid,
            producer_epoch=epoch,
            topics=(
                to0.TxnOffsetCommitRequestTopic(
                    name=to0.TopicName("txn-in"), partitions=(partition0,)
                ),
            ),
        ),
    )
    assert answer0.topics[0].partitions[0].error_code == ErrorCode.none
    dt = _wire(0, "describe_transactions")
    described = kafka_call(
        address,
        dt.DescribeTransactionsRequest(transactional_ids=(dt.TransactionalId("txn-wire"),)),
    ).transaction_states[0]
    # Described while open: Kafka gives a start time of -1 (which kio cannot read) otherwise.
    assert (described.transaction_state, described.producer_epoch) == ("Ongoing", epoch)
    assert described.transaction_start_time.timestamp() > 0
    et = _wire(3, "end_txn")
    wrong = kafka_call(
        address,
        et.EndTxnRequest(
            transactional_id=et.TransactionalId("txn-wire"),
            producer_id=et.ProducerId(pid + 1),
            producer_epoch=epoch,
            committed=True,
        ),
    )
    assert wrong.error_code == ErrorCode.invalid_producer_id_mapping
    assert init().error_code == ErrorCode.concurrent_transactions  # aborts the open one
    deadline = time.monotonic() + 10
    while (answer := init()).error_code == ErrorCode.concurrent_transactions:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert (answer.error_code, answer.producer_id, answer.producer_epoch) == (
        ErrorCode.none,
        pid,
        epoch + 2,  # one bump fenced the open transaction, one is the new instance's
    )
    assert commit_offset(epoch, "", -1) == ErrorCode.producer_fenced
    of = _wire(7, "offset_fetch")
    fetched = kafka_call(
        address,
        of.OffsetFetchRequest(group_id=of.GroupId("g-wire"), topics=None, require_stable=True),
    )
    assert fetched.error_code == ErrorCode.none and fetched.topics == ()  # aborted: nothing
    lt = _wire(1, "list_transactions")
    listed = kafka_call(address, lt.ListTransactionsRequest(state_filters=("Empty", "Nope")))
    assert ("txn-wire", pid) in {
        (t.transactional_id, t.producer_id) for t in listed.transaction_states
    }
    assert listed.unknown_state_filters == ("Nope",)


def _leader_answer(boot: str, request: object, pick: Callable[[Any], Any]) -> Any:
    """The one node whose answer for txn-b's partition is not NOT_LEADER_OR_FOLLOWER."""
    answers = [pick(kafka_call(address, request)) for address in boot.split(",")]
    led = [a for a in answers if a.error_code != ErrorCode.not_leader_or_follower]
    assert len(led) == 1, answers
    return led[0]


def _lso_and_open_start(boot: str, producer_id: int) -> tuple[int, int, int]:
    """(read_committed LATEST, read_uncommitted LATEST, the producer's
    current_txn_start_offset) of txn-b/0, from its leader."""
    offsets = []
    for isolation in (1, 0):
        request = lo.ListOffsetsRequest(
            replica_id=BrokerId(-1),
            isolation_level=i8(isolation),
            topics=(
                lo.ListOffsetsTopic(
                    name=TopicName("txn-b"),
                    partitions=(
                        lo.ListOffsetsPartition(
                            partition_index=i32(0),
                            current_leader_epoch=i32(-1),
                            timestamp=i64(-1),
                        ),
                    ),
                ),
            ),
        )
        answer = _leader_answer(boot, request, lambda r: r.topics[0].partitions[0])
        assert answer.error_code == ErrorCode.none
        offsets.append(int(answer.offset))
    request = dp.DescribeProducersRequest(
        topics=(dp.TopicRequest(name=TopicName("txn-b"), partition_indexes=(i32(0),)),)
    )
    answer = _leader_answer(boot, request, lambda r: r.topics[0].partitions[0])
    assert answer.error_code == ErrorCode.none
    starts = [
        int(p.current_txn_start_offset)
        for p in answer.active_producers
        if int(p.producer_id) == producer_id
    ]
    return offsets[0], offsets[1], starts[0] if starts else -1


def test_an_open_transaction_holds_the_lso_and_describe_producers_shows_it(boot: str) -> None:
    producer = _producer(boot, "txn-lso")
    plain = kafka.Producer({"bootstrap.servers": boot, "acks": "all"})
    producer.begin_transaction()  # type: ignore[attr-defined]
    producer.produce("txn-b", value=b"open", partition=0)  # type: ignore[attr-defined]
    producer.flush(30)  # type: ignore[attr-defined]
    plain.produce("txn-b", value=b"plain", partition=0)
    assert plain.flush(30) == 0
    # The transactional producer is the one with an open transaction on txn-b/0.
    request = dp.DescribeProducersRequest(
        topics=(dp.TopicRequest(name=TopicName("txn-b"), partition_indexes=(i32(0),)),)
    )
    answer = _leader_answer(boot, request, lambda r: r.topics[0].partitions[0])
    (open_producer,) = [
        int(p.producer_id) for p in answer.active_producers if p.current_txn_start_offset >= 0
    ]
    lso, high_watermark, start = _lso_and_open_start(boot, open_producer)
    assert lso == start < high_watermark  # the plain record after it is not stable yet
    producer.commit_transaction(30)  # type: ignore[attr-defined]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        lso, high_watermark, start = _lso_and_open_start(boot, open_producer)
        if start == -1 and lso == high_watermark:
            break
        time.sleep(0.05)
    assert start == -1 and lso == high_watermark  # the marker ended it
    assert "plain" in _read(boot, "read_committed", {"txn-b": 1}, 1)


def test_raftlog_s_consumer_reads_committed_over_grpc(txn_cluster: LocalCluster) -> None:
    """raftlog's own Consumer, on the gRPC fetch path, with isolation_level: read_committed
    skips aborted records and markers, read_uncommitted sees the aborted records too."""
    producer = _producer(txn_cluster.kafka_bootstrap, "txn-grpc-reader")
    producer.begin_transaction()  # type: ignore[attr-defined]
    producer.produce("txn-a", value=b"grpc-committed", partition=1)  # type: ignore[attr-defined]
    producer.commit_transaction(30)  # type: ignore[attr-defined]
    producer.begin_transaction()  # type: ignore[attr-defined]
    producer.produce("txn-a", value=b"grpc-aborted", partition=1)  # type: ignore[attr-defined]
    producer.flush(30)  # type: ignore[attr-defined]
    producer.abort_transaction(30)  # type: ignore[attr-defined]
    seen = {}
    for isolation in ("read_committed", "read_uncommitted"):
        with Consumer(
            txn_cluster.bootstrap,
            auto_offset_reset="earliest",
            isolation_level=isolation,  # type: ignore[arg-type]
            consumer_timeout_ms=1500,
        ) as consumer:
            consumer.assign([("txn-a", 1)])
            seen[isolation] = {
                r.value for r in consumer if r.value is not None and b"grpc" in r.value
            }
    assert seen["read_committed"] == {b"grpc-committed"}
    assert seen["read_uncommitted"] == {b"grpc-committed", b"grpc-aborted"}


def test_a_transactional_batch_for_a_partition_not_in_a_transaction_is_refused(
    txn_cluster: LocalCluster,
) -> None:
    """KIP-890 part 1 through a real node: a transactional batch of a producer whose
    transaction never added the partition gets INVALID_TXN_STATE from its leader, and
    nothing is written (the high watermark stays)."""
    batch = encode_batch(
        [RecordInput(None, b"stray", 0)],
        producer_id=2**40,  # no transactional id has it
        producer_epoch=0,
        base_sequence=0,
        is_transactional=True,
    )
    boot = txn_cluster.kafka_bootstrap
    before = _lso_and_open_start(boot, 2**40)[1]
    answers = [
        kafka_call(address, produce_request("txn-b", batch)).responses[0].partition_responses[0]
        for address in boot.split(",")
    ]
    codes = sorted(int(a.error_code) for a in answers)
    not_leader = int(ErrorCode.not_leader_or_follower)
    assert codes == sorted([int(ErrorCode.invalid_txn_state), not_leader, not_leader])
    assert _lso_and_open_start(boot, 2**40)[1] == before


def _txn_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    """`raftlog txn ...` with --format json: (exit code, parsed stdout or None, stderr)."""
    code = cli_main(["txn", *argv, "--format", "json"])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else None, err


def _console(capsys: pytest.CaptureFixture[str], grpc_boot: str, *argv: str) -> list[str]:
    """The values `raftlog consume txn-a` prints whose value starts with "hanging-"."""
    consume = ["consume", "txn-a", "--timeout-ms", "1000", "--format", "json", *argv]
    assert cli_main([*consume, "--bootstrap", grpc_boot]) == 0
    values = [json.loads(line)["value"] for line in capsys.readouterr().out.splitlines()]
    return [value for value in values if value.startswith("hanging-")]


def test_an_operator_lists_describes_and_aborts_a_hanging_transaction(
    txn_cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """A confluent-kafka producer begins a transaction on txn-a's two partitions and never
    ends it: `raftlog txn list` shows it Ongoing, `describe` its partitions, `abort` ends it
    through the coordinator; then the last stable offsets pass it, a read_committed consumer
    sees a later committed record and none of the hanging ones, and the producer is fenced."""
    grpc_boot, boot = txn_cluster.bootstrap, txn_cluster.kafka_bootstrap
    where = ("--bootstrap", grpc_boot)
    hanging = _producer(boot, "txn-hanging")
    hanging.begin_transaction()  # type: ignore[attr-defined]
    for partition in range(TOPICS["txn-a"]):
        hanging.produce("txn-a", value=f"hanging-{partition}".encode(), partition=partition)  # type: ignore[attr-defined]
    hanging.flush(30)  # type: ignore[attr-defined]
    parts = [("txn-a", p) for p in range(TOPICS["txn-a"])]
    reader = Consumer(grpc_boot, isolation_level="read_committed")
    try:
        stuck = reader.end_offsets(parts)
        high = Consumer(grpc_boot).end_offsets(parts)
        assert all(stuck[tp] < high[tp] for tp in stuck), (stuck, high)  # the LSO waits
        # The console consumer, as kafka-console-consumer: read_uncommitted by default.
        assert sorted(_console(capsys, grpc_boot)) == ["hanging-0", "hanging-1"]
        assert _console(capsys, grpc_boot, "--isolation-level", "read_committed") == []

        code, listed, _ = _txn_cli(capsys, "list", "--state", "Ongoing", *where)
        assert code == 0
        (row,) = [t for t in listed if t["transactional_id"] == "txn-hanging"]
        with Admin(grpc_boot) as admin:
            controller = admin.describe_cluster().controller_id
        assert (row["state"], row["coordinator_id"]) == ("Ongoing", controller)
        assert row["producer_id"] >= 0 and row["age_ms"] >= 0, row
        code, described, _ = _txn_cli(capsys, "describe", "txn-hanging", *where)
        assert code == 0
        assert [tuple(tp) for tp in described["partitions"]] == parts
        assert described["producer_id"] == row["producer_id"]
        assert described["start_time_ms"] > 0 and described["timeout_ms"] == 30_000

        code, aborted, _ = _txn_cli(capsys, "abort", "txn-hanging", *where)
        assert code == 0
        assert aborted["state"] == "CompleteAbort"
        assert aborted["producer_epoch"] > row["producer_epoch"]  # fenced
        code, _, err = _txn_cli(capsys, "abort", "txn-hanging", *where)
        assert code == 1 and "INVALID_TXN_STATE" in err and "no transaction open" in err
        code, _, err = _txn_cli(capsys, "describe", "txn-no-such-id", *where)
        assert code == 1 and "TRANSACTIONAL_ID_NOT_FOUND" in err and "txn-no-such-id" in err

        moved = reader.end_offsets(parts)
        assert all(moved[tp] > high[tp] for tp in moved), (moved, high)  # past the markers
        committer = _producer(boot, "txn-after-hanging")
        committer.begin_transaction()  # type: ignore[attr-defined]
        committer.produce("txn-a", value=b"after-hanging", partition=0)  # type: ignore[attr-defined]
        committer.commit_transaction(30)  # type: ignore[attr-defined]
        seen = _read(boot, "read_committed", {"txn-a": 2}, 1, ("after-hanging", "hanging-"))
        assert seen == ["after-hanging"]
        seen = _read(boot, "read_uncommitted", {"txn-a": 2}, 3, ("after-hanging", "hanging-"))
        assert seen == ["after-hanging", "hanging-0", "hanging-1"]
    finally:
        reader.close()

    with pytest.raises(kafka.KafkaException) as raised:
        hanging.produce("txn-a", value=b"hanging-late", partition=0)  # type: ignore[attr-defined]
        hanging.flush(10)  # type: ignore[attr-defined]
        hanging.commit_transaction(10)  # type: ignore[attr-defined]
    assert raised.value.args[0].fatal() or raised.value.args[0].txn_requires_abort()


def _committed_offset(boot: str, group_id: str, topic: str, partition: int) -> int:
    consumer = kafka.Consumer({"bootstrap.servers": boot, "group.id": group_id})
    try:
        (tp,) = consumer.committed([kafka.TopicPartition(topic, partition)], timeout=30)
        return int(tp.offset)
    finally:
        consumer.close()


def test_raftlogs_own_transactional_producer_over_grpc(txn_cluster: LocalCluster) -> None:
    """raftlog.client.Producer with a transactional_id, on the gRPC API: a committed and an
    aborted transaction across three partitions of two topics, each with offsets sent to the
    transaction; read_committed readers (confluent-kafka) see the committed records only and
    the group's offset is the committed transaction's; a second instance fences the first."""
    grpc_boot, boot = txn_cluster.bootstrap, txn_cluster.kafka_bootstrap
    with Producer(grpc_boot, transactional_id="grpc-txn") as producer:
        producer.init_transactions()
        for tag, offset, commit in (("own-committed", 5, True), ("own-aborted", 9, False)):
            producer.begin_transaction()
            for name, partitions in TOPICS.items():
                for partition in range(partitions):
                    value = f"{tag}-{name}-{partition}".encode()
                    producer.send(name, value=value, partition=partition)
            producer.send_offsets_to_transaction({("txn-in", 0): offset}, "grpc-txn-group")
            if commit:
                producer.commit_transaction()
            else:
                producer.abort_transaction()
        tags = ("own-committed", "own-aborted")
        committed = sorted(
            f"own-committed-{n}-{p}" for n, parts in TOPICS.items() for p in range(parts)
        )
        aborted = [v.replace("committed", "aborted") for v in committed]
        assert _read(boot, "read_committed", TOPICS, 3, tags) == committed
        assert _read(boot, "read_uncommitted", TOPICS, 6, tags) == sorted(committed + aborted)
        assert _committed_offset(boot, "grpc-txn-group", "txn-in", 0) == 5

        producer.begin_transaction()
        producer.send("txn-b", value=b"own-zombie", partition=0).result(timeout=30)
        with Producer(grpc_boot, transactional_id="grpc-txn") as newer:
            newer.init_transactions()  # aborts the older instance's transaction
            with pytest.raises((ProducerFencedError, TransactionError)):
                producer.send("txn-b", value=b"own-zombie-late", partition=0)
                producer.commit_transaction()
        seen = _read(boot, "read_committed", {"txn-b": 1}, 1, ("own-committed", "own-zombie"))
        assert seen == ["own-committed-txn-b-0"]


# Last in the module: it kills a node of the module's cluster.
def test_a_new_controller_finishes_the_transactions_of_the_old_one(
    txn_cluster: LocalCluster,
) -> None:
    """SIGKILL of the coordinator (the controller) right after EndTxn was answered, so its
    markers may not all be written: the new controller writes them from the replicated state,
    read_committed readers see the whole transaction, and the producer carries on with the
    new coordinator."""
    boot = txn_cluster.kafka_bootstrap
    producer = _producer(boot, "txn-failover")
    producer.begin_transaction()  # type: ignore[attr-defined]
    _send_everywhere(producer, "failover-1")
    producer.commit_transaction(30)  # type: ignore[attr-defined]
    fc = _wire(3, "find_coordinator")
    found = kafka_call(
        boot.split(",")[0], fc.FindCoordinatorRequest(key="txn-failover", key_type=i8(1))
    )
    txn_cluster.kill_node(int(found.node_id))
    producer.begin_transaction()  # type: ignore[attr-defined]
    _send_everywhere(producer, "failover-2")
    producer.commit_transaction(60)  # type: ignore[attr-defined]
    survivors = ",".join(a for a in boot.split(",") if not a.endswith(f":{found.port}"))
    expected = sorted(
        f"failover-{round_}-{n}-{p}"
        for round_ in (1, 2)
        for n, partitions in TOPICS.items()
        for p in range(partitions)
    )
    assert _read(survivors, "read_committed", TOPICS, 6, ("failover-",)) == expected


def _frame(request: Any, correlation_id: int) -> bytes:
    body = io.BytesIO()
    entity_writer(type(request))(body, request)
    api = (int(request.__api_key__), int(request.__version__))
    payload = struct.pack(">hhih", *api, correlation_id, 4) + b"test" + body.getvalue()
    return struct.pack(">i", len(payload)) + payload


def _answer(sock: socket.socket, request: Any, correlation_id: int) -> Any:
    (size,) = struct.unpack(">i", read_exactly(sock, 4))
    data = read_exactly(sock, size)
    assert struct.unpack_from(">i", data)[0] == correlation_id
    schema = load_response_schema(int(request.__api_key__), int(request.__version__))
    return entity_reader(schema)(data, 4)[0]


def _init_producer_id(boot: str, txn_id: str) -> tuple[str, Any]:
    """InitProducerId for `txn_id` at its coordinator, found as a client finds it (an earlier
    test may have killed a node): (the coordinator's address, the answer)."""
    ipi, fc = _wire(4, "init_producer_id"), _wire(3, "find_coordinator")
    timeout = i32Timedelta.parse(datetime.timedelta(seconds=60))
    init = ipi.InitProducerIdRequest(transactional_id=ipi.TransactionalId(txn_id),
                                     transaction_timeout=timeout)  # fmt: skip
    deadline = time.monotonic() + 30
    for attempt in itertools.count():
        started = None
        try:
            found = kafka_call(
                boot.split(",")[attempt % 3],
                fc.FindCoordinatorRequest(key=txn_id, key_type=i8(1)),
            )
            address = f"{found.host}:{found.port}"
            started = kafka_call(address, init)
        except OSError:
            pass
        if started is not None and started.error_code == ErrorCode.none:
            return address, started
        assert time.monotonic() < deadline, started
        time.sleep(0.2)
    raise AssertionError("unreachable")


def _add_partition_request(txn_id: str, pid: Any, epoch: Any, topic: str) -> Any:
    """AddPartitionsToTxn v0 of partition 0 of `topic` to `txn_id`'s transaction."""
    ap = _wire(0, "add_partitions_to_txn")
    return ap.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=ap.TransactionalId(txn_id),
        v3_and_below_producer_id=pid,
        v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=(
            ap.AddPartitionsToTxnTopic(name=ap.TopicName(topic), partitions=(i32(0),)),
        ),
    )


def test_an_end_txn_pipelined_behind_add_partitions_to_txn_sees_the_partition_added(
    boot: str,
) -> None:
    """librdkafka's abort_transaction with records still queued sends EndTxn(abort) right behind
    its AddPartitionsToTxn on one connection; Kafka serves a connection's requests one at a
    time, so the EndTxn sees the partition added and aborts the transaction."""
    et = _wire(1, "end_txn")
    codes = []
    for n in range(5):
        txn_id = f"txn-pipelined-{n}"
        address, started = _init_producer_id(boot, txn_id)
        pid, epoch = started.producer_id, started.producer_epoch
        add = _add_partition_request(txn_id, pid, epoch, "txn-a")
        end = et.EndTxnRequest(transactional_id=et.TransactionalId(txn_id), producer_id=pid,
                               producer_epoch=epoch, committed=False)  # fmt: skip
        host, _, port = address.rpartition(":")
        with socket.create_connection((host, int(port)), timeout=15) as sock:
            sock.sendall(_frame(add, 1) + _frame(end, 2))  # both before either answer
            added, ended = _answer(sock, add, 1), _answer(sock, end, 2)
        added_partition = added.results_by_topic_v3_and_below[0].results_by_partition[0]
        assert added_partition.partition_error_code == ErrorCode.none
        codes.append(ended.error_code)
    assert codes == [ErrorCode.none] * 5, codes


def test_a_reused_sequence_after_an_abort_is_refused_not_acknowledged_as_the_old_batch(
    boot: str,
) -> None:
    """librdkafka's abort_transaction purges a batch it had queued for a retry after its
    leader died, though the leader had written it (and the next leader committed it), and
    numbers the next transaction's first batch there from the purged batch's sequence. Taken
    for a retry, that new batch was acknowledged at the aborted batch's offset and never
    written: the chaos suite's lost committed writes. It is refused OUT_OF_ORDER_SEQUENCE
    and nothing is written (test_sequence_reuse.py: the same with librdkafka itself)."""
    et = _wire(1, "end_txn")
    txn_id = "txn-sequence-reuse"
    address, started = _init_producer_id(boot, txn_id)
    pid, epoch = started.producer_id, started.producer_epoch

    def add() -> None:
        request = _add_partition_request(txn_id, pid, epoch, "txn-b")
        deadline = time.monotonic() + 30
        while True:  # CONCURRENT_TRANSACTIONS while the last one completes
            answer = kafka_call(address, request)
            code = answer.results_by_topic_v3_and_below[0].results_by_partition[0]
            if code.partition_error_code == ErrorCode.none:
                return
            assert time.monotonic() < deadline, code
            time.sleep(0.1)

    def produce(value: bytes) -> int:
        """The partition leader's answer (an earlier test killed a node: leaders move)."""
        batch = encode_batch(
            [RecordInput(None, value, 0)],
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=0,
            is_transactional=True,
        )
        deadline = time.monotonic() + 30
        while True:
            for address in boot.split(","):
                try:
                    answer = kafka_call(address, produce_request("txn-b", batch))
                except OSError:
                    continue
                code = int(answer.responses[0].partition_responses[0].error_code)
                if code != int(ErrorCode.not_leader_or_follower):
                    return code
            assert time.monotonic() < deadline, "no leader for txn-b-0"
            time.sleep(0.2)

    def abort() -> None:
        end = et.EndTxnRequest(transactional_id=et.TransactionalId(txn_id), producer_id=pid,
                               producer_epoch=epoch, committed=False)  # fmt: skip
        assert kafka_call(address, end).error_code == ErrorCode.none

    add()
    assert produce(b"reuse-written-then-purged") == int(ErrorCode.none)
    abort()
    add()
    assert produce(b"reuse-next-transaction") == int(ErrorCode.out_of_order_sequence_number)
    abort()
    seen = _read(boot, "read_uncommitted", {"txn-b": 1}, 1, ("reuse-",))
    assert seen == ["reuse-written-then-purged"]


def test_end_txn_v5_answers_the_next_producer_and_a_retry_gets_it_again(boot: str) -> None:
    """EndTxn v5 (KIP-890 part 2) answers the producer the next transaction uses (the epoch
    bumped; at the spent epoch a new producer id at epoch 0, shown on the real handlers in
    tests/unit/rpc/test_txn_rotation_handlers.py, since reaching it here takes 32766
    commits); a retry with the epoch it ended at (its answer lost) gets the same answer, and
    the next transaction under the answered producer is held while the end completes, then
    joins it, while the ended epoch is fenced."""
    et = _wire(5, "end_txn")
    txn_id = "txn-end-v5"
    address, started = _init_producer_id(boot, txn_id)
    pid, epoch = started.producer_id, started.producer_epoch

    def added(producer_epoch: Any) -> Any:
        answer = kafka_call(address, _add_partition_request(txn_id, pid, producer_epoch, "txn-a"))
        return answer.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code

    def end(producer_epoch: Any) -> Any:
        return kafka_call(
            address,
            et.EndTxnRequest(
                transactional_id=et.TransactionalId(txn_id),
                producer_id=pid,
                producer_epoch=producer_epoch,
                committed=True,
            ),
        )

    assert added(epoch) == ErrorCode.none
    ended = end(epoch)
    answered = (ended.error_code, ended.producer_id, ended.producer_epoch)
    assert answered == (ErrorCode.none, pid, epoch + 1)
    again = end(epoch)
    assert (again.error_code, again.producer_id, again.producer_epoch) == answered
    assert added(ended.producer_epoch) == ErrorCode.none
    assert added(epoch) == ErrorCode.producer_fenced


def test_the_chaos_final_read_does_not_take_a_hanging_transaction_for_the_end(boot: str) -> None:
    """The txn chaos workload's final read, read_committed, reads each partition up to its
    high watermark. A transaction left open (its producer gone when the run stopped) holds
    the last stable offset back, and committed records after it stay unread until the
    coordinator ends it: the partition is unfinished (the run unchecked), not finished at the
    last stable offset with those records reported lost. librdkafka answers a read_committed
    consumer's watermark query with the last stable offset, so the end is asked by a
    read_uncommitted one."""
    hanging = _producer(boot, "txn-final-hanging")
    hanging.begin_transaction()  # type: ignore[attr-defined]
    hanging.produce("txn-final", value=b"final-hanging", partition=0)  # type: ignore[attr-defined]
    assert hanging.flush(30) == 0  # type: ignore[attr-defined]
    committer = _producer(boot, "txn-final-committer")
    committer.begin_transaction()  # type: ignore[attr-defined]
    committer.produce("txn-final", value=b"final-committed", partition=0)  # type: ignore[attr-defined]
    committer.commit_transaction(30)  # type: ignore[attr-defined]
    # EndTxn is answered once the decision is committed; the COMMIT marker follows it, as in
    # Kafka. The end the final read takes must include it.
    watermarks = kafka.Consumer(
        {
            "bootstrap.servers": boot,
            "group.id": "txn-final-probe",
            "isolation.level": "read_uncommitted",  # else the answer is the LSO, held at 0
        }
    )
    try:
        deadline = time.monotonic() + 30
        while watermarks.get_watermark_offsets(kafka.TopicPartition("txn-final", 0), 10)[1] < 3:
            assert time.monotonic() < deadline, "the COMMIT marker was not written in 30 s"
            time.sleep(0.05)
    finally:
        watermarks.close()

    recorder = HistoryRecorder(time.monotonic_ns)
    options = TxnOptions(topics=("txn-final",), partitions=1, final_read_timeout_s=3.0)
    try:
        final_txn_read(boot, recorder, options)
    finally:
        hanging.abort_transaction(30)  # type: ignore[attr-defined]
    done = recorder.events[-1]
    assert done.type == "ok", done
    assert done.value["unfinished"] == [["txn-final", 0]]
    assert done.value["ends"] == {"txn-final/0": 3}  # two records and the COMMIT marker
    assert done.value["records"] == []  # the open transaction's first offset is 0
