"""The raftlog client library: Admin, Producer and Consumer over the raftlog.v1 gRPC API.

    from raftlog.client import Admin, Producer, Consumer

    admin = Admin("127.0.0.1:9091,127.0.0.1:9092")
    admin.create_topic("events", partitions=6, replication_factor=3)
    with Producer("127.0.0.1:9091", acks="all") as producer:
        meta = producer.send("events", value=b"hello", key=b"user-1").result(timeout=10)
    consumer = Consumer("127.0.0.1:9091")
    consumer.assign([("events", 0)])
    consumer.seek(("events", 0), 0)
    records = consumer.poll(timeout_ms=1000)

The modules behind it: `_connection` (bootstrap, metadata cache, leader routing, channels),
`producer` with `accumulator`, `partitioner` and the `_sender` thread, `consumer`, `admin`,
`config` (validated options) and `errors` (the exception tree).
"""

from raftlog.client import errors
from raftlog.client._connection import TopicPartition
from raftlog.client._transactions import ConsumerGroupMetadata
from raftlog.client.accumulator import RecordMetadata
from raftlog.client.admin import (
    Admin,
    ClusterDescription,
    NodeDescription,
    PartitionDescription,
    TopicDescription,
    TransactionDescription,
)
from raftlog.client.consumer import Consumer, ConsumerRecord
from raftlog.client.producer import Producer

__all__ = [
    "Admin",
    "ClusterDescription",
    "Consumer",
    "ConsumerGroupMetadata",
    "ConsumerRecord",
    "NodeDescription",
    "PartitionDescription",
    "Producer",
    "RecordMetadata",
    "TopicDescription",
    "TopicPartition",
    "TransactionDescription",
    "errors",
]
