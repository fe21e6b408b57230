"""Route proxies: the links between JetStream servers, each one cuttable in one direction.

Theory of operation. Server i reaches server j only through the proxy for the directed pair
(i, j) (its config lists the proxy's port as j's route, see `jetstream_cluster`), so every
route connection between i and j crosses exactly one proxy that knows which end dialed. A
connection's two directions are pumped by two threads. A cut link (src, dst) stalls the
direction that carries src's bytes to dst: the pump holds what it read and reads no more, so
TCP's flow control backs up to the sender, as a firewall dropping packets would (the
sender's pings go unanswered, the Raft groups across the cut time out and elect). Healing
lets the held bytes through; a connection one side gave up on in between is closed, and its
replacement dials through the same proxy. No root is needed. All on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterable, Iterator

__all__ = ["Link", "RouteProxies", "accepted_pairs"]

Link = tuple[int, int]
_CHUNK_BYTES = 64 * 1024
_POLL_S = 0.05
_CONNECT_TIMEOUT_S = 2.0


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


class RouteProxies:
    """One listening proxy per directed pair: (dialer, target) -> (listen port, target port)."""

    def __init__(self, routes: dict[Link, tuple[int, int]]) -> None:
        self._routes = routes
        self._cut: set[Link] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._listeners: list[socket.socket] = []
        self._connections: set[socket.socket] = set()

    def start(self) -> None:
        """Listen on every route's proxy port and start forwarding; raises OSError if a port is
        taken."""
        for (dialer, target), (listen_port, target_port) in self._routes.items():
            listener = socket.create_server(("127.0.0.1", listen_port), reuse_port=False)
            listener.settimeout(_POLL_S * 4)
            self._listeners.append(listener)
            threading.Thread(
                target=self._accept, args=(listener, dialer, target, target_port),
                name=f"route-proxy-{dialer}-{target}", daemon=True,
            ).start()  # fmt: skip

    def stop(self) -> None:
        """Close every listener and connection; the pump threads end on their own."""
        self._stopping.set()
        with self._lock:
            sockets = [*self._listeners, *self._connections]
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def cut(self, links: Iterable[Link]) -> None:
        """Stall the directed `links` (src, dst): src's bytes to dst are held, not dropped, until
        healed."""
        with self._lock:
            self._cut |= set(links)

    def heal(self, node: int) -> None:
        """Every link from or to `node` flows again."""
        with self._lock:
            self._cut = {link for link in self._cut if node not in link}

    def is_cut(self, link: Link) -> bool:
        """Whether the directed `link` is cut now."""
        with self._lock:
            return link in self._cut

    @property
    def cut_links(self) -> frozenset[Link]:
        """The directed links cut now."""
        with self._lock:
            return frozenset(self._cut)

    def _accept(self, listener: socket.socket, dialer: int, target: int, port: int) -> None:
        for inbound, outbound in accepted_pairs(listener, port, self._stopping):
            with self._lock:
                self._connections |= {inbound, outbound}
            for source, sink, link in ((inbound, outbound, (dialer, target)),
                                       (outbound, inbound, (target, dialer))):  # fmt: skip
                threading.Thread(
                    target=self._pump, args=(source, sink, link), daemon=True,
                    name=f"route-pump-{link[0]}-{link[1]}",
                ).start()  # fmt: skip

    def _wait_uncut(self, link: Link) -> bool:
        while self.is_cut(link):
            if self._stopping.wait(_POLL_S):
                return False
        return True

    def _send_all(self, sink: socket.socket, data: bytes) -> None:
        """Send everything, however long the receiver takes (a paused server reads nothing
        but its connection stays up, as it would on a real network)."""
        view = memoryview(data)
        while view:
            try:
                view = view[sink.send(view) :]
            except TimeoutError:
                if self._stopping.is_set():
                    raise

    def _pump(self, source: socket.socket, sink: socket.socket, link: Link) -> None:
        source.settimeout(_POLL_S * 4)
        try:
            while self._wait_uncut(link):
                try:
                    data = source.recv(_CHUNK_BYTES)
                except TimeoutError:
                    continue
                if not data or not self._wait_uncut(link):
                    break
                self._send_all(sink, data)
        except OSError:
            pass  # either end went away: close both below
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            with self._lock:
                self._connections -= {source, sink}
