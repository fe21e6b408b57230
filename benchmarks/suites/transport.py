"""Benchmark: which byte path carries node-to-node Raft traffic.

Theory of operation. A receiver process (this file run with `--serve LOOP DIR`) listens with
every candidate at once; this process is the sender. Both sides run one event loop each in
separate processes, so neither candidate shares a GIL with its peer. For each candidate and
message size the sender moves `volume_bytes`, then the receiver answers with the byte count
it received, and the clock stops when that answer arrives (so bytes still in kernel buffers
are not counted as moved). Every candidate runs on asyncio's default loop and on uvloop (a
receiver process per kind, the sender on a fresh loop of the same kind each round).

Candidates that send the same seeded random payloads from memory, one message each:
- `grpc`: a grpc.aio bidirectional stream of raw bytes messages (no protobuf: identity
  serializers, so only gRPC's own framing and HTTP/2 flow control are measured);
- `tcp`: [u32 length][payload] frames over asyncio streams (`writelines`, `readexactly`);
- `tcpbuf`: the same frames, sent through a `Protocol` that honours pause/resume_writing and
  received by a `BufferedProtocol` that reads large frames straight into their own buffer;
- `raft_append`: raftlog's own codec and `PeerTransport`, AppendRequests of 1 MiB made of
  1 KiB entries (and, for comparison, 16 KiB entries), counting entry data bytes at the
  receiver's `on_messages`, on both loops.

Candidates that move the leader's log (`LeaderLog`: 16 KiB RecordBatches written by
`SegmentedLog` into a real segment file), in spans of whole batches of at most the message
size, to a follower (`FollowerReceiver`) that reads them into a preallocated buffer and
writes them to its own file (page cache, no fsync) as it would append them:
- `push_read`: the leader preads each span into Python (as building AppendEntries from the
  log does) and writes [u32 length][span] through a flow-controlled transport, streaming;
- `pull_sendfile`: the follower sends FETCH(offset, max bytes) when it has written the
  previous span; the leader answers with a 12-byte header and `os.sendfile` from the
  segment on a non-blocking socket, so payload bytes never enter Python on the sender;
- `pull_read`: the same pull protocol with pread + sendmsg instead of sendfile, which tells
  the pull protocol's cost from sendfile's gain.

Contract with benchmarks/run.py: `run(out_dir, *, quick) -> dict[str, float]`. Running the file
directly prints the metrics as JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import json
import os
import pathlib
import random
import resource
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import TypeVar, cast

import grpc
import grpc.aio

from raftlog.config import LogConfig, TransportConfig
from raftlog.rpc.peer_transport import WRITE_SLICE_BYTES
from raftlog.storage.log import SegmentedLog
from raftlog.storage.records import RecordInput, encode_batch

sys.path[:0] = [str(pathlib.Path(__file__).resolve().parent)]
from _transport_raft import (  # noqa: E402 (found through the path set just above)
    KIB,
    MIB,
    SEED,
    SENDER,
    payloads,
    send_raft_append,
    serve_raft_append,
)

T = TypeVar("T")
GRPC_METHOD = "/raftlog.bench.Transport/Stream"
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", 8 * MIB),
    ("grpc.max_receive_message_length", 8 * MIB),
]
LENGTH = struct.Struct("!I")
END_MARKER = 0  # a zero-length frame ends a run


# --- receiver side ----------------------------------------------------------------------------


async def grpc_stream_handler(
    request_iterator: grpc.aio.ServicerContext, context: grpc.aio.ServicerContext
) -> object:
    del context
    total = 0
    async for message in request_iterator:  # type: ignore[attr-defined]
        total += len(message)
    yield total.to_bytes(8, "big")


async def tcp_stream_handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    total = 0
    with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
        while True:
            (length,) = LENGTH.unpack(await reader.readexactly(4))
            if length == END_MARKER:
                writer.write(total.to_bytes(8, "big"))
                await writer.drain()
                total = 0
                continue
            total += len(await reader.readexactly(length))
    writer.close()


class BufferedReceiver(asyncio.BufferedProtocol):
    """Small frames are parsed out of one reusable buffer; a frame larger than what is left
    of it gets a buffer of its own that the kernel fills directly (no copy after recv)."""

    chunk_bytes = 256 * KIB

    def __init__(self) -> None:
        self.buffer = bytearray(self.chunk_bytes)
        self.view = memoryview(self.buffer)
        self.start = 0
        self.filled = 0
        self.large: bytearray | None = None
        self.large_filled = 0
        self.total = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.large is not None:
            return memoryview(self.large)[self.large_filled :]
        return self.view[self.filled :]

    def buffer_updated(self, nbytes: int) -> None:
        if self.large is not None:
            self.large_filled += nbytes
            if self.large_filled == len(self.large):
                self.on_frame(memoryview(self.large))
                self.large = None
            return
        self.filled += nbytes
        self.parse()

    def parse(self) -> None:
        # The same discipline as PeerTransport's receiver: a partial frame stays in place
        # while the rest of it fits behind it, so mid-sized frames are never shifted.
        start, needed = self.start, 4
        while self.filled - start >= 4:
            (length,) = LENGTH.unpack_from(self.buffer, start)
            if self.filled - start - 4 >= length:
                self.on_frame(self.view[start + 4 : start + 4 + length])
                start += 4 + length
                continue
            needed = 4 + length
            if needed > self.chunk_bytes:
                # Too big for the shared buffer: move the head into its own buffer.
                self.large = bytearray(length)
                head = self.filled - start - 4
                self.large[:head] = self.view[start + 4 : self.filled]
                self.large_filled = head
                start, needed = self.filled, 4
            break
        if start == self.filled:
            start = self.filled = 0
        elif start + needed > self.chunk_bytes:
            remaining = self.filled - start
            self.buffer[:remaining] = self.view[start : self.filled]
            start, self.filled = 0, remaining
        self.start = start

    def on_frame(self, frame: memoryview) -> None:
        if len(frame) == 0:
            assert self.transport is not None
            self.transport.write(self.total.to_bytes(8, "big"))
            self.total = 0
        self.total += len(frame)


async def serve(directory: pathlib.Path) -> None:
    loop = asyncio.get_running_loop()
    server = grpc.aio.server(options=GRPC_OPTIONS)
    handler = grpc.stream_stream_rpc_method_handler(grpc_stream_handler)  # type: ignore[arg-type]
    service = grpc.method_handlers_generic_handler("raftlog.bench.Transport", {"Stream": handler})
    server.add_generic_rpc_handlers((service,))
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    tcp = await asyncio.start_server(tcp_stream_handler, "127.0.0.1", 0, limit=STREAM_LIMIT_BYTES)
    tcpbuf = await loop.create_server(BufferedReceiver, "127.0.0.1", 0)
    raft, receiver = await serve_raft_append()
    followers = {
        name: await loop.create_server(
            functools.partial(FollowerReceiver, directory, name, pull=name.startswith("pull")),
            "127.0.0.1",
            0,
        )
        for name in FILE_SENDERS
    }
    ports = {
        "grpc": grpc_port,
        "tcp": tcp.sockets[0].getsockname()[1],
        "tcpbuf": tcpbuf.sockets[0].getsockname()[1],
        "raft_append": raft,
        **{name: server.sockets[0].getsockname()[1] for name, server in followers.items()},
    }
    print(json.dumps(ports), flush=True)
    # Serve until the parent closes our stdin; a line "peer PORT" names the raft sender.
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        receiver.update_peers({SENDER: ("127.0.0.1", int(line.split()[1]))})
    await receiver.close()
    await server.stop(None)


# --- sender side ------------------------------------------------------------------------------


async def send_grpc(port: int, messages: list[bytes], volume_bytes: int) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS) as channel:
        stream = channel.stream_stream(GRPC_METHOD)
        call = stream()
        sent = 0
        while sent < volume_bytes:
            message = messages[(sent // len(messages[0])) % len(messages)]
            await call.write(message)
            sent += len(message)
        await call.done_writing()
        answer = await call.read()
        assert isinstance(answer, bytes)
        return int.from_bytes(answer, "big")


async def send_tcp(port: int, messages: list[bytes], volume_bytes: int) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=STREAM_LIMIT_BYTES)
    header = LENGTH.pack(len(messages[0]))
    sent = 0
    while sent < volume_bytes:
        message = messages[(sent // len(messages[0])) % len(messages)]
        writer.writelines([header, message])
        await writer.drain()
        sent += len(message)
    writer.write(LENGTH.pack(END_MARKER))
    answer = await reader.readexactly(8)
    writer.close()
    return int.from_bytes(answer, "big")


class FlowControlledSender(asyncio.Protocol):
    def __init__(self) -> None:
        self.writable = asyncio.Event()
        self.writable.set()
        self.answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def data_received(self, data: bytes) -> None:
        self.answer.set_result(data)


async def send_tcpbuf(port: int, messages: list[bytes], volume_bytes: int) -> int:
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_connection(FlowControlledSender, "127.0.0.1", port)
    header = LENGTH.pack(len(messages[0]))
    sent = 0
    while sent < volume_bytes:
        if not protocol.writable.is_set():
            await protocol.writable.wait()
        message = messages[(sent // len(messages[0])) % len(messages)]
        transport.writelines([header, message])
        sent += len(message)
    transport.write(LENGTH.pack(END_MARKER))
    answer = await protocol.answer
    transport.close()
    return int.from_bytes(answer, "big")


# --- candidates that serve the leader's log file (push from Python, pull with sendfile) -------

BATCH_BYTES = 16 * KIB  # one producer batch (a linger-filled 16 KiB RecordBatch v2)
LEADER_LOG_BYTES = 32 * MIB  # the leader's segment; ranges wrap around it
FETCH = struct.Struct("!QI")  # follower -> leader: next offset wanted, max bytes
RESPONSE = struct.Struct("!IQ")  # leader -> follower: payload length, next offset
REPORT = struct.Struct("!Q")  # follower -> leader after an empty response: bytes it wrote
FETCH_BYTES_MAX = 1 * MIB  # what the follower asks for (Kafka's replica.fetch.max.bytes)
FOLLOWER_BUFFER_BYTES = 8 * MIB  # the follower's preallocated receive buffer
FOLLOWER_FILE_WINDOW_BYTES = 64 * MIB  # the follower's file wraps here: bounded disk use


class LeaderLog:
    """The leader's side of the file candidates: seeded random 16 KiB batches written by
    `SegmentedLog` into a real segment file and flushed, plus the position of every batch
    (what the segment's offset index gives the real leader). Offsets are virtual and wrap
    around the segment so any volume can be moved; a range never wraps (one file span)."""

    def __init__(self, directory: pathlib.Path, log_bytes: int = LEADER_LOG_BYTES) -> None:
        shutil.rmtree(directory, ignore_errors=True)
        config = LogConfig(segment_bytes_max=2 * log_bytes, batch_bytes_max=2 * BATCH_BYTES)
        log = SegmentedLog.open(directory, config=config)
        rng = random.Random(SEED)
        value_bytes = BATCH_BYTES - batch_overhead_bytes()
        for _ in range(log_bytes // BATCH_BYTES):
            record = RecordInput(key=None, value=rng.randbytes(value_bytes), timestamp_ms=0)
            log.append(encode_batch([record]), leader_epoch=1)
        log.flush()
        self.positions: list[int] = []
        offset = 0
        while offset < log.log_end_offset:
            result = log.read(offset, bytes_max=4 * MIB)
            position = result.position
            for header in result.headers:
                assert header.size_bytes == BATCH_BYTES, header
                self.positions.append(position)
                position += header.size_bytes
            offset = result.next_offset
            self.path = result.segment_path
        log.close()
        self.batch_count = len(self.positions)
        self.fd = os.open(self.path, os.O_RDONLY)

    def span(self, offset: int, bytes_max: int) -> tuple[int, int, int]:
        """(file position, length, next offset) of the whole batches from `offset` that fit
        in `bytes_max` (at least one), without crossing the end of the segment."""
        first = offset % self.batch_count
        count = max(1, min(bytes_max // BATCH_BYTES, self.batch_count - first))
        return self.positions[first], count * BATCH_BYTES, offset + count

    def close(self) -> None:
        os.close(self.fd)


def batch_overhead_bytes() -> int:
    """Bytes a one-record batch adds to its value (so a batch can be made exactly 16 KiB)."""
    probe = 10 * KIB  # long enough that the value's varint length takes two bytes, as below
    batch = encode_batch([RecordInput(key=None, value=bytes(probe), timestamp_ms=0)])
    return len(batch) - probe


class FollowerReceiver(asyncio.BufferedProtocol):
    """The follower's side of both file candidates: frames are read by the kernel straight
    into one preallocated buffer and written from it to the follower's own file (page cache,
    no fsync: the fsync is the same for every candidate). A partial frame is moved to the
    front only when the buffer's tail cannot hold it (at most one frame per 8 MiB).

    push: frames are [u32 length][batches]; an empty frame ends a run and is answered with
    the byte count. pull: the follower asks (FETCH) as soon as the previous span is written,
    so each fetch acknowledges everything before its offset, as in Kafka's KRaft."""

    def __init__(self, directory: pathlib.Path, name: str, *, pull: bool) -> None:
        self.path = directory / f"{name}.log"
        self.pull = pull
        self.header = RESPONSE if pull else LENGTH
        self.buffer = bytearray(FOLLOWER_BUFFER_BYTES)
        self.view = memoryview(self.buffer)
        self.start = self.filled = 0
        self.written = 0
        self.fd = -1
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        if self.pull:
            self.transport.write(FETCH.pack(0, FETCH_BYTES_MAX))

    def connection_lost(self, exc: Exception | None) -> None:
        os.close(self.fd)
        self.fd = -1

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view[self.filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self.filled += nbytes
        start, header_bytes = self.start, self.header.size
        needed = header_bytes
        while self.filled - start >= header_bytes:
            fields = self.header.unpack_from(self.buffer, start)
            length = fields[0]
            if self.filled - start - header_bytes < length:
                needed = header_bytes + length
                break
            body = self.view[start + header_bytes : start + header_bytes + length]
            start += header_bytes + length
            self.on_frame(body, fields)
        if start == self.filled:
            start = self.filled = 0
        elif start + needed > FOLLOWER_BUFFER_BYTES:
            remaining = self.filled - start
            self.buffer[:remaining] = self.view[start : self.filled]
            start, self.filled = 0, remaining
        self.start = start

    def on_frame(self, body: memoryview, fields: tuple[int, ...]) -> None:
        assert self.transport is not None
        if not body:  # the end of a run
            self.transport.write(REPORT.pack(self.written))
            self.written = 0
            return
        os.pwrite(self.fd, body, self.written % FOLLOWER_FILE_WINDOW_BYTES)
        self.written += len(body)
        if self.pull:
            self.transport.write(FETCH.pack(fields[1], FETCH_BYTES_MAX))


async def send_push_file(port: int, leader: LeaderLog, span_bytes: int, volume_bytes: int) -> int:
    """push+read: the leader reads each span of batches from its segment into Python (one
    pread, as building AppendEntries from the log does) and writes [u32 length][span]
    through a flow-controlled transport, without waiting for the follower."""
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_connection(FlowControlledSender, "127.0.0.1", port)
    # PeerTransport's write discipline: a 4 MiB high-water mark, large frames in 256 KiB
    # slices (asyncio 3.11 shifts its one bytearray of unsent bytes after every send).
    transport.set_write_buffer_limits(high=TransportConfig().write_buffer_bytes_max)
    offset = sent = 0
    while sent < volume_bytes:
        if not protocol.writable.is_set():
            await protocol.writable.wait()
        position, length, next_offset = leader.span(offset, span_bytes)
        span = memoryview(os.pread(leader.fd, length, position))
        transport.write(LENGTH.pack(length))
        for start in range(0, length, WRITE_SLICE_BYTES):
            transport.write(span[start : start + WRITE_SLICE_BYTES])
        sent += length
        offset = next_offset
    transport.write(LENGTH.pack(END_MARKER))
    answer = await protocol.answer
    transport.close()
    (written,) = REPORT.unpack(answer)
    return int(written)


async def recv_exactly(sock: socket.socket, size: int) -> bytes:
    loop = asyncio.get_running_loop()
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        count = await loop.sock_recv_into(sock, view[got:])
        if count == 0:
            raise ConnectionError(f"the follower closed the connection after {got}/{size} bytes")
        got += count
    return bytes(buffer)


async def writable(sock: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def on_writable() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_writer(sock.fileno(), on_writable)
    try:
        await ready
    finally:
        loop.remove_writer(sock.fileno())


async def send_all(sock: socket.socket, parts: list[bytes | memoryview], flags: int = 0) -> None:
    """sendmsg on the non-blocking socket until every byte of `parts` has gone."""
    views = [memoryview(part) for part in parts]
    while views:
        try:
            sent = sock.sendmsg(views, [], flags)
        except BlockingIOError:
            await writable(sock)
            continue
        while views and sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        if views:
            views[0] = views[0][sent:]


async def sendfile_all(sock: socket.socket, fd: int, position: int, count: int) -> None:
    """os.sendfile until `count` bytes of the file have gone: they never enter Python."""
    while count > 0:
        try:
            sent = os.sendfile(sock.fileno(), fd, position, count)
        except BlockingIOError:
            await writable(sock)
            continue
        assert sent > 0, "the file is shorter than the span"
        position += sent
        count -= sent


async def serve_pull(
    port: int, leader: LeaderLog, span_bytes: int, volume_bytes: int, *, use_sendfile: bool
) -> int:
    """pull: the leader answers each FETCH with a RESPONSE header and the span's bytes, by
    `os.sendfile` from the segment (pull+sendfile) or by pread + sendmsg (pull+read, to tell
    the pull protocol's cost from sendfile's gain). One fetch is in flight, as in KRaft.
    The run ends when a fetch arrives after `volume_bytes` were sent (the follower has
    written them all); an empty response asks the follower for its byte count."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        await loop.sock_connect(sock, ("127.0.0.1", port))
        offset = sent = 0
        while True:
            fetch_offset, fetch_bytes = FETCH.unpack(await recv_exactly(sock, FETCH.size))
            assert fetch_offset == offset, (fetch_offset, offset)
            if sent >= volume_bytes:
                break
            position, length, offset = leader.span(offset, min(fetch_bytes, span_bytes))
            header = RESPONSE.pack(length, offset)
            if use_sendfile:
                await send_all(sock, [header], socket.MSG_MORE)
                await sendfile_all(sock, leader.fd, position, length)
            else:
                await send_all(sock, [header, os.pread(leader.fd, length, position)])
            sent += length
        await send_all(sock, [RESPONSE.pack(0, offset)])
        (written,) = REPORT.unpack(await recv_exactly(sock, REPORT.size))
        assert written == sent, (written, sent)
        return int(written)
    finally:
        sock.close()


FileSender = Callable[[int, LeaderLog, int, int], Awaitable[int]]
FILE_SENDERS: dict[str, FileSender] = {
    "push_read": send_push_file,
    "pull_read": functools.partial(serve_pull, use_sendfile=False),
    "pull_sendfile": functools.partial(serve_pull, use_sendfile=True),
}


# --- driver -----------------------------------------------------------------------------------

Sender = Callable[[int, list[bytes], int], Awaitable[int]]
SENDERS: dict[str, Sender] = {"grpc": send_grpc, "tcp": send_tcp, "tcpbuf": send_tcpbuf}
SIZES_KIB = (16, 256, 1024)
# uvloop is measured where it is installed (a dependency on every platform but Windows).
EVENT_LOOPS = ("asyncio", "uvloop") if importlib.util.find_spec("uvloop") else ("asyncio",)


REPEATS = 7  # the machine is shared: the median of runs interleaved across candidates
STREAM_LIMIT_BYTES = 4 * MIB  # StreamReader's default 64 KiB would pause reading mid-frame

Measurement = Callable[[], Awaitable[tuple[int, float]]]  # -> (bytes moved, seconds)


def timed(send: Sender, port: int, messages: list[bytes], volume_bytes: int) -> Measurement:
    async def once() -> tuple[int, float]:
        start = time.perf_counter()
        received = await send(port, messages, volume_bytes)
        elapsed = time.perf_counter() - start
        assert received >= volume_bytes, (send.__name__, received, volume_bytes)
        return received, elapsed

    return once


def file_timed(
    send: FileSender, port: int, leader: LeaderLog, span_bytes: int, volume_bytes: int
) -> Measurement:
    async def once() -> tuple[int, float]:
        start = time.perf_counter()
        received = await send(port, leader, span_bytes, volume_bytes)
        elapsed = time.perf_counter() - start
        assert received >= volume_bytes, (send, received, volume_bytes)
        return received, elapsed

    return once


def raft_timed(
    port: int, volume_bytes: int, announce: Callable[[int], None], entry_bytes: int
) -> Measurement:
    async def once() -> tuple[int, float]:
        return await send_raft_append(port, volume_bytes, announce, entry_bytes=entry_bytes)

    return once


def cpu_seconds(server_pid: int) -> tuple[float, float]:
    """CPU time used so far by this process (the sender, all its threads) and by the
    receiver process.

    Wall-clock rates on an oversubscribed machine favour candidates with more threads (gRPC's
    core runs its own), so CPU seconds per GB moved is reported too: it does not depend on
    what else runs. The receiver's figure has the kernel's clock-tick resolution (10 ms)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    stat = pathlib.Path(f"/proc/{server_pid}/stat").read_text().rsplit(")", 1)[1].split()
    server_ticks = int(stat[11]) + int(stat[12])  # utime, stime: fields 14 and 15
    return own.ru_utime + own.ru_stime, server_ticks / os.sysconf("SC_CLK_TCK")


def run_on(event_loop: str, main: Callable[[], Coroutine[object, object, T]]) -> T:
    """Run `main()` on a fresh event loop of the named kind (both sides use the same kind)."""
    if event_loop == "uvloop":
        import uvloop  # optional: only the uvloop runs need it

        return uvloop.run(main())
    assert event_loop == "asyncio", event_loop
    return asyncio.run(main())


class Receiver:
    """One receiver process (`--serve`) running on the given kind of event loop."""

    def __init__(self, event_loop: str, directory: pathlib.Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--serve", event_loop, str(directory)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self.stdin = self.process.stdin
        self.ports: dict[str, int] = json.loads(self.process.stdout.readline())

    def announce(self, port: int) -> None:
        self.stdin.write(f"peer {port}\n")
        self.stdin.flush()

    def close(self) -> None:
        self.stdin.close()
        self.process.wait(timeout=30)


def measurements_for(
    receiver: Receiver, leader: LeaderLog, volume_bytes: int, suffix: str
) -> dict[str, Measurement]:
    ports, measurements = receiver.ports, {}
    for size_kib in SIZES_KIB:
        messages = payloads(size_kib * KIB)
        for name, send in SENDERS.items():
            measurements[f"transport_{name}_{size_kib}k{suffix}"] = timed(
                send, ports[name], messages, volume_bytes
            )
        for name, file_send in FILE_SENDERS.items():
            measurements[f"transport_{name}_{size_kib}k{suffix}"] = file_timed(
                file_send, ports[name], leader, size_kib * KIB, volume_bytes
            )
    for entry_kib, name in ((1, "raft_append"), (16, "raft_append_16k_entries")):
        measurements[f"transport_{name}{suffix}"] = raft_timed(
            ports["raft_append"], volume_bytes, receiver.announce, entry_kib * KIB
        )
    return measurements


Sample = tuple[float, float, float]  # GB/s, CPU s/GB of both processes, of the sender


async def one_round(
    measurements: dict[str, Measurement],
    warm_ups: dict[str, Measurement],
    receiver_pid: int,
    samples: dict[str, list[Sample]],
) -> None:
    """Each warm-up once (connections, caches, the follower files' pages), then each
    measurement once, appending its sample."""
    for warm_up in warm_ups.values():
        await warm_up()
    for name, measure_once in measurements.items():
        sender_before, receiver_before = cpu_seconds(receiver_pid)
        moved_bytes, elapsed_s = await measure_once()
        sender_after, receiver_after = cpu_seconds(receiver_pid)
        sender_s = sender_after - sender_before
        total_s = sender_s + receiver_after - receiver_before
        gigabytes = moved_bytes / 1e9
        sample = (gigabytes / elapsed_s, total_s / gigabytes, sender_s / gigabytes)
        samples.setdefault(name, []).append(sample)


def measure(
    work: pathlib.Path, *, quick: bool, event_loops: tuple[str, ...], repeats: int = REPEATS
) -> dict[str, float]:
    """`<name>_gb_s` and `<name>_cpu_s_per_gb` per candidate, size and event loop. Every
    round runs each candidate once on each kind of loop (a fresh loop per round and kind,
    the receiver on the same kind), so load that comes and goes hits all alike; medians of
    the rounds. Metrics on uvloop carry the suffix `_uvloop`."""
    volume_bytes = (64 if quick else 256) * MIB
    leader = LeaderLog(work / "leader")
    receivers = {loop: Receiver(loop, work / f"follower-{loop}") for loop in event_loops}
    samples: dict[str, list[Sample]] = {}
    try:
        for round_index in range(repeats):
            for event_loop, receiver in receivers.items():
                suffix = "" if event_loop == "asyncio" else f"_{event_loop}"
                measurements = measurements_for(receiver, leader, volume_bytes, suffix)
                warm_ups = {}
                if round_index == 0:
                    warm_ups = measurements_for(receiver, leader, 4 * MIB, suffix)
                pid = receiver.process.pid
                run_on(
                    event_loop,
                    functools.partial(one_round, measurements, warm_ups, pid, samples),
                )
    finally:
        for receiver in receivers.values():
            receiver.close()
        leader.close()
    metrics: dict[str, float] = {}
    for name, values in samples.items():
        metrics[f"{name}_gb_s"] = statistics.median(rate for rate, _, _ in values)
        metrics[f"{name}_cpu_s_per_gb"] = statistics.median(cost for _, cost, _ in values)
        metrics[f"{name}_sender_cpu_s_per_gb"] = statistics.median(c for _, _, c in values)
    add_ratios(metrics, event_loops)
    metrics["transport_load_average_1m"] = os.getloadavg()[0]
    return metrics


def add_ratios(metrics: dict[str, float], event_loops: tuple[str, ...]) -> None:
    """`_vs_grpc` (rate ratio) and `_cpu_saving` (> 1: that many times less CPU per byte)."""
    for size_kib in SIZES_KIB:
        grpc_rate = metrics[f"transport_grpc_{size_kib}k_gb_s"]
        grpc_cost = metrics[f"transport_grpc_{size_kib}k_cpu_s_per_gb"]
        for name in ("tcp", "tcpbuf"):
            rate = metrics[f"transport_{name}_{size_kib}k_gb_s"]
            cost = metrics[f"transport_{name}_{size_kib}k_cpu_s_per_gb"]
            metrics[f"transport_{name}_vs_grpc_{size_kib}k"] = rate / grpc_rate
            metrics[f"transport_{name}_vs_grpc_{size_kib}k_cpu_saving"] = grpc_cost / cost
        push_cost = metrics[f"transport_push_read_{size_kib}k_cpu_s_per_gb"]
        for name in ("pull_read", "pull_sendfile"):
            cost = metrics[f"transport_{name}_{size_kib}k_cpu_s_per_gb"]
            metrics[f"transport_{name}_vs_push_read_{size_kib}k_cpu_saving"] = push_cost / cost
        if "uvloop" in event_loops:
            for name in (*SENDERS, *FILE_SENDERS):
                base = f"transport_{name}_{size_kib}k"
                metrics[f"{base}_uvloop_cpu_saving"] = (
                    metrics[f"{base}_cpu_s_per_gb"] / metrics[f"{base}_uvloop_cpu_s_per_gb"]
                )
    if "uvloop" in event_loops:
        for name in ("raft_append", "raft_append_16k_entries"):
            metrics[f"transport_{name}_uvloop_cpu_saving"] = (
                metrics[f"transport_{name}_cpu_s_per_gb"]
                / metrics[f"transport_{name}_uvloop_cpu_s_per_gb"]
            )
    metrics["transport_raft_append_vs_grpc_256k"] = (
        metrics["transport_raft_append_gb_s"] / metrics["transport_grpc_256k_gb_s"]
    )


def run(out_dir: pathlib.Path, *, quick: bool) -> dict[str, float]:
    work = out_dir / "transport-work"
    try:
        metrics = measure(work, quick=quick, event_loops=EVENT_LOOPS)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "transport.json").write_text(json.dumps(metrics, indent=2, sort_keys=True))
    return metrics


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        event_loop, directory = sys.argv[2], pathlib.Path(sys.argv[3])
        run_on(event_loop, functools.partial(serve, directory))
    else:
        quick = "--quick" in sys.argv
        result = run(pathlib.Path("bench-out"), quick=quick)
        print(json.dumps(result, indent=2, sort_keys=True))
