"""One connection of the node-to-node transport (raftlog.rpc.peer_transport): the HELLO
exchange, frame parsing straight into a reusable buffer, and write flow control. The
transport owns the connections and everything they report to."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, cast

from raftlog.errors import FrameError, HandshakeError, TransportError
from raftlog.rpc.codec import FRAME_HEADER, Buffer, FrameKind, decode_frame_header, decode_hello
from raftlog.types import NodeId

if TYPE_CHECKING:
    from raftlog.rpc.peer_transport import PeerTransport

__all__ = ["PeerConnection"]

log = logging.getLogger("raftlog.rpc.peer_transport")


class PeerConnection(asyncio.BufferedProtocol):
    """One TCP (or TLS) connection: HELLO exchange, frame parsing, write flow control."""

    def __init__(self, owner: PeerTransport, *, expected: NodeId | None) -> None:
        self.owner = owner
        self.expected = expected  # the peer we dialed; None for an inbound connection
        self.peer_id: NodeId | None = None  # set once its HELLO checked out
        self.transport: asyncio.Transport | None = None
        self.paused = False  # the socket's write buffer is above its high-water mark
        loop = asyncio.get_running_loop()
        self.hello_done: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        size = owner.config.receive_buffer_bytes
        self.buffer = bytearray(size)
        self.view = memoryview(self.buffer)
        self.start = 0  # buffer[start:filled] holds bytes received and not yet parsed
        self.filled = 0
        self.large: memoryview | None = None  # a frame bigger than the buffer, filled in place
        self.large_kind = FrameKind.MESSAGES
        self.large_filled = 0
        # The last large frame's buffer, reused for the next one that fits: a follower takes
        # 1 MiB appends one after another, and a fresh bytearray costs a zero-fill and page
        # faults each time. Kept only up to twice the frame size senders aim for.
        self.large_spare: bytearray | None = None
        self.large_spare_bytes_max = 2 * owner.config.frame_bytes_target

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport; not checked with isinstance: uvloop's implement
        # asyncio.Transport's interface without subclassing it.
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        self.owner._connections.add(self)
        transport.set_write_buffer_limits(high=self.owner.config.write_buffer_bytes_max)
        if self.expected is not None:
            # The dialer speaks first; the listener answers only a HELLO it accepts, so a
            # refused dialer never believes it is connected.
            transport.write(self.owner._hello)
        else:
            # A stranger that connects and never says HELLO does not get to hold a socket.
            timeout_s = self.owner.config.hello_timeout_ms / 1000
            asyncio.get_running_loop().call_later(timeout_s, self.abort_without_hello)

    def abort_without_hello(self) -> None:
        if self.peer_id is None and self.transport is not None:
            self.owner._counters.handshakes_refused += 1
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner._forget(self)
        if not self.hello_done.done():
            self.hello_done.set_exception(TransportError(f"connection lost before HELLO: {exc}"))
            self.hello_done.exception()  # retrieved here so an unawaited future stays quiet
        if not self.closed.done():
            self.closed.set_result(None)

    def writable(self) -> bool:
        # is_closing() turns True at once when a send fails, before connection_lost runs.
        transport = self.transport
        return not self.paused and transport is not None and not transport.is_closing()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        peer = self.owner._peers.get(self.expected) if self.expected is not None else None
        if peer is not None and peer.connection is self:
            self.owner._pump(peer)

    def write(self, frame: Buffer) -> None:
        assert self.transport is not None and self.peer_id is not None
        self.transport.write(frame)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # --- reading: frames are parsed out of `buffer`; large ones land in their own buffer ---

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.large is not None:
            return self.large[self.large_filled :]
        return self.view[self.filled :]

    def buffer_updated(self, nbytes: int) -> None:
        try:
            if self.large is not None:
                self.large_filled += nbytes
                if self.large_filled == len(self.large):
                    large, self.large = self.large, None
                    # Decoding copies what it keeps out of the frame: the buffer is free after.
                    self.on_frame(self.large_kind, large)
                return
            self.filled += nbytes
            self.parse()
        except TransportError as error:
            self.fail(error)

    def parse(self) -> None:
        """Deliver every complete frame in buffer[start:filled]. A partial frame stays where
        it is while the rest of it fits behind it; it moves to the front only when it would
        not, and a frame larger than the whole buffer moves into a buffer of its own."""
        start, header_bytes = self.start, FRAME_HEADER.size
        frame_bytes_max = self.owner.config.frame_bytes_max
        needed_bytes = header_bytes  # to make progress from `start`
        while self.filled - start >= header_bytes and self.transport is not None:
            header = self.view[start : start + header_bytes]
            kind, length = decode_frame_header(header, frame_bytes_max=frame_bytes_max)
            body_start = start + header_bytes
            if self.filled - body_start >= length:
                self.on_frame(kind, self.view[body_start : body_start + length])
                start = body_start + length
                continue
            needed_bytes = header_bytes + length
            if needed_bytes > len(self.buffer):
                # Too big for the shared buffer: its own buffer, filled by the kernel directly.
                self.large = self._large_buffer(length)
                self.large_kind = kind
                self.large_filled = self.filled - body_start
                self.large[: self.large_filled] = self.view[body_start : self.filled]
                start, needed_bytes = self.filled, header_bytes
            break
        if start == self.filled:
            start = self.filled = 0
        elif start + needed_bytes > len(self.buffer):
            remaining = self.filled - start
            self.buffer[:remaining] = self.view[start : self.filled]
            start, self.filled = 0, remaining
        self.start = start
        assert 0 <= self.start <= self.filled < len(self.buffer), (self.start, self.filled)

    def _large_buffer(self, length: int) -> memoryview:
        """A buffer of exactly `length` bytes for one large frame (the spare if it fits)."""
        spare = self.large_spare
        if spare is None or len(spare) < length:
            spare = bytearray(length)
            self.large_spare = spare if length <= self.large_spare_bytes_max else None
        return memoryview(spare)[:length]

    def on_frame(self, kind: FrameKind, body: memoryview) -> None:
        if self.peer_id is None:
            self.on_hello(kind, body)
        elif kind is FrameKind.HELLO or self.expected is not None:
            # Peers send everything but HELLO only over connections they dialed.
            raise FrameError(f"unexpected {kind.name} frame from node {self.peer_id}")
        elif kind is FrameKind.MESSAGES:
            self.owner._deliver(self.peer_id, body, FRAME_HEADER.size + len(body))
        else:
            self.owner._deliver_call_frame(self.peer_id, kind, body, FRAME_HEADER.size + len(body))

    def on_hello(self, kind: FrameKind, body: memoryview) -> None:
        if kind is not FrameKind.HELLO:
            raise HandshakeError(f"{kind.name} frame before HELLO")
        hello = decode_hello(body)
        self.owner._check_hello(self, hello)
        self.peer_id = hello.node_id
        if self.expected is None:
            self.owner._accept_inbound(self, hello.node_id)
            assert self.transport is not None
            self.transport.write(self.owner._hello)
        if not self.hello_done.done():
            self.hello_done.set_result(None)

    def fail(self, error: TransportError) -> None:
        counters = self.owner._counters
        if isinstance(error, HandshakeError):
            counters.handshakes_refused += 1
        else:
            counters.frame_errors += 1
        log.warning("node %s: closing connection: %s", self.owner.node_id, error)
        if not self.hello_done.done():
            self.hello_done.set_exception(error)
            self.hello_done.exception()
        self.abort()
