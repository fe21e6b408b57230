"""raftlog's own transactional Producer on the gRPC API, against a real node process:

- EndTxn bumps the producer epoch (KIP-890 part 2): the next transaction is numbered at the
  new epoch from sequence 0, and a late produce carrying the ended transaction's epoch is
  refused INVALID_PRODUCER_EPOCH instead of joining the next transaction (the Jepsen
  Bufstream scenario);
- TxnOffsetCommit with a consumer's `group_metadata()` is checked against the group's
  membership (KIP-447): a member that left (a zombie) or an epoch the coordinator never gave
  is refused, nothing is held, and the group's committed offsets stay those of the
  transactions that passed;
- an AddPartitionsToTxn arriving while the previous transaction's markers are still being
  written is held until that transaction completes, then joins the next transaction, instead
  of being refused CONCURRENT_TRANSACTIONS (the same hold as on the Kafka listener).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from raftlog.chaos.local_backend import send_fault_rules
from raftlog.client import Admin, Consumer, ConsumerGroupMetadata, Producer
from raftlog.client.errors import ServerError
from raftlog.local_cluster import LocalCluster
from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.rpc.v1 import raftlog_pb2_grpc as pb_grpc
from raftlog.storage.records import RecordInput, encode_batch
from tests.integration.conftest import start_cluster, wait_until

# --chaos: the marker hold (`hold_txn_markers`) of the held-request test.
GROUP_FLAGS = ("--set", "metadata.group_heartbeat_interval_ms=300", "--chaos")
WAIT_S = 60


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = start_cluster(tmp_path_factory.mktemp("grpc-txn"), 1, *GROUP_FLAGS)
    try:
        with Admin(cluster.bootstrap) as admin:
            for topic in ("late-out", "eos-in", "eos-out", "held-out"):
                admin.create_topic(topic, partitions=1, replication_factor=1)
        yield cluster
    finally:
        cluster.stop()


def _values(cluster: LocalCluster, topic: str, isolation: str) -> list[bytes]:
    with Consumer(
        cluster.bootstrap,
        auto_offset_reset="earliest",
        isolation_level=isolation,  # type: ignore[arg-type]
        consumer_timeout_ms=1500,
    ) as consumer:
        consumer.assign([(topic, 0)])
        return [r.value for r in consumer if r.value is not None]


def test_a_late_produce_of_an_ended_transaction_is_refused_not_joined_to_the_next(
    cluster: LocalCluster,
) -> None:
    with (
        Admin(cluster.bootstrap) as admin,
        Producer(cluster.bootstrap, transactional_id="late-writer") as producer,
    ):
        producer.init_transactions()
        first = admin.describe_transaction("late-writer")
        producer.begin_transaction()
        producer.send("late-out", value=b"first", partition=0).result(timeout=WAIT_S)
        producer.commit_transaction()
        bumped = admin.describe_transaction("late-writer")
        assert (bumped.producer_id, bumped.producer_epoch) == (
            first.producer_id,
            first.producer_epoch + 1,
        )

        producer.begin_transaction()  # numbered at the bumped epoch, from sequence 0
        producer.send("late-out", value=b"second", partition=0).result(timeout=WAIT_S)
        # The first transaction's batch arriving late: its epoch, and the sequence that
        # follows the two records above, the one the partition would take at that epoch had
        # EndTxn kept it. The partition is in the open transaction, so only the epoch
        # refuses it.
        late = encode_batch(
            [RecordInput(None, b"late", 0)],
            producer_id=first.producer_id,
            producer_epoch=first.producer_epoch,
            base_sequence=2,
            is_transactional=True,
        )
        request = pb.ProduceRequest(topic="late-out", partition=0, batches=[late])
        with grpc.insecure_channel(cluster.bootstrap) as channel:  # the one node leads
            answer = pb_grpc.LogStub(channel).Produce(request, timeout=WAIT_S)
        assert pb.ErrorCode.Name(answer.error.code) == "INVALID_PRODUCER_EPOCH", answer
        producer.commit_transaction()
        assert admin.describe_transaction("late-writer").producer_epoch == first.producer_epoch + 2

    assert _values(cluster, "late-out", "read_committed") == [b"first", b"second"]
    assert _values(cluster, "late-out", "read_uncommitted") == [b"first", b"second"]


def _subscribed(cluster: LocalCluster, group_id: str) -> Consumer:
    consumer = Consumer(
        cluster.bootstrap, group_id=group_id, auto_offset_reset="earliest", fetch_max_wait_ms=100
    )
    consumer.subscribe(["eos-in"])
    deadline = time.monotonic() + WAIT_S
    while not consumer.assignment():
        assert time.monotonic() < deadline, "no assignment in time"
        consumer.poll(timeout_ms=100)
    return consumer


def _transaction_with_offsets(
    producer: Producer, offset: int, group: str | ConsumerGroupMetadata
) -> None:
    producer.begin_transaction()
    producer.send("eos-out", value=f"out-{offset}".encode(), partition=0)
    producer.send_offsets_to_transaction({("eos-in", 0): offset}, group)
    producer.commit_transaction()


def _refused_code(producer: Producer, offset: int, group: str | ConsumerGroupMetadata) -> str:
    with pytest.raises(ServerError) as refused:
        _transaction_with_offsets(producer, offset, group)
    producer.abort_transaction()
    return refused.value.code


def test_offsets_of_a_member_that_is_no_longer_in_the_group_are_refused(
    cluster: LocalCluster,
) -> None:
    group_id = "eos-group"
    with Producer(cluster.bootstrap, transactional_id="eos-writer") as producer:
        producer.init_transactions()
        zombie = _subscribed(cluster, group_id)
        zombie_metadata = zombie.group_metadata()
        assert zombie_metadata.member_id and zombie_metadata.member_epoch > 0, zombie_metadata
        _transaction_with_offsets(producer, 3, zombie_metadata)
        # The offsets become the group's with the commit's markers, just after EndTxn.
        wait_until(lambda: zombie.committed(("eos-in", 0)) == 3, timeout_s=WAIT_S, what="3")
        zombie.close()  # leaves: its partition moves to the next member

        member = _subscribed(cluster, group_id)
        try:
            assert _refused_code(producer, 7, zombie_metadata) == "UNKNOWN_MEMBER"
            current = member.group_metadata()
            ahead = dataclasses.replace(current, member_epoch=current.member_epoch + 1)
            assert _refused_code(producer, 8, ahead) == "FENCED_MEMBER_EPOCH"
            _transaction_with_offsets(producer, 5, member.group_metadata())
            wait_until(lambda: member.committed(("eos-in", 0)) == 5, timeout_s=WAIT_S, what="5")
        finally:
            member.close()
    assert _values(cluster, "eos-out", "read_committed") == [b"out-3", b"out-5"]


def test_add_partitions_while_the_last_end_completes_is_held_not_refused(
    cluster: LocalCluster,
) -> None:
    """The markers of the first transaction are held (the node refuses to write them) when
    the next transaction's AddPartitionsToTxn arrives, so its previous transaction is
    certainly still completing: the request must wait for the completion and succeed, not
    come back CONCURRENT_TRANSACTIONS before the markers were written."""
    tid, partitions = "held-writer", [pb.TopicPartitions(topic="held-out", partitions=[0])]
    with grpc.insecure_channel(cluster.bootstrap) as channel:
        log = pb_grpc.LogStub(channel)
        init = log.InitProducerId(
            pb.InitProducerIdRequest(transactional_id=tid, transaction_timeout_ms=60_000),
            timeout=WAIT_S,
        )
        assert not init.HasField("error"), init
        producer = {"transactional_id": tid, "producer_id": init.producer_id}
        added = log.AddPartitionsToTxn(
            pb.AddPartitionsToTxnRequest(
                **producer, producer_epoch=init.producer_epoch, partitions=partitions
            ),
            timeout=WAIT_S,
        )
        assert not added.HasField("error"), added
        assert send_fault_rules(cluster.bootstrap, {"hold_txn_markers": True}, 10)
        lifted_at: list[float] = []
        try:
            ended = log.EndTxn(
                pb.EndTxnRequest(**producer, producer_epoch=init.producer_epoch, commit=True),
                timeout=WAIT_S,
            )
            assert not ended.HasField("error"), ended
            answers: list[tuple[pb.AddPartitionsToTxnResponse, float]] = []
            next_add = pb.AddPartitionsToTxnRequest(
                **producer, producer_epoch=ended.producer_epoch, partitions=partitions
            )
            sender = threading.Thread(
                target=lambda: answers.append(
                    (log.AddPartitionsToTxn(next_add, timeout=WAIT_S), time.monotonic())
                )
            )
            sender.start()
            # Whatever comes back before the hold is lifted was not held for the completion.
            time.sleep(1.0)
            lifted_at.append(time.monotonic())
            assert send_fault_rules(cluster.bootstrap, {"hold_txn_markers": False}, 10)
            sender.join(WAIT_S)
        finally:
            if not lifted_at:
                send_fault_rules(cluster.bootstrap, {"hold_txn_markers": False}, 10)
        [(answer, answered_at)] = answers
        assert not answer.HasField("error"), pb.ErrorCode.Name(answer.error.code)
        assert answered_at > lifted_at[0]
        with Admin(cluster.bootstrap) as admin:
            txn = admin.describe_transaction(tid)
        assert (txn.state, txn.producer_epoch) == ("Ongoing", ended.producer_epoch)
