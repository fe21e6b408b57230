"""What the chaos suite's TCP proxies share (`jetstream_proxy.RouteProxies` between JetStream
servers, `kafka_proxy.KafkaDelayProxy` in front of Kafka listeners): loopback listeners, each
accepted connection paired with a fresh one to its target, every socket tracked so `stop()`
closes them all, and the close of a pair once either end went away.

Theory of operation. A `TcpProxy` listens on 127.0.0.1 ports (`_listen`); one thread per
listener accepts, dials the target for each connection (one whose target is down is closed at
once, so the dialer sees its connection fail, as with no proxy) and hands the pair to the
subclass's `serve` callable, which starts the threads that move the bytes. Those threads poll
`_stopping` and call `_close` when they end. No root is needed.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["CHUNK_BYTES", "POLL_S", "TcpProxy", "accepted_pairs", "spawn"]

CHUNK_BYTES = 64 * 1024  # one read from a socket at most
POLL_S = 0.05  # how often a blocked thread looks at `_stopping`
_CONNECT_TIMEOUT_S = 2.0

Serve = Callable[[socket.socket, socket.socket], None]


def spawn(target: Callable[..., Any], *args: Any, name: str) -> None:
    """Run `target(*args)` on a daemon thread called `name` (a proxy's threads never keep the
    process up; `stop()` ends them)."""
    threading.Thread(target=target, args=args, name=name, daemon=True).start()


def accepted_pairs(
    listener: socket.socket, port: int, stopping: threading.Event
) -> Iterator[tuple[socket.socket, socket.socket]]:
    """Each connection `listener` accepts, with a new connection to 127.0.0.1:`port` for it,
    until `stopping` or the listener is closed; one whose target is down is closed at once (the
    dialer sees its connection fail)."""
    while not stopping.is_set():
        try:
            inbound, _ = listener.accept()
        except TimeoutError:
            continue
        except OSError:
            return  # closed by stop()
        try:
            outbound = socket.create_connection(("127.0.0.1", port), _CONNECT_TIMEOUT_S)
        except OSError:
            inbound.close()  # the target is down: the dialer sees its connection fail
            continue
        yield inbound, outbound


class TcpProxy:
    """Listeners and the connections through them (module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._listeners: list[socket.socket] = []
        self._connections: set[socket.socket] = set()

    def stop(self) -> None:
        """Close every listener and connection; the proxy's threads end on their own."""
        self._stopping.set()
        with self._lock:
            sockets = [*self._listeners, *self._connections]
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def _listen(self, listen_port: int, target_port: int, serve: Serve, *, name: str) -> None:
        """Listen on 127.0.0.1:`listen_port`; `serve(inbound, outbound)` gets each accepted
        connection with its new connection to `target_port`, both tracked, on the accepting
        thread (`name`). Raises OSError if the port is taken."""
        listener = socket.create_server(("127.0.0.1", listen_port))
        listener.settimeout(POLL_S * 4)
        self._listeners.append(listener)
        spawn(self._accept, listener, target_port, serve, name=name)

    def _accept(self, listener: socket.socket, target_port: int, serve: Serve) -> None:
        for inbound, outbound in accepted_pairs(listener, target_port, self._stopping):
            with self._lock:
                self._connections |= {inbound, outbound}
            serve(inbound, outbound)

    def _close(self, *sockets: socket.socket) -> None:
        """Shut down and close `sockets` (either end gone: the other must see it too)."""
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        with self._lock:
            self._connections -= set(sockets)
