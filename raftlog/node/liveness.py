"""A node's liveness: registering with the controller, then heartbeating (pipelined), and
measuring how late its own event loop runs.

Heartbeats are pipelined: one is sent every `node_heartbeat_interval_ms` whether or not the
previous one has committed yet, at most lease / interval at once. A heartbeat's commit waits
for the metadata group's passes on the controller and a follower, which a busy node (a
thousand groups being created) stretches to seconds; sent one after another, each such delay
also delayed the next send, and a node alive and heartbeating had its lease lapse and was
fenced for the metadata group's slowness. A heartbeat that committed renews the node's lease
from the moment it was sent (`NodeLease.renew`); one older than the lease renews nothing, so
it gives up then.

The loop-lag probe feeds `LoopLagMeter`: the lease and the controller's failure detector run
on loop time, so silence the node's own late loop explains is held against nobody.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from raftlog.config import MetadataConfig
from raftlog.errors import RaftlogError
from raftlog.metadata import ApplyResult, Command, ErrorCode, NodeHeartbeat, RegisterNode
from raftlog.node.leases import LoopLagMeter, NodeLease
from raftlog.types import NodeId

__all__ = ["NodeLiveness"]

log = logging.getLogger(__name__)


class NodeLiveness:
    def __init__(
        self,
        *,
        node_id: NodeId,
        config: MetadataConfig,
        lease: NodeLease,
        loop_lag: LoopLagMeter,
        registration: Callable[[], RegisterNode],
        heartbeat: Callable[[], NodeHeartbeat],
        submit: Callable[..., Awaitable[ApplyResult]],
        on_decommissioned: Callable[..., None],
        each_pass: Callable[[], Awaitable[None]],
    ) -> None:
        self._node_id = node_id
        self._config = config
        self._lease = lease
        self._loop_lag = loop_lag
        self._registration = registration
        self._heartbeat = heartbeat
        self._submit = submit
        self._on_decommissioned = on_decommissioned
        self._each_pass = each_pass

    async def run(self) -> None:
        """Register this node, then heartbeat; `each_pass` runs every interval too (the
        controller's duties, leadership moves and reports)."""
        interval_s = self._config.node_heartbeat_interval_ms / 1000
        lease_s = self._config.node_lease_ms / 1000
        in_flight: set[asyncio.Task[bool]] = set()
        try:
            await self._turns(interval_s, lease_s, in_flight)
        finally:
            for task in in_flight:
                task.cancel()

    async def _turns(
        self, interval_s: float, lease_s: float, in_flight: set[asyncio.Task[bool]]
    ) -> None:
        registered = False
        while True:
            if not registered:
                registered = await self._submit_once(
                    self._registration(), timeout_s=interval_s * 2, restarted=True
                )
            elif len(in_flight) < self.heartbeats_in_flight_max():
                # A heartbeat older than the lease renews nothing: it gives up then.
                task = asyncio.create_task(
                    self._submit_once(self._heartbeat(), timeout_s=lease_s, restarted=False)
                )
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
            await self._each_pass()
            await asyncio.sleep(interval_s if registered else 0.2)

    def heartbeats_in_flight_max(self) -> int:
        return -(-self._config.node_lease_ms // self._config.node_heartbeat_interval_ms)

    async def _submit_once(self, command: Command, *, timeout_s: float, restarted: bool) -> bool:
        """Submit a registration or heartbeat; renews the lease from its send time when it
        commits. Whether it committed."""
        sent_at = self._lease.loop_time()
        try:
            result = await self._submit(command, timeout_s=timeout_s)
        except (RaftlogError, TimeoutError, OSError) as error:
            log.debug("node %s: liveness submit failed: %s", self._node_id, error)
            return False
        if result.code is ErrorCode.NODE_DECOMMISSIONED:
            self._on_decommissioned(result.message, restarted=restarted)
        if result.ok:
            self._lease.renew(sent_at)
        return result.ok

    async def measure_loop_lag(self) -> None:
        """Measure how late this node's event loop runs timers; the controller's failure
        detector does not count that lag as the other nodes' silence."""
        interval_s = self._config.loop_lag_probe_interval_ms / 1000
        lease_ms = self._config.node_lease_ms
        while True:
            self._loop_lag.expect(interval_s)
            await asyncio.sleep(interval_s)
            lag_s = self._loop_lag.woke()
            if lag_s * 1000 >= lease_ms / 4:
                log.info(
                    "node %s: event loop ran %.0f ms late (timer %.0f ms; lease %s ms): "
                    "that silence is not held against other nodes",
                    self._node_id, lag_s * 1000, interval_s * 1000, lease_ms,
                )  # fmt: skip
