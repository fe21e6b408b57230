"""Random requests for every API and version the listener advertises, sent to a real node:
whatever a request decodes into, its handler answers, refuses or closes the connection, and
the node goes on serving everyone else (it never stops, no task of it fails)."""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from raftlog.local_cluster import LocalCluster
from raftlog.rpc.kafka import APIS
from tests.kafka.kafka_wire import kafka_call, started_cluster

VERSIONS = [
    (api.key, v) for api in APIS.values() for v in range(api.version_min, api.version_max + 1)
]
# Mostly zeros and small numbers: they decode into empty arrays, empty strings and small
# counts far more often than uniform bytes, so handlers run, not just the decoder.
BODY = st.lists(st.sampled_from([0, 0, 0, 0, 1, 2, 3, 0x7F, 0xFF]), max_size=60).map(bytes)


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with started_cluster(tmp_path_factory.mktemp("kafka-fuzz"), node_count=1) as cluster:
        yield cluster


def _send(port: int, api_key: int, version: int, body: bytes) -> None:
    # An empty tagged-field section ends a flexible header; before a non-flexible body it is
    # one more body byte, which is as good a fuzz input.
    header = struct.pack(">hhih", api_key, version, 7, 4) + b"fuzz\x00"
    payload = header + body
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        # An answer, a close, or a request that waits (a long poll, a join).
        with contextlib.suppress(TimeoutError, ConnectionResetError):
            sock.recv(65536)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(which=st.sampled_from(VERSIONS), body=BODY)
def test_random_requests_never_take_the_node_down(
    fuzzed: LocalCluster, which: tuple[int, int], body: bytes
) -> None:
    node = next(iter(fuzzed.nodes.values()))
    _send(node.kafka_port, *which, body)
    assert fuzzed.is_running(node.node_id)


def test_the_node_still_serves_after_the_fuzzing(fuzzed: LocalCluster) -> None:
    from kio.schema.api_versions.v0.request import ApiVersionsRequest

    node = next(iter(fuzzed.nodes.values()))
    response = kafka_call(f"127.0.0.1:{node.kafka_port}", ApiVersionsRequest())
    assert response.error_code == ErrorCode.none
    assert fuzzed.is_running(node.node_id)
    with open(node.log_file) as handle:
        log = handle.read()
    assert "stopping the node" not in log and "Traceback" not in log, log[-2000:]
