"""Caps on client connections per IP address and in total (`ConnectionLimits`).

The model is checked with an injected table of established connections and a manual clock;
then the real interceptor on an in-process gRPC server, with the kernel's own table: a
connection over the cap is refused with RESOURCE_EXHAUSTED naming the cap while admitted
connections carry on, and once one closes the refused client gets in. Waits are for
conditions with a generous deadline, never fixed sleeps.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from raftlog.config import NodeConfig
from raftlog.errors import ConfigError
from raftlog.rpc.security import (
    ClientLimits,
    ConnectionLimits,
    PeerKey,
    SecurityInterceptor,
    established_tcp_peers,
    peer_key,
)
from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.rpc.v1 import raftlog_pb2_grpc as pb_grpc

HANG_GUARD_S = 60


def test_grpc_peer_strings_name_address_and_port() -> None:
    assert peer_key("ipv4:127.0.0.1:5123") == ("127.0.0.1", 5123)
    assert peer_key("ipv6:[::1]:443") == ("::1", 443)
    assert peer_key("ipv6:%5B::ffff:10.0.0.7%5D:99") == ("10.0.0.7", 99)  # dual stack, quoted
    assert peer_key("unix:/tmp/socket") is None
    assert peer_key("ipv4:garbage") is None


def test_the_kernel_table_is_read_for_established_connections_only(tmp_path: Path) -> None:
    header = "  sl  local_address rem_address   st tx_queue ...\n"
    tcp = tmp_path / "tcp"
    tcp.write_text(
        header
        + "   0: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 0 0 1\n"
        + "   1: 0100007F:1F90 0200007F:D432 08 00000000:00000000 00:00000000 0 0 2\n"
    )
    tcp6 = tmp_path / "tcp6"
    tcp6.write_text(
        header
        + "   0: 00000000000000000000000000000000:1F90 "
        + "0000000000000000FFFF00000700000A:0063 01 0 0 0 0 0 3\n"
        + "   1: 00000000000000000000000000000000:1F90 "
        + "00000000000000000000000001000000:01BB 01 0 0 0 0 0 4\n"
    )
    peers = established_tcp_peers((str(tcp), str(tcp6)))
    assert peers == {("127.0.0.1", 0xD431), ("10.0.0.7", 99), ("::1", 443)}
    assert established_tcp_peers((str(tmp_path / "absent"),)) is None


class Table:
    """The established connections the model sees, and a clock the test moves."""

    def __init__(self) -> None:
        self.live: set[PeerKey] | None = set()
        self.now = 0.0

    def limits(self, per_address_max: int, total_max: int) -> ConnectionLimits:
        return ConnectionLimits(
            per_address_max=per_address_max,
            total_max=total_max,
            idle_ms_max=10_000,
            established=lambda: None if self.live is None else set(self.live),
            clock=lambda: self.now,
        )

    def connect(self, address: str, port: int) -> str:
        assert self.live is not None
        self.live.add((address, port))
        return f"ipv4:{address}:{port}"


def test_a_connection_over_the_per_address_cap_is_refused_until_one_closes() -> None:
    table = Table()
    limits = table.limits(per_address_max=2, total_max=10)
    first, second, third = (table.connect("10.0.0.1", port) for port in (1, 2, 3))
    other = table.connect("10.0.0.2", 1)
    assert limits.refusal(first) is None and limits.refusal(second) is None
    refusal = limits.refusal(third)
    assert refusal is not None and "client_connections_per_address_max=2" in refusal
    assert "10.0.0.1" in refusal
    assert limits.refusal(other) is None  # another address is unaffected
    assert limits.refusal(first) is None  # and so are admitted connections
    assert table.live is not None
    table.live.discard(("10.0.0.1", 1))  # the first connection closes
    table.now += 1
    assert limits.refusal(third) is None
    assert len(limits.admitted) == 3


def test_the_total_cap_counts_every_address() -> None:
    table = Table()
    limits = table.limits(per_address_max=2, total_max=3)
    admitted = [table.connect(f"10.0.0.{n}", 1) for n in range(3)]
    assert all(limits.refusal(peer) is None for peer in admitted)
    refusal = limits.refusal(table.connect("10.0.0.9", 1))
    assert refusal is not None and "client_connections_max=3" in refusal


def test_without_the_kernel_table_idle_connections_are_forgotten() -> None:
    table = Table()
    table.live = None
    limits = table.limits(per_address_max=1, total_max=5)
    assert limits.refusal("ipv4:10.0.0.1:1") is None
    assert limits.refusal("ipv4:10.0.0.1:2") is not None
    table.now += 11  # past idle_ms_max: gRPC has closed the first connection by now
    assert limits.refusal("ipv4:10.0.0.1:2") is None


def test_calls_on_unix_sockets_are_not_counted() -> None:
    limits = Table().limits(per_address_max=1, total_max=1)
    assert limits.refusal("unix:/run/a") is None and limits.refusal("unix:/run/b") is None
    assert limits.admitted == {}


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"client_connections_per_address_max": 0}, "must be positive"),
        ({"client_connections_per_address_max": 9, "client_connections_max": 8}, "must not"),
    ],
)
def test_connection_caps_are_validated(overrides: dict[str, int], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        NodeConfig(**overrides).validate()  # type: ignore[arg-type]


class Log(pb_grpc.LogServicer):
    async def Fetch(self, request: pb.FetchRequest, context: Any) -> pb.FetchResponse:
        return pb.FetchResponse(high_watermark=7)


async def fetch(channel: grpc.aio.Channel) -> int:
    stub: Any = pb_grpc.LogStub(channel)  # type: ignore[no-untyped-call]
    answer = await stub.Fetch(pb.FetchRequest(topic="t"), timeout=10)
    return int(answer.high_watermark)


def separate(address: str) -> grpc.aio.Channel:
    """A channel with its own TCP connection (gRPC shares subchannels by default)."""
    return grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])


def test_a_real_server_refuses_the_connection_over_the_cap_and_serves_the_others() -> None:
    async def main() -> None:
        limits = ConnectionLimits(per_address_max=2, total_max=2, idle_ms_max=60_000)
        interceptor = SecurityInterceptor(
            None, ClientLimits(requests_in_flight_max=8, produce_buffer_bytes_max=1000),
            connections=limits,
        )  # fmt: skip
        server = grpc.aio.server(interceptors=[interceptor])
        pb_grpc.add_LogServicer_to_server(Log(), server)  # type: ignore[no-untyped-call]
        address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        await server.start()
        first, second, third = separate(address), separate(address), separate(address)
        try:
            assert await fetch(first) == 7 and await fetch(second) == 7
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await fetch(third)
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "client_connections_per_address_max=2" in (caught.value.details() or "")
            assert await fetch(first) == 7 and await fetch(second) == 7  # unaffected
            await first.close()
            deadline = time.monotonic() + HANG_GUARD_S / 2
            while True:  # until the kernel has dropped the first connection
                try:
                    assert await fetch(third) == 7
                    break
                except grpc.aio.AioRpcError as error:
                    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    assert time.monotonic() < deadline, "the closed connection still counts"
                    await asyncio.sleep(0.05)
            assert await fetch(second) == 7
        finally:
            for channel in (second, third):
                await channel.close()
            await server.stop(grace=None)

    asyncio.run(asyncio.wait_for(main(), HANG_GUARD_S))


def test_a_node_started_with_a_cap_enforces_it_and_stays_up(tmp_path: Path) -> None:
    """The node wires the caps from its config (`--set`): end to end on a real node."""
    from raftlog.local_cluster import LocalCluster

    cluster = LocalCluster.create(tmp_path / "cluster", node_count=1)
    cluster.start("--set", "client_connections_per_address_max=3")
    address = cluster.bootstrap

    def sync_fetch(channel: grpc.Channel) -> grpc.StatusCode:
        stub: Any = pb_grpc.LogStub(channel)  # type: ignore[no-untyped-call]
        try:
            stub.Metadata(pb.MetadataRequest(), timeout=10)
        except grpc.RpcError as error:
            return error.code()  # type: ignore[attr-defined, no-any-return]
        return grpc.StatusCode.OK

    options = [("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.insecure_channel(address, options=options) for _ in range(4)]
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        while sync_fetch(channels[0]) != grpc.StatusCode.OK:  # until the node serves
            assert time.monotonic() < deadline and cluster.is_running(1)
            time.sleep(0.2)
        assert [sync_fetch(c) for c in channels[1:3]] == [grpc.StatusCode.OK] * 2
        assert sync_fetch(channels[3]) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert [sync_fetch(c) for c in channels[:3]] == [grpc.StatusCode.OK] * 3
        assert cluster.is_running(1)
    finally:
        for channel in channels:
            channel.close()
        cluster.stop()
