"""SASL_SSL on the Kafka listener: TLS with the node's certificate, SASL/PLAIN with raftlog's
tokens (the password is a token, its principal's grants apply per topic), nothing served
before authentication."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftlog.cluster_cli import wait_for_controller
from raftlog.local_cluster import LocalCluster
from tests.security.pki import make_pki

kafka = pytest.importorskip("confluent_kafka")
admin_module = pytest.importorskip("confluent_kafka.admin")

TOKENS = {
    "admin": "admin-token-0123456789abcdef",
    "alice": "alice-token-0123456789abcdef",
    "node": "node-token-0123456789abcdef00",
}


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Path]]:
    """A cluster with a token file and TLS, and the CA that signed its certificate."""
    directory = tmp_path_factory.mktemp("kafka-sasl")
    tokens = directory / "tokens.toml"
    tokens.write_text(
        "[tokens]\n"
        + "".join(f'"{token}" = "{name}"\n' for name, token in TOKENS.items())
        + '[permissions.admin]\n"*" = ["read", "write", "admin"]\n'
        + '[permissions.alice]\n"alice-*" = ["read", "write"]\n'
        + '"transactional_id:alice-*" = ["write"]\n'
        + '[permissions.node]\n"*" = ["read", "write", "admin", "cluster"]\n'
    )
    tokens.chmod(0o600)
    pki = make_pki(directory)
    flags = ("--auth-tokens", str(tokens), "--tls-cert", str(pki.cert), "--tls-key",
             str(pki.key), "--tls-ca", str(pki.ca))  # fmt: skip
    cluster = LocalCluster.create(directory / "c", node_count=3, node_flags=flags)
    cluster.start()
    try:
        wait_for_controller(
            cluster.bootstrap, timeout_s=60, token=TOKENS["admin"], tls_ca=str(pki.ca)
        )
        yield cluster, pki.ca
    finally:
        cluster.stop()


def _sasl(secure: tuple[LocalCluster, Path], user: str, password: str) -> dict[str, Any]:
    cluster, ca = secure
    return {
        "bootstrap.servers": cluster.kafka_bootstrap,
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(ca),
        "sasl.mechanism": "PLAIN",
        "sasl.username": user,
        "sasl.password": password,
    }


def test_a_token_s_grants_apply_to_kafka_clients(secure: tuple[LocalCluster, Path]) -> None:
    client = admin_module.AdminClient(_sasl(secure, "admin", TOKENS["admin"]))
    for name in ("alice-data", "other-data"):
        topic = admin_module.NewTopic(name, num_partitions=1, replication_factor=3)
        client.create_topics([topic], operation_timeout=30)[name].result(timeout=40)
    time.sleep(1)  # leaders settle on the preferred replicas

    alice = _sasl(secure, "alice", TOKENS["alice"])
    results: dict[str, object] = {}
    producer = kafka.Producer({**alice, "acks": "all", "message.send.max.retries": 0})
    for name in ("alice-data", "other-data"):
        producer.produce(name, b"v", on_delivery=lambda e, m, n=name: results.update({n: e}))
    assert producer.flush(30) == 0
    assert results["alice-data"] is None
    denied = results["other-data"]
    assert denied is not None and denied.code() == kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED  # type: ignore[attr-defined]

    consumer = kafka.Consumer({**alice, "group.id": "alice-g", "enable.auto.commit": False})
    consumer.assign([kafka.TopicPartition("alice-data", 0, kafka.OFFSET_BEGINNING)])
    try:
        message = None
        deadline = time.monotonic() + 20
        while message is None and time.monotonic() < deadline:
            message = consumer.poll(0.5)
        assert message is not None and message.error() is None and message.value() == b"v"
    finally:
        consumer.close()


def test_a_kip848_group_member_needs_read_on_its_subscription(
    secure: tuple[LocalCluster, Path],
) -> None:
    """ConsumerGroupHeartbeat applies the grants of the gRPC heartbeat: `read` on every
    subscribed topic (the topics exist: the first test made them)."""
    alice = {
        **_sasl(secure, "alice", TOKENS["alice"]),
        "group.protocol": "consumer",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    }
    allowed = kafka.Consumer({**alice, "group.id": "alice-kip848"})
    refused = kafka.Consumer({**alice, "group.id": "alice-kip848-other"})
    allowed.subscribe(["alice-data"])
    refused.subscribe(["other-data"])
    try:
        message, error = None, None
        deadline = time.monotonic() + 30
        while (message is None or error is None) and time.monotonic() < deadline:
            got = allowed.poll(0.2)
            message = message or (got if got is not None and got.error() is None else None)
            failed = refused.poll(0.2)
            error = error or (failed.error() if failed is not None else None)
        assert message is not None and message.value() == b"v"
        assert error is not None
        assert error.code() == kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED, error  # type: ignore[attr-defined]
    finally:
        allowed.close()
        refused.close()


def test_no_or_a_wrong_token_is_served_nothing(secure: tuple[LocalCluster, Path]) -> None:
    for config in (
        {"bootstrap.servers": secure[0].kafka_bootstrap},  # no TLS, no SASL
        {**_sasl(secure, "x", "y"), "security.protocol": "SSL"},  # TLS without SASL
        _sasl(secure, "alice", "not-a-token-0123456789"),
    ):
        client = admin_module.AdminClient({**config, "socket.timeout.ms": 3000})
        with pytest.raises(kafka.KafkaException):
            client.list_topics(timeout=3)


def test_authorized_operations_follow_the_token_s_grants(
    secure: tuple[LocalCluster, Path],
) -> None:
    """Metadata and DescribeCluster answer, when asked, the operations a principal's grants
    allow, as Kafka's bit sets (KIP-430): `read` is READ, DESCRIBE and DESCRIBE_CONFIGS on a
    topic, `write` WRITE, `admin` CREATE, DELETE, ALTER and ALTER_CONFIGS; on the cluster
    every principal may DESCRIBE, DESCRIBE_CONFIGS and IDEMPOTENT_WRITE, `admin` on every
    topic ("*") adds CREATE, `cluster` CLUSTER_ACTION, ALTER and ALTER_CONFIGS (the topics
    exist: the first test made them)."""
    acl = admin_module.AclOperation
    everyone = {acl.DESCRIBE, acl.DESCRIBE_CONFIGS, acl.IDEMPOTENT_WRITE}
    read_write = {acl.READ, acl.WRITE, acl.DESCRIBE, acl.DESCRIBE_CONFIGS}
    admin_ops = {acl.CREATE, acl.DELETE, acl.ALTER, acl.ALTER_CONFIGS}
    expected = {
        "alice": (everyone, {"alice-data": read_write}),
        "admin": (everyone | {acl.CREATE}, {"other-data": read_write | admin_ops}),
    }
    for user, (cluster_ops, topic_ops) in expected.items():
        client = admin_module.AdminClient(_sasl(secure, user, TOKENS[user]))
        described = client.describe_cluster(include_authorized_operations=True)
        assert set(described.result(timeout=20).authorized_operations) == cluster_ops, user
        for name, ops in topic_ops.items():
            topics = kafka.TopicCollection([name])
            futures = client.describe_topics(topics, include_authorized_operations=True)
            assert set(futures[name].result(timeout=20).authorized_operations) == ops, user


def test_a_transactional_id_needs_a_grant(secure: tuple[LocalCluster, Path]) -> None:
    """A token uses a transactional id only with `write` on `transactional_id:<id>`; any other
    id is TRANSACTIONAL_ID_AUTHORIZATION_FAILED, fatal for the producer."""
    alice = _sasl(secure, "alice", TOKENS["alice"])
    allowed = kafka.Producer({**alice, "transactional.id": "alice-tx"})
    allowed.init_transactions(30)
    refused = kafka.Producer({**alice, "transactional.id": "bob-tx"})
    with pytest.raises(kafka.KafkaException) as raised:
        refused.init_transactions(30)
    error = raised.value.args[0]
    assert error.code() == kafka.KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert error.fatal()
