"""Kafka-listener proxies that can hold one client's requests: the `txn-delay` nemesis's network.

Theory of operation. With `--workload txn` every node advertises (`--kafka-advertise`) the
port of its proxy instead of its own Kafka listener, so every Kafka client connection to
every node crosses one `KafkaDelayProxy` listener. The proxy passes bytes both ways; in the
client-to-node direction it splits the stream into Kafka request frames (a 4-byte size, then
the request header) and decodes only the header's api_key and client_id. `arm(client_id,
api_keys, delay_s)` makes the next request of that client with one of those api_keys (0
Produce, 26 EndTxn) be held for `delay_s`, together with everything after it on that
connection, as a delayed TCP segment holds back the rest of its stream. The client meanwhile
times out, drops the connection and retries on a new one; the proxy keeps the node side of the
held connection open, and when the delay is over sends the held requests to the node, which
sees them arrive late, during the producer's next transaction (the scenario of Jepsen's
Bufstream report). The node's answers are read and dropped. All on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import functools
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from raftlog.chaos.tcp_proxy import CHUNK_BYTES, POLL_S, TcpProxy, spawn

__all__ = [
    "API_ADD_PARTITIONS_TO_TXN",
    "API_END_TXN",
    "API_PRODUCE",
    "Held",
    "KafkaDelayProxy",
    "request_header",
]

API_PRODUCE = 0
API_ADD_PARTITIONS_TO_TXN = 24
API_END_TXN = 26
_FRAME_BYTES_MAX = 64 * 1024 * 1024  # a larger size prefix is not a Kafka request
_LINGER_S = 2.0  # the node side stays open this long after a release, so the node answers


@dataclass(frozen=True, slots=True)
class Held:
    """One held request, as reported to the listener when it is held and when released."""

    client_id: str
    api_key: int
    api_version: int
    correlation_id: int
    node_port: int
    delay_s: float


def request_header(frame: bytes) -> tuple[int, int, int, str]:
    """(api_key, api_version, correlation_id, client_id) of one request frame (size prefix
    included): request header v1+ layout, which every request but ControlledShutdown v0 uses;
    raises ValueError when
    too short."""
    if len(frame) < 14:
        raise ValueError(f"request frame of {len(frame)} bytes has no header")
    api_key, api_version, correlation_id, length = struct.unpack_from(">hhih", frame, 4)
    client_id = "" if length < 0 else frame[14 : 14 + length].decode(errors="replace")
    return api_key, api_version, correlation_id, client_id


@dataclass(frozen=True, slots=True)
class _Arming:
    client_id: str
    api_keys: frozenset[int]
    delay_s: float
    release_on: frozenset[int]


class _Hold:
    """Requests held on one connection: appended in order, sent to the node at once on
    `release` (by the connection's own thread when the delay is over, or by the thread that
    saw a `release_on` request, which sends them before forwarding that request)."""

    def __init__(self, arming: _Arming, node: socket.socket, held: Held,
                 on_release: Callable[[Held], None]) -> None:  # fmt: skip
        self.arming = arming
        self.release_at = time.monotonic() + arming.delay_s
        self._node = node
        self._held = held
        self._on_release = on_release
        self._lock = threading.Lock()
        self._frames: list[bytes] = []
        self.done = False

    def offer(self, frame: bytes) -> bool:
        """Hold `frame` behind the others if the hold is on; False once released."""
        with self._lock:
            if not self.done:
                self._frames.append(frame)
            return not self.done

    def release(self) -> None:
        """Send every held frame to the node (once); raises OSError if the node went away."""
        with self._lock:
            if self.done:
                return
            self.done = True
            frames, self._frames = self._frames, []
            self._node.sendall(b"".join(frames))
        self._on_release(self._held)


class KafkaDelayProxy(TcpProxy):
    """One listening port per node: listen port -> the node's Kafka port. `stop()` drops the
    requests still held."""

    def __init__(self, routes: dict[int, int]) -> None:
        super().__init__()
        self._routes = routes
        self._on_held: Callable[[str, Held], None] | None = None
        self._armed: _Arming | None = None
        self._holding: _Hold | None = None  # the hold under way, for its early release

    def start(self) -> None:
        """Listen on every route's port and start forwarding; raises OSError if a port is taken."""
        for listen_port, node_port in self._routes.items():
            serve = functools.partial(self._connection, node_port)
            self._listen(listen_port, node_port, serve, name=f"kafka-proxy-{listen_port}")

    def set_listener(self, listener: Callable[[str, Held], None]) -> None:
        """Call `listener("held" | "released", held)` at each hold and release (from the proxy's
        threads)."""
        self._on_held = listener

    def arm(
        self,
        client_id: str,
        api_keys: frozenset[int],
        delay_s: float,
        *,
        release_on: frozenset[int] = frozenset(),
    ) -> None:
        """Hold the next request of `client_id` whose api_key is in `api_keys` (and what follows it
        on its connection) for `delay_s`, or until the same client sends a request whose api_key
        is in `release_on` (on any connection), whichever comes first; replaces an arming not
        yet used."""
        assert api_keys and delay_s > 0
        with self._lock:
            self._armed = _Arming(client_id, api_keys, delay_s, release_on)

    def disarm(self) -> bool:
        """Cancel an arming not yet used; True if there was one."""
        with self._lock:
            armed, self._armed = self._armed, None
        return armed is not None

    def _take(self, api_key: int, client_id: str) -> tuple[_Arming | None, _Hold | None]:
        """The arming this request starts a hold of, if any; and the hold under way it ends
        early, if any (its frames must go before this request)."""
        with self._lock:
            armed, holding = self._armed, self._holding
            if armed is not None and armed.client_id == client_id and api_key in armed.api_keys:
                self._armed = None
                return armed, None
            if holding is None or holding.arming.client_id != client_id:
                return None, None
            if api_key not in holding.arming.release_on:
                return None, None
            self._holding = None
            return None, holding

    def _start_hold(self, arming: _Arming, node: socket.socket, held: Held) -> _Hold:
        hold = _Hold(arming, node, held, self._released)
        with self._lock:
            self._holding = hold
        if self._on_held is not None:
            self._on_held("held", held)
        return hold

    def _released(self, held: Held) -> None:
        if self._on_held is not None:
            self._on_held("released", held)

    def _connection(self, node_port: int, client: socket.socket, node: socket.socket) -> None:
        spawn(self._requests, client, node, node_port, name=f"kafka-proxy-req-{node_port}")
        spawn(self._responses, node, client, name=f"kafka-proxy-resp-{node_port}")

    def _requests(self, client: socket.socket, node: socket.socket, node_port: int) -> None:
        """Client to node, frame by frame, holding what an arming picks."""
        client.settimeout(POLL_S)
        pending = b""
        hold: _Hold | None = None
        try:
            while not self._stopping.is_set():
                if hold is not None and time.monotonic() >= hold.release_at:
                    hold.release()
                if hold is not None and hold.done:
                    hold = None
                try:
                    data = client.recv(CHUNK_BYTES) if client.fileno() >= 0 else b""
                except TimeoutError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    if hold is None:
                        self._stopping.wait(_LINGER_S)  # the node answers what it was sent
                        return
                    client.close()  # what the client left held still goes to the node later
                    self._stopping.wait(POLL_S)
                    continue
                pending += data
                frames, pending = _split_frames(pending)
                for frame in frames:
                    hold = self._forward(frame, node, node_port, hold)
        except (OSError, ValueError):
            pass  # either end went away, or not Kafka: close both below
        finally:
            self._close(client, node)

    def _forward(
        self, frame: bytes, node: socket.socket, node_port: int, hold: _Hold | None
    ) -> _Hold | None:
        """Send `frame` to the node, or hold it; the hold of this connection afterwards."""
        api_key, version, correlation_id, client_id = request_header(frame)
        arming, ended = self._take(api_key, client_id)
        if ended is not None:
            ended.release()  # the held requests reach their node before this one
        if arming is not None and hold is None:
            held = Held(client_id, api_key, version, correlation_id, node_port, arming.delay_s)
            hold = self._start_hold(arming, node, held)
        if hold is None or not hold.offer(frame):
            node.sendall(frame)
        return hold

    def _responses(self, node: socket.socket, client: socket.socket) -> None:
        """Node to client, as is; after the client left, the node's answers are read and dropped.
        The request thread may have closed both sockets before this thread first ran."""
        try:
            node.settimeout(POLL_S * 4)
            while not self._stopping.is_set():
                try:
                    data = node.recv(CHUNK_BYTES)
                except TimeoutError:
                    continue
                if not data:
                    break
                with contextlib.suppress(OSError):
                    client.sendall(data)
        except OSError:
            pass
        finally:
            self._close(client, node)


def _split_frames(data: bytes) -> tuple[list[bytes], bytes]:
    """Whole request frames (each with its size prefix) at the front of `data`, and the rest."""
    frames: list[bytes] = []
    while len(data) >= 4:
        (size,) = struct.unpack_from(">i", data, 0)
        if not 0 <= size <= _FRAME_BYTES_MAX:
            raise ValueError(f"request size {size}: not a Kafka request")
        if len(data) < 4 + size:
            break
        frames.append(data[: 4 + size])
        data = data[4 + size :]
    return frames, data
