"""A grpc.aio server interceptor that reports every unary call to the process's recorder.

It is the outermost interceptor, so a call refused by authentication or a limit counts
with the status it got. The API label is the full method name, one of the server's
registered methods: a method the server does not know never reaches a handler, so the
label set is fixed by the service definitions. The outcome code is the gRPC status name
when the call failed at the gRPC level (INVALID_ARGUMENT, UNAUTHENTICATED, ...), else the
name of the raftlog `ErrorCode` the response carries in its `error` field (NOT_LEADER,
UNKNOWN_TOPIC_OR_PARTITION, ...), else OK: both are fixed enumerations. Streaming methods
(health watch, reflection) are not timed: their duration is the client's choice.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.runtime.recorder import recorder
from raftlog.settings import NodeSettings

__all__ = ["RequestMetricsInterceptor", "request_interceptors"]

Handler = Any  # grpc.RpcMethodHandler: generic in the stubs, not subscriptable at run time
Context = Any  # grpc.aio.ServicerContext


def request_interceptors(settings: NodeSettings) -> list[grpc.aio.ServerInterceptor]:
    """The interceptor when the node serves metrics (`--metrics-listen`), else none."""
    return [] if settings.metrics_listen is None else [RequestMetricsInterceptor()]


class RequestMetricsInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        return grpc.unary_unary_rpc_method_handler(
            _timed(handler_call_details.method, handler.unary_unary),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


def _timed(method: str, behavior: Callable[..., Any]) -> Callable[[Any, Context], Awaitable[Any]]:
    api = method.removeprefix("/")

    async def timed(request: Any, context: Context) -> Any:
        started = time.perf_counter()
        response = None
        failed = True
        try:
            result = behavior(request, context)
            response = await result if inspect.isawaitable(result) else result
            failed = False
            return response
        finally:
            recorder().record_request(
                protocol="grpc",
                api=api,
                error_code=_status_name(context, failed=failed) or _error_name(response),
                seconds=time.perf_counter() - started,
            )

    return timed


def _status_name(context: Context, *, failed: bool) -> str | None:
    """The status the call ends with if not OK: the one the handler set or aborted with; a
    handler that raised without one ends UNKNOWN (gRPC's rule)."""
    code = context.code()
    if isinstance(code, grpc.StatusCode) and code is not grpc.StatusCode.OK:
        return str(code.name)
    return "UNKNOWN" if failed else None


def _error_name(response: Any) -> str:
    """The raftlog error a response carries in its `error` field, else OK."""
    try:
        if not response.HasField("error"):
            return "OK"
    except (AttributeError, ValueError):  # not a message, or one without an error field
        return "OK"
    return str(pb.ErrorCode.Name(response.error.code))
