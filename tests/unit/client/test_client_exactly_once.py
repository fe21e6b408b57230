"""Property: under planted faults, every acknowledged record is read back once, in send order.

The fake cluster refuses produce requests with retriable errors (NOT_LEADER with a hint,
REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS) and drops responses after appending (the client cannot
tell a lost answer from a lost request). With idempotence on, retries must neither lose nor
duplicate a record, and batches in flight (sent in sequence order, retried in order with
their sequence numbers) must keep each partition in order.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

from client_fake_cluster import FakeCluster
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftlog.client import Consumer, Producer
from raftlog.client.partitioner import partition_for_key
from raftlog.rpc.v1 import raftlog_pb2 as pb

PARTITIONS = 3
_topic_numbers = itertools.count()

records_strategy = st.lists(
    st.tuples(st.sampled_from([None, b"alpha", b"beta", b"gamma"]), st.binary(max_size=40)),
    min_size=1,
    max_size=40,
)
faults_strategy = st.lists(
    st.sampled_from([pb.NOT_LEADER, pb.REQUEST_TIMED_OUT, pb.NOT_ENOUGH_REPLICAS, -1]),
    max_size=6,
)


def read_partition(cluster: FakeCluster, topic: str, partition: int) -> list[tuple[int, bytes]]:
    consumer = Consumer(cluster.bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=0)
    consumer.assign([(topic, partition)])
    end = cluster.state.partition(topic, partition).high_watermark
    got: list[tuple[int, bytes]] = []
    while consumer.position((topic, partition)) < end:
        got.extend((r.offset, r.value or b"") for r in consumer.poll(timeout_ms=0))
    consumer.close()
    return got


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    records=records_strategy,
    faults=faults_strategy,
    compression=st.sampled_from([None, "lz4"]),
    linger_ms=st.sampled_from([0, 60_000]),
)
def test_acknowledged_records_arrive_exactly_once_in_order(
    cluster: FakeCluster,
    records: list[tuple[bytes | None, bytes]],
    faults: list[int],
    compression: str | None,
    linger_ms: int,
) -> None:
    topic = f"t{next(_topic_numbers)}"
    cluster.state.create_topic(topic, PARTITIONS, replication_factor=2)
    with cluster.state.condition:
        cluster.state.fail_next["Produce"] = [code for code in faults if code >= 0]
        cluster.state.drop_next_produce_responses = faults.count(-1)
    with Producer(
        cluster.bootstrap,
        compression=compression,
        linger_ms=linger_ms,
        retry_backoff_ms=0,  # type: ignore[arg-type]
    ) as producer:
        futures = [producer.send(topic, value=value, key=key) for key, value in records]
        producer.flush()
    sent: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
    for (key, value), future in zip(records, futures, strict=True):
        meta = future.result(0)
        if key is not None:
            assert meta.partition == partition_for_key(key, PARTITIONS)
        sent[meta.partition].append((meta.offset, value))
    for partition in range(PARTITIONS):
        offsets = [offset for offset, _ in sent[partition]]
        assert offsets == sorted(set(offsets)), "send order and offsets disagree"
        assert read_partition(cluster, topic, partition) == sent[partition]
