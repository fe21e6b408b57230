"""The txn-delay proxy on loopback sockets: it passes Kafka request frames through, holds the armed
client's chosen request with what follows it on that connection, and on an early release
sends the held requests to their node before the request that released them."""

from __future__ import annotations

import socket
import struct
import threading
import time

from raftlog.chaos.kafka_proxy import (
    API_ADD_PARTITIONS_TO_TXN,
    API_END_TXN,
    API_PRODUCE,
    Held,
    KafkaDelayProxy,
    request_header,
)
from tests.kafka.kafka_wire import read_exactly


def _frame(api_key: int, correlation_id: int, client_id: str) -> bytes:
    name = client_id.encode()
    payload = struct.pack(">hhih", api_key, 9, correlation_id, len(name)) + name + b"body"
    return struct.pack(">i", len(payload)) + payload


class _Node:
    """A listener that records the (api_key, correlation_id) of every frame it gets, in order."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.got: list[tuple[int, int]] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        try:
            while True:
                (size,) = struct.unpack(">i", read_exactly(conn, 4))
                frame = struct.pack(">i", size) + read_exactly(conn, size)
                api_key, _, correlation_id, _ = request_header(frame)
                with self._lock:
                    self.got.append((api_key, correlation_id))
        except (OSError, AssertionError, struct.error):
            conn.close()

    def wait_for(self, count: int) -> list[tuple[int, int]]:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.got) >= count:
                    return list(self.got)
            time.sleep(0.01)
        raise AssertionError(f"the node got {self.got}, expected {count} frames")


def _proxy(node: _Node) -> tuple[KafkaDelayProxy, int, list[tuple[str, Held]]]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proxy = KafkaDelayProxy({port: node.port})
    events: list[tuple[str, Held]] = []
    proxy.set_listener(lambda what, held: events.append((what, held)))
    proxy.start()
    return proxy, port, events


def test_request_header_decodes_api_key_version_correlation_and_client_id() -> None:
    assert request_header(_frame(API_END_TXN, 7, "chaos-txn-0")) == (26, 9, 7, "chaos-txn-0")


def test_an_armed_request_is_held_with_what_follows_it_then_released_in_order() -> None:
    node = _Node()
    proxy, port, events = _proxy(node)
    try:
        proxy.arm("victim", frozenset({API_PRODUCE}), 0.5)
        with socket.create_connection(("127.0.0.1", port)) as victim:
            victim.sendall(_frame(API_END_TXN, 1, "victim"))  # not armed: passes
            victim.sendall(_frame(API_PRODUCE, 2, "victim") + _frame(API_END_TXN, 3, "victim"))
            assert node.wait_for(1) == [(API_END_TXN, 1)]
            with socket.create_connection(("127.0.0.1", port)) as other:
                other.sendall(_frame(API_PRODUCE, 9, "other"))  # another client: passes
                assert node.wait_for(2)[1] == (API_PRODUCE, 9)
            assert node.wait_for(4)[2:] == [(API_PRODUCE, 2), (API_END_TXN, 3)]
    finally:
        proxy.stop()
    assert [what for what, _ in events] == ["held", "released"]
    assert events[0][1].correlation_id == 2


def test_a_release_on_request_sends_the_held_ones_first_even_after_the_client_left() -> None:
    node = _Node()
    proxy, port, events = _proxy(node)
    try:
        proxy.arm("victim", frozenset({API_PRODUCE}), 30.0,
                  release_on=frozenset({API_ADD_PARTITIONS_TO_TXN}))  # fmt: skip
        with socket.create_connection(("127.0.0.1", port)) as victim:
            victim.sendall(_frame(API_PRODUCE, 1, "victim"))
            deadline = time.monotonic() + 10
            while not events and time.monotonic() < deadline:
                time.sleep(0.01)
        # The client gave up on that connection; a new one starts the next transaction.
        with socket.create_connection(("127.0.0.1", port)) as again:
            again.sendall(_frame(API_ADD_PARTITIONS_TO_TXN, 2, "victim"))
            # The proxy writes the held frame before it forwards the trigger; the two travel
            # on two connections, so the node's readers may record them in either order.
            got = node.wait_for(2)
            assert sorted(got) == [(API_PRODUCE, 1), (API_ADD_PARTITIONS_TO_TXN, 2)], got
    finally:
        proxy.stop()
    assert [what for what, _ in events] == ["held", "released"]
