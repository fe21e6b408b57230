"""A node's metrics endpoint: `GET /metrics` in Prometheus's text format on `--metrics-listen`.

Theory of operation. `NodeMetrics` installs a `PrometheusRecorder` as the process's
recorder (`raftlog.runtime.recorder`: the event counters and histograms), registers a
`SnapshotCollector` (the state read at scrape time) and the process collector (CPU,
memory, file descriptors); `start` opens a small asyncio HTTP server and a probe that measures the
event loop's lag. A scrape takes the snapshot on the loop, where it cannot race the groups,
then renders the registry on a worker thread (`prometheus_client.generate_latest`), so a
large exposition does not hold the loop; scrapes are rendered one at a time.

Bounds: a request head is at most `REQUEST_HEAD_BYTES_MAX`, read within
`REQUEST_TIMEOUT_S`; a connection carries one request (Prometheus opens one a scrape); at
most `CONNECTIONS_MAX` are served at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Gauge,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.process_collector import ProcessCollector

from raftlog.metrics.collector import SnapshotCollector
from raftlog.metrics.events import PrometheusRecorder
from raftlog.metrics.snapshot import NodeView, capture
from raftlog.runtime.recorder import install

__all__ = ["NodeMetrics"]

log = logging.getLogger(__name__)

REQUEST_HEAD_BYTES_MAX = 8 * 1024
REQUEST_TIMEOUT_S = 5.0
# Connections served at once; more are closed unanswered (a scraper retries next interval).
CONNECTIONS_MAX = 16
# The lag probe wakes this often; each wake costs a few microseconds of loop time.
LOOP_LAG_INTERVAL_S = 0.5
METRICS_PATHS = ("/metrics", "/")


class NodeMetrics:
    """Construction installs the recorder; `stop` puts the previous one back."""

    def __init__(self, view: NodeView) -> None:
        # `_created` series double every counter's and histogram's series for a start time
        # that process_start_time_seconds already gives.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.view = view
        self.registry = CollectorRegistry(auto_describe=False)
        self.recorder = PrometheusRecorder(self.registry)
        # Installed now, before the node starts, so its first elections count too.
        self._previous = install(self.recorder)
        self.collector = SnapshotCollector()
        self.registry.register(self.collector)
        ProcessCollector(namespace="", registry=self.registry)
        self.capture_seconds = Gauge(
            "raftlog_metrics_capture_seconds",
            "Longest time this scrape held the event loop in one step of copying the node's state",
            registry=self.registry,
        )
        self._render_lock = asyncio.Lock()
        self._server: asyncio.Server | None = None
        self._probe: asyncio.Task[None] | None = None
        self.bound_port = 0
        self._connections = 0

    async def start(self, host: str, port: int) -> None:
        assert self._server is None, "started twice"
        self._server = await asyncio.start_server(
            self._serve, host, port, limit=REQUEST_HEAD_BYTES_MAX
        )
        self.bound_port = self._server.sockets[0].getsockname()[1]
        self._probe = asyncio.create_task(self._probe_loop_lag(), name="metrics-loop-lag")
        log.info("node %s: metrics on http://%s:%d/metrics", self.view.node_id, host, port)

    async def stop(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        install(self._previous)

    async def render(self) -> bytes:
        """The exposition of this node's metrics now."""
        async with self._render_lock:
            snapshot, step_s_max = await capture(self.view)
            self.collector.set_snapshot(snapshot)
            self.capture_seconds.set(step_s_max)
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(None, generate_latest, self.registry)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._connections >= CONNECTIONS_MAX:
            log.debug("metrics connection closed: %d already open", self._connections)
            writer.close()
            return
        self._connections += 1
        try:
            head = await asyncio.wait_for(_read_head(reader), REQUEST_TIMEOUT_S)
            status, body, content_type = await self._answer(head)
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode("ascii")
            )
            writer.write(body)
            await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, ValueError) as error:
            log.debug("metrics request dropped: %r", error)
        finally:
            self._connections -= 1
            writer.close()

    async def _answer(self, head: bytes) -> tuple[str, bytes, str]:
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = request_line.split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return "400 Bad Request", b"malformed request line\n", "text/plain"
        method, target = parts[0], parts[1].split("?", 1)[0]
        if method != "GET":
            return "405 Method Not Allowed", f"{method}: only GET\n".encode(), "text/plain"
        if target not in METRICS_PATHS:
            return "404 Not Found", f"{target}: metrics are at /metrics\n".encode(), "text/plain"
        return "200 OK", await self.render(), CONTENT_TYPE_LATEST

    async def _probe_loop_lag(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + LOOP_LAG_INTERVAL_S
            await asyncio.sleep(LOOP_LAG_INTERVAL_S)
            self.recorder.on_loop_lag(max(0.0, loop.time() - due))


async def _read_head(reader: asyncio.StreamReader) -> bytes:
    """The request line and headers; a head over `REQUEST_HEAD_BYTES_MAX` is refused."""
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        raise ValueError(f"request head over {REQUEST_HEAD_BYTES_MAX} bytes") from None
