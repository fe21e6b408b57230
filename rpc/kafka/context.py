"""What every Kafka handler gets: the node port, the listener's bounds, this node's id and
Kafka address, and where other nodes' Kafka listeners are (from the metadata quorum, where
each node registers its advertised Kafka address).

The node is the gRPC servicers' `NodePort`; of it the Kafka handlers call the metadata
reads (`metadata`, `controller_id`, `wait_metadata_caught_up`), the data calls (`produce`,
`fetch`, `list_offsets`, `end_offset_for_epoch`, `allocate_producer_id`) and the
admin calls (`create_topic`, `delete_topic`, `create_partitions`, `delete_records`, `submit`
for group offsets and topic auto-creation).
KIP-848 groups go to the node's `ConsumerGroupService`, the coordinator the gRPC Groups
service uses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from raftlog.config import KafkaConfig, NodeConfig
from raftlog.metadata.consumer_group_service import ConsumerGroupService
from raftlog.rpc.kafka.auth import Session
from raftlog.rpc.kafka.auto_create import AutoTopicCreator
from raftlog.rpc.kafka.classic_group_coordinator import ClassicGroups
from raftlog.rpc.kafka.topic_regex import TopicRegexes
from raftlog.rpc.port import NodePort
from raftlog.rpc.security import Permission
from raftlog.types import NodeId

__all__ = ["KafkaContext", "split_address"]


def split_address(address: str) -> tuple[str, int]:
    """`address` ("host:port", split at the last colon) as (host, port); asserts it has a host and a
    numeric port."""
    host, _, port = address.rpartition(":")
    assert host and port.isdigit(), address
    return host, int(port)


@dataclass(frozen=True, slots=True)
class KafkaContext:
    node: NodePort
    # The metadata term this node coordinates consumer groups in (None: not the controller,
    # or its term's first entry not applied yet), as raftlog's own group service sees it.
    controller_term: Callable[[], int | None]
    node_config: NodeConfig
    node_id: NodeId
    kafka_address: str
    groups: ClassicGroups
    # raftlog's group coordinator, shared with the gRPC Groups service (KIP-848 groups).
    consumer_groups: ConsumerGroupService
    # The patterns of members subscribed by regex, beside the coordinator's topic names.
    topic_regexes: TopicRegexes
    # Topics on their way to being created for a Metadata request (auto.create.topics.enable).
    auto_topics: AutoTopicCreator
    session: Session  # the connection's authentication (one context per connection)
    client_id: str = ""  # of the request being handled (the connection's client)

    def allowed(self, permission: Permission, topic: str) -> bool:
        """Whether this connection's principal holds `permission` on `topic` (always True without a
        token file)."""
        return self.session.allowed(permission, topic)

    @property
    def config(self) -> KafkaConfig:
        return self.node_config.kafka

    def kafka_address_of(self, node_id: NodeId) -> str:
        """The Kafka address `node_id` registered; "" if it has none (or is unknown)."""
        info = self.node.metadata.state.node(node_id)
        if info is not None and info.kafka_address:
            return info.kafka_address
        return self.kafka_address if node_id == self.node_id else ""

    def brokers(self) -> list[tuple[NodeId, str, int]]:
        """(node id, host, port) of every live node with a Kafka listener, this one too."""
        found: dict[NodeId, str] = {
            info.node_id: info.kafka_address
            for info in self.node.metadata.state.nodes()
            if info.kafka_address and info.alive
        }
        found.setdefault(self.node_id, self.kafka_address)
        return [(node, *split_address(found[node])) for node in sorted(found)]
