"""PeerTransport over mutual TLS: the ssl contexts pass straight through to asyncio (issue 10).

Certificates come from the openssl command line, made fresh per test session: a throwaway CA
and one node certificate for 127.0.0.1 that every node uses on both sides.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import ssl
import subprocess
from pathlib import Path

import pytest
from loopback import FAST, A, B, Inbox, closing, heartbeat, run

from raftlog.rpc.peer_transport import PeerTransport
from raftlog.types import NodeId, RaftGroupId

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pki")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1",
            "-subj", "/CN=raftlog-test-ca", cwd=root)  # fmt: skip
    openssl("req", *ec, "-keyout", "node.key", "-out", "node.csr", "-subj", "/CN=node",
            cwd=root)  # fmt: skip
    (root / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "node.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "node.crt", "-days", "1", "-extfile", "san.ext",
            cwd=root)  # fmt: skip
    return root


def contexts(pki: Path, *, client_cert: bool = True) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki / "ca.crt"))
    server.load_cert_chain(pki / "node.crt", pki / "node.key")
    server.verify_mode = ssl.CERT_REQUIRED  # mutual: a dialer must show a node certificate
    client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(pki / "ca.crt"))
    if client_cert:
        client.load_cert_chain(pki / "node.crt", pki / "node.key")
    return server, client


async def tls_node(
    pki: Path, node_id: NodeId, inbox: Inbox, *, client_cert: bool = True
) -> tuple[PeerTransport, int]:
    server, client = contexts(pki, client_cert=client_cert)
    transport = PeerTransport(
        node_id=node_id,
        cluster_id="test",
        config=FAST,
        on_messages=inbox,
        ssl_server=server,
        ssl_client=client,
        rng=random.Random(node_id),
    )
    _, port = await transport.start("127.0.0.1", 0)
    return transport, port


def test_messages_flow_over_mutual_tls(pki: Path) -> None:
    async def scenario() -> None:
        inbox_a, inbox_b = Inbox(), Inbox()
        a, port_a = await tls_node(pki, A, inbox_a)
        b, port_b = await tls_node(pki, B, inbox_b)
        a.update_peers({B: ("127.0.0.1", port_b)})
        b.update_peers({A: ("127.0.0.1", port_a)})
        a.send(B, RaftGroupId(1), heartbeat(A, B, 1))
        a.send(B, RaftGroupId(2), heartbeat(A, B, 2))
        b.send(A, RaftGroupId(1), heartbeat(B, A, 3))
        await inbox_b.wait_for(2)
        await inbox_a.wait_for(1)
        assert inbox_b.messages() == [heartbeat(A, B, 1), heartbeat(A, B, 2)]
        assert inbox_a.messages() == [heartbeat(B, A, 3)]
        await closing(a, b)

    run(scenario)


def test_a_dialer_without_a_certificate_is_refused(pki: Path) -> None:
    async def scenario() -> None:
        inbox_b = Inbox()
        a, _ = await tls_node(pki, A, Inbox(), client_cert=False)
        b, port_b = await tls_node(pki, B, inbox_b)
        b.update_peers({A: ("127.0.0.1", 1)})
        a.update_peers({B: ("127.0.0.1", port_b)})
        a.send(B, RaftGroupId(1), heartbeat(A, B, 1))
        while a.counters().connect_failures < 2:
            await asyncio.sleep(0)  # yield to the redial loop
        assert a.counters().connects == 0 and inbox_b.items == []
        await closing(a, b)

    run(scenario)
