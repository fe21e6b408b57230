"""A real 3-node cluster with TLS on both listeners, mutual TLS between nodes and tokens.

Checks issue 10 end to end: clients with the right token and permission produce and
consume over TLS; a client without credentials, with a wrong token or without permission is
refused with a message naming the topic and the missing permission; a plaintext client
cannot talk to a TLS node; and a known record value never crosses the wire in clear.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from raftlog.client import Admin, Consumer, Producer
from raftlog.client.errors import ClientError
from raftlog.local_cluster import LocalCluster
from raftlog.rpc.security import bearer_metadata
from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.rpc.v1 import raftlog_pb2_grpc as pb_grpc
from raftlog.storage.records import RecordInput, decode_batch, encode_batch
from raftlog.tls import grpc_channel_credentials
from tests.security.pki import TOKENS, Pki, RecordingProxy

SECRET_VALUE = b"SECRET-card-4111-1111-1111-1111"


def secure_flags(pki: Pki, tokens: Path) -> tuple[str, ...]:
    return ("--tls-cert", str(pki.cert), "--tls-key", str(pki.key), "--tls-ca", str(pki.ca),
            "--peer-tls", "--auth-tokens", str(tokens))  # fmt: skip


def wait_for_nodes(bootstrap: str, ca: Path, count: int, *, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with Admin(bootstrap, tls_ca=ca, token=TOKENS["admin"], request_timeout_ms=3000) as a:
                cluster = a.describe_cluster()
            alive = [n for n in cluster.nodes if n.alive]
            if cluster.controller_id is not None and len(alive) >= count:
                return
        except ClientError as error:
            last = error
        time.sleep(0.2)
    raise AssertionError(f"no controller with {count} live nodes in {timeout_s}s: {last}")


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, pki: Pki, tokens_file: Path
) -> Iterator[LocalCluster]:
    cluster = LocalCluster.create(tmp_path_factory.mktemp("secure"), node_count=3)
    cluster.start(*secure_flags(pki, tokens_file))
    try:
        wait_for_nodes(cluster.bootstrap, pki.ca, 3, timeout_s=60)
        with admin(cluster, pki, "admin") as a:
            a.create_topic("orders", partitions=1, replication_factor=3)
        yield cluster
    finally:
        cluster.stop()


def admin(cluster: LocalCluster, pki: Pki, who: str | None) -> Admin:
    token = None if who is None else TOKENS.get(who, who)
    return Admin(cluster.bootstrap, tls_ca=pki.ca, token=token, request_timeout_ms=5000)


def test_a_client_with_a_token_produces_and_consumes_over_tls(
    cluster: LocalCluster, pki: Pki
) -> None:
    with Producer(cluster.bootstrap, tls_ca=pki.ca, token=TOKENS["writer"]) as producer:
        # A write-only principal may still look its topic up (Metadata: read, write or admin).
        metadata = producer.send("orders", value=b"first order").result(timeout=30)
    consumer = Consumer(cluster.bootstrap, tls_ca=pki.ca, token=TOKENS["reader"])
    try:
        consumer.assign([("orders", 0)])
        consumer.seek(("orders", 0), metadata.offset)
        records = []
        deadline = time.monotonic() + 30
        while not records and time.monotonic() < deadline:
            records = consumer.poll(timeout_ms=500)
        assert [r.value for r in records][:1] == [b"first order"]
    finally:
        consumer.close()


def test_data_directories_are_owner_only(cluster: LocalCluster) -> None:
    for node in cluster.nodes.values():
        data_dir = Path(node.data_dir)
        assert data_dir.stat().st_mode & 0o777 == 0o700, data_dir
        files = [p for p in data_dir.rglob("*") if p.is_file()]
        assert files, f"no data files under {data_dir}"
        for path in files:
            assert path.stat().st_mode & 0o077 == 0, f"{path} is readable by others"


@pytest.mark.parametrize(
    ("who", "expected"),
    [(None, "no credentials"), ("wrong-token-0123456789abcdef", "token is not valid")],
)
def test_a_client_without_valid_credentials_is_unauthenticated(
    cluster: LocalCluster, pki: Pki, who: str | None, expected: str
) -> None:
    with admin(cluster, pki, who) as a, pytest.raises(ClientError) as caught:
        a.list_topics()
    assert "UNAUTHENTICATED" in str(caught.value) and expected in str(caught.value)
    assert "0123456789abcdef" not in str(caught.value)  # a token is never echoed


def test_a_client_without_permission_is_denied_naming_topic_and_permission(
    cluster: LocalCluster, pki: Pki
) -> None:
    with admin(cluster, pki, "alice") as a, pytest.raises(ClientError) as caught:
        a.create_topic("payroll", partitions=1, replication_factor=1)
    message = str(caught.value)
    assert "PERMISSION_DENIED" in message and "'payroll'" in message and "'admin'" in message
    with Producer(cluster.bootstrap, tls_ca=pki.ca, token=TOKENS["reader"], retries=0) as p:
        future = p.send("orders", value=b"not allowed")
        with pytest.raises(ClientError) as denied:
            future.result(timeout=30)
    message = str(denied.value)
    assert "PERMISSION_DENIED" in message and "'orders'" in message and "'write'" in message


def test_a_plaintext_client_cannot_talk_to_a_tls_node(cluster: LocalCluster) -> None:
    with (
        Admin(cluster.bootstrap, token=TOKENS["admin"], request_timeout_ms=2000) as a,
        pytest.raises(ClientError),
    ):
        a.list_topics()


def test_a_record_value_never_crosses_the_wire_in_clear(cluster: LocalCluster, pki: Pki) -> None:
    with admin(cluster, pki, "admin") as a:
        leader = a.describe_topic("orders").partitions[0].leader
    assert leader is not None
    proxy = RecordingProxy(("127.0.0.1", cluster.nodes[leader].client_port))
    channel = grpc.secure_channel(proxy.address, grpc_channel_credentials(pki.ca))
    try:
        stub = pb_grpc.LogStub(channel)  # type: ignore[no-untyped-call]
        metadata = bearer_metadata(TOKENS["alice"])
        record = RecordInput(key=None, value=SECRET_VALUE, timestamp_ms=int(time.time() * 1000))
        batch = encode_batch([record])
        request = pb.ProduceRequest(topic="orders", partition=0, batches=[batch], acks=pb.ACKS_ALL)
        produced = stub.Produce(request, timeout=30, metadata=metadata)
        assert produced.error.code == pb.NONE, produced.error
        fetch = pb.FetchRequest(
            topic="orders", partition=0, offset=produced.base_offset, max_bytes=1 << 20
        )
        fetched = stub.Fetch(fetch, timeout=30, metadata=metadata)
        values = [r.value for r in decode_batch(fetched.batches).records]
    finally:
        channel.close()
        proxy.close()
    assert SECRET_VALUE in values  # the client sees it ...
    wire = proxy.wire_bytes()
    assert len(wire) > 1000 and SECRET_VALUE not in wire  # ... the wire never does
    assert TOKENS["alice"].encode() not in wire


def raftlog_cli(*argv: str, token_env: str | None = None, stdin: bytes = b"") -> tuple[int, str]:
    environment = {k: v for k, v in os.environ.items() if k != "RAFTLOG_TOKEN"}
    if token_env is not None:
        environment["RAFTLOG_TOKEN"] = token_env
    done = subprocess.run(
        [sys.executable, "-m", "raftlog", *argv],
        input=stdin,
        capture_output=True,
        env=environment,
        timeout=120,
    )
    return done.returncode, (done.stdout + done.stderr).decode(errors="replace")


def test_the_cli_takes_tls_ca_and_a_token_from_flag_or_environment(
    cluster: LocalCluster, pki: Pki
) -> None:
    common = ("--bootstrap", cluster.bootstrap, "--tls-ca", str(pki.ca))
    code, out = raftlog_cli("topic", "list", *common, "--token", TOKENS["admin"])
    assert code == 0 and "orders" in out, out
    code, out = raftlog_cli("produce", "orders", *common, token_env=TOKENS["alice"], stdin=b"cli\n")
    assert code == 0 and "produced 1 records" in out, out
    code, out = raftlog_cli("topic", "list", *common)
    assert code == 1 and "UNAUTHENTICATED" in out, out
    code, out = raftlog_cli("produce", "orders", *common, token_env=TOKENS["reader"], stdin=b"x\n")
    assert code == 1 and "PERMISSION_DENIED" in out and "'write'" in out, out


def test_health_checks_need_no_token(cluster: LocalCluster, pki: Pki) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    credentials = grpc_channel_credentials(pki.ca)
    with grpc.secure_channel(cluster.nodes[1].client_address, credentials) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        answer = stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
