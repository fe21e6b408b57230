"""Forwarding to the controller (raftlog.rpc.forwarding): one connection per controller
address and lane, reused call after call (liveness on a connection of its own); a failed
call cancels no other; the number of open channels is bounded. A real gRPC server runs the
real Internal servicer; the node behind it is a recorder of the commands it is asked to
commit."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from raftlog.errors import NotControllerError
from raftlog.metadata import ApplyResult, Command, ErrorCode, NodeHeartbeat
from raftlog.rpc.admin_servicer import InternalServicer
from raftlog.rpc.forwarding import CHANNELS_MAX, ControllerForwarder
from raftlog.rpc.v1 import raftlog_pb2_grpc as pb_grpc
from raftlog.types import NodeId


class _Controller:
    """The node side of Internal.SubmitMetadata: always the controller, commits at once."""

    controller_id = NodeId(1)

    def __init__(self) -> None:
        self.submitted: list[Command] = []

    def is_controller(self) -> bool:
        return True

    async def submit(self, command: Command, *, timeout_s: float) -> ApplyResult:
        self.submitted.append(command)
        return ApplyResult(ErrorCode.NONE, "")


class _Peers(grpc.aio.ServerInterceptor):
    """Records the client end (address and port: one per connection) of every call."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = await continuation(details)
        if handler is None or handler.unary_unary is None:
            return handler
        inner = handler.unary_unary

        async def record(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            self.seen.add(context.peer())
            return await inner(request, context)

        return grpc.unary_unary_rpc_method_handler(
            record,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


async def _server(controller: _Controller, peers: _Peers) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server(interceptors=[peers])
    pb_grpc.add_InternalServicer_to_server(InternalServicer(controller), server)  # type: ignore[no-untyped-call,arg-type]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def _heartbeat(i: int) -> NodeHeartbeat:
    return NodeHeartbeat(node_id=NodeId(2), incarnation=7, now_ms=i)


def test_forwards_reuse_one_connection_per_controller_address_and_lane() -> None:
    async def scenario() -> None:
        controller, peers = _Controller(), _Peers()
        server, address = await _server(controller, peers)
        forward = ControllerForwarder(credentials=None, token=None)
        try:
            for i in range(20):
                result = await forward(address, _heartbeat(i), 5.0)
                assert result.code is ErrorCode.NONE
            assert controller.submitted == [_heartbeat(i) for i in range(20)]
            assert len(peers.seen) == 1, peers.seen  # one connection carried every forward
            await forward(address, _heartbeat(20), 5.0, lane="liveness")
            assert len(peers.seen) == 2, peers.seen  # liveness has a connection of its own
            assert forward.open_channels() == [(address, "other"), (address, "liveness")]
        finally:
            await forward.close()
            await server.stop(grace=None)
        assert forward.open_channels() == []

    asyncio.run(scenario())


def test_a_failed_call_cancels_no_other_call_on_its_channel() -> None:
    """Two calls on the shared channel wait at the controller; one's deadline passes, the
    other still commits once the controller lets it, and the channel stays open."""

    class _Holding(_Controller):
        release = asyncio.Event()

        async def submit(self, command: Command, *, timeout_s: float) -> ApplyResult:
            if isinstance(command, NodeHeartbeat) and command.now_ms in (0, 1):
                await self.release.wait()
            return await super().submit(command, timeout_s=timeout_s)

    async def scenario() -> None:
        controller = _Holding()
        _Holding.release = asyncio.Event()
        server, address = await _server(controller, _Peers())
        forward = ControllerForwarder(credentials=None, token=None)
        try:
            held = asyncio.create_task(forward(address, _heartbeat(0), 5.0))
            with pytest.raises(NotControllerError):
                await forward(address, _heartbeat(1), 0.2)  # deadline; the controller waits
            controller.release.set()
            assert (await held).code is ErrorCode.NONE
            assert forward.open_channels() == [(address, "other")]
            await server.stop(grace=None)
            with pytest.raises(NotControllerError):
                await forward(address, _heartbeat(2), 2.0)  # nobody listens any more
            with pytest.raises(NotControllerError):
                await forward("", _heartbeat(3), 1.0)  # no controller address known
        finally:
            await forward.close()

    asyncio.run(scenario())


def test_channels_stay_open_for_the_most_recently_used_addresses_only() -> None:
    async def scenario() -> None:
        started = [await _server(_Controller(), _Peers()) for _ in range(CHANNELS_MAX + 2)]
        addresses = [address for _, address in started]
        forward = ControllerForwarder(credentials=None, token=None)
        try:
            for i, address in enumerate(addresses):
                await forward(address, _heartbeat(i), 5.0)
            await forward(addresses[2], _heartbeat(99), 5.0)  # used again: most recent
            expected = [(a, "other") for a in [*addresses[3:], addresses[2]]]
            assert forward.open_channels() == expected[-CHANNELS_MAX:]
        finally:
            await forward.close()
            for server, _ in started:
                await server.stop(grace=None)

    asyncio.run(scenario())
