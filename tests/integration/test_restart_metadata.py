"""A restarted node answers metadata reads only once its copy has caught up (raftlog.metadata
.catch_up): asked at once, it never says that a topic created while it was down does not
exist (a Spark test met UNKNOWN_TOPIC from a node restarted 4 s earlier).

Each read goes over raw gRPC to the restarted node alone, sent the moment its port accepts
connections, so no client retry or second address can hide a wrong answer. The node may hold
the read until it has caught up, or refuse it with a retriable NOT_CONTROLLER naming the
controller (the client then asks the controller); it must not answer without the topic.
"""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

import grpc

from raftlog.client import Admin
from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.rpc.v1 import raftlog_pb2_grpc as pb_grpc
from tests.integration.conftest import start_cluster

TOPIC = "created-while-down"
PARTITIONS = 3


def _wait_accepting(address: str, *, timeout_s: float) -> None:
    """Return as soon as `address` accepts a TCP connection (the node's gRPC server is up)."""
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, int(port)), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.005)
    raise AssertionError(f"{address} did not accept connections within {timeout_s}s")


def _assert_caught_up_or_refused(error: pb.Error, topics: list[str], where: str) -> None:
    if error.code != pb.NONE:
        assert error.code == pb.NOT_CONTROLLER and error.retriable, (where, error)
        return
    assert TOPIC in topics, f"{where} answered without {TOPIC!r}: {topics}"


def _read_at_once(address: str) -> None:
    """Metadata, DescribeTopic and ListTopics from `address` alone, right away."""
    with grpc.insecure_channel(address) as channel:
        log_stub = pb_grpc.LogStub(channel)  # type: ignore[no-untyped-call]
        admin_stub = pb_grpc.AdminStub(channel)  # type: ignore[no-untyped-call]
        metadata = log_stub.Metadata(pb.MetadataRequest(topics=[TOPIC]), timeout=30)
        _assert_caught_up_or_refused(metadata.error, [t.name for t in metadata.topics], "Metadata")
        if metadata.error.code == pb.NONE:
            assert len(metadata.topics[0].partitions) == PARTITIONS
        described = admin_stub.DescribeTopic(pb.DescribeTopicRequest(name=TOPIC), timeout=30)
        _assert_caught_up_or_refused(described.error, [described.topic.name], "DescribeTopic")
        listed = admin_stub.ListTopics(pb.ListTopicsRequest(), timeout=30)
        _assert_caught_up_or_refused(listed.error, list(listed.names), "ListTopics")


def test_a_restarted_follower_answers_for_a_topic_created_while_it_was_down(
    tmp_path: Path,
) -> None:
    cluster = start_cluster(tmp_path, 3)
    try:
        with Admin(cluster.bootstrap) as admin:
            controller = admin.describe_cluster().controller_id
        down = next(n for n in cluster.nodes if n != controller)
        cluster.kill_node(down, sig=signal.SIGKILL)
        survivors = ",".join(n.client_address for n in cluster.nodes.values() if n.pid)
        with Admin(survivors) as admin:
            admin.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=3)
        node = cluster.start_node(down)
        _wait_accepting(node.client_address, timeout_s=60)
        _read_at_once(node.client_address)
        # Through the client, asking that node alone: followed to the controller if refused.
        with Admin(node.client_address) as alone:
            assert len(alone.describe_topic(TOPIC).partitions) == PARTITIONS
    finally:
        cluster.stop()


def test_a_restarted_single_node_cluster_still_serves_metadata(tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path, 1)
    try:
        with Admin(cluster.bootstrap) as admin:
            admin.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=1)
        cluster.kill_node(1, sig=signal.SIGKILL)
        node = cluster.start_node(1)
        _wait_accepting(node.client_address, timeout_s=60)
        with grpc.insecure_channel(node.client_address) as channel:
            stub = pb_grpc.LogStub(channel)  # type: ignore[no-untyped-call]
            metadata = stub.Metadata(pb.MetadataRequest(topics=[TOPIC]), timeout=30)
        # A sole voter elects itself and applies its own registration: it answers, never
        # refuses for want of another node.
        assert metadata.error.code == pb.NONE, metadata.error
        assert [t.name for t in metadata.topics] == [TOPIC]
    finally:
        cluster.stop()
