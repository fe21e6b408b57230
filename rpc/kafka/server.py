"""The Kafka listener: one asyncio server, one protocol object per client connection.

Theory of operation. Bytes go into the connection's `FrameDecoder`; each whole frame is
decoded (header, then body with kio) and its handler started at once as a task, so a client
that pipelines requests (a producer with several in flight) has them all under way, and
handlers start in arrival order (a partition sees a producer's batches in the order sent).
A Produce that has to wait for an earlier request of another kind (`predecessors`) holds
back every later Produce until its own handler has begun: the task of a request whose wait
just ended runs a turn of the loop later, and a Produce arriving in that turn, with nothing
left to wait for, would reach the partition first, where the producer's next batch is
refused OUT_OF_ORDER_SEQUENCE (fatal to librdkafka) and the batch before it acknowledged.

Responses leave strictly in request order, as Kafka requires: a handler's task, once its
handler returns, writes its own response if it is the oldest pending request, then every
later one already answered (`_write_answered`); one that finishes early leaves its response
for the task of the request before it. The response is thus written in the same turn that
answered it, with no writer task to wake in between. At most
`kafka.requests_in_flight_max` requests are pending per connection; beyond it the
connection stops reading, so a client cannot queue unbounded work. Anything that cannot be
decoded closes the connection (the stream can no longer be trusted) and touches nothing
else: other connections, and the node, go on serving.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import dataclasses
import logging
import ssl as ssl_module
from collections.abc import Coroutine
from typing import Any, cast

from kio.schema.errors import ErrorCode

from raftlog.config import NodeConfig
from raftlog.metadata.consumer_group_service import ConsumerGroupService, monotonic_ms
from raftlog.rpc.kafka.apis import API_VERSIONS, APIS, api_versions_response
from raftlog.rpc.kafka.auth import SASL_AUTHENTICATE, SASL_HANDSHAKE, Session
from raftlog.rpc.kafka.auto_create import AutoTopicCreator
from raftlog.rpc.kafka.classic_group_coordinator import ClassicGroups
from raftlog.rpc.kafka.context import KafkaContext
from raftlog.rpc.kafka.frame import (
    FrameDecoder,
    FrameError,
    RequestHeader,
    decode_body,
    decode_header,
    response_frame,
)
from raftlog.rpc.kafka.schema import Chunks, request_is_flexible, request_reader, response_writer
from raftlog.rpc.kafka.topic_regex import TopicRegexes
from raftlog.rpc.port import NodePort
from raftlog.rpc.security import AccessControl
from raftlog.runtime.produce_trace import RequestTrace
from raftlog.runtime.produce_trace import begin as begin_produce_trace
from raftlog.types import NodeId

__all__ = ["KafkaListener"]

log = logging.getLogger(__name__)

# What a connection may send before it authenticated (when the node has a token file).
_BEFORE_AUTH = frozenset({API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE})

PRODUCE_API_KEY = 0  # Kafka's Produce (rpc.kafka.log_handlers.PRODUCE)


@dataclasses.dataclass(slots=True, eq=False)
class _Pending:
    """A request on its way: its handler's task until `answered` (then its response, None
    for none, or the handler's error)."""

    header: RequestHeader
    version: int
    task: asyncio.Task[None] | None = None
    answered: bool = False
    response: Any | None = None
    error: BaseException | None = None
    # The produce being timed stage by stage (produce_trace), if any.
    trace: RequestTrace | None = None
    # A Produce that waits for earlier requests: done once its handler has begun, which
    # later Produce requests wait for (None: it began in its task's first step).
    began: asyncio.Future[None] | None = None

    def answer(self, response: Any | None) -> None:
        self.response, self.answered = response, True


class KafkaListener:
    def __init__(
        self,
        node: NodePort,
        *,
        consumer_groups: ConsumerGroupService,
        config: NodeConfig,
        node_id: NodeId,
        kafka_address: str,
        access: AccessControl | None = None,
    ) -> None:
        self._access = access
        groups = ClassicGroups(
            clock_ms=monotonic_ms,
            groups_max=config.metadata.groups_max,
            members_max=config.metadata.group_members_max,
            initial_rebalance_delay_ms=config.kafka.group_initial_rebalance_delay_ms,
        )
        self._context = KafkaContext(
            node=node,
            controller_term=consumer_groups.controller_term,
            node_config=config,
            node_id=node_id,
            kafka_address=kafka_address,
            groups=groups,
            consumer_groups=consumer_groups,
            topic_regexes=TopicRegexes(
                members_max=config.kafka.topic_regex_members_max,
                pattern_chars_max=config.kafka.topic_regex_chars_max,
                memory_bytes_max=config.kafka.topic_regex_memory_bytes_max,
            ),
            session=Session(access),
            auto_topics=AutoTopicCreator(node, config.kafka),
        )
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        self.bound_port = 0

    async def start(
        self, host: str, port: int, *, ssl: ssl_module.SSLContext | None = None
    ) -> None:
        """Listen on host:port; with `ssl`, every connection is TLS (Kafka's SSL/SASL_SSL)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._accept, host, port, ssl=ssl)
        self.bound_port = self._server.sockets[0].getsockname()[1]

    def _accept(self) -> _Connection:
        context = dataclasses.replace(self._context, session=Session(self._access))
        return _Connection(context, self._connections)

    async def close(self) -> None:
        """Stop accepting, abort every open connection (their pending requests are cancelled,
        unanswered) and wait until the server has closed."""
        if self._server is not None:
            self._server.close()
        self._context.auto_topics.close()
        for connection in list(self._connections):
            connection.abort("listener closing")
        if self._server is not None:
            await self._server.wait_closed()


class _Connection(asyncio.Protocol):
    def __init__(self, context: KafkaContext, registry: set[_Connection]) -> None:
        self._context = context
        self._registry = registry
        self._decoder = FrameDecoder(frame_bytes_max=context.config.frame_bytes_max)
        self._pending: collections.deque[_Pending] = collections.deque()
        self._transport: asyncio.Transport | None = None
        self._writable = True
        self._reading_paused = False
        self._peer = "?"

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Register the connection, or abort it at once when `kafka.connections_max` connections are
        already open."""
        # Not checked with isinstance: uvloop's transports do not subclass asyncio.Transport.
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        self._peer = str(transport.get_extra_info("peername"))
        if len(self._registry) >= self._context.config.connections_max:
            log.warning("kafka: refusing %s: kafka.connections_max reached", self._peer)
            transport.abort()
            return
        self._registry.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the connection and cancel its pending handlers; their responses have nowhere to
        go."""
        self._registry.discard(self)
        self._transport = None
        pending, self._pending = self._pending, collections.deque()
        for request in pending:
            if request.task is not None:
                request.task.cancel()

    def pause_writing(self) -> None:
        """Transport buffer full: answered responses wait until `resume_writing`."""
        self._writable = False

    def resume_writing(self) -> None:
        """Transport buffer drained: write the responses that waited."""
        self._writable = True
        self._write_answered()

    def data_received(self, data: bytes) -> None:
        """Buffer `data` and start a handler for every whole frame, unless reading is paused at
        `kafka.requests_in_flight_max`; a frame that does not decode (FrameError) aborts the
        connection."""
        self._decoder.receive_data(data)
        try:
            while self._transport is not None and not self._reading_paused:
                frame = self._decoder.next_frame()
                if frame is None:
                    return
                try:
                    self._dispatch(frame)
                except FrameError:
                    log.debug("kafka: undecodable frame %s", frame[:256].hex())
                    raise
        except FrameError as error:
            self.abort(str(error))

    # -- requests ------------------------------------------------------------------------

    def _dispatch(self, frame: bytes) -> None:
        request = self._start(frame)
        self._pending.append(request)
        if len(self._pending) >= self._context.config.requests_in_flight_max:
            self._pause_reading()
        if request.answered:
            self._write_answered()

    def _start(self, frame: bytes) -> _Pending:
        """Decode `frame` and start its handler (or answer it at once); raises FrameError
        for what cannot be."""
        header, _ = decode_header(frame, flexible=False)
        # Timed from here, the frame just taken off the connection; None unless metrics
        # are served.
        trace = begin_produce_trace("kafka") if header.api_key == PRODUCE_API_KEY else None
        api = APIS.get(header.api_key)
        if api is None:
            raise FrameError(f"unknown api key {header.api_key}")
        if not api.supports(header.api_version):
            if header.api_key != API_VERSIONS:
                raise FrameError(
                    f"{api.name} v{header.api_version} is not supported (versions "
                    f"{api.version_min}-{api.version_max})"
                )
            unsupported = _Pending(header, 0)
            unsupported.answer(api_versions_response(0, ErrorCode.unsupported_version))
            return unsupported
        if self._context.session.principal is None and header.api_key not in _BEFORE_AUTH:
            raise FrameError(f"{api.name} before SASL authentication")
        flexible = request_is_flexible(header.api_key, header.api_version)
        header, offset = decode_header(frame, flexible=flexible)
        what = f"{api.name} v{header.api_version}"
        request = decode_body(
            frame, offset, request_reader(header.api_key, header.api_version), what=what
        )
        if header.client_id != self._context.client_id:
            self._context = dataclasses.replace(self._context, client_id=header.client_id or "")
        loop = asyncio.get_running_loop()
        pending = _Pending(header, header.api_version, trace=trace)
        handler = in_order(
            self._pending, pending, api.handler(self._context, request, header.api_version)
        )
        if trace is None:
            pending.task = loop.create_task(self._serve(pending, handler))
            return pending
        # The handler's task, and the per-partition tasks it starts, see the trace.
        context = contextvars.copy_context()
        context.run(trace.attach)
        pending.task = loop.create_task(self._serve(pending, handler), context=context)
        return pending

    async def _serve(self, pending: _Pending, handler: Coroutine[Any, Any, Any | None]) -> None:
        """Run the handler, then write every response now due, in this same step."""
        try:
            response = await handler
        except asyncio.CancelledError:
            raise
        except Exception as error:
            pending.error = error
            pending.answered = True
        else:
            pending.answer(response)
        self._write_answered()

    def _write_answered(self) -> None:
        """Write the responses of the oldest requests, in order, while they are answered
        (and the transport takes more)."""
        while self._pending and self._pending[0].answered and self._transport is not None:
            if not self._writable:
                return  # resume_writing comes back here
            pending = self._pending.popleft()
            if pending.error is not None:
                log.error(
                    "kafka: api %s from %s failed",
                    pending.header.api_key,
                    self._peer,
                    exc_info=pending.error,
                )
                self.abort("handler failed")
                return
            if pending.response is not None and not self._write(pending):
                return
            if self._reading_paused and len(self._pending) < self._resume_at():
                self._resume_reading()

    def _write(self, pending: _Pending) -> bool:
        """Write `pending`'s response; False if the connection was aborted instead."""
        header, version = pending.header, pending.version
        try:
            self._send(header, version, pending.response)
        except Exception:
            log.exception("kafka: api %s v%s: response does not encode", header.api_key, version)
            self.abort("response does not encode")
            return False
        if pending.trace is not None:
            pending.trace.finish()
        if header.api_key == SASL_AUTHENTICATE and self._context.session.principal is None:
            self.abort("SASL authentication failed")
            return False
        return True

    def _send(self, header: RequestHeader, version: int, response: Any) -> None:
        body = Chunks()
        response_writer(header.api_key, version)(body, response)
        # ApiVersions answers with header v0 whatever its version, so that a client can
        # read it before it knows which versions the node speaks.
        flexible = header.api_key != API_VERSIONS and request_is_flexible(header.api_key, version)
        assert self._transport is not None
        self._transport.writelines(
            response_frame(header.correlation_id, body.pieces, flexible=flexible)
        )

    def _resume_at(self) -> int:
        return max(1, self._context.config.requests_in_flight_max // 2)

    def _pause_reading(self) -> None:
        if self._transport is not None and not self._reading_paused:
            self._reading_paused = True
            self._transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._transport is not None and self._reading_paused:
            self._reading_paused = False
            self._transport.resume_reading()
            self.data_received(b"")  # frames that arrived while paused

    def abort(self, reason: str) -> None:
        """Close the connection at once, unflushed, logging `reason`; a no-op once it is closed."""
        if self._transport is not None:
            log.info("kafka: closing connection from %s: %s", self._peer, reason)
            # Nothing more is read or written (handlers still running find no transport).
            transport, self._transport = self._transport, None
            transport.abort()


def in_order(
    pending: collections.deque[_Pending],
    request: _Pending,
    handler: Coroutine[Any, Any, Any | None],
) -> Coroutine[Any, Any, Any | None]:
    """`handler` of the connection's new `request`, to run once the connection's `pending`
    requests (oldest first) that it must follow allow (`predecessors`)."""
    earlier = predecessors(pending, request.header.api_key)
    if earlier and request.header.api_key == PRODUCE_API_KEY:
        request.began = asyncio.get_running_loop().create_future()
    return _after(earlier, request.began, handler)


def predecessors(pending: collections.deque[_Pending], api_key: int) -> list[asyncio.Future[None]]:
    """What a new request of the connection waits for before its handler begins, given the
    connection's `pending` requests (oldest first).

    Kafka serves a connection's requests one at a time, and clients count on it: librdkafka
    pipelines EndTxn behind AddPartitionsToTxn, which must see the partitions added. Only
    Produce requests overlap one another (a pipelining producer's batches): any other
    request waits until every earlier one is served. A Produce waits until every earlier
    request of another kind is served, and until every earlier Produce that had to wait has
    begun (`_Pending.began`); one that did not wait began in its task's first step, which
    runs before this one's. Each partition thus sees a producer's batches in the order sent.
    """
    waits: list[asyncio.Future[None]] = []
    for earlier in pending:
        if earlier.answered or earlier.task is None:
            continue
        if api_key != PRODUCE_API_KEY or earlier.header.api_key != PRODUCE_API_KEY:
            waits.append(earlier.task)
        elif earlier.began is not None and not earlier.began.done():
            waits.append(earlier.began)
    return waits


async def _after(
    earlier: list[asyncio.Future[None]],
    began: asyncio.Future[None] | None,
    handler: Coroutine[Any, Any, Any | None],
) -> Any | None:
    """Run `handler` once everything in `earlier` is done (whatever the outcome), and mark
    `began` done right behind the handler's first step.

    `began` is completed by a callback queued *before* the handler runs: the handler's
    first step queues its partition calls first (asyncio runs callbacks in the order
    queued), so a later Produce, woken by `began`, queues its own calls behind them."""
    try:
        if earlier:
            await asyncio.wait(earlier)
    except BaseException:
        handler.close()  # never started: no "never awaited" warning
        if began is not None and not began.done():
            began.set_result(None)  # the connection is going: nothing waits for order
        raise
    if began is not None:
        asyncio.get_running_loop().call_soon(_begin, began)
    return await handler


def _begin(began: asyncio.Future[None]) -> None:
    if not began.done():
        began.set_result(None)
