"""The `slow` nemesis: a node that is alive but whose event loop stalls again and again.

Theory of operation. Real nodes are slow every day (a GC pause, a noisy neighbour, a slow
disk): their loop stops for a moment and then carries on. `Staller` plays that on one node
for the fault's hold window: it stops the whole process (`ClusterControl.pause`: SIGSTOP on
the local backend, the cgroup freezer under docker) for a stall drawn from `STALL_MS`, lets
it run for a gap drawn from `GAP_MS`, and again, until `stop`. The lengths come from the
fault's seed, so a run replays; what the history keeps is the *measured* length of every
stall (from before the pause to after the resume), since a busy machine stretches them.

A stall no longer than an election timeout less one heartbeat interval cannot, by Raft's
rules, make a follower of the stalled leader time out: it heard a heartbeat at most one
interval before the stall began. So a stall counts as one that *removed a leader* only past
that length (`removes_leader`); the run's elections are judged against those
(`raftlog.chaos.elections`).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["GAP_MS", "STALL_MS", "Staller", "removes_leader"]

# How long one stall lasts, and how long the node runs between two stalls.
STALL_MS = (50, 500)
GAP_MS = (100, 1000)
# Stalls one fault may make: bounds the history a long hold writes (a hold of minutes).
STALLS_MAX = 1000


class PauseControl(Protocol):
    def pause(self, node: int) -> bool:
        """Freeze `node`'s process; whether it was running to be frozen."""
        ...

    def resume(self, node: int) -> bool:
        """Let `node`'s process run again; whether it was running."""
        ...


def removes_leader(
    stall_ms: float, *, election_timeout_ms: int, heartbeat_interval_ms: int
) -> bool:
    """Whether a leader stalled this long may rightly lose its leadership: its followers
    last heard it up to one heartbeat interval before the stall (Raft §5.2)."""
    assert election_timeout_ms > heartbeat_interval_ms > 0
    return stall_ms + heartbeat_interval_ms > election_timeout_ms


class Staller:
    """Stalls `node` in bursts on a thread of its own, from `start` until `stop`. The clocks
    and the sleep are parameters so that one stall can be tested without waiting."""

    def __init__(
        self,
        control: PauseControl,
        node: int,
        seed: int,
        *,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._control = control
        self._node = node
        self._rng = random.Random(seed)
        self._sleep = sleep
        self._monotonic = monotonic
        self._wall = wall
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"slow-{node}", daemon=True)
        self.stalls: list[tuple[float, float]] = []  # (start, epoch seconds; length, ms)

    def start(self) -> None:
        """Start stalling on the staller's own thread; call once."""
        self._thread.start()

    def stop(self) -> dict[str, Any]:
        """Stop stalling, leave the node running; what was done, for the history."""
        self._stopping.set()
        self._thread.join()
        self._control.resume(self._node)  # in case the thread died between the two calls
        assert not self._thread.is_alive()
        return {
            "node": self._node,
            "stalls": [{"at_s": round(at_s, 3), "ms": round(ms, 1)} for at_s, ms in self.stalls],
        }

    def stall_once(self) -> float:
        """Stall the node once and let it run again; returns the gap to wait, in seconds."""
        stall_s = self._rng.uniform(*STALL_MS) / 1000
        gap_s = self._rng.uniform(*GAP_MS) / 1000
        started, started_at_s = self._monotonic(), self._wall()
        paused = self._control.pause(self._node)
        # Not cut short by stop: a stall lasts its own length.
        self._sleep(stall_s)
        self._control.resume(self._node)
        if paused:  # a node that was down was not stalled
            self.stalls.append((started_at_s, (self._monotonic() - started) * 1000))
        assert gap_s > 0
        return gap_s

    def _run(self) -> None:
        while not self._stopping.is_set() and len(self.stalls) < STALLS_MAX:
            self._stopping.wait(self.stall_once())
