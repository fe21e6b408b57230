"""Responses on one connection leave in request order (Kafka requires it), whichever handler
finishes first: a pipelined mix of produces (answered when committed) and requests answered
at once, sent in one write on one socket to a real node's Kafka port."""

from __future__ import annotations

import socket

from kio.schema.api_versions.v0.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode

from raftlog.client import Admin
from raftlog.local_cluster import LocalCluster
from raftlog.storage.records import RecordInput, encode_batch
from tests.kafka.kafka_wire import (
    create_topic,
    decode_response,
    produce_request,
    read_frame,
    request_frame,
)

TOPIC = "pipelined"


def test_pipelined_responses_come_back_in_request_order(kafka_cluster: LocalCluster) -> None:
    create_topic(kafka_cluster, TOPIC, partitions=1)
    with Admin(kafka_cluster.bootstrap) as admin:
        leader = admin.describe_topic(TOPIC).partitions[0].leader
    port = kafka_cluster.nodes[leader].kafka_port
    requests = []
    for index in range(4):
        batch = encode_batch([RecordInput(b"k", b"value %d" % index, 1_700_000_000_000)])
        requests += [produce_request(TOPIC, batch), ApiVersionsRequest()]
    frames = b"".join(request_frame(r, correlation_id) for correlation_id, r in enumerate(requests))
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        sock.sendall(frames)
        answers = [read_frame(sock) for _ in requests]
    assert [correlation_id for correlation_id, _ in answers] == list(range(len(requests)))
    produced = [
        decode_response(request, data)
        for request, (_, data) in zip(requests, answers, strict=True)
        if request.__api_key__ == 0
    ]
    parts = [response.responses[0].partition_responses[0] for response in produced]
    assert all(part.error_code == ErrorCode.none for part in parts), parts
    offsets = [part.base_offset for part in parts]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets), offsets
