"""Kafka's wire protocol beside raftlog's gRPC API, so Kafka clients and tools work as they are.

`KafkaListener` serves one node's Kafka port. Message layouts come from kio (generated from
Apache Kafka's JSON schemas, chosen over kafka-python's by benchmarks/suites/kafka_codec.py);
handlers call the node only through `raftlog.rpc.port.NodePort`, the port the gRPC
servicers use, and make the same calls they make, so no Raft or log logic lives here.
"""

from raftlog.rpc.kafka.apis import APIS, Api
from raftlog.rpc.kafka.server import KafkaListener

__all__ = ["APIS", "Api", "KafkaListener"]
