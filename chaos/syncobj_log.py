"""The outside baseline: a tiny replicated log on pysyncobj, run by the same chaos machinery.

Theory of operation. Three (or five) `SyncObj` nodes live in this process, on loopback TCP
ports, each holding the same replicated state: a list of values per partition, appended to by
one `@replicated` method whose return value (the list index) is the offset. Each node has a
journal file, so a killed node comes back with its log. We tick each node from our own thread
(`autoTick=False`), which is what lets the nemesis kill a node (stop its ticker, close its
sockets; restart builds a new `SyncObj` over the same journal) and pause one (its ticker
stops; its sockets stay open, like a SIGSTOPped process). Network faults have no hook in
pysyncobj, so `set_faults` answers False and the runner refuses partition nemeses here.

Clients: a send goes to the node that believes it is the leader (or any live node, which
forwards) and completes from pysyncobj's callback, or as unknown after `send_timeout_s`.
Reads (polls, watermarks, the final read) read the state of the node that believes it is the
leader: pysyncobj has no read index, so a deposed leader that has not noticed yet answers
from old state, and the checker will say so if that shows.
"""

from __future__ import annotations

import heapq
import itertools
import random
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated

from raftlog.chaos.clients import (
    ChaosConsumer,
    ChaosProducer,
    DefiniteSendFailure,
    FinalRead,
    ReadRecord,
)
from raftlog.local_cluster import free_port_base

__all__ = ["SyncObjBackend"]

# Codes after which the command was certainly not appended anywhere.
_DEFINITE = {FAIL_REASON.QUEUE_FULL, FAIL_REASON.MISSING_LEADER, FAIL_REASON.REQUEST_DENIED}
_TICK_S = 0.02


class _LogState(SyncObj):  # type: ignore[misc]  # pysyncobj has no type information
    def __init__(self, address: str, partners: list[str], conf: SyncObjConf) -> None:
        super().__init__(address, partners, conf)
        self.partitions: dict[int, list[str]] = {}

    @replicated  # type: ignore[untyped-decorator]
    def append(self, partition: int, value: str) -> int:
        """Replicated: append `value` to the partition's list; its index there is the offset."""
        log = self.partitions.setdefault(partition, [])
        log.append(value)
        return len(log) - 1


class _Node:
    """One SyncObj and the thread that ticks it; kill, restart, pause and resume."""

    def __init__(self, address: str, partners: list[str], journal: Path) -> None:
        self.address, self._partners, self._journal = address, partners, journal
        self.state: _LogState | None = None
        self.paused = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Create the node's SyncObj over its journal and start ticking it (the node is down)."""
        assert self.state is None
        conf = SyncObjConf(
            autoTick=False, journalFile=str(self._journal), dynamicMembershipChange=False
        )
        self.state = _LogState(self.address, self._partners, conf)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._tick, name=f"syncobj-{self.address}", daemon=True
        )
        self._thread.start()

    def _tick(self) -> None:
        state, stop = self.state, self._stop
        assert state is not None
        while not stop.is_set():
            if self.paused:
                stop.wait(_TICK_S)
            else:
                state.doTick(_TICK_S)
        state.destroy()  # autoTick=False: closes the transport on this (the ticking) thread

    def kill(self) -> None:
        """Stop ticking and close the node's sockets, its journal kept; a no-op when it is down."""
        if self.state is None:
            return
        self._stop.set()
        assert self._thread is not None
        self._thread.join(10)
        self.state = None
        self.paused = False

    def leading(self) -> _LogState | None:
        """The node's state if it runs, is not paused and believes it leads; else None."""
        state = self.state
        return state if state is not None and not self.paused and state._isLeader() else None


class _Producer:
    def __init__(self, backend: SyncObjBackend, send_timeout_s: float) -> None:
        self._backend = backend
        self._timeout_s = send_timeout_s
        self._deadlines: list[tuple[float, int, Future[int]]] = []
        self._order = itertools.count()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        threading.Thread(target=self._expire, name="syncobj-expiry", daemon=True).start()

    def send(self, topic: str, partition: int, value: str, key: str | None = None) -> Future[int]:
        """Append through the leader, or any live node, which forwards; the future gives the offset,
        or DefiniteSendFailure (refused), RuntimeError (unknown) or TimeoutError after
        `send_timeout_s`. Raises DefiniteSendFailure with no live node, ValueError for a key."""
        if key is not None:
            raise ValueError("keyed sends need a log that keeps keys (the raftlog backends)")
        future: Future[int] = Future()
        state = self._backend.some_node()
        if state is None:
            raise DefiniteSendFailure("no live node to send to")

        def callback(result: Any, error: int) -> None:
            """pysyncobj's answer: resolve the future with the offset, or fail it definitely or as
            unknown by the reason code; ignored once the future timed out."""
            if future.done():
                return
            if error == FAIL_REASON.SUCCESS:
                future.set_result(int(result))
            elif error in _DEFINITE:
                future.set_exception(DefiniteSendFailure(f"pysyncobj refused: reason {error}"))
            else:
                future.set_exception(RuntimeError(f"pysyncobj outcome unknown: reason {error}"))

        with self._lock:
            heapq.heappush(
                self._deadlines, (time.monotonic() + self._timeout_s, next(self._order), future)
            )
        state.append(partition, value, callback=callback)
        return future

    def _expire(self) -> None:
        while not self._closed.wait(0.1):
            now = time.monotonic()
            with self._lock:
                while self._deadlines and self._deadlines[0][0] <= now:
                    _, _, future = heapq.heappop(self._deadlines)
                    if not future.done():
                        future.set_exception(TimeoutError(f"no answer in {self._timeout_s}s"))

    def close(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for outstanding sends to complete, then stop expiring them."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(
            not f.done() for _, _, f in list(self._deadlines)
        ):
            time.sleep(0.05)
        self._closed.set()


class _Consumer:
    def __init__(self, backend: SyncObjBackend, partitions: Sequence[int]) -> None:
        self._backend = backend
        self._positions = dict.fromkeys(partitions, 0)

    def poll(self, timeout_ms: int) -> list[ReadRecord]:
        """Records past each position, waiting up to `timeout_ms` for some (a long poll)."""
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            state = self._backend.leader_state(timeout_s=max(0.0, deadline - time.monotonic()))
            records: list[ReadRecord] = []
            for partition, position in self._positions.items():
                log = state.partitions.get(partition, [])[position : position + 200]
                records += [ReadRecord(partition, position + i, v) for i, v in enumerate(log)]
                self._positions[partition] = position + len(log)
            if records or time.monotonic() >= deadline:
                return records
            time.sleep(_TICK_S)

    def close(self) -> None:
        """Forget the positions."""
        self._positions.clear()


class SyncObjBackend:
    """Both the `Backend` (nodes and faults) and the `LogClients` for the pysyncobj log."""

    def __init__(self, directory: Path, *, node_count: int, base_port: int | None = None) -> None:
        assert node_count in (3, 5), node_count
        base = base_port if base_port is not None else free_port_base(node_count)
        addresses = [f"127.0.0.1:{base + i}" for i in range(1, node_count + 1)]
        (directory / "syncobj").mkdir(parents=True, exist_ok=True)
        self._nodes = {
            i: _Node(
                a, [p for p in addresses if p != a], directory / "syncobj" / f"node-{i}.journal"
            )
            for i, a in enumerate(addresses, start=1)
        }
        self.node_ids: Sequence[int] = sorted(self._nodes)
        self._rng = random.Random(base)

    # -- Backend ------------------------------------------------------------------------------

    @property
    def log_paths(self) -> list[str]:
        """Always empty: the nodes live in this process and write no logs."""
        return []

    def start(self, *, timeout_s: float = 60.0) -> SyncObjBackend:
        """Start every node and wait up to `timeout_s` for a leader (TimeoutError if none); the
        backend is its own clients."""
        for node in self._nodes.values():
            node.start()
        self.leader_state(timeout_s=timeout_s)
        return self

    def stop(self) -> None:
        """Kill every node."""
        for node in self._nodes.values():
            node.kill()

    def kill(self, node: int) -> bool:
        """Stop the node's ticker and close its sockets; always True."""
        self._nodes[node].kill()
        return True

    def restart(self, node: int) -> bool:
        """Start the node again over its journal if it is down; always True."""
        if self._nodes[node].state is None:
            self._nodes[node].start()
        return True

    def pause(self, node: int) -> bool:
        """Stop ticking the node, its sockets left open like a SIGSTOPped process; always True."""
        self._nodes[node].paused = True
        return True

    def resume(self, node: int) -> bool:
        """Tick the node again; always True."""
        self._nodes[node].paused = False
        return True

    def set_faults(self, node: int, rules: dict[str, Any]) -> bool:
        """Always False: pysyncobj has no network fault hook."""
        return False  # pysyncobj has no network fault hook (see the module docstring)

    def lose_unsynced(self, node: int) -> dict[str, Any] | None:
        """Always None: there is no durability manifest to cut back to."""
        return None  # no durability manifest (see the module docstring)

    def corrupt(self, node: int, rng: random.Random) -> dict[str, Any] | None:
        """Always None: this backend damages no file."""
        return None  # pysyncobj keeps its log in memory: there is no file to damage

    def reassign(self, partition: int, replicas: Sequence[int]) -> str | None:
        """Always refused: one fixed group; the reason."""
        return "pysyncobj: one fixed group, no reassignment"

    def add_node(self) -> int | str:
        """Always refused: one fixed group; the reason."""
        return "pysyncobj: one fixed group"

    def remove_node(self, node: int, timeout_s: float) -> str | None:
        """Always refused: one fixed group; the reason."""
        return "pysyncobj: one fixed group, no decommission"

    def observers(self) -> tuple[int, ...]:
        """Always empty: every node is a voter of the one group."""
        return ()

    def partition_replicas(self, partition: int) -> tuple[int, ...] | None:
        """Always None: there are no per-partition replica sets."""
        return None

    def partition_leader(self, partition: int) -> int | None:
        """The node that believes it leads the one group (every partition); None if none does."""
        return next((i for i, n in self._nodes.items() if n.leading() is not None), None)

    def controller(self) -> int | None:
        """The leader of the one group, as for every partition."""
        return self.partition_leader(0)

    # -- LogClients ---------------------------------------------------------------------------

    def some_node(self) -> _LogState | None:
        """The state of the node that believes it leads, else a random live, unpaused node's; None
        if there is none."""
        leader = next((n.leading() for n in self._nodes.values() if n.leading() is not None), None)
        if leader is not None:
            return leader
        alive = [n.state for n in self._nodes.values() if n.state is not None and not n.paused]
        return self._rng.choice(alive) if alive else None

    def leader_state(self, *, timeout_s: float) -> _LogState:
        """The state of the node that believes it leads, waiting up to `timeout_s` for one; raises
        TimeoutError. A deposed leader that has not noticed yet counts: pysyncobj has no read index.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            for node in self._nodes.values():
                state = node.leading()
                if state is not None:
                    return state
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no pysyncobj leader within {timeout_s:.1f}s")
            time.sleep(0.05)

    def create_topic(
        self,
        topic: str,
        partitions: int,
        replication_factor: int,
        config: Mapping[str, str] | None = None,
    ) -> None:
        """Nothing to create: a partition's log begins at its first append (the topic name is not
        used)."""
        assert partitions > 0  # partitions are created on first append

    def producer(self, *, acks: str, idempotence: bool) -> ChaosProducer:
        """A producer that sends through the nodes with a 5 s timeout; `acks` and `idempotence` are
        ignored (every append is replicated)."""
        return _Producer(self, send_timeout_s=5.0)

    def consumer(self, topic: str, partitions: Sequence[int]) -> ChaosConsumer:
        """A consumer of `partitions`, each read from offset 0 out of the leader's state."""
        return _Consumer(self, partitions)

    def high_watermarks(self, topic: str, partitions: Sequence[int]) -> dict[int, int]:
        """The length of each partition's log in the leader's state; raises TimeoutError without a
        leader within 2 s."""
        state = self.leader_state(timeout_s=2.0)
        return {p: len(state.partitions.get(p, [])) for p in partitions}

    def final_read(self, topic: str, partition: int, *, timeout_s: float) -> FinalRead:
        """The whole partition log from the leader's state; raises TimeoutError without a leader
        within `timeout_s`."""
        state = self.leader_state(timeout_s=timeout_s)
        log = list(state.partitions.get(partition, []))
        return FinalRead(tuple(ReadRecord(partition, i, v) for i, v in enumerate(log)), len(log))
