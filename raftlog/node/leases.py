"""Leases and liveness, measured on this node's monotonic clock (`MonotonicClock`).

Two views of the same heartbeats, never compared across nodes:

- `NodeLease`: this node's own lease. It starts full (one `node_lease_ms` from the node's
  start) and is renewed from the moment a heartbeat that then committed was *sent*, so a
  slow commit never extends it. A node whose lease lapsed hands its partition leaderships
  away and refuses produce (`Node.is_fenced`). It too runs on this node's loop time: a
  node whose own loop is late (creating a thousand groups, starved of CPU) has not read
  the answers to its heartbeats, and handing its leaderships away would only add
  elections to the load that made it late. A node the controller fences stays fenced
  (the metadata says so), so a really silent node still hands over.
- `ControllerWatch`: while this node is the controller, each node's silence since the later
  of its last heartbeat and the controller's taking office (a new controller grants every
  node a full lease, as KRaft does), and since when each node has been alive without
  interruption in its current incarnation (the auto-rebalance grace period).

The failure detector never fires on silence the controller's own slowness explains. A
heartbeat counts when it reaches the controller, not when it commits (a slow metadata
commit says nothing about the sender; KRaft's controller also stamps a broker's heartbeat on
receipt). And silence is measured on the controller's *loop time*: `LoopLagMeter` measures
how late the node's event loop runs a timer (starved of CPU, a GC pause, a stop signal), and
`ControllerWatch` takes that lag out of every node's silence, since heartbeats
that arrived meanwhile sat unread in the controller's sockets. A node silent for a lease of
loop time is fenced: a really silent node still goes within its lease plus what the
controller itself was late.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from raftlog.metadata import NodeInfo
from raftlog.runtime.clock import MonotonicClock
from raftlog.types import NodeId

__all__ = ["ControllerWatch", "LoopLagMeter", "NodeLease"]


class NodeLease:
    def __init__(
        self, clock: MonotonicClock, *, lease_ms: int, loop_lag: LoopLagMeter | None = None
    ) -> None:
        assert lease_ms > 0, lease_ms
        self._clock = clock
        self._lease_s = lease_ms / 1000
        self._loop_lag = loop_lag if loop_lag is not None else LoopLagMeter(clock)
        # When the last heartbeat that renewed the lease was sent, in loop time (start: one
        # full lease).
        self._renewed_at = self.loop_time()

    def loop_time(self) -> float:
        """This node's clock less every lag of its loop: what `renew` takes."""
        return self._clock.monotonic() - self._loop_lag.lagged_s()

    def renew(self, sent_at: float) -> None:
        """A heartbeat sent at `sent_at` (`loop_time()`) committed."""
        self._renewed_at = max(self._renewed_at, sent_at)

    def lapsed(self) -> bool:
        return self.lapse_cause() is not None

    def lapse_cause(self) -> str | None:
        """Why the lease lapsed (which timer, how late), or None while it holds."""
        age_s = self.loop_time() - self._renewed_at
        if age_s < self._lease_s:
            return None
        return (
            f"own lease timer: last renewed by a heartbeat sent {age_s * 1000:.0f} ms of loop "
            f"time ago, {(age_s - self._lease_s) * 1000:.0f} ms past its "
            f"{self._lease_s * 1000:.0f} ms lease (own loop lag so far, not counted: "
            f"{self._loop_lag.lagged_s() * 1000:.0f} ms)"
        )


class LoopLagMeter:
    """How late an event loop runs a timer: `expect(interval_s)` before sleeping that long,
    `woke()` after. `lagged_s()` is every lag so far, the overdue part of a pending timer
    included (a loop that was stalled may run other overdue work before that timer)."""

    def __init__(self, clock: MonotonicClock) -> None:
        self._clock = clock
        self._lagged_s = 0.0
        self._due_at: float | None = None

    def expect(self, interval_s: float) -> None:
        assert interval_s >= 0, interval_s
        assert self._due_at is None, "expect() twice without woke()"
        self._due_at = self._clock.monotonic() + interval_s

    def woke(self) -> float:
        """Seconds the wake-up came after its due time (added to `lagged_s`)."""
        lag_s = self._overdue_s()
        self._lagged_s += lag_s
        self._due_at = None
        return lag_s

    def lagged_s(self) -> float:
        return self._lagged_s + self._overdue_s()

    def _overdue_s(self) -> float:
        if self._due_at is None:
            return 0.0
        return max(0.0, self._clock.monotonic() - self._due_at)


class ControllerWatch:
    def __init__(self, clock: MonotonicClock, *, loop_lag: LoopLagMeter | None = None) -> None:
        self._clock = clock
        # Loop time is the clock less every lag of this node's loop: it stands still while
        # the loop could not run (a meter never started measures none).
        self._loop_lag = loop_lag if loop_lag is not None else LoopLagMeter(clock)
        # Since when (and in which metadata term) this node is the controller, in loop time.
        self._in_office: tuple[int, float] | None = None
        # Each node's last heartbeat that reached this controller, in loop time.
        self._heard_at: dict[NodeId, float] = {}
        # Since when each node has been alive without interruption, and in which
        # incarnation (a restart starts its grace period again).
        self._alive_since: dict[NodeId, tuple[int, float]] = {}

    def heard(self, node_id: NodeId) -> None:
        """A heartbeat or registration of `node_id` reached this controller."""
        self._heard_at[node_id] = self._loop_time(self._clock.monotonic())

    def loop_lag_ms(self) -> float:
        """Every lag of this node's loop so far (what loop time leaves out)."""
        return self._loop_lag.lagged_s() * 1000

    def _loop_time(self, now: float) -> float:
        return now - self._loop_lag.lagged_s()

    def silence_ms(self, term: int, node_ids: Iterable[NodeId], now: float) -> dict[NodeId, int]:
        """How long (in loop time) each node has been silent at `now`, as the controller of
        `term` sees it; the first call of a new term takes office and forgets what an earlier
        term heard."""
        loop_now = self._loop_time(now)
        if self._in_office is None or self._in_office[0] != term:
            self._in_office = (term, loop_now)
            self._heard_at.clear()
            self._alive_since.clear()
        since = self._in_office[1]
        return {
            n: int((loop_now - max(self._heard_at.get(n, since), since)) * 1000) for n in node_ids
        }

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
