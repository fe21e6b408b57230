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

import functools
import socket
from collections.abc import Iterable

from raftlog.chaos.tcp_proxy import CHUNK_BYTES, POLL_S, TcpProxy, spawn

__all__ = ["Link", "RouteProxies"]

Link = tuple[int, int]


class RouteProxies(TcpProxy):
    """One listening proxy per directed pair: (dialer, target) -> (listen port, target port)."""

    def __init__(self, routes: dict[Link, tuple[int, int]]) -> None:
        super().__init__()
        self._routes = routes
        self._cut: set[Link] = set()

    def start(self) -> None:
        """Listen on every route's proxy port and start forwarding; raises OSError if a port is
        taken."""
        for (dialer, target), (listen_port, target_port) in self._routes.items():
            serve = functools.partial(self._route, dialer, target)
            self._listen(listen_port, target_port, serve, name=f"route-proxy-{dialer}-{target}")

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

    def _route(
        self, dialer: int, target: int, inbound: socket.socket, outbound: socket.socket
    ) -> None:
        for source, sink, link in ((inbound, outbound, (dialer, target)),
                                   (outbound, inbound, (target, dialer))):  # fmt: skip
            spawn(self._pump, source, sink, link, name=f"route-pump-{link[0]}-{link[1]}")

    def _wait_uncut(self, link: Link) -> bool:
        while self.is_cut(link):
            if self._stopping.wait(POLL_S):
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
        source.settimeout(POLL_S * 4)
        try:
            while self._wait_uncut(link):
                try:
                    data = source.recv(CHUNK_BYTES)
                except TimeoutError:
                    continue
                if not data or not self._wait_uncut(link):
                    break
                self._send_all(sink, data)
        except OSError:
            pass  # either end went away: close both below
        finally:
            self._close(source, sink)
