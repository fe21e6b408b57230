"""A sequence reused after abort_transaction, with the real client: librdkafka (confluent-kafka)
through a proxy that loses one Produce answer, on a one-node cluster.

The chaos suite's lost committed writes (docs/chaos.md, "committed records acknowledged but
never written"): a transactional Produce reached its leader and was written, but its answer
was lost with the connection. librdkafka queued the batch for a retry; the application then
aborted the transaction, and `abort_transaction` purged the queued batch and advanced the
partition's sequence base past it (`rd_kafka_toppar_purge_queues`: "these messages will not
be produced (retried)"), so the next transaction's first batch there carried the purged
batch's sequences under the same epoch. Answered as that batch's duplicate, the new record
was acknowledged at the aborted record's offset and never written, and the commit succeeded.

Here the node advertises the proxy's port (`--kafka-advertise`), so every client connection
crosses it. Armed, the proxy sends the producer's next Produce to the node, waits for the
node's answer (the batch is written: acks=all) and closes both ends instead of passing it on.
The producer's statistics then show the batch back in its partition's queue and not in
flight (it was sent, `txmsgs`, and requeued), and a retry backoff longer than the test's
next steps keeps it there until `abort_transaction` purges it. What the client learns of the
next transaction must be true: committed with its record readable by read_committed, or
failed (aborted, or a fatal error: librdkafka takes OUT_OF_ORDER_SEQUENCE_NUMBER for its
oldest batch in flight as a fatal error, and the application replaces the producer, whose
init_transactions aborts the open transaction).
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from raftlog.chaos.kafka_proxy import API_PRODUCE, request_header
from raftlog.chaos.tcp_proxy import CHUNK_BYTES, POLL_S, TcpProxy, spawn
from raftlog.client import Admin
from raftlog.cluster_cli import wait_for_controller
from raftlog.local_cluster import LocalCluster
from tests.kafka import txn_helpers as txn
from tests.kafka.kafka_wire import wait_for_preferred_leaders

kafka = pytest.importorskip("confluent_kafka")

TOPIC = "sequence-reuse"
CLIENT_ID = "sequence-reuse-producer"
TRANSACTIONAL_ID = "sequence-reuse"
EVENT_WAIT_S = 15.0  # a bound on each wait for an event (they come within a second)
STATISTICS_INTERVAL_MS = 100
# Far longer than from the requeue to the purge (a statistics interval and a call): the retry
# stays queued until purged. librdkafka also waits this long before it retries the abort's
# EndTxn, which fails once: the lost connection made it look for its coordinator again.
RETRY_BACKOFF_MS = 3_000
_FRAME_BYTES_MAX = 64 * 1024 * 1024  # a larger size prefix is not a Kafka frame


def _read_exactly(sock: socket.socket, count: int, stopping: threading.Event) -> bytes | None:
    """`count` bytes from `sock`, or None once it is closed or the proxy stops."""
    data = b""
    while len(data) < count:
        if stopping.is_set():
            return None
        try:
            chunk = sock.recv(min(CHUNK_BYTES, count - len(data)))
        except TimeoutError:
            continue
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    return data


def _read_frame(sock: socket.socket, stopping: threading.Event) -> bytes | None:
    """One Kafka frame (size prefix included), or None once `sock` is closed."""
    prefix = _read_exactly(sock, 4, stopping)
    if prefix is None:
        return None
    (size,) = struct.unpack(">i", prefix)
    if not 0 <= size <= _FRAME_BYTES_MAX:
        return None  # not Kafka: the connection is closed
    body = _read_exactly(sock, size, stopping)
    return None if body is None else prefix + body


@dataclass(slots=True)
class _Pair:
    """What a connection's two threads share: the correlation id of the Produce whose answer
    is dropped, set before that request goes to the node."""

    drop_correlation_id: int | None = None


class _DropOneProduceAnswer(TcpProxy):
    """One Kafka listener's proxy that can lose the answer to one Produce (module docstring);
    `answer_dropped` is set once the node answered the armed Produce and both ends of its
    connection were closed."""

    def __init__(self, node_port: int) -> None:
        super().__init__()
        self._node_port = node_port
        self._armed_client_id: str | None = None
        self.answer_dropped = threading.Event()
        self.port = 0  # the listening port, once started

    def start(self) -> int:
        """Listen on a free loopback port; returns it. Raises OSError if none is free."""
        self._listen(0, self._node_port, self._connection, name="drop-answer-proxy")
        self.port = self._listeners[-1].getsockname()[1]
        return self.port

    def arm(self, client_id: str) -> None:
        """Drop the answer to the next Produce of `client_id`."""
        with self._lock:
            self._armed_client_id = client_id

    def _take(self, api_key: int, client_id: str) -> bool:
        with self._lock:
            if api_key != API_PRODUCE or client_id != self._armed_client_id:
                return False
            self._armed_client_id = None
            return True

    def _connection(self, client: socket.socket, node: socket.socket) -> None:
        client.settimeout(POLL_S)
        node.settimeout(POLL_S)
        pair = _Pair()
        spawn(self._requests, client, node, pair, name="drop-answer-proxy-requests")
        spawn(self._responses, node, client, pair, name="drop-answer-proxy-responses")

    def _requests(self, client: socket.socket, node: socket.socket, pair: _Pair) -> None:
        try:
            while (frame := _read_frame(client, self._stopping)) is not None:
                api_key, _, correlation_id, client_id = request_header(frame)
                if self._take(api_key, client_id):
                    pair.drop_correlation_id = correlation_id
                node.sendall(frame)
        except (OSError, ValueError):
            pass  # either end went away, or not Kafka: close both below
        finally:
            self._close(client, node)

    def _responses(self, node: socket.socket, client: socket.socket, pair: _Pair) -> None:
        try:
            while (frame := _read_frame(node, self._stopping)) is not None:
                (correlation_id,) = struct.unpack_from(">i", frame, 4)
                if correlation_id == pair.drop_correlation_id:
                    self._close(client, node)
                    self.answer_dropped.set()
                    return
                client.sendall(frame)
        except OSError:
            pass
        finally:
            self._close(client, node)


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[_DropOneProduceAnswer]:
    """The proxy in front of a one-node cluster, which advertises the proxy's port as its
    Kafka listener, with TOPIC (one partition, one replica) led."""
    cluster = LocalCluster.create(tmp_path / "cluster", node_count=1)
    node = cluster.nodes[1]
    proxy = _DropOneProduceAnswer(node.kafka_port)
    port = proxy.start()
    try:
        cluster.start("--kafka-advertise", f"127.0.0.1:{port}")
        wait_for_controller(cluster.bootstrap, timeout_s=60)
        with Admin(cluster.bootstrap) as admin:
            admin.create_topic(TOPIC, partitions=1, replication_factor=1)
            wait_for_preferred_leaders(admin, TOPIC)
        yield proxy
    finally:
        cluster.stop()
        proxy.stop()


class _Statistics:
    """The producer's latest statistics (librdkafka's `stats_cb`, served by `poll`)."""

    def __init__(self) -> None:
        self.latest: dict[str, Any] = {}

    def on_stats(self, text: str) -> None:
        self.latest = json.loads(text)

    def requeued(self) -> bool:
        """TOPIC-0's one message was sent (txmsgs counts it when its request is built) and is
        queued again, none in flight: librdkafka handled the lost connection and holds the
        batch for a retry."""
        partition = self.latest.get("topics", {}).get(TOPIC, {}).get("partitions", {}).get("0")
        if partition is None:
            return False
        sent: int = partition["txmsgs"]
        queued: int = partition["msgq_cnt"] + partition["xmit_msgq_cnt"]
        in_flight: int = partition["msgs_inflight"]
        return sent >= 1 and queued == 1 and in_flight == 0


def _producer(boot: str, statistics: _Statistics | None = None) -> Any:
    """A transactional producer that sends each record at once; with `statistics`, it reports
    them every STATISTICS_INTERVAL_MS and retries a batch only after RETRY_BACKOFF_MS."""
    settings: dict[str, Any] = {"client.id": CLIENT_ID, "linger.ms": 0}
    if statistics is not None:
        settings |= {
            "retry.backoff.ms": RETRY_BACKOFF_MS,
            "retry.backoff.max.ms": RETRY_BACKOFF_MS,
            "statistics.interval.ms": STATISTICS_INTERVAL_MS,
            "stats_cb": statistics.on_stats,
        }
    return txn.transactional_producer(boot, TRANSACTIONAL_ID, **settings)


def _wait_requeued(producer: Any, statistics: _Statistics) -> None:
    deadline = time.monotonic() + EVENT_WAIT_S
    while not statistics.requeued():
        assert time.monotonic() < deadline, f"not queued for a retry: {statistics.latest}"
        producer.poll(0.05)


def test_a_record_after_an_abort_that_purged_a_written_batch_is_committed_or_refused(
    proxy: _DropOneProduceAnswer,
) -> None:
    boot = f"127.0.0.1:{proxy.port}"  # what the node advertises
    reports: dict[str, Any] = {}

    def delivered(error: Any, message: Any) -> None:
        reports[message.value().decode()] = error if error is not None else message.offset()

    statistics = _Statistics()
    producer = _producer(boot, statistics)
    producer.begin_transaction()
    proxy.arm(CLIENT_ID)
    producer.produce(TOPIC, value=b"purged", partition=0, on_delivery=delivered)
    assert proxy.answer_dropped.wait(EVENT_WAIT_S), "the Produce never reached the node"
    _wait_requeued(producer, statistics)
    producer.abort_transaction(30)
    purged = reports.get("purged")
    assert purged is not None and purged.code() == kafka.KafkaError._PURGE_QUEUE, reports

    producer.begin_transaction()
    producer.produce(TOPIC, value=b"next", partition=0, on_delivery=delivered)
    learned = txn.end_transaction(producer, commit=True)
    print(f"the next transaction: {learned}; delivery reports: {reports}")
    if learned == txn.FATAL:
        # librdkafka's answer to OUT_OF_ORDER_SEQUENCE_NUMBER; its documentation's recovery:
        # a new producer, whose init_transactions aborts the transaction left open.
        producer = _producer(boot)
    producer.begin_transaction()
    producer.produce(TOPIC, value=b"after", partition=0, on_delivery=delivered)
    assert txn.end_transaction(producer, commit=True) == txn.COMMITTED, reports

    # The purged batch was written (the scenario happened): read_uncommitted sees it.
    assert txn.read_values(boot, "read_uncommitted", {TOPIC: 1}, 1, ("purged",)) == ["purged"]
    expected = ["after", "next"] if learned == txn.COMMITTED else ["after"]
    committed = txn.read_values(boot, "read_committed", {TOPIC: 1}, 1, ("next", "after"))
    assert committed == expected, f"the producer learned {learned}; delivery reports {reports}"
