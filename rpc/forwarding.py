"""Forwarding a metadata command to the controller (Internal.SubmitMetadata).

A node that is not the controller forwards its own liveness heartbeat every
`metadata.node_heartbeat_interval_ms`, its leadership reports and its clients' admin
commands. Each forward goes over a channel kept open per (controller address, lane) and
reused: a channel per call costs a TCP and HTTP/2 handshake on both nodes and, on the
controller, a new connection to admit (raftlog.rpc.security.ConnectionLimits reads the
kernel's TCP table for each), which was most of an idle node's CPU.

Liveness (registrations and heartbeats) has a lane, hence a connection, of its own: the
controller bounds the calls in flight per connection (`client_requests_in_flight_max`), and
a burst of leadership reports after a thousand elections must not get a heartbeat refused.
At most `CHANNELS_MAX` channels stay open, the least recently used closed first (the
controller moves rarely). A failed call leaves its channel open: closing it would cancel the
other calls in flight on it, and gRPC reconnects a channel by itself.
"""

from __future__ import annotations

from typing import Literal

import grpc

from raftlog.errors import NotControllerError
from raftlog.metadata import ApplyResult, Command, ErrorCode
from raftlog.metadata.commands import encode_command
from raftlog.rpc.security import bearer_metadata
from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.rpc.v1 import raftlog_pb2_grpc as pb_grpc
from raftlog.types import NodeId

__all__ = ["CHANNELS_MAX", "ControllerForwarder", "Lane"]

CHANNELS_MAX = 8

Lane = Literal["liveness", "other"]


class ControllerForwarder:
    """Calls Internal.SubmitMetadata on the node at a client address, with the node's TLS
    credentials (None: in clear) and token (None: none)."""

    def __init__(self, *, credentials: grpc.ChannelCredentials | None, token: str | None) -> None:
        self._credentials = credentials
        self._token = token
        # Insertion-ordered: the least recently used first.
        self._channels: dict[tuple[str, Lane], grpc.aio.Channel] = {}

    async def __call__(
        self, address: str, command: Command, timeout_s: float, *, lane: Lane = "other"
    ) -> ApplyResult:
        if not address:
            raise NotControllerError(leader_hint=None)
        request = pb.SubmitMetadataRequest(
            command=encode_command(command), timeout_ms=int(timeout_s * 1000)
        )
        channel = await self._channel((address, lane))
        stub = pb_grpc.InternalStub(channel)  # type: ignore[no-untyped-call]
        try:
            response = await stub.SubmitMetadata(
                request, timeout=timeout_s, metadata=bearer_metadata(self._token)
            )
        except grpc.aio.AioRpcError as error:
            # The controller we knew is unreachable (dead, or an election is under way) or
            # refused the call for now: retriable, with no hint until this node learns more.
            raise NotControllerError(leader_hint=None) from error
        if response.HasField("error") and response.error.code != pb.NONE:
            hint = response.error.leader_id
            raise NotControllerError(leader_hint=None if hint < 0 else NodeId(hint))
        first = response.producer_id_first
        return ApplyResult(
            ErrorCode(response.result_code),
            response.result_message,
            producer_id_first=None if first < 0 else first,
        )

    async def _channel(self, key: tuple[str, Lane]) -> grpc.aio.Channel:
        channel = self._channels.pop(key, None)
        if channel is None:
            while len(self._channels) >= CHANNELS_MAX:
                await self._discard(next(iter(self._channels)))
            address, _ = key
            # Channels to one target share a connection through gRPC's global subchannel
            # pool; a pool of its own gives each lane its own connection.
            options = (("grpc.use_local_subchannel_pool", 1),)
            channel = (
                grpc.aio.insecure_channel(address, options)
                if self._credentials is None
                else grpc.aio.secure_channel(address, self._credentials, options)
            )
        self._channels[key] = channel  # now the most recently used
        assert len(self._channels) <= CHANNELS_MAX
        return channel

    async def _discard(self, key: tuple[str, Lane]) -> None:
        channel = self._channels.pop(key, None)
        if channel is not None:
            await channel.close()

    def open_channels(self) -> list[tuple[str, Lane]]:
        """The (address, lane) of every open channel, least recently used first."""
        return list(self._channels)

    async def close(self) -> None:
        for key in list(self._channels):
            await self._discard(key)
