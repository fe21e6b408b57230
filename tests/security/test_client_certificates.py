"""Mutual TLS for clients (`--tls-client-ca`): a real node, clients with certificates.

A client whose certificate chains to the node's client CA is the principal its certificate
names (CN, or its first SAN without a CN) and gets exactly the permissions the ACL file grants
that principal, as a token principal would. A client without a certificate, or with one from
another CA, is refused with an error that says so; a token, when sent, still wins.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftlog.client import Admin, Consumer, Producer
from raftlog.client.errors import ClientError
from raftlog.errors import ConfigError
from raftlog.local_cluster import LocalCluster
from raftlog.rpc.security import certificate_principal
from raftlog.serve import settings_from_args
from tests.security.pki import TOKENS, Pki, make_client_cert
from tests.security.test_access_control import parse
from tests.security.test_secure_cluster import raftlog_cli

BOB = "spiffe://raftlog-test/bob"  # a certificate without a CN: its SAN is the principal


def write_acl(path: Path) -> Path:
    path.write_text(
        f'[tokens]\n"{TOKENS["admin"]}" = "admin"\n'
        '[permissions.admin]\n"*" = ["read", "write", "admin"]\n'
        '[permissions.operator]\n"*" = ["read", "write", "admin"]\n'
        '[permissions.alice]\n"orders" = ["read", "write"]\n'
        f'[permissions."{BOB}"]\n"orders" = ["read"]\n'
    )
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def certs(pki: Pki) -> dict[str, Pki]:
    root = pki.ca.parent
    return {
        "operator": make_client_cert(root, "operator"),
        "alice": make_client_cert(root, "alice"),
        "bob": make_client_cert(root, "", san=f"URI:{BOB}"),
        "mallory": make_client_cert(root, "alice", authority="foreign"),  # alice's CN, wrong CA
    }


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, pki: Pki, certs: dict[str, Pki]
) -> Iterator[LocalCluster]:
    directory = tmp_path_factory.mktemp("mtls")
    acl = write_acl(directory / "acl.toml")
    cluster = LocalCluster.create(directory / "cluster", node_count=1)
    node_tls = ("--tls-cert", str(pki.cert), "--tls-key", str(pki.key), "--tls-ca", str(pki.ca))
    cluster.start(*node_tls, "--auth-tokens", str(acl), "--tls-client-ca", str(pki.ca))
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with Admin(cluster.bootstrap, **options(pki, certs["operator"])) as admin:
                    if admin.describe_cluster().controller_id is not None:
                        admin.create_topic("orders", partitions=1, replication_factor=1)
                        break
            except ClientError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.2)
        yield cluster
    finally:
        cluster.stop()


def options(pki: Pki, cert: Pki | None, token: str | None = None) -> dict[str, Any]:
    """Client options: trust the node's CA, present `cert` (if any), send `token` (if any)."""
    files = {} if cert is None else {"tls_cert": cert.cert, "tls_key": cert.key}
    return {"tls_ca": pki.ca, "request_timeout_ms": 5000, "token": token, **files}


def test_a_certificate_principal_produces_and_consumes_what_it_is_granted(
    cluster: LocalCluster, pki: Pki, certs: dict[str, Pki]
) -> None:
    with Producer(cluster.bootstrap, **options(pki, certs["alice"])) as producer:
        sent = producer.send("orders", value=b"from alice").result(timeout=30)
    consumer = Consumer(cluster.bootstrap, **options(pki, certs["bob"]))
    try:
        consumer.assign([("orders", 0)])
        consumer.seek(("orders", 0), sent.offset)
        records: list[Any] = []
        deadline = time.monotonic() + 30
        while not records and time.monotonic() < deadline:
            records = consumer.poll(timeout_ms=500)
        assert [r.value for r in records][:1] == [b"from alice"]
    finally:
        consumer.close()


@pytest.mark.parametrize(("who", "principal"), [("alice", "alice"), ("bob", BOB)])
def test_a_certificate_principal_is_denied_what_it_lacks(
    cluster: LocalCluster, pki: Pki, certs: dict[str, Pki], who: str, principal: str
) -> None:
    with (
        Admin(cluster.bootstrap, **options(pki, certs[who])) as admin,
        pytest.raises(ClientError) as caught,
    ):
        admin.create_topic("payroll", partitions=1, replication_factor=1)
    message = str(caught.value)
    assert "PERMISSION_DENIED" in message and f"{principal!r}" in message, message
    assert "'payroll'" in message and "'admin'" in message, message


def test_a_client_without_a_certificate_is_told_it_needs_one(
    cluster: LocalCluster, pki: Pki
) -> None:
    with (
        Admin(cluster.bootstrap, **options(pki, None, token=TOKENS["admin"])) as admin,
        pytest.raises(ClientError) as caught,
    ):
        admin.list_topics()
    message = str(caught.value)
    assert "requires a client certificate" in message and "presented none" in message, message


def test_a_certificate_from_another_ca_is_refused(
    cluster: LocalCluster, pki: Pki, certs: dict[str, Pki]
) -> None:
    with (
        Admin(cluster.bootstrap, **options(pki, certs["mallory"])) as admin,
        pytest.raises(ClientError) as caught,
    ):
        admin.list_topics()
    message = str(caught.value)
    assert "requires a client certificate" in message, message
    assert str(certs["mallory"].cert) in message, message


def test_a_token_wins_over_the_certificate(
    cluster: LocalCluster, pki: Pki, certs: dict[str, Pki]
) -> None:
    with Admin(cluster.bootstrap, **options(pki, certs["alice"], token=TOKENS["admin"])) as admin:
        admin.create_topic("alice-as-admin", partitions=1, replication_factor=1)
        assert "alice-as-admin" in admin.list_topics()


def test_the_cli_takes_a_client_certificate(
    cluster: LocalCluster, pki: Pki, certs: dict[str, Pki]
) -> None:
    alice = certs["alice"]
    mtls = ("--bootstrap", cluster.bootstrap, "--tls-ca", str(pki.ca),
            "--tls-cert", str(alice.cert), "--tls-key", str(alice.key))  # fmt: skip
    code, out = raftlog_cli("produce", "orders", *mtls, stdin=b"cli\n")
    assert code == 0 and "produced 1 records" in out, out
    code, out = raftlog_cli("topic", "create", "nope", "--replication-factor", "1", *mtls)
    assert code == 1 and "PERMISSION_DENIED" in out and "'alice'" in out, out


def test_the_principal_is_the_cn_else_the_first_san() -> None:
    assert certificate_principal({"x509_common_name": [b"alice"]}) == "alice"
    both = {"x509_common_name": [b"alice"], "x509_subject_alternative_name": [b"x", b"y"]}
    assert certificate_principal(both) == "alice"
    san_only = {"x509_common_name": [b""], "x509_subject_alternative_name": [b"x", b"y"]}
    assert certificate_principal(san_only) == "x"
    assert certificate_principal({"transport_security_type": [b"ssl"]}) is None


def test_a_client_ca_needs_node_tls_and_an_acl_file(pki: Pki, tmp_path: Path) -> None:
    acl = write_acl(tmp_path / "acl.toml")
    tls = ("--tls-cert", str(pki.cert), "--tls-key", str(pki.key))
    settings = settings_from_args(parse(*tls, "--auth-tokens", str(acl), "--tls-client-ca", "ca"))
    assert settings.tls_client_ca == Path("ca")
    for argv in (
        (*tls, "--tls-client-ca", "ca"),
        ("--auth-tokens", str(acl), "--tls-client-ca", "ca"),
    ):
        with pytest.raises(ConfigError, match="tls_client_ca"):
            settings_from_args(parse(*argv))


def test_the_toml_key_tls_client_ca(tmp_path: Path, pki: Pki) -> None:
    from raftlog.settings import settings_from_toml

    acl = write_acl(tmp_path / "acl.toml")
    path = tmp_path / "node.toml"
    path.write_text(
        f'[node]\nnode_id = 1\ndata_dir = "{tmp_path}"\nlisten = "127.0.0.1:1"\n'
        f'peers = "1=127.0.0.1:101"\ntls_cert = "{pki.cert}"\ntls_key = "{pki.key}"\n'
        f'auth_tokens = "{acl}"\ntls_client_ca = "{pki.ca}"\n'
    )
    assert settings_from_toml(path).tls_client_ca == pki.ca
