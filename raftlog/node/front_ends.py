"""The Kafka front end of a node: the Kafka wire-protocol listener beside the gRPC API.

Both front ends call the node through one port (`raftlog.node.api.NodeApi`); the Kafka one
is served when `--kafka-listen` is set, guarded by the node's token file (SASL/PLAIN) and,
with `--tls-cert`/`--tls-key`, by TLS (SSL, or SASL_SSL with tokens).
"""

from __future__ import annotations

import logging
import ssl

from raftlog.errors import ConfigError
from raftlog.metadata.consumer_group_service import ConsumerGroupService
from raftlog.rpc.kafka import KafkaListener
from raftlog.rpc.port import NodePort
from raftlog.rpc.security import load_access_control
from raftlog.settings import NodeSettings

__all__ = ["kafka_listener", "start_kafka_listener"]


def kafka_listener(
    api: NodePort, consumer_groups: ConsumerGroupService, settings: NodeSettings
) -> KafkaListener | None:
    """The Kafka wire-protocol listener, when --kafka-listen is set (not started)."""
    if settings.kafka_listen is None:
        return None
    # The node's token file (--auth-tokens) also guards Kafka clients (SASL/PLAIN).
    access = None if settings.auth_tokens is None else load_access_control(settings.auth_tokens)
    return KafkaListener(
        api,
        consumer_groups=consumer_groups,
        config=settings.config,
        node_id=settings.node_id,
        kafka_address=settings.kafka_address,
        access=access,
    )


async def start_kafka_listener(listener: KafkaListener, settings: NodeSettings) -> None:
    """Bind the listener on --kafka-listen; raises ConfigError on an unusable certificate."""
    assert settings.kafka_listen is not None
    tls = None if settings.tls_cert is None else _kafka_tls(settings)
    await listener.start(*settings.kafka_listen, ssl=tls)
    logging.getLogger("raftlog").info(
        "node %s serving Kafka clients on %s", settings.node_id, settings.kafka_address
    )


def _kafka_tls(settings: NodeSettings) -> ssl.SSLContext:
    assert settings.tls_cert is not None and settings.tls_key is not None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(str(settings.tls_cert), str(settings.tls_key))
    except (ssl.SSLError, OSError) as error:
        raise ConfigError(
            f"--tls-cert {settings.tls_cert} / --tls-key {settings.tls_key}: not a usable "
            f"certificate and key for the Kafka listener: {error}"
        ) from None
    return context
