"""Helpers of the Kafka listener's tests: topics with leaders, kcat, and one Kafka request over
a plain socket, encoded and decoded by kio (for the APIs a test wants to see exactly: clients
hide them behind their own state machines)."""

from __future__ import annotations

import contextlib
import datetime
import importlib
import io
import shutil
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.index import load_response_schema
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import Records, i16, i32, i32Timedelta

from raftlog.client import Admin
from raftlog.client.errors import TopicAlreadyExistsError
from raftlog.cluster_cli import wait_for_controller
from raftlog.local_cluster import LocalCluster


def kafka_call(address: str, request: Any, *, correlation_id: int = 1) -> Any:
    """Send `request` (a kio request entity) to `address`, return the decoded response."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=15) as sock:
        sock.sendall(request_frame(request, correlation_id))
        answered, data = read_frame(sock)
    assert answered == correlation_id
    return decode_response(request, data)


def request_frame(request: Any, correlation_id: int) -> bytes:
    """`request` (a kio request entity) as one frame, size first."""
    api_key, version = int(request.__api_key__), int(request.__version__)
    body = io.BytesIO()
    entity_writer(type(request))(body, request)
    header = struct.pack(">hhih", api_key, version, correlation_id, 4) + b"test"
    if request.__flexible__:
        header += b"\x00"  # no tagged fields
    payload = header + body.getvalue()
    return struct.pack(">i", len(payload)) + payload


def read_frame(sock: socket.socket) -> tuple[int, bytes]:
    """One response frame: its correlation id and the whole frame after the size."""
    (size,) = struct.unpack(">i", read_exactly(sock, 4))
    data = read_exactly(sock, size)
    return struct.unpack_from(">i", data)[0], data


def decode_response(request: Any, data: bytes) -> Any:
    """The response to `request` from its frame (as `read_frame` returns it)."""
    api_key, version = int(request.__api_key__), int(request.__version__)
    response_class = load_response_schema(api_key, version)
    offset = 5 if response_class.__flexible__ and api_key != 18 else 4
    response, used = entity_reader(response_class)(data, offset)
    assert offset + used == len(data)
    return response


def produce_request(topic: str, batch: bytes, *, version: int = 9) -> Any:
    """A Produce (acks=all) of `batch` to partition 0 of `topic`, at `version` (3 to 9)."""
    pr = importlib.import_module(f"kio.schema.produce.v{version}.request")
    return pr.ProduceRequest(
        transactional_id=None,
        acks=i16(-1),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=15)),
        topic_data=(
            pr.TopicProduceData(
                name=pr.TopicName(topic),
                partition_data=(pr.PartitionProduceData(index=i32(0), records=Records(batch)),),
            ),
        ),
    )


def read_exactly(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {count} bytes")
        data += chunk
    return data


def create_topic(cluster: LocalCluster, name: str, *, partitions: int) -> None:
    """Create `name` and wait until each partition is led by its preferred replica.

    Leadership settles on the preferred replica shortly after creation; clients that cache
    metadata for minutes and do not refresh it on every NOT_LEADER (aiokafka resetting an
    offset) would otherwise keep asking the first leader."""
    with Admin(cluster.bootstrap) as admin:
        # The client asks again after a slow answer; then the first attempt made it.
        with contextlib.suppress(TopicAlreadyExistsError):
            admin.create_topic(name, partitions=partitions, replication_factor=3)
        wait_for_preferred_leaders(admin, name)


def wait_for_preferred_leaders(admin: Admin, name: str) -> None:
    """Wait until each partition of `name` is led by its preferred replica (where leadership
    settles shortly after a topic is created)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        described = admin.describe_topic(name)
        if all(p.leader == p.replicas[0] for p in described.partitions):
            return
        time.sleep(0.05)
    raise AssertionError(f"topic {name}: not every partition led by its preferred replica")


def kcat_path() -> str:
    """kcat (Debian package `kcat`, librdkafka's command-line client), or skip."""
    path = shutil.which("kcat")
    if path is None:
        pytest.skip("kcat is not installed (apt-get install -y kcat); the Makefile installs it")
    return path


@contextlib.contextmanager
def started_cluster(
    directory: Path, *, node_count: int = 3, flags: tuple[str, ...] = ()
) -> Iterator[LocalCluster]:
    """A local cluster of `node_count` nodes started with `flags`, once it has a controller;
    stopped on the way out."""
    cluster = LocalCluster.create(directory, node_count=node_count, node_flags=flags)
    cluster.start()
    try:
        wait_for_controller(cluster.bootstrap, timeout_s=60)
        yield cluster
    finally:
        cluster.stop()
