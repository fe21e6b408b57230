"""The JetStream backend: the same workload, nemeses and checker against NATS JetStream.

Theory of operation. `JetStreamBackend` is both the runner's `Backend` and the workload's
`LogClients`. It runs a `JetStreamCluster` (3 or 5 `nats-server` processes, file storage,
JetStream's default `sync_interval` or "always") whose routes go through `RouteProxies`.

Mapping: one topic partition is one stream, `<topic>-<p>` on the subject `<topic>.<p>`, with
`replication_factor` replicas. Each stream is its own Raft group, as each raftlog partition
is, and its sequences are dense, so `offset = sequence - 1` and the high watermark is the
stream's last sequence. Subjects per partition in one stream would put every partition in
one Raft group and share one sequence across partitions: further from the model under test.

Clients run on one asyncio loop in a background thread (nats-py is asynchronous); each call
from the workload's threads is bounded in time. A send is a JetStream publish (one request,
2 s timeout, never retried by us): its ack's sequence is the offset; "no responders" (no
stream leader took the message) is a definite failure, anything else unknown. Polls and the
final read fetch messages by sequence from the stream leader (`STREAM.MSG.GET` with
`next_by_subj`, which steps over gaps); watermarks are `STREAM.INFO`'s last sequence.

Faults: kill is SIGKILL and restart starts the server on its store again; pause and resume
are SIGSTOP/SIGCONT; partitions cut directed links in the route proxies (`set_faults`
takes the same block rules as raftlog's --chaos hook). lose-unsynced: the servers run under
strace (`trace_io`), and after the SIGKILL each file of the node is cut back to what its
fsyncs made durable (`jetstream_durability`). corrupt damages one message block of a
killed node. Nemeses that need raftlog internals are refused (`UNSUPPORTED_NEMESES`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import threading
import time
from collections.abc import Coroutine, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import nats
from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.js.api import RawStreamMsg
from nats.js.client import JetStreamContext
from nats.js.errors import NoStreamResponseError, NotFoundError

from raftlog.chaos.clients import (
    ChaosConsumer,
    ChaosProducer,
    DefiniteSendFailure,
    FinalRead,
    ReadRecord,
)
from raftlog.chaos.jetstream_cluster import (
    JetStreamCluster,
    create_stream,
    quiet_client_error,
    stream_name,
    subject_name,
)
from raftlog.chaos.jetstream_durability import (
    DurabilityTracker,
    corrupt_one,
    cut_to_durable,
    snapshot_sizes,
)
from raftlog.chaos.jetstream_proxy import RouteProxies

__all__ = ["UNSUPPORTED_NEMESES", "JetStreamBackend"]

# Clock faults need raftlog's SetFaults clock hook; membership nemeses need raftlog's
# reassignment and observers; flaky needs its transport's fault injector.
UNSUPPORTED_NEMESES = (
    "flaky",
    "clock-jump",
    "clock-skew",
    "move-replica",
    "add-node",
    "remove-node",
)
SEND_TIMEOUT_S = 2.0
CALL_TIMEOUT_S = 5.0
POLL_RECORDS_MAX = 100
STREAM_GONE_S = 10.0
T = TypeVar("T")


class _Loop:
    """An asyncio loop on its own thread; `call` runs a coroutine there, bounded."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="jetstream-loop",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> Future[T]:
        """Schedule `coroutine` on the loop's thread; the future gives its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def call(self, coroutine: Coroutine[Any, Any, T], timeout_s: float = CALL_TIMEOUT_S) -> T:
        """Run `coroutine` on the loop and wait for its result; raises what it raised, or
        TimeoutError after `timeout_s` (the coroutine keeps running)."""
        return self.submit(coroutine).result(timeout=timeout_s)

    def close(self) -> None:
        """Cancel what is still running (a reconnect loop of a client nobody closed), stop."""

        async def cancel_the_rest() -> None:
            """Cancel every other task on the loop and wait until they end."""
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            self.call(cancel_the_rest(), timeout_s=10.0)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()


async def _connect(urls: list[str]) -> tuple[Client, JetStreamContext]:
    # Pings every second: a client on a paused server must notice and move on in seconds.
    client = await nats.connect(
        servers=urls, connect_timeout=2, reconnect_time_wait=0.2, max_reconnect_attempts=-1,
        ping_interval=1, max_outstanding_pings=2, allow_reconnect=True,
        error_cb=quiet_client_error,
    )  # fmt: skip
    return client, client.jetstream(timeout=SEND_TIMEOUT_S)


async def _next_message(js: JetStreamContext, topic: str, partition: int, sequence: int
                        ) -> RawStreamMsg | None:  # fmt: skip
    """The first message at or after `sequence`, from the stream leader; None past the end."""
    try:
        return await js.get_msg(
            stream_name(topic, partition),
            seq=sequence,
            subject=subject_name(topic, partition),
            next=True,
        )
    except NotFoundError:
        return None


class _Connection:
    """A client's connection, made on first use: a worker may be created while every server
    is down, and its first operation then fails (recorded) instead of the worker."""

    def __init__(self, urls: list[str]) -> None:
        self._urls = urls
        self._connected: tuple[Client, JetStreamContext] | None = None
        self._lock: asyncio.Lock | None = None

    async def js(self) -> JetStreamContext:
        """The JetStream context, connecting on first use; raises what the connect raised (OSError,
        a NATS error, TimeoutError)."""
        if self._lock is None:
            self._lock = asyncio.Lock()  # here: on the loop's thread
        async with self._lock:
            if self._connected is None:
                self._connected = await _connect(self._urls)
        return self._connected[1]

    async def close(self) -> None:
        """Close the connection, if one was made."""
        if self._connected is not None:
            await self._connected[0].close()


class _Producer:
    def __init__(self, loop: _Loop, urls: list[str]) -> None:
        self._loop = loop
        self._connection = _Connection(urls)
        self._pending: set[Future[int]] = set()

    async def _publish(self, topic: str, partition: int, value: str) -> int:
        try:
            js = await self._connection.js()
        except (OSError, NatsError, TimeoutError) as error:
            raise DefiniteSendFailure(f"no server to publish to: {error!r}") from error
        try:
            ack = await js.publish(subject_name(topic, partition), value.encode())
        except (NoRespondersError, NoStreamResponseError) as error:
            raise DefiniteSendFailure(f"no stream leader took it: {error!r}") from error
        return ack.seq - 1

    def send(self, topic: str, partition: int, value: str, key: str | None = None) -> Future[int]:
        """Publish the value on the loop; the future gives its offset (sequence - 1),
        DefiniteSendFailure when no server or no stream leader took it, else the publish error
        (unknown). Raises ValueError for a key."""
        if key is not None:
            raise ValueError("keyed sends need a log that keeps keys (the raftlog backends)")
        future = self._loop.submit(self._publish(topic, partition, value))
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)
        return future

    def close(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for outstanding publishes, then close the connection."""
        deadline = time.monotonic() + timeout_s
        while self._pending and time.monotonic() < deadline:
            time.sleep(0.05)
        with contextlib.suppress(Exception):
            self._loop.call(self._connection.close())


class _Consumer:
    def __init__(self, loop: _Loop, urls: list[str], topic: str, partitions: Sequence[int]):
        self._loop, self._topic = loop, topic
        self._connection = _Connection(urls)
        self._next = dict.fromkeys(partitions, 1)  # the next sequence to read

    async def _poll(self) -> list[ReadRecord]:
        js = await self._connection.js()
        records: list[ReadRecord] = []
        for partition, sequence in self._next.items():
            for _ in range(POLL_RECORDS_MAX):
                message = await _next_message(js, self._topic, partition, sequence)
                if message is None:
                    break
                assert message.seq is not None and message.seq >= sequence, (message.seq, sequence)
                value = (message.data or b"").decode(errors="replace")
                records.append(ReadRecord(partition, message.seq - 1, value))
                sequence = message.seq + 1
            self._next[partition] = sequence
        return records

    def poll(self, timeout_ms: int) -> list[ReadRecord]:
        """Up to 100 new messages per partition, read by sequence from the stream leaders; sleeps a
        little when there are none. Raises the NATS error or TimeoutError."""
        records = self._loop.call(self._poll(), timeout_s=CALL_TIMEOUT_S * 4)
        if not records:
            time.sleep(min(timeout_ms, 200) / 1000)  # nothing new: do not spin on the leader
        return records

    def close(self) -> None:
        """Close the connection, errors ignored."""
        with contextlib.suppress(Exception):
            self._loop.call(self._connection.close())


class JetStreamBackend:
    """`Backend` and `LogClients` over a local JetStream cluster."""

    def __init__(
        self, directory: Path, *, node_count: int, topic: str, sync_interval: str | None,
        trace_io: bool,
    ) -> None:  # fmt: skip
        assert node_count in (3, 5), node_count
        self._topic = topic
        self._cluster = JetStreamCluster.create(
            directory / "jetstream", node_count=node_count, sync_interval=sync_interval,
            proxied_routes=True, trace_io=trace_io,
        )  # fmt: skip
        cluster = self._cluster
        self._proxies = RouteProxies(
            {pair: (port, cluster.nodes[pair[1]].cluster_port)
             for pair, port in cluster.proxy_ports.items()}
        )  # fmt: skip
        self.node_ids: Sequence[int] = sorted(cluster.nodes)
        self._baselines: dict[int, dict[str, int]] = {}
        self._loop: _Loop | None = None
        self._admin: tuple[Client, JetStreamContext] | None = None

    # -- Backend ------------------------------------------------------------------------------

    @property
    def log_paths(self) -> list[str]:
        """Every server's server.log."""
        return [str(n.directory / "server.log") for n in self._cluster.nodes.values()]

    def start(self, *, timeout_s: float = 60.0) -> JetStreamBackend:
        """Start the route proxies and every server, wait for a meta leader and connect; returns the
        backend, which is its own clients. Raises TimeoutError after `timeout_s`."""
        self._proxies.start()
        for node in self.node_ids:
            self._start_node(node)
        self._cluster.wait_meta_leader(timeout_s=timeout_s)
        self._loop = _Loop()
        self._admin = self._loop.call(_connect(self._cluster.urls), timeout_s=timeout_s)
        return self

    def stop(self) -> None:
        """Close the admin connection, kill every server, stop the proxies and the client loop."""
        if self._loop is not None and self._admin is not None:
            with contextlib.suppress(Exception):
                self._loop.call(self._admin[0].close())
        self._cluster.stop()
        self._proxies.stop()
        if self._loop is not None:
            self._loop.close()

    def _start_node(self, node: int) -> None:
        if self._cluster.trace_io:
            self._baselines[node] = snapshot_sizes(self._cluster.nodes[node].store_dir)
        self._cluster.start_node(node)

    def kill(self, node: int) -> bool:
        """SIGKILL the node's server; always True."""
        self._cluster.kill(node)
        return True

    def restart(self, node: int) -> bool:
        """Start the node's server again on its store unless it runs (a new trace baseline with
        `trace_io`); always True."""
        if not self._cluster.nodes[node].running:
            self._start_node(node)
        return True

    def pause(self, node: int) -> bool:
        """SIGSTOP the node's server; False if it is not running."""
        return self._cluster.signal(node, signal.SIGSTOP)

    def resume(self, node: int) -> bool:
        """SIGCONT the node's server; False if it is not running."""
        return self._cluster.signal(node, signal.SIGCONT)

    def set_faults(self, node: int, rules: dict[str, Any]) -> bool:
        """Heal, or cut the `block` links outgoing from or incoming to `node` in the route proxies;
        False for any other rule (link degradation, clocks), which have no hook here."""
        if rules.get("heal"):
            self._proxies.heal(node)
            return True
        blocked = rules.get("block")
        if blocked is None:
            return False  # link degradation and clocks: no hook here (refused up front)
        direction = rules.get("direction")
        if direction == "outgoing":
            self._proxies.cut((node, peer) for peer in blocked)
        elif direction == "incoming":
            self._proxies.cut((peer, node) for peer in blocked)
        else:
            return False
        return True

    def lose_unsynced(self, node: int) -> dict[str, Any] | None:
        """Cut the killed node's files back to what its fsyncs made durable (its trace)."""
        state = self._cluster.nodes[node]
        if not self._cluster.trace_io or state.running or node not in self._baselines:
            return None
        tracker = DurabilityTracker(self._baselines[node])
        with state.trace_path(state.starts - 1).open(errors="replace") as trace:
            tracker.feed(trace)
        return cut_to_durable(tracker, state.store_dir)

    def corrupt(self, node: int, rng: random.Random) -> dict[str, Any] | None:
        """Damage one data file of `node`, which the nemesis killed (see corrupt_one)."""
        state = self._cluster.nodes[node]
        assert not state.running, f"corrupt: node {node} must be killed first"
        return corrupt_one(state.store_dir, rng)

    def reassign(self, partition: int, replicas: Sequence[int]) -> str | None:
        """Always refused: no reassignment; the reason."""
        return "jetstream backend: no reassignment"

    def add_node(self) -> int | str:
        """Always refused: the servers are fixed; the reason."""
        return "jetstream backend: fixed servers"

    def remove_node(self, node: int, timeout_s: float) -> str | None:
        """Always refused: the servers are fixed; the reason."""
        return "jetstream backend: fixed servers"

    def observers(self) -> tuple[int, ...]:
        """Always empty: there are no observers."""
        return ()

    def partition_replicas(self, partition: int) -> tuple[int, ...] | None:
        """Always None: the nemesis cannot move streams."""
        return None

    def partition_leader(self, partition: int) -> int | None:
        """The node leading the partition's stream, per STREAM.INFO; None without an answer within
        two seconds."""
        assert self._loop is not None and self._admin is not None
        js = self._admin[1]
        with contextlib.suppress(Exception):
            info = self._loop.call(js.stream_info(stream_name(self._topic, partition)), 2.0)
            return self._cluster.node_by_name(info.cluster.leader if info.cluster else None)
        return None

    def controller(self) -> int | None:
        """The JetStream meta leader as a running node sees it; None if unknown."""
        return self._cluster.meta_leader()

    # -- LogClients ---------------------------------------------------------------------------

    def create_topic(
        self,
        topic: str,
        partitions: int,
        replication_factor: int,
        config: Mapping[str, str] | None = None,
    ) -> None:
        """Create one file-storage stream per partition with `replication_factor` replicas and wait
        for each one's leader; `config` is ignored. Raises TimeoutError when a stream or its leader
        does not appear in time."""
        assert self._loop is not None and self._admin is not None
        for p in range(partitions):
            coroutine = create_stream(
                self._admin[1],
                stream_name(topic, p),
                subject_name(topic, p),
                replicas=replication_factor,
            )
            self._loop.call(coroutine, timeout_s=60.0)

    def producer(self, *, acks: str, idempotence: bool) -> ChaosProducer:
        """A producer publishing through its own connection; raises ValueError unless `acks` is
        "all" (`idempotence` is ignored)."""
        if acks != "all":
            raise ValueError(f"jetstream backend: every publish is acknowledged (acks={acks})")
        assert self._loop is not None
        return _Producer(self._loop, self._cluster.urls)

    def consumer(self, topic: str, partitions: Sequence[int]) -> ChaosConsumer:
        """A consumer of `partitions` through its own connection, each read from offset 0."""
        assert self._loop is not None
        return _Consumer(self._loop, self._cluster.urls, topic, partitions)

    def high_watermarks(self, topic: str, partitions: Sequence[int]) -> dict[int, int]:
        """Each partition's stream's last sequence (its offset end); raises the NATS error or
        TimeoutError."""
        assert self._loop is not None and self._admin is not None
        js = self._admin[1]
        return {
            p: self._loop.call(js.stream_info(stream_name(topic, p))).state.last_seq
            for p in partitions
        }

    def final_read(self, topic: str, partition: int, *, timeout_s: float) -> FinalRead:
        """Every message of the partition's stream up to its last sequence; a stream that stays
        unknown reads as empty with end 0. Raises TimeoutError past `timeout_s`."""
        assert self._loop is not None and self._admin is not None
        return self._loop.call(self._read_all(topic, partition), timeout_s=timeout_s)

    async def _read_all(self, topic: str, partition: int) -> FinalRead:
        assert self._admin is not None
        js = self._admin[1]
        end = await self._last_sequence(js, stream_name(topic, partition))
        records: list[ReadRecord] = []
        sequence = 1
        while sequence <= end:
            message = await _next_message(js, topic, partition, sequence)
            if message is None or message.seq is None or message.seq > end:
                break
            value = (message.data or b"").decode(errors="replace")
            records.append(ReadRecord(partition, message.seq - 1, value))
            sequence = message.seq + 1
        return FinalRead(tuple(records), end)

    @staticmethod
    async def _last_sequence(js: JetStreamContext, name: str) -> int:
        """The stream's last sequence; 0 when the cluster keeps saying it has no such stream
        (a power loss can take a whole stream: its files zero bytes on every server), so the
        checker counts its acknowledged records as lost. A restarted cluster may answer
        "not found" while its meta group replays, hence the wait before believing it."""
        deadline = time.monotonic() + STREAM_GONE_S
        while True:
            try:
                return (await js.stream_info(name)).state.last_seq
            except NotFoundError:
                if time.monotonic() > deadline:
                    return 0
                await asyncio.sleep(0.5)
