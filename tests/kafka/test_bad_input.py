"""Bad input on a real node's Kafka port: the connection is answered or closed as Kafka does,
and the node keeps serving everyone else."""

from __future__ import annotations

import socket
import struct

import pytest
from kio.schema.api_versions.v0.response import ApiVersionsResponse
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader

from raftlog.local_cluster import LocalCluster
from raftlog.rpc.kafka import APIS
from tests.kafka.kafka_wire import read_exactly


def _connect(cluster: LocalCluster) -> socket.socket:
    node = next(iter(cluster.nodes.values()))
    return socket.create_connection(("127.0.0.1", node.kafka_port), timeout=10)


def _request(api_key: int, version: int, correlation_id: int, body: bytes = b"") -> bytes:
    payload = struct.pack(">hhih", api_key, version, correlation_id, 1) + b"t" + body
    return struct.pack(">i", len(payload)) + payload


def _read_response(sock: socket.socket) -> tuple[int, bytes]:
    (size,) = struct.unpack(">i", read_exactly(sock, 4))
    data = read_exactly(sock, size)
    return struct.unpack_from(">i", data)[0], data[4:]


def _api_versions_v0(sock: socket.socket, correlation_id: int) -> ApiVersionsResponse:
    sock.sendall(_request(18, 0, correlation_id))
    answered, body = _read_response(sock)
    assert answered == correlation_id
    response, _ = entity_reader(ApiVersionsResponse)(body, 0)
    return response


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_api_versions_advertises_exactly_the_table(kafka_cluster: LocalCluster) -> None:
    with _connect(kafka_cluster) as sock:
        response = _api_versions_v0(sock, 1)
    assert response.error_code == ErrorCode.none
    advertised = {(a.api_key, a.min_version, a.max_version) for a in response.api_keys}
    assert advertised == {(a.key, a.version_min, a.version_max) for a in APIS.values()}


def test_a_newer_api_versions_gets_unsupported_version_in_v0(kafka_cluster: LocalCluster) -> None:
    with _connect(kafka_cluster) as sock:
        sock.sendall(_request(18, 99, 5))
        answered, body = _read_response(sock)
        response, _ = entity_reader(ApiVersionsResponse)(body, 0)
    assert answered == 5 and response.error_code == ErrorCode.unsupported_version
    assert {a.api_key for a in response.api_keys} == set(APIS)


@pytest.mark.parametrize(
    "garbage",
    [
        struct.pack(">i", 200 * 1024 * 1024),  # over kafka.frame_bytes_max
        struct.pack(">i", -5),
        _request(9999, 0, 1),  # unknown api key
        _request(3, 999, 1),  # unsupported version
        _request(3, 1, 1, body=b"\x00\x00\x00\x09\x00"),  # a size field that lies
    ],
)
def test_garbage_closes_its_connection_and_others_are_served(
    kafka_cluster: LocalCluster, garbage: bytes
) -> None:
    with _connect(kafka_cluster) as bystander, _connect(kafka_cluster) as sock:
        sock.sendall(garbage)
        assert _closed(sock)
        assert _api_versions_v0(bystander, 2).error_code == ErrorCode.none
