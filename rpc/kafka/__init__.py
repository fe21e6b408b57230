"""Kafka's wire protocol beside raftlog's gRPC API, so Kafka clients and tools work as they are.

`KafkaListener` serves one node's Kafka port. Message layouts come from kio (generated from
Apache Kafka's JSON schemas, chosen over kafka-python's by benchmarks/suites/kafka_codec.py);
handlers (`log_handlers`, `cluster_handlers`) call the broker only through `KafkaBroker`
(`port.py`), the same calls the gRPC servicers make, so no Raft or log logic lives here.
"""

from raftlog.rpc.kafka.apis import APIS, Api
from raftlog.rpc.kafka.port import KafkaBroker
from raftlog.rpc.kafka.server import KafkaListener

__all__ = ["APIS", "Api", "KafkaBroker", "KafkaListener"]
