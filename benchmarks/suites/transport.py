"""Benchmark: which byte path carries node-to-node Raft traffic (issue 4).

Theory of operation. A receiver process (this file run with `--serve`) listens with every
candidate at once; this process is the sender. Both sides run one asyncio event loop each in
separate processes, so neither candidate shares a GIL with its peer. For each candidate and
message size the sender moves the same seeded random payloads until `volume_bytes` have gone,
then sends an end marker; the receiver answers with the byte count it received, and the clock
stops when that answer arrives (so bytes still in kernel buffers are not counted as moved).

Candidates:
- `grpc`: a grpc.aio bidirectional stream of raw bytes messages (no protobuf: identity
  serializers, so only gRPC's own framing and HTTP/2 flow control are measured);
- `tcp`: [u32 length][payload] frames over asyncio streams (`writelines`, `readexactly`);
- `tcpbuf`: the same frames, sent through a `Protocol` that honours pause/resume_writing and
  received by a `BufferedProtocol` that reads large frames straight into their own buffer;
- `raft_append`: raftlog's own codec and `PeerTransport`, AppendRequests of 1 MiB made of
  1 KiB entries (and, for comparison, 16 KiB entries), counting entry data bytes at the
  receiver's `on_messages`.

Contract with benchmarks/run.py: `run(out_dir, *, quick) -> dict[str, float]`. Running the file
directly prints the metrics as JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import random
import resource
import struct
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable

import grpc
import grpc.aio

from raftlog.config import TransportConfig
from raftlog.raft.types import AppendRequest, AppendResponse, Entry, EntryKind, Message
from raftlog.rpc.peer_transport import PeerTransport
from raftlog.types import GroupId, NodeId, Offset, Term

SEED = 20261122
KIB = 1024
MIB = 1024 * KIB
GRPC_METHOD = "/raftlog.bench.Transport/Stream"
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", 8 * MIB),
    ("grpc.max_receive_message_length", 8 * MIB),
]
LENGTH = struct.Struct("!I")
END_MARKER = 0  # a zero-length frame ends a run


def payloads(size_bytes: int, count: int = 16) -> list[bytes]:
    """The same seeded random payloads for every candidate."""
    rng = random.Random(SEED + size_bytes)
    return [rng.randbytes(size_bytes) for _ in range(count)]


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
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

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


async def serve() -> None:
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
    ports = {
        "grpc": grpc_port,
        "tcp": tcp.sockets[0].getsockname()[1],
        "tcpbuf": tcpbuf.sockets[0].getsockname()[1],
        "raft_append": raft,
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


# --- raftlog's own transport ----------------------------------------------------------------

SENDER, RECEIVER = NodeId(1), NodeId(2)


async def serve_raft_append() -> tuple[int, PeerTransport]:
    """A PeerTransport that counts entry bytes and answers an empty append with the count."""
    totals = {"bytes": 0}

    def on_messages(sender: NodeId, items: list[tuple[GroupId, Message]]) -> None:
        for group, message in items:
            if not isinstance(message, AppendRequest):
                continue
            if not message.entries:  # the end marker
                answer = AppendResponse(Term(1), RECEIVER, sender, True, Offset(totals["bytes"]))
                receiver.send(sender, group, answer)
                totals["bytes"] = 0
            totals["bytes"] += sum(len(entry.data) for entry in message.entries)

    receiver = PeerTransport(
        node_id=RECEIVER, cluster_id="bench", config=TransportConfig(), on_messages=on_messages
    )
    _, port = await receiver.start("127.0.0.1", 0)
    return port, receiver


def append_request(entries: tuple[Entry, ...]) -> AppendRequest:
    return AppendRequest(Term(1), SENDER, RECEIVER, Offset(-1), Term(0), entries, Offset(0))


async def send_raft_append(
    port: int, volume_bytes: int, announce: Callable[[int], None], *, entry_bytes: int = KIB
) -> tuple[int, float]:
    """Bytes of entry data per second through codec + PeerTransport, 1 MiB appends made of
    `entry_bytes` entries, spread over 100 groups; the sender paces with wait_queue_below."""
    entries = tuple(
        Entry(Term(1), Offset(i), 1, EntryKind.DATA, data)
        for i, data in enumerate(payloads(entry_bytes, count=MIB // entry_bytes))
    )
    request, end = append_request(entries), append_request(())
    answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def on_messages(sender: NodeId, items: list[tuple[GroupId, Message]]) -> None:
        for _, message in items:
            if isinstance(message, AppendResponse) and not answer.done():
                answer.set_result(message.last_offset)

    sender = PeerTransport(
        node_id=SENDER, cluster_id="bench", config=TransportConfig(), on_messages=on_messages
    )
    _, own_port = await sender.start("127.0.0.1", 0)
    announce(own_port)
    sender.update_peers({RECEIVER: ("127.0.0.1", port)})
    await sender.wait_connected(RECEIVER)
    sent = 0
    start = time.perf_counter()
    while sent < volume_bytes:
        await sender.wait_queue_below(RECEIVER, 32 * MIB)
        sender.send(RECEIVER, GroupId(sent // MIB % 100), request)
        sent += MIB
    sender.send(RECEIVER, GroupId(0), end)
    received = await answer
    elapsed = time.perf_counter() - start
    await sender.close()
    dropped = sender.counters().messages_dropped_queue_full
    assert received == sent and dropped == 0, (received, sent, dropped)
    return sent, elapsed


# --- driver -----------------------------------------------------------------------------------

Sender = Callable[[int, list[bytes], int], Awaitable[int]]
SENDERS: dict[str, Sender] = {"grpc": send_grpc, "tcp": send_tcp, "tcpbuf": send_tcpbuf}


REPEATS = 5  # the machine is shared: the median of runs interleaved across candidates
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


def raft_timed(
    port: int, volume_bytes: int, announce: Callable[[int], None], entry_bytes: int
) -> Measurement:
    async def once() -> tuple[int, float]:
        return await send_raft_append(port, volume_bytes, announce, entry_bytes=entry_bytes)

    return once


def cpu_seconds(server_pid: int) -> float:
    """CPU time used so far by this process (all its threads) and by the receiver process.

    Wall-clock rates on an oversubscribed machine favour candidates with more threads (gRPC's
    core runs its own), so CPU seconds per GB moved is reported too: it does not depend on
    what else runs. The receiver's figure has the kernel's clock-tick resolution (10 ms)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    stat = pathlib.Path(f"/proc/{server_pid}/stat").read_text().rsplit(")", 1)[1].split()
    server_ticks = int(stat[11]) + int(stat[12])  # utime, stime: fields 14 and 15
    return own.ru_utime + own.ru_stime + server_ticks / os.sysconf("SC_CLK_TCK")


async def interleaved_medians(
    measurements: dict[str, Measurement], server_pid: int
) -> dict[str, float]:
    """`<name>_gb_s` and `<name>_cpu_s_per_gb` per measurement: every round runs each
    candidate once, so load that comes and goes hits all alike; medians of the rounds."""
    rates: dict[str, list[float]] = {name: [] for name in measurements}
    costs: dict[str, list[float]] = {name: [] for name in measurements}
    for _ in range(REPEATS):
        for name, measure_once in measurements.items():
            cpu_before = cpu_seconds(server_pid)
            moved_bytes, elapsed_s = await measure_once()
            cpu_s = cpu_seconds(server_pid) - cpu_before
            rates[name].append(moved_bytes / elapsed_s / 1e9)
            costs[name].append(cpu_s / (moved_bytes / 1e9))
    metrics = {f"{name}_gb_s": sorted(v)[REPEATS // 2] for name, v in rates.items()}
    for name, values in costs.items():
        metrics[f"{name}_cpu_s_per_gb"] = sorted(values)[REPEATS // 2]
    return metrics


async def measure(
    ports: dict[str, int], announce: Callable[[int], None], server_pid: int, *, quick: bool
) -> dict[str, float]:
    volume_bytes = (64 if quick else 256) * MIB
    measurements: dict[str, Measurement] = {}
    for size_kib in (16, 256):
        messages = payloads(size_kib * KIB)
        for name, send in SENDERS.items():
            await send(ports[name], messages, 4 * MIB)  # warm up connections and caches
            measurements[f"transport_{name}_{size_kib}k"] = timed(
                send, ports[name], messages, volume_bytes
            )
    await send_raft_append(ports["raft_append"], 16 * MIB, announce)  # warm up
    for entry_kib, name in ((1, "raft_append"), (16, "raft_append_16k_entries")):
        measurements[f"transport_{name}"] = raft_timed(
            ports["raft_append"], volume_bytes, announce, entry_kib * KIB
        )
    metrics = await interleaved_medians(measurements, server_pid)
    for size_kib in (16, 256):
        grpc_rate = metrics[f"transport_grpc_{size_kib}k_gb_s"]
        grpc_cost = metrics[f"transport_grpc_{size_kib}k_cpu_s_per_gb"]
        for name in ("tcp", "tcpbuf"):
            rate = metrics[f"transport_{name}_{size_kib}k_gb_s"]
            cost = metrics[f"transport_{name}_{size_kib}k_cpu_s_per_gb"]
            metrics[f"transport_{name}_vs_grpc_{size_kib}k"] = rate / grpc_rate
            # > 1: the candidate needs that many times less CPU than gRPC per byte.
            metrics[f"transport_{name}_vs_grpc_{size_kib}k_cpu_saving"] = grpc_cost / cost
    metrics["transport_raft_append_vs_grpc_256k"] = (
        metrics["transport_raft_append_gb_s"] / metrics["transport_grpc_256k_gb_s"]
    )
    metrics["transport_load_average_1m"] = os.getloadavg()[0]
    return metrics


def run(out_dir: pathlib.Path, *, quick: bool) -> dict[str, float]:
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdin is not None and server.stdout is not None
    stdin = server.stdin

    def announce(port: int) -> None:
        stdin.write(f"peer {port}\n")
        stdin.flush()

    try:
        ports = json.loads(server.stdout.readline())
        metrics = asyncio.run(measure(ports, announce, server.pid, quick=quick))
    finally:
        stdin.close()
        server.wait(timeout=30)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "transport.json").write_text(json.dumps(metrics, indent=2, sort_keys=True))
    return metrics


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        asyncio.run(serve())
    else:
        quick = "--quick" in sys.argv
        result = run(pathlib.Path("bench-out"), quick=quick)
        print(json.dumps(result, indent=2, sort_keys=True))
