"""The security interceptor on an in-process gRPC server with a scripted Log servicer.

The servicer's Produce parks until the test releases it, so "N calls in flight" is a fact the
test waits for (an event), never a timing guess. Checks: per-client in-flight bounds and the
node's produce-buffer bound answer RESOURCE_EXHAUSTED at once while other clients carry on;
unknown methods are refused; every refusal names what was wrong.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest

from raftlog.rpc.security import (
    AccessControl,
    ClientLimits,
    Grant,
    Permission,
    SecurityInterceptor,
    bearer_metadata,
)
from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.rpc.v1 import raftlog_pb2_grpc as pb_grpc

HANG_GUARD_S = 30
ALICE, BOB = "alice-token-0123456789", "bob-token-0123456789ab"
ALL = frozenset(Permission)


def access() -> AccessControl:
    from raftlog.rpc.security import _digest

    return AccessControl(
        {_digest(ALICE): "alice", _digest(BOB): "bob"},
        {"alice": (Grant("*", ALL),), "bob": (Grant("*", ALL),)},
    )


class ParkingLog(pb_grpc.LogServicer):
    """Produce parks until `release` is set; Fetch answers at once."""

    def __init__(self) -> None:
        self.parked = 0
        self.arrived = asyncio.Event()
        self.release = asyncio.Event()

    async def Produce(self, request: pb.ProduceRequest, context: Any) -> pb.ProduceResponse:
        self.parked += 1
        self.arrived.set()
        await self.release.wait()
        return pb.ProduceResponse(base_offset=0)

    async def Fetch(self, request: pb.FetchRequest, context: Any) -> pb.FetchResponse:
        return pb.FetchResponse(high_watermark=7)


Scenario = Callable[[Any, ParkingLog, ClientLimits], Awaitable[None]]


def serve(limits: ClientLimits, scenario: Scenario) -> None:
    async def main() -> None:
        servicer = ParkingLog()
        server = grpc.aio.server(interceptors=[SecurityInterceptor(access(), limits)])
        pb_grpc.add_LogServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                await scenario(channel, servicer, limits)
        finally:
            servicer.release.set()
            await server.stop(grace=None)

    asyncio.run(asyncio.wait_for(main(), HANG_GUARD_S))


def log_stub(channel: Any) -> Any:
    return pb_grpc.LogStub(channel)  # type: ignore[no-untyped-call]


async def wait_parked(servicer: ParkingLog, count: int) -> None:
    while servicer.parked < count:
        servicer.arrived.clear()
        await servicer.arrived.wait()


def produce(size_bytes: int = 10) -> pb.ProduceRequest:
    return pb.ProduceRequest(topic="t", partition=0, batches=[bytes(size_bytes)])


def test_a_client_over_its_in_flight_bound_is_refused_and_others_carry_on() -> None:
    async def scenario(channel: Any, servicer: ParkingLog, limits: ClientLimits) -> None:
        stub = log_stub(channel)
        alice = bearer_metadata(ALICE)
        parked = [asyncio.ensure_future(stub.Produce(produce(), metadata=alice)) for _ in "ab"]
        await wait_parked(servicer, 2)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Fetch(pb.FetchRequest(topic="t"), metadata=alice)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "'alice'" in (caught.value.details() or "")
        assert "client_requests_in_flight_max" in (caught.value.details() or "")
        answer = await stub.Fetch(pb.FetchRequest(topic="t"), metadata=bearer_metadata(BOB))
        assert answer.high_watermark == 7  # bob is unaffected
        servicer.release.set()
        await asyncio.gather(*parked)
        assert limits.in_flight == {} and limits.produce_bytes == 0
        again = await stub.Fetch(pb.FetchRequest(topic="t"), metadata=alice)
        assert again.high_watermark == 7  # alice is served again once her calls finished

    serve(ClientLimits(requests_in_flight_max=2, produce_buffer_bytes_max=1 << 20), scenario)


def test_the_node_bounds_buffered_produce_bytes() -> None:
    async def scenario(channel: Any, servicer: ParkingLog, limits: ClientLimits) -> None:
        stub = log_stub(channel)
        parked = stub.Produce(produce(600), metadata=bearer_metadata(ALICE))
        parked_future = asyncio.ensure_future(parked)
        await wait_parked(servicer, 1)
        assert limits.produce_bytes > 600
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Produce(produce(600), metadata=bearer_metadata(BOB))
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "produce_buffer_bytes_max=1000" in (caught.value.details() or "")
        fetched = await stub.Fetch(pb.FetchRequest(topic="t"), metadata=bearer_metadata(BOB))
        assert fetched.high_watermark == 7  # reads still flow
        servicer.release.set()
        await parked_future
        assert limits.produce_bytes == 0

    serve(ClientLimits(requests_in_flight_max=8, produce_buffer_bytes_max=1000), scenario)


def test_calls_without_a_rule_are_unimplemented() -> None:
    async def scenario(channel: Any, servicer: ParkingLog, limits: ClientLimits) -> None:
        stub = log_stub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Metadata(pb.MetadataRequest(), metadata=bearer_metadata(ALICE))
        # Metadata has a rule but this servicer does not implement it: gRPC's own answer.
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED

    serve(ClientLimits(requests_in_flight_max=1, produce_buffer_bytes_max=1000), scenario)


def serve_anonymous(limits: ClientLimits, scenario: Scenario) -> None:
    """As `serve`, but without a token file: everyone is `anonymous`, limits per connection."""

    async def main() -> None:
        servicer = ParkingLog()
        server = grpc.aio.server(interceptors=[SecurityInterceptor(None, limits)])
        pb_grpc.add_LogServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            await scenario(f"127.0.0.1:{port}", servicer, limits)
        finally:
            servicer.release.set()
            await server.stop(grace=None)

    asyncio.run(asyncio.wait_for(main(), HANG_GUARD_S))


def test_without_a_token_file_limits_apply_per_connection() -> None:
    async def scenario(address: Any, servicer: ParkingLog, limits: ClientLimits) -> None:
        async with (
            grpc.aio.insecure_channel(address) as first,
            grpc.aio.insecure_channel(
                address, options=[("grpc.use_local_subchannel_pool", 1)]
            ) as second,
        ):
            busy, other = log_stub(first), log_stub(second)
            parked = asyncio.ensure_future(busy.Produce(produce()))
            await wait_parked(servicer, 1)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await busy.Fetch(pb.FetchRequest(topic="t"))
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert (await other.Fetch(pb.FetchRequest(topic="t"))).high_watermark == 7
            servicer.release.set()
            await parked

    serve_anonymous(ClientLimits(requests_in_flight_max=1, produce_buffer_bytes_max=1000), scenario)


def test_bytes_that_are_not_the_request_are_invalid_argument_after_authentication() -> None:
    async def scenario(channel: Any, servicer: ParkingLog, limits: ClientLimits) -> None:
        raw = channel.unary_unary("/raftlog.v1.Log/Fetch")  # bytes in, bytes out
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await raw(b"\xff\xff\xff", metadata=bearer_metadata(ALICE))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "3 request bytes are not a valid request message" in (caught.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as anonymous:
            await raw(b"\xff\xff\xff")  # no token: refused before the bytes are even parsed
        assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED

    serve(ClientLimits(requests_in_flight_max=2, produce_buffer_bytes_max=1000), scenario)
