"""Node-to-node Raft transport: length-prefixed frames over asyncio TCP (optionally TLS).

Theory of operation. Chosen by measurement over a grpc.aio stream (benchmarks/suites/
transport.py, docs/transport.md): frames are written with `Transport.write` under the
socket's pause/resume flow control and read by a `BufferedProtocol` straight into a reusable
buffer (a frame too large for it gets a buffer of its own that the kernel fills directly).

Connections. Each node dials one outbound connection per peer and sends all its Raft traffic,
for every group, over it; a peer's messages arrive over the connection *it* dialed. Both ends
send a HELLO (cluster id, node id) first and check the other's: a node never accepts Raft
traffic from another cluster, from a node it does not know, or from a dialed address that
turned out to be someone else. Every message's sender and receiver must match the HELLO.

Sending never blocks. `send()` appends to the peer's pending list; one callback per event-loop
iteration seals everything pending for that peer into one frame (split at `frame_bytes_max`
and `frame_messages_max`). Frames wait in a per-peer queue bounded in bytes
(`peer_queue_bytes_max`, counting pending, queued and fault-delayed bytes) until the socket's
write buffer is below `write_buffer_bytes_max`. A message that does not fit is dropped and
counted: Raft tolerates loss and resends. While a peer is down (between a failed attempt and
the next one, with exponential backoff and jitter) messages to it are dropped at once, and
frames queued when a connection breaks are discarded, so a peer never receives a flood of
stale traffic when it comes back. A HELLO from a peer we are backing off from ends the
backoff at once (the peer is up: it just dialed us), so a restarted node hears from us as soon
as it has dialed us, not after our backoff toward it.

Metadata calls. `send_call_frame` queues a CALL or REPLY frame (raftlog.rpc.peer_calls)
ahead of the Raft traffic waiting for the peer (behind only a frame half written): a
heartbeat to the controller must not wait behind megabytes of appends. Such frames are
bounded, dropped and faulted like any other; they arrive through `on_call_frame`. When the
connection a peer dialed to us closes, `on_peer_disconnected(peer)` says so: whatever the
peer had queued for us on it (replies included) is gone.

Receiving calls `on_messages(sender, items)` synchronously, once per frame, with every
(group, message) pair of that frame. An exception it raises closes that connection and goes
to the event loop's exception handler (a node stops on a failed assertion there:
Node._on_loop_exception). Malformed frames and refused HELLOs close the connection and
are counted.

Node liveness. Every `node_heartbeat_interval_ms` the node sends each connected peer whose
queue is empty one heartbeat: an empty MESSAGES frame (a frame carrying Raft traffic says
the same, so a busy link sends no extra frame). One heartbeat per node pair covers every
Raft group, which is what lets idle groups quiesce (raftlog.raft.quiesce). A peer is
reachable while some frame of it arrived within `node_liveness_timeout_ms`; it becomes
unreachable when that lapses, when its inbound connection closes (a killed process closes
its sockets: no need to wait), or when it is removed. Each change is reported once through
`on_peer_liveness(peer, reachable)`.

Faults. With a `FaultInjector` (only when the node runs with the chaos flag) every outgoing
frame gets a fate (drop, duplicate, delay, hold back to reorder) and every incoming frame may
be blocked; without one the path is a single `is None` test per frame.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
import ssl
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields

from raftlog.config import TransportConfig
from raftlog.errors import FrameError, HandshakeError, TransportError
from raftlog.raft.types import Message
from raftlog.rpc.codec import (
    FrameKind,
    Hello,
    Item,
    decode_messages,
    encode_hello,
    encode_message_parts,
    item_size_bytes,
)
from raftlog.rpc.faults import FaultInjector, FrameFate
from raftlog.rpc.out_frame import (
    FRAME_OVERHEAD_BYTES,
    HEARTBEAT_FRAME,
    WRITE_SLICE_BYTES,
    OutFrame,
)
from raftlog.rpc.peer_connection import PeerConnection
from raftlog.types import NodeId, RaftGroupId

__all__ = ["OnCallFrame", "OnMessages", "PeerTransport", "TransportCounters"]

log = logging.getLogger(__name__)

OnMessages = Callable[[NodeId, list[Item]], None]
OnPeerLiveness = Callable[[NodeId, bool], None]
# A CALL or REPLY frame's body (a view of the receive buffer: copy what is kept).
OnCallFrame = Callable[[NodeId, FrameKind, memoryview], None]
Address = tuple[str, int]


@dataclass(slots=True)
class TransportCounters:
    """Totals since start; `PeerTransport.counters()` hands out copies."""

    frames_sent: int = 0
    bytes_sent: int = 0
    messages_sent: int = 0
    frames_received: int = 0
    bytes_received: int = 0
    messages_received: int = 0
    messages_dropped_queue_full: int = 0
    messages_dropped_peer_down: int = 0
    messages_dropped_unknown_peer: int = 0
    frames_dropped_disconnected: int = 0
    frames_dropped_fault: int = 0
    frames_blocked_incoming: int = 0
    connects: int = 0
    connect_failures: int = 0
    handshakes_refused: int = 0
    frame_errors: int = 0
    heartbeats_sent: int = 0
    call_frames_sent: int = 0  # CALL and REPLY frames queued
    call_frames_received: int = 0
    peers_unreachable: int = 0  # reachable -> unreachable transitions


class _Phase(enum.Enum):
    CONNECTING = "connecting"  # queue: the first attempt or a retry is under way
    CONNECTED = "connected"
    DOWN = "down"  # backing off after a failure: drop at once


class _Peer:
    """Outbound state for one peer node."""

    __slots__ = (
        "address",
        "connected",
        "connection",
        "flush_scheduled",
        "frame_sent_bytes",
        "frames",
        "held",
        "node_id",
        "pending",
        "pending_bytes",
        "phase",
        "queued_bytes",
        "redial",
        "removed",
        "space",
        "task",
    )

    def __init__(self, node_id: NodeId, address: Address) -> None:
        self.node_id = node_id
        self.address = address
        self.phase = _Phase.CONNECTING
        self.connection: PeerConnection | None = None
        self.pending: list[Item] = []
        self.pending_bytes = 0
        self.frames: deque[OutFrame] = deque()
        self.frame_sent_bytes = 0  # how much of frames[0] the socket already has
        self.queued_bytes = 0  # pending + frames + frames delayed or held by faults
        self.flush_scheduled = False
        self.held: OutFrame | None = None  # a frame held back to be reordered
        self.connected = asyncio.Event()
        self.space = asyncio.Event()  # set whenever queued_bytes goes down
        # Set when the peer's own HELLO arrives while we back off: it is up, dial it now.
        self.redial = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.removed = False


class PeerTransport:
    """One node's end of the node-to-node transport. See the module docstring."""

    def __init__(
        self,
        *,
        node_id: NodeId,
        cluster_id: str,
        config: TransportConfig,
        on_messages: OnMessages,
        ssl_server: ssl.SSLContext | None = None,
        ssl_client: ssl.SSLContext | None = None,
        faults: FaultInjector | None = None,
        rng: random.Random | None = None,
        incarnation: int = 0,
        on_peer_restart: Callable[[NodeId], None] | None = None,
        on_peer_liveness: OnPeerLiveness | None = None,
        on_call_frame: OnCallFrame | None = None,
        on_peer_disconnected: Callable[[NodeId], None] | None = None,
    ) -> None:
        self.node_id = node_id
        self.config = config.validate()
        self._hello = encode_hello(Hello(cluster_id, node_id, incarnation=incarnation))
        self._on_peer_restart = on_peer_restart
        self._peer_incarnations: dict[NodeId, int] = {}
        self.cluster_id = cluster_id
        self._on_messages = on_messages
        self._ssl_server = ssl_server
        self._ssl_client = ssl_client
        self._faults = faults
        self._rng = rng if rng is not None else random.Random()
        self._peers: dict[NodeId, _Peer] = {}
        self._inbound: dict[NodeId, PeerConnection] = {}
        self._connections: set[PeerConnection] = set()
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._counters = TransportCounters()
        self._on_peer_liveness = on_peer_liveness
        self._on_call_frame = on_call_frame
        self._on_peer_disconnected = on_peer_disconnected
        self._heard_at: dict[NodeId, float] = {}  # loop time of the last frame from a peer
        self._reachable: set[NodeId] = set()
        self._liveness_task: asyncio.Task[None] | None = None

    # --- lifecycle ---

    async def start(self, host: str, port: int) -> Address:
        """Listen for peers; returns the bound (host, port) (port 0 picks a free one)."""
        assert self._server is None and not self._closed, "start() is called once"
        self._loop = asyncio.get_running_loop()
        self._server = await self._loop.create_server(
            lambda: PeerConnection(self, expected=None), host, port, ssl=self._ssl_server
        )
        bound = self._server.sockets[0].getsockname()
        self._liveness_task = self._loop.create_task(self._liveness_loop())
        self._liveness_task.add_done_callback(self._on_connect_loop_done)
        return (bound[0], bound[1])

    async def close(self) -> None:
        """Stop listening, drop every connection and queue; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._liveness_task is not None:
            self._liveness_task.cancel()
        for peer in list(self._peers.values()):
            self._remove_peer(peer)
        for connection in list(self._connections):
            connection.abort()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        tasks = [peer.task for peer in self._peers.values() if peer.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)
        self._peers.clear()

    def update_peers(self, peers: Mapping[NodeId, Address]) -> None:
        """Make the peer set exactly `peers` (this node excluded); changed addresses redial."""
        assert self._loop is not None and not self._closed, "update_peers() between start and close"
        assert self.node_id not in peers, f"node {self.node_id} is not its own peer"
        for node_id, peer in list(self._peers.items()):
            if peers.get(node_id) != peer.address:
                # A moved peer keeps its inbound connection: its identity was checked by HELLO.
                self._remove_peer(peer, keep_inbound=node_id in peers)
                del self._peers[node_id]
        for node_id, address in peers.items():
            if node_id not in self._peers:
                peer = _Peer(node_id, address)
                peer.task = self._loop.create_task(self._connect_loop(peer))
                peer.task.add_done_callback(self._on_connect_loop_done)
                self._peers[node_id] = peer
        assert set(self._peers) == set(peers)

    def _on_connect_loop_done(self, task: asyncio.Task[None]) -> None:
        # The loop only ends by cancellation; anything else is a bug the node must not hide.
        if not task.cancelled() and task.exception() is not None:
            assert self._loop is not None
            self._loop.call_exception_handler(
                {
                    "message": f"node {self.node_id}: connect loop failed",
                    "task": task,
                    "exception": task.exception(),
                }
            )

    def _remove_peer(self, peer: _Peer, *, keep_inbound: bool = False) -> None:
        peer.removed = True
        if not keep_inbound:
            self._set_reachable(peer.node_id, reachable=False)
        if peer.task is not None:
            peer.task.cancel()
        if peer.connection is not None:
            peer.connection.abort()
        inbound = None if keep_inbound else self._inbound.pop(peer.node_id, None)
        if inbound is not None:
            inbound.abort()
        self._discard_queue(peer)

    # --- sending ---

    def send(self, peer: NodeId, group: RaftGroupId, message: Message) -> None:
        """Queue `message` for `peer`; never blocks, drops (and counts) when it cannot queue.

        Raises FrameError for a message that could never fit in a frame: that is a bug in the
        caller's bounds (NodeConfig.validate keeps appends well below frame_bytes_max)."""
        state = self._peers.get(peer)
        if state is None:
            self._counters.messages_dropped_unknown_peer += 1
            return
        size = item_size_bytes(message)
        if size + FRAME_OVERHEAD_BYTES > self.config.frame_bytes_max:
            raise FrameError(
                f"{type(message).__name__} of {size} bytes for node {peer} cannot fit in "
                f"frame_bytes_max={self.config.frame_bytes_max}"
            )
        if state.phase is _Phase.DOWN:
            self._counters.messages_dropped_peer_down += 1
            return
        if state.queued_bytes + size > self.config.peer_queue_bytes_max:
            self._counters.messages_dropped_queue_full += 1
            return
        if (
            state.pending_bytes + size + FRAME_OVERHEAD_BYTES > self.config.frame_bytes_max
            or len(state.pending) >= self.config.frame_messages_max
        ):
            self._seal(state)
        state.pending.append((group, message))
        state.pending_bytes += size
        state.queued_bytes += size
        if state.pending_bytes >= self.config.frame_bytes_target:
            self._seal(state)
        elif not state.flush_scheduled:
            state.flush_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._flush, state)

    def flush_now(self) -> None:
        """Seal every peer's pending messages into frames and hand them to the sockets now,
        not at the loop's next turn (`_flush`, scheduled by `send`; it then finds nothing).

        The group host calls this before it blocks the loop in an fsync: the appends a
        leader's pass just sent reach the followers while the leader's own write syncs
        (Raft thesis §10.2.1), instead of after it."""
        for peer in self._peers.values():
            if peer.pending and not peer.removed:
                self._seal(peer)

    def send_call_frame(self, peer: NodeId, frame: bytes) -> bool:
        """Queue one CALL or REPLY frame (header included) for `peer`, ahead of its queued
        Raft traffic; False when it was dropped (and counted) instead."""
        state = self._peers.get(peer)
        if state is None:
            self._counters.messages_dropped_unknown_peer += 1
            return False
        if len(frame) > self.config.frame_bytes_max:
            raise FrameError(
                f"call frame of {len(frame)} bytes for node {peer} exceeds "
                f"frame_bytes_max={self.config.frame_bytes_max}"
            )
        if state.phase is _Phase.DOWN:
            self._counters.messages_dropped_peer_down += 1
            return False
        if state.queued_bytes + len(frame) > self.config.peer_queue_bytes_max:
            self._counters.messages_dropped_queue_full += 1
            return False
        state.queued_bytes += len(frame)
        self._counters.call_frames_sent += 1
        out = OutFrame((frame,))
        if self._faults is None or not self._faults.active:
            self._enqueue(state, out, first=True)
        else:
            self._route_with_faults(state, out, self._faults.outgoing(peer), first=True)
        return True

    def _flush(self, peer: _Peer) -> None:
        peer.flush_scheduled = False
        if peer.pending and not peer.removed:
            self._seal(peer)

    def _seal(self, peer: _Peer) -> None:
        """Encode everything pending for `peer` into one frame and route it."""
        assert peer.pending, "sealing an empty frame"
        frame = OutFrame(encode_message_parts(peer.pending, size_bytes=peer.pending_bytes))
        peer.queued_bytes += FRAME_OVERHEAD_BYTES
        self._counters.messages_sent += len(peer.pending)
        peer.pending = []
        peer.pending_bytes = 0
        if self._faults is None or not self._faults.active:
            self._enqueue(peer, frame)
        else:
            self._route_with_faults(peer, frame, self._faults.outgoing(peer.node_id))

    def _enqueue(self, peer: _Peer, frame: OutFrame, *, first: bool = False) -> None:
        if peer.removed or peer.phase is _Phase.DOWN:
            self._release(peer, len(frame))
            self._counters.frames_dropped_disconnected += 1
            return
        if first:
            # Behind the frame the socket already has part of, if any; a reordered frame
            # (faults) still follows the next ordinary frame.
            peer.frames.insert(1 if peer.frame_sent_bytes else 0, frame)
            self._pump(peer)
            return
        peer.frames.append(frame)
        if peer.held is not None:  # a reordered frame goes right after this one
            peer.frames.append(peer.held)
            peer.held = None
        self._pump(peer)

    def _pump(self, peer: _Peer) -> None:
        """Hand queued frames to the socket while its write buffer has room."""
        connection = peer.connection
        if connection is None or peer.phase is not _Phase.CONNECTED:
            return
        while peer.frames and connection.writable():
            # Large frames go in slices: asyncio (3.11) keeps unsent bytes in one bytearray
            # and shifts it after every send, so a huge write costs quadratic memmoves.
            frame = peer.frames[0]
            chunk = frame.chunk(peer.frame_sent_bytes, WRITE_SLICE_BYTES)
            connection.write(chunk)
            peer.frame_sent_bytes += len(chunk)
            if peer.frame_sent_bytes == len(frame):
                peer.frames.popleft()
                peer.frame_sent_bytes = 0
                self._release(peer, len(frame))
                self._counters.frames_sent += 1
                self._counters.bytes_sent += len(frame)

    def _release(self, peer: _Peer, size_bytes: int) -> None:
        peer.queued_bytes -= size_bytes
        assert peer.queued_bytes >= 0, (peer.node_id, peer.queued_bytes)
        peer.space.set()

    def _discard_queue(self, peer: _Peer) -> None:
        """Forget framed traffic for a peer whose connection broke: it would arrive stale."""
        self._counters.frames_dropped_disconnected += len(peer.frames)
        for frame in peer.frames:
            self._release(peer, len(frame))
        peer.frames.clear()
        peer.frame_sent_bytes = 0  # a half-sent frame is never resumed on a new connection
        if peer.held is not None:
            self._release(peer, len(peer.held))
            peer.held = None

    # --- faults (only with a FaultInjector) ---

    def _route_with_faults(
        self, peer: _Peer, frame: OutFrame, fate: FrameFate, *, first: bool = False
    ) -> None:
        if fate.copies == 0:
            self._release(peer, len(frame))
            self._counters.frames_dropped_fault += 1
            return
        if fate.copies == 2:
            peer.queued_bytes += len(frame)  # the duplicate is the same immutable bytes
        assert self._loop is not None
        for _ in range(fate.copies):
            if fate.delay_s > 0:
                self._loop.call_later(fate.delay_s, lambda: self._enqueue(peer, frame, first=first))
            elif fate.hold_back_s is not None and peer.held is None and not first:
                peer.held = frame
                self._loop.call_later(fate.hold_back_s, self._release_held, peer, frame)
            else:
                self._enqueue(peer, frame, first=first)

    def _release_held(self, peer: _Peer, frame: OutFrame) -> None:
        # No later frame came within the reorder window: send the held one anyway.
        if peer.held is frame:
            peer.held = None
            self._enqueue(peer, frame)

    # --- connecting ---

    async def _connect_loop(self, peer: _Peer) -> None:
        failures = 0
        while not peer.removed:
            peer.phase = _Phase.CONNECTING
            try:
                connection = await self._dial(peer)
            except (TimeoutError, OSError, TransportError) as error:
                self._counters.connect_failures += 1
                failures += 1
                log.debug("node %s: dialing node %s failed: %s", self.node_id, peer.node_id, error)
            else:
                failures = 0
                await self._run_connection(peer, connection)
            peer.phase = _Phase.DOWN
            self._discard_queue(peer)
            if await self._back_off(peer, self._backoff_s(failures)):
                failures = 0

    async def _back_off(self, peer: _Peer, backoff_s: float) -> bool:
        """Wait `backoff_s` before the next dial, or less if the peer's HELLO arrives
        meanwhile (returns True then): a restarted node dials us first, and making it wait
        out our backoff (up to reconnect_backoff_ms_max) would delay everything we send it,
        such as the metadata it needs to catch up."""
        peer.redial.clear()
        try:
            await asyncio.wait_for(peer.redial.wait(), backoff_s)
        except TimeoutError:
            return False
        return True

    async def _dial(self, peer: _Peer) -> PeerConnection:
        assert self._loop is not None
        host, port = peer.address
        server_hostname = host if self._ssl_client is not None else None
        connect = self._loop.create_connection(
            lambda: PeerConnection(self, expected=peer.node_id),
            host,
            port,
            ssl=self._ssl_client,
            server_hostname=server_hostname,
        )
        config = self.config
        _, connection = await asyncio.wait_for(connect, config.connect_timeout_ms / 1000)
        try:
            await asyncio.wait_for(connection.hello_done, config.hello_timeout_ms / 1000)
        except BaseException:
            connection.abort()
            raise
        return connection

    async def _run_connection(self, peer: _Peer, connection: PeerConnection) -> None:
        self._counters.connects += 1
        peer.connection = connection
        peer.phase = _Phase.CONNECTED
        peer.connected.set()
        try:
            self._pump(peer)
            await connection.closed
        finally:
            peer.connection = None
            peer.connected.clear()

    def _backoff_s(self, failures: int) -> float:
        low, high = self.config.reconnect_backoff_ms_min, self.config.reconnect_backoff_ms_max
        ceiling_ms: int = min(high, low << min(failures, 30))
        # Jitter in [ceiling/2, ceiling] so restarted peers do not redial in lockstep.
        backoff_s = ceiling_ms * (0.5 + self._rng.random() / 2) / 1000
        assert 0 < backoff_s <= high / 1000, backoff_s
        return backoff_s

    # --- receiving (called by PeerConnection) ---

    def _check_hello(self, connection: PeerConnection, hello: Hello) -> None:
        if hello.cluster_id != self.cluster_id:
            raise HandshakeError(
                f"node {hello.node_id} is in cluster {hello.cluster_id!r}, "
                f"this node in {self.cluster_id!r}"
            )
        expected = connection.expected
        if expected is not None and hello.node_id != expected:
            raise HandshakeError(f"dialed node {expected} but node {hello.node_id} answered")
        if expected is None and (hello.node_id not in self._peers or hello.node_id == self.node_id):
            raise HandshakeError(f"node {hello.node_id} is not a known peer of node {self.node_id}")
        previous = self._peer_incarnations.get(hello.node_id)
        self._peer_incarnations[hello.node_id] = hello.incarnation
        if previous is not None and previous != hello.incarnation and self._on_peer_restart:
            self._on_peer_restart(hello.node_id)

    def _accept_inbound(self, connection: PeerConnection, node_id: NodeId) -> None:
        older = self._inbound.get(node_id)
        if older is not None and older is not connection:
            older.abort()  # the peer redialed: its old connection is dead or half-open
        self._inbound[node_id] = connection
        peer = self._peers.get(node_id)
        if peer is not None and peer.phase is _Phase.DOWN:
            peer.redial.set()  # it is up again: cut our backoff toward it short

    def _admit(self, sender: NodeId, frame_bytes: int) -> bool:
        """Count a received frame; whether to read it (a chaos fault may block it)."""
        self._counters.frames_received += 1
        self._counters.bytes_received += frame_bytes
        faults = self._faults
        if faults is not None and faults.active and not faults.allow_incoming(sender):
            self._counters.frames_blocked_incoming += 1
            return False
        return True

    def _deliver(self, sender: NodeId, body: memoryview, frame_bytes: int) -> None:
        if not self._admit(sender, frame_bytes):
            return
        items = decode_messages(body, messages_max=self.config.frame_messages_max)
        for _, message in items:
            if message.sender != sender or message.receiver != self.node_id:
                raise FrameError(
                    f"{type(message).__name__} from node {message.sender} to node "
                    f"{message.receiver} arrived from node {sender} at node {self.node_id}"
                )
        self._heard(sender)
        if not items:
            return  # a node-pair heartbeat
        self._counters.messages_received += len(items)
        self._on_messages(sender, items)

    def _deliver_call_frame(
        self, sender: NodeId, kind: FrameKind, body: memoryview, frame_bytes: int
    ) -> None:
        if not self._admit(sender, frame_bytes):
            return
        if self._on_call_frame is None:
            raise FrameError(f"{kind.name} frame from node {sender}: this node takes no calls")
        self._heard(sender)
        self._counters.call_frames_received += 1
        self._on_call_frame(sender, kind, body)

    def _heard(self, sender: NodeId) -> None:
        self._heard_at[sender] = asyncio.get_running_loop().time()
        if sender not in self._reachable:
            self._set_reachable(sender, reachable=True)

    def _forget(self, connection: PeerConnection) -> None:
        self._connections.discard(connection)
        if connection.peer_id is not None and self._inbound.get(connection.peer_id) is connection:
            del self._inbound[connection.peer_id]
            # The peer's own connection closed: its process died or the link broke.
            self._set_reachable(connection.peer_id, reachable=False)
            if self._on_peer_disconnected is not None:
                self._on_peer_disconnected(connection.peer_id)

    # --- node liveness ---

    async def _liveness_loop(self) -> None:
        assert self._loop is not None
        interval_s = self.config.node_heartbeat_interval_ms / 1000
        while not self._closed:
            started = self._loop.time()
            await asyncio.sleep(interval_s)
            # While this loop was stalled (a long pass, a GC pause) nothing could be read:
            # that time does not count against peers, or every stall would report them all
            # unreachable and wake every quiesced group.
            stalled_s = self._loop.time() - started - interval_s
            if stalled_s > interval_s:
                for peer in self._heard_at:
                    self._heard_at[peer] += stalled_s
            self._send_heartbeats()
            self._expire_liveness()

    def _send_heartbeats(self) -> None:
        """One empty frame to each connected peer with nothing queued (traffic says it too)."""
        for peer in self._peers.values():
            if peer.phase is not _Phase.CONNECTED or peer.frames or peer.pending:
                continue
            if peer.queued_bytes + len(HEARTBEAT_FRAME) > self.config.peer_queue_bytes_max:
                continue
            peer.queued_bytes += len(HEARTBEAT_FRAME)
            self._counters.heartbeats_sent += 1
            frame = OutFrame((HEARTBEAT_FRAME,))
            if self._faults is None or not self._faults.active:
                self._enqueue(peer, frame)
            else:  # a partition must cut liveness too
                self._route_with_faults(peer, frame, self._faults.outgoing(peer.node_id))

    def _expire_liveness(self) -> None:
        assert self._loop is not None
        deadline = self._loop.time() - self.config.node_liveness_timeout_ms / 1000
        for peer in sorted(self._reachable):
            if self._heard_at.get(peer, deadline) <= deadline:
                self._set_reachable(peer, reachable=False)

    def _set_reachable(self, peer: NodeId, *, reachable: bool) -> None:
        if (peer in self._reachable) == reachable or (reachable and self._closed):
            return
        if reachable:
            self._reachable.add(peer)
        else:
            self._reachable.discard(peer)
            self._heard_at.pop(peer, None)
            self._counters.peers_unreachable += 1
        log.debug("node %s: peer %s reachable=%s", self.node_id, peer, reachable)
        if self._on_peer_liveness is not None:
            self._on_peer_liveness(peer, reachable)

    def is_reachable(self, peer: NodeId) -> bool:
        """Whether a frame of `peer` arrived within the liveness timeout (node liveness)."""
        return peer in self._reachable

    # --- observation ---

    def counters(self) -> TransportCounters:
        values = {f.name: getattr(self._counters, f.name) for f in fields(TransportCounters)}
        return TransportCounters(**values)

    def is_connected(self, peer: NodeId) -> bool:
        state = self._peers.get(peer)
        return state is not None and state.phase is _Phase.CONNECTED

    async def wait_connected(self, peer: NodeId) -> None:
        """Wait until the outbound connection to `peer` has exchanged HELLOs."""
        await self._peers[peer].connected.wait()

    def queued_bytes(self, peer: NodeId) -> int:
        return self._peers[peer].queued_bytes

    async def wait_queue_below(self, peer: NodeId, size_bytes: int) -> None:
        """Wait until fewer than `size_bytes` are queued for `peer` (for bulk senders that
        prefer to pace themselves rather than have messages dropped)."""
        state = self._peers[peer]
        while state.queued_bytes >= size_bytes and not state.removed:
            state.space.clear()
            await state.space.wait()
