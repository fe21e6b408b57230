"""`diagnose_tls_refusal`: what a client is told when a TLS node refused it.

gRPC reports every handshake refusal as a closed socket; the diagnosis replays the handshake
with the client's own files. Servers here are in-process gRPC servers on loopback.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from raftlog.local_cluster import free_port_base
from raftlog.tls import TlsFiles, diagnose_tls_refusal, grpc_server_credentials
from tests.security.pki import Pki, make_client_cert


def start(credentials: grpc.ServerCredentials | None) -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    if credentials is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def mutual(pki: Pki) -> Iterator[str]:
    files = TlsFiles(cert=pki.cert, key=pki.key, ca=pki.ca)
    server, address = start(grpc_server_credentials(files, client_ca=pki.ca))
    yield address
    server.stop(grace=None)


def test_a_client_without_a_certificate_is_told_it_needs_one(mutual: str, pki: Pki) -> None:
    reason = diagnose_tls_refusal(mutual, ca=pki.ca)
    assert reason is not None and "requires a client certificate" in reason
    assert "presented none" in reason


def test_a_certificate_of_another_ca_is_named(mutual: str, pki: Pki) -> None:
    foreign = make_client_cert(pki.ca.parent, "diagnosis", authority="foreign")
    reason = diagnose_tls_refusal(mutual, ca=pki.ca, cert=foreign.cert, key=foreign.key)
    assert reason is not None and f"presented {foreign.cert}" in reason


def test_an_accepted_client_gets_no_diagnosis(mutual: str, pki: Pki) -> None:
    good = make_client_cert(pki.ca.parent, "diagnosis-ok")
    assert diagnose_tls_refusal(mutual, ca=pki.ca, cert=good.cert, key=good.key) is None


def test_a_node_certificate_the_client_does_not_trust(mutual: str, pki: Pki) -> None:
    reason = diagnose_tls_refusal(mutual, ca=pki.foreign_ca)
    assert reason is not None and "not trusted by tls_ca" in reason


def test_a_plaintext_node_is_named(pki: Pki) -> None:
    server, address = start(None)
    try:
        reason = diagnose_tls_refusal(address, ca=pki.ca)
    finally:
        server.stop(grace=None)
    assert reason is not None and "is the node serving TLS?" in reason


def test_a_node_that_is_down_is_not_a_tls_refusal(pki: Pki) -> None:
    port = free_port_base(1) + 1
    with socket.socket() as probe:  # nothing listens there
        assert probe.connect_ex(("127.0.0.1", port)) != 0
    assert diagnose_tls_refusal(f"127.0.0.1:{port}", ca=pki.ca, timeout_s=1.0) is None
