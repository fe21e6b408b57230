"""Leases and liveness, measured on this node's monotonic clock (`MonotonicClock`).

Two views of the same heartbeats, never compared across nodes:

- `NodeLease`: this node's own lease. It starts full (one `node_lease_ms` from the node's
  start) and is renewed from the moment a heartbeat that then committed was *sent*, so a
  slow commit never extends it. A node whose lease lapsed hands its partition leaderships
  away and refuses produce (`Broker.is_fenced`).
- `ControllerWatch`: while this node is the controller, each node's silence since the later
  of its last committed heartbeat and the controller's taking office (a new controller
  grants every node a full lease, as KRaft does), and since when each node has been alive
  without interruption in its current incarnation (the auto-rebalance grace period).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from raftlog.metadata import NodeInfo
from raftlog.runtime.clock import MonotonicClock
from raftlog.types import NodeId

__all__ = ["ControllerWatch", "NodeLease"]


class NodeLease:
    def __init__(self, clock: MonotonicClock, *, lease_ms: int) -> None:
        assert lease_ms > 0, lease_ms
        self._clock = clock
        self._lease_s = lease_ms / 1000
        # When the last heartbeat that renewed the lease was sent (start: one full lease).
        self._renewed_at = clock.monotonic()

    def renew(self, sent_at: float) -> None:
        """A heartbeat sent at `sent_at` (this clock) committed."""
        self._renewed_at = sent_at

    def lapsed(self) -> bool:
        return self._clock.monotonic() - self._renewed_at >= self._lease_s


class ControllerWatch:
    def __init__(self, clock: MonotonicClock) -> None:
        self._clock = clock
        # Since when (and in which metadata term) this node is the controller.
        self._in_office: tuple[int, float] | None = None
        # Each node's last heartbeat this controller committed.
        self._heard_at: dict[NodeId, float] = {}
        # Since when each node has been alive without interruption, and in which
        # incarnation (a restart starts its grace period again).
        self._alive_since: dict[NodeId, tuple[int, float]] = {}

    def heard(self, node_id: NodeId) -> None:
        """A heartbeat or registration of `node_id` committed through this controller."""
        self._heard_at[node_id] = self._clock.monotonic()

    def silence_ms(self, term: int, node_ids: Iterable[NodeId], now: float) -> dict[NodeId, int]:
        """How long each node has been silent at `now`, as the controller of `term` sees it;
        the first call of a new term takes office and forgets what an earlier term heard."""
        if self._in_office is None or self._in_office[0] != term:
            self._in_office = (term, now)
            self._heard_at.clear()
            self._alive_since.clear()
        since = self._in_office[1]
        return {n: int((now - max(self._heard_at.get(n, since), since)) * 1000) for n in node_ids}

    def alive_for_ms(
        self, nodes: Iterable[NodeInfo], silent_ms: Mapping[NodeId, int], recent_ms: int, now: float
    ) -> dict[NodeId, int]:
        """How long each node has been alive without interruption at `now`.

        A node counts as alive since the controller first saw it unfenced in its current
        incarnation: being fenced or restarting starts its grace period again. A node not
        heard from within `recent_ms` (it may have just died) is left out until it is heard
        again; that alone does not restart its grace period, so a heartbeat delayed on a
        loaded machine costs nothing but a later move."""
        alive_for_ms: dict[NodeId, int] = {}
        for info in nodes:
            if not info.alive:
                self._alive_since.pop(info.node_id, None)
                continue
            seen = self._alive_since.get(info.node_id)
            if seen is None or seen[0] != info.incarnation:
                seen = self._alive_since[info.node_id] = (info.incarnation, now)
            if silent_ms.get(info.node_id, recent_ms) < recent_ms:
                alive_for_ms[info.node_id] = int((now - seen[1]) * 1000)
        return alive_for_ms
