"""Topic auto-creation: Kafka's auto.create.topics.enable (`kafka.auto_create_topics_enable`,
off by default).

Theory of operation. A Metadata request that names a topic this node's copy of the metadata
does not hold, sent with allow_auto_topic_creation (implied before v4), has the topic
created: the node submits an `AutoCreateTopic` through the node port (`submit`, which
reaches the controller wherever it is), the controller plans it as it plans a CreateTopics
(`raftlog.node.metadata_calls`), with `kafka.num_partitions` partitions and
`kafka.default_replication_factor` replicas, at most the live nodes. The Metadata is
answered at once with the retriable LEADER_NOT_AVAILABLE, and the client asks again until
the topic and its leaders exist, as Kafka's brokers answer. A name Kafka would not create
gets INVALID_TOPIC_EXCEPTION instead, and a principal without admin permission on it
TOPIC_AUTHORIZATION_FAILED (the Metadata handler decides both before asking here).

Bounds: a name on its way to the controller is not sent again, at most
`kafka.auto_create_in_flight_max` are on their way from one node (beyond that a name is
answered LEADER_NOT_AVAILABLE all the same, and a later Metadata sends it), and each waits
at most `kafka.auto_create_timeout_ms`. An outcome is only logged: the client learns it from
its next Metadata.
"""

from __future__ import annotations

import asyncio
import logging

from raftlog.config import KafkaConfig
from raftlog.errors import RaftlogError
from raftlog.metadata import AutoCreateTopic
from raftlog.rpc.port import NodePort

__all__ = ["AutoTopicCreator"]

log = logging.getLogger(__name__)


class AutoTopicCreator:
    """The auto-creations one node's Kafka listener has on their way (module docstring)."""

    def __init__(self, node: NodePort, config: KafkaConfig) -> None:
        self._node = node
        self._config = config
        self._in_flight: dict[str, asyncio.Task[None]] = {}

    @property
    def enabled(self) -> bool:
        """Whether this node creates unknown topics its Kafka clients ask for."""
        return self._config.auto_create_topics_enable

    def create_nowait(self, name: str, *, live_nodes: int) -> None:
        """Start creating topic `name`, whose name is valid, unless it is on its way already or
        the bound of creations in flight is reached."""
        assert self.enabled, name
        if (
            name in self._in_flight
            or len(self._in_flight) >= self._config.auto_create_in_flight_max
        ):
            return
        command = AutoCreateTopic(
            name=name,
            partition_count=self._config.num_partitions,
            replication_factor=max(1, min(self._config.default_replication_factor, live_nodes)),
        )
        task = asyncio.get_running_loop().create_task(self._create(command))
        self._in_flight[name] = task
        task.add_done_callback(lambda _: self._in_flight.pop(name, None))
        assert len(self._in_flight) <= self._config.auto_create_in_flight_max

    async def _create(self, command: AutoCreateTopic) -> None:
        timeout_s = self._config.auto_create_timeout_ms / 1000
        try:
            result = await self._node.submit(command, timeout_s=timeout_s)
        except (RaftlogError, TimeoutError) as error:
            log.info("auto-creating topic %r: %s", command.name, error or "timed out")
            return
        if result.ok:
            log.info("auto-created topic %r for a Kafka client", command.name)
        else:
            log.info(
                "auto-creating topic %r: %s %s", command.name, result.code.value, result.message
            )

    def close(self) -> None:
        """Cancel the creations on their way (the listener is closing)."""
        for task in list(self._in_flight.values()):
            task.cancel()
