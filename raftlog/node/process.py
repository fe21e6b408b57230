"""One `raftlog serve` process: tune the allocator, run a node (and its metrics endpoint)
until SIGTERM or SIGINT or until a task of the node fails, then stop it."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys

from raftlog.metrics import NodeMetrics
from raftlog.node.malloc_tuning import tune_malloc
from raftlog.node.node import Node
from raftlog.settings import NodeSettings

__all__ = ["run_node"]

log = logging.getLogger("raftlog")


async def run_node(settings: NodeSettings) -> int:
    """Run a node until a signal (exit 0) or a failed task (1); 2 if --metrics-listen fails."""
    config = settings.config
    if not tune_malloc(
        trim_threshold_bytes=config.malloc_trim_threshold_bytes,
        mmap_threshold_bytes=config.malloc_mmap_threshold_bytes,
    ):
        log.info("no glibc mallopt: malloc thresholds left as they are")
    node = Node(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    # Before the node starts, so that its first elections and flushes count.
    metrics = None if settings.metrics_listen is None else NodeMetrics(node)
    await node.start()
    if metrics is not None and not await _start_metrics(metrics, settings):
        await node.stop()
        return 2
    # Everything built so far (modules, gRPC and protobuf tables, the recovered state) lives
    # as long as the process: move it out of the collector's generations, so a full
    # collection, triggered by per-request garbage, no longer walks it all and stalls the
    # loop for tens of milliseconds (gc.freeze, as CPython's docs advise for servers).
    gc.collect()
    gc.freeze()
    log.info(
        "node %s serving clients on %s, peers on %s",
        settings.node_id,
        settings.client_address,
        settings.raft_address,
    )
    failed = await _wait_for_stop_or_failure(node, stop)
    if metrics is not None:
        await metrics.stop()
    await node.stop()
    return 1 if failed else 0


async def _start_metrics(metrics: NodeMetrics, settings: NodeSettings) -> bool:
    assert settings.metrics_listen is not None
    try:
        await metrics.start(*settings.metrics_listen)
    except OSError as error:
        host, port = settings.metrics_listen
        print(f"raftlog serve: --metrics-listen {host}:{port}: {error}", file=sys.stderr)
        await metrics.stop()
        return False
    return True


async def _wait_for_stop_or_failure(node: Node, stop: asyncio.Event) -> bool:
    """True if a task of the node failed (already logged where it happened)."""
    assert node.failed is not None
    stopping: asyncio.Future[object] = asyncio.ensure_future(stop.wait())
    failing: asyncio.Future[object] = node.failed  # type: ignore[assignment]
    await asyncio.wait([stopping, failing], return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not node.failed.done():
        return False
    # Retrieving it keeps asyncio from logging it again.
    node.failed.exception()
    return True
