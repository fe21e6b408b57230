"""InitProducerId, idempotence, OffsetForLeaderEpoch and DescribeCluster with real clients;
pipelined produces answered in request order."""

from __future__ import annotations

import datetime
import socket

import pytest
from kio.schema.api_versions.v0.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4 import request as ipi
from kio.schema.offset_for_leader_epoch.v4 import request as ofle
from kio.static.primitive import i16, i32, i32Timedelta

from raftlog.client import Admin
from raftlog.local_cluster import LocalCluster
from raftlog.storage.records import RecordInput, encode_batch
from tests.kafka.kafka_wire import (
    create_topic,
    decode_response,
    kafka_call,
    produce_request,
    read_frame,
    request_frame,
)

kafka = pytest.importorskip("confluent_kafka")
admin_module = pytest.importorskip("confluent_kafka.admin")


def test_idempotent_producer_writes_each_record_once(kafka_cluster: LocalCluster) -> None:
    create_topic(kafka_cluster, "idem", partitions=2)
    boot = kafka_cluster.kafka_bootstrap
    producer = kafka.Producer(
        {"bootstrap.servers": boot, "enable.idempotence": True, "linger.ms": 2}
    )
    for i in range(500):
        producer.produce("idem", key=b"%d" % i, value=b"v%d" % i)
    assert producer.flush(30) == 0
    consumer = kafka.Consumer(
        {"bootstrap.servers": boot, "group.id": "unused", "enable.auto.commit": False}
    )
    consumer.assign([kafka.TopicPartition("idem", p, kafka.OFFSET_BEGINNING) for p in (0, 1)])
    keys: list[bytes] = []
    try:
        while len(keys) < 500:
            message = consumer.poll(10)
            assert message is not None and message.error() is None
            keys.append(message.key())
    finally:
        consumer.close()
    assert sorted(keys) == sorted(b"%d" % i for i in range(500))


def _init_transactional(address: str, timeout_s: int) -> tuple[ErrorCode, int, int]:
    request = ipi.InitProducerIdRequest(
        transactional_id=ipi.TransactionalId("t1"),
        transaction_timeout=i32Timedelta.parse(datetime.timedelta(seconds=timeout_s)),
        producer_id=ipi.ProducerId(-1),
        producer_epoch=i16(-1),
    )
    response = kafka_call(address, request)
    return response.error_code, int(response.producer_id), int(response.producer_epoch)


def test_init_producer_id_with_a_transactional_id_answers_on_the_coordinator_only(
    kafka_cluster: LocalCluster,
) -> None:
    """The controller is the transaction coordinator: it hands out a producer id at epoch 0,
    then bumps the epoch at each InitProducerId of the same id; the other nodes answer
    NOT_COORDINATOR, and a timeout past transaction.max.timeout.ms is refused."""
    answers = {
        node_id: _init_transactional(f"127.0.0.1:{node.kafka_port}", 60)
        for node_id, node in kafka_cluster.nodes.items()
    }
    coordinators = [n for n, (code, _, _) in answers.items() if code == ErrorCode.none]
    assert len(coordinators) == 1, answers
    assert all(
        code == ErrorCode.not_coordinator
        for n, (code, _, _) in answers.items()
        if n not in coordinators
    ), answers
    address = f"127.0.0.1:{kafka_cluster.nodes[coordinators[0]].kafka_port}"
    _, producer_id, epoch = answers[coordinators[0]]
    assert producer_id >= 0 and epoch == 0
    assert _init_transactional(address, 60) == (ErrorCode.none, producer_id, 1)
    assert _init_transactional(address, 3600)[0] == ErrorCode.invalid_transaction_timeout


def test_offset_for_leader_epoch_is_the_raft_term_and_high_watermark(
    kafka_cluster: LocalCluster,
) -> None:
    create_topic(kafka_cluster, "epochs", partitions=1)
    producer = kafka.Producer({"bootstrap.servers": kafka_cluster.kafka_bootstrap})
    for i in range(10):
        producer.produce("epochs", value=b"%d" % i, partition=0)
    assert producer.flush(30) == 0
    with Admin(kafka_cluster.bootstrap) as admin:
        (partition,) = admin.describe_topic("epochs").partitions
    assert partition.leader is not None
    leader = kafka_cluster.nodes[partition.leader]
    term = partition.epoch
    consumer = kafka.Consumer({"bootstrap.servers": kafka_cluster.kafka_bootstrap, "group.id": "x"})
    try:
        _, high_watermark = consumer.get_watermark_offsets(
            kafka.TopicPartition("epochs", 0), timeout=10
        )
    finally:
        consumer.close()
    request = ofle.OffsetForLeaderEpochRequest(
        replica_id=ofle.BrokerId(-1),
        topics=(
            ofle.OffsetForLeaderTopic(
                topic=ofle.TopicName("epochs"),
                partitions=(
                    ofle.OffsetForLeaderPartition(
                        partition=i32(0), current_leader_epoch=i32(term), leader_epoch=i32(term)
                    ),
                ),
            ),
        ),
    )
    response = kafka_call(f"127.0.0.1:{leader.kafka_port}", request)
    (answer,) = response.topics[0].partitions
    assert answer.error_code == ErrorCode.none
    assert (answer.leader_epoch, answer.end_offset) == (term, high_watermark)
    # A follower refuses: only the leader knows what is committed.
    follower = next(n for n in kafka_cluster.nodes.values() if n.node_id != partition.leader)
    response = kafka_call(f"127.0.0.1:{follower.kafka_port}", request)
    assert response.topics[0].partitions[0].error_code == ErrorCode.not_leader_or_follower


def test_describe_cluster_lists_every_kafka_listener_and_the_controller(
    kafka_cluster: LocalCluster,
) -> None:
    client = admin_module.AdminClient({"bootstrap.servers": kafka_cluster.kafka_bootstrap})
    described = client.describe_cluster(request_timeout=15).result(timeout=20)
    listed = {(n.id, n.host, n.port) for n in described.nodes}
    assert listed == {(n.node_id, "127.0.0.1", n.kafka_port) for n in kafka_cluster.nodes.values()}
    with Admin(kafka_cluster.bootstrap) as admin:
        assert described.controller.id == admin.describe_cluster().controller_id


def test_a_retried_batch_answers_its_first_offsets_and_is_written_once(
    kafka_cluster: LocalCluster,
) -> None:
    create_topic(kafka_cluster, "retried", partitions=1)
    node = next(iter(kafka_cluster.nodes.values()))
    init = ipi.InitProducerIdRequest(
        transactional_id=None,
        transaction_timeout=i32Timedelta.parse(datetime.timedelta(seconds=60)),
        producer_id=ipi.ProducerId(-1),
        producer_epoch=i16(-1),
    )
    granted = kafka_call(f"127.0.0.1:{node.kafka_port}", init)
    assert granted.error_code == ErrorCode.none and granted.producer_id >= 0
    batch = encode_batch(
        [RecordInput(b"k", b"once", 1_700_000_000_000)],
        producer_id=granted.producer_id,
        producer_epoch=granted.producer_epoch,
        base_sequence=0,
    )
    with Admin(kafka_cluster.bootstrap) as admin:
        (partition,) = admin.describe_topic("retried").partitions
    assert partition.leader is not None
    leader = f"127.0.0.1:{kafka_cluster.nodes[partition.leader].kafka_port}"
    answers = [kafka_call(leader, produce_request("retried", batch)) for _ in range(2)]
    first, again = (a.responses[0].partition_responses[0] for a in answers)
    assert first.error_code == again.error_code == ErrorCode.none
    assert first.base_offset == again.base_offset
    # A batch that skips a sequence number is refused, as today's gRPC path refuses it.
    gap = encode_batch(
        [RecordInput(b"k", b"gap", 1_700_000_000_000)],
        producer_id=granted.producer_id,
        producer_epoch=granted.producer_epoch,
        base_sequence=5,
    )
    refused = kafka_call(leader, produce_request("retried", gap))
    code = refused.responses[0].partition_responses[0].error_code
    assert code == ErrorCode.out_of_order_sequence_number
    consumer = kafka.Consumer({"bootstrap.servers": kafka_cluster.kafka_bootstrap, "group.id": "x"})
    try:
        _, high = consumer.get_watermark_offsets(kafka.TopicPartition("retried", 0), timeout=10)
    finally:
        consumer.close()
    assert high == first.base_offset + 1  # the record once, nothing after it


def test_an_idempotent_producer_continues_into_a_recreated_topic(
    kafka_cluster: LocalCluster,
) -> None:
    # The recreated partition knows nothing of the producer, whose next batch continues its
    # sequence: Kafka accepts it (librdkafka test 0107). Refused OUT_OF_ORDER_SEQUENCE, the
    # producer raised a fatal error and produced nothing more. And librdkafka ignores metadata
    # whose leader epoch is below the one it cached for the name: were the new partition's
    # epoch lower than the deleted one's, the producer's records stayed queued forever.
    create_topic(kafka_cluster, "recreated", partitions=1)
    fatal: list[object] = []
    producer = kafka.Producer(
        {"bootstrap.servers": kafka_cluster.kafka_bootstrap, "enable.idempotence": True,
         "linger.ms": 2, "error_cb": lambda error: fatal.append(error) if error.fatal() else None}
    )  # fmt: skip
    for i in range(10):
        producer.produce("recreated", value=b"before-%d" % i, partition=0)
    assert producer.flush(30) == 0
    admin = Admin(kafka_cluster.bootstrap)
    deleted_epoch = admin.describe_topic("recreated").partitions[0].epoch
    admin.delete_topic("recreated")
    create_topic(kafka_cluster, "recreated", partitions=1)
    assert admin.describe_topic("recreated").partitions[0].epoch > deleted_epoch
    admin.close()
    failures: list[object] = []
    for i in range(10):
        producer.produce(
            "recreated",
            value=b"after-%d" % i,
            partition=0,
            on_delivery=lambda error, message: failures.append(error) if error else None,
        )
    assert producer.flush(60) == 0
    assert fatal == [] and failures == []
    consumer = kafka.Consumer(
        {"bootstrap.servers": kafka_cluster.kafka_bootstrap, "group.id": "unused",
         "enable.auto.commit": False}
    )  # fmt: skip
    consumer.assign([kafka.TopicPartition("recreated", 0, kafka.OFFSET_BEGINNING)])
    values: list[bytes] = []
    try:
        while len(values) < 10:
            message = consumer.poll(10)
            assert message is not None and message.error() is None
            values.append(message.value())
    finally:
        consumer.close()
    assert values == [b"after-%d" % i for i in range(10)]


def test_pipelined_responses_come_back_in_request_order(kafka_cluster: LocalCluster) -> None:
    """Responses on one connection leave in request order (Kafka requires it), whichever
    handler finishes first: produces (answered when committed) pipelined with ApiVersions
    (answered at once), sent in one write on one socket."""
    create_topic(kafka_cluster, "pipelined", partitions=1)
    with Admin(kafka_cluster.bootstrap) as admin:
        leader = admin.describe_topic("pipelined").partitions[0].leader
    port = kafka_cluster.nodes[leader].kafka_port
    requests = []
    for index in range(4):
        batch = encode_batch([RecordInput(b"k", b"value %d" % index, 1_700_000_000_000)])
        requests += [produce_request("pipelined", batch), ApiVersionsRequest()]
    frames = b"".join(request_frame(r, correlation_id) for correlation_id, r in enumerate(requests))
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        sock.sendall(frames)
        answers = [read_frame(sock) for _ in requests]
    assert [correlation_id for correlation_id, _ in answers] == list(range(len(requests)))
    produced = [
        decode_response(request, data)
        for request, (_, data) in zip(requests, answers, strict=True)
        if request.__api_key__ == 0
    ]
    parts = [response.responses[0].partition_responses[0] for response in produced]
    assert all(part.error_code == ErrorCode.none for part in parts), parts
    offsets = [part.base_offset for part in parts]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets), offsets
