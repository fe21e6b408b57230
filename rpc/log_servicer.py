"""gRPC servicers of the raftlog.v1 API: requests in, node calls, responses out.

Theory of operation. This module is the only place that knows both protobuf and the broker's
exception tree. Each handler validates the request eagerly (a malformed request as a whole is
INVALID_ARGUMENT with a message naming the field), calls the node, and maps every raftlog
error onto the per-partition `Error` message (code, message, retriable, leader hint), so one
bad partition never fails a connection and clients always learn where the leader went.
Unexpected exceptions are not swallowed: gRPC turns them into INTERNAL and the log records them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

from raftlog import errors
from raftlog.metadata.state import ALLOCATED_PRODUCER_ID_LIMIT
from raftlog.rpc import txn_producer_calls as txn_calls
from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.rpc.v1 import raftlog_pb2_grpc as pb_grpc
from raftlog.runtime.produce_trace import begin as begin_produce_trace
from raftlog.types import Commitment

if TYPE_CHECKING:
    from raftlog.metadata.consumer_group_service import ConsumerGroupService
    from raftlog.rpc.port import MetadataReadPort, NodePort

__all__ = ["LogServicer", "error_proto"]

FETCH_BYTES_MAX = 64 * 1024 * 1024
WAIT_MS_MAX = 60_000
TIMEOUT_MS_MAX = 300_000

_ACKS = {
    pb.ACKS_ALL: Commitment.QUORUM,
    pb.ACKS_LEADER: Commitment.LEADER,
    pb.ACKS_NONE: Commitment.NONE,
}

# Most specific first: LeaderNotReadyError is also a NotLeaderError.
_CODES: list[tuple[type[errors.RaftlogError], int]] = [
    (errors.NotControllerError, pb.NOT_CONTROLLER),
    (errors.LeaderNotReadyError, pb.NOT_LEADER),
    (errors.NotLeaderError, pb.NOT_LEADER),
    (errors.UnknownTopicOrPartitionError, pb.UNKNOWN_TOPIC_OR_PARTITION),
    (errors.BatchTooLargeError, pb.BATCH_TOO_LARGE),
    (errors.BatchOverSegmentError, pb.BATCH_TOO_LARGE),
    (errors.CorruptBatchError, pb.CORRUPT_BATCH),
    (errors.RequestTimedOutError, pb.REQUEST_TIMED_OUT),
    (errors.OffsetOutOfRangeError, pb.OFFSET_OUT_OF_RANGE),
    (errors.OutOfOrderSequenceError, pb.OUT_OF_ORDER_SEQUENCE),
    (errors.InvalidRecordError, pb.INVALID_RECORD),
    (errors.ProducerFencedError, pb.INVALID_PRODUCER_EPOCH),
    (errors.PolicyViolationError, pb.POLICY_VIOLATION),
    (errors.ProposalDroppedError, pb.NOT_ENOUGH_REPLICAS),
]


def error_proto(error: errors.RaftlogError, node: MetadataReadPort) -> pb.Error:
    code = next((c for kind, c in _CODES if isinstance(error, kind)), pb.INVALID_REQUEST)
    leader = getattr(error, "leader_hint", None)
    return pb.Error(
        code=code,  # type: ignore[arg-type]
        message=str(error),
        retriable=error.retriable,
        leader_id=-1 if leader is None else leader,
        leader_address="" if leader is None else node.leader_address(leader),
    )


async def _invalid(context: grpc.aio.ServicerContext[Any, Any], message: str) -> None:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)


async def _check_partition(
    context: grpc.aio.ServicerContext[Any, Any], topic: str, partition: int
) -> None:
    if not topic:
        await _invalid(context, "topic: must not be empty")
    if partition < 0:
        await _invalid(context, f"partition: must be >= 0, got {partition}")


def _coordinator_handler(
    call: Callable[[txn_calls.TxnPorts, Any], Awaitable[Any]],
) -> Callable[[LogServicer, Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]:
    """A Log handler that hands its request to the transaction coordinator's `call`
    (`rpc/txn_producer_calls.py`), which answers every refusal in the response's `error`."""

    async def handle(
        servicer: LogServicer, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        return await call(servicer.txn_ports, request)

    return handle


class LogServicer(pb_grpc.LogServicer):
    def __init__(self, node: NodePort, groups: ConsumerGroupService) -> None:
        self._node = node
        self.txn_ports = txn_calls.TxnPorts(node, groups)

    AddPartitionsToTxn = _coordinator_handler(txn_calls.add_partitions_to_txn)
    AddOffsetsToTxn = _coordinator_handler(txn_calls.add_offsets_to_txn)
    TxnOffsetCommit = _coordinator_handler(txn_calls.txn_offset_commit)
    EndTxn = _coordinator_handler(txn_calls.end_txn)

    async def Produce(
        self, request: pb.ProduceRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ProduceResponse:
        trace = begin_produce_trace("grpc")
        if trace is None:
            return await self._produce(request, context)
        # The handler runs in a task of its own: the trace is this request's alone.
        token = trace.attach()
        try:
            return await self._produce(request, context)
        finally:
            trace.detach(token)
            trace.finish()

    async def _produce(
        self, request: pb.ProduceRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ProduceResponse:
        await _check_partition(context, request.topic, request.partition)
        if not request.batches:
            await _invalid(context, "batches: at least one record batch is required")
        if request.acks not in _ACKS:
            await _invalid(context, f"acks: unknown value {request.acks}")
        if not 0 <= request.timeout_ms <= TIMEOUT_MS_MAX:
            await _invalid(context, f"timeout_ms: must be in [0, {TIMEOUT_MS_MAX}]")
        timeout_s = (request.timeout_ms or 30_000) / 1000
        try:
            result = await self._node.produce(
                request.topic,
                request.partition,
                list(request.batches),
                commitment=_ACKS[request.acks],
                timeout_s=timeout_s,
            )
        except errors.RaftlogError as error:
            return pb.ProduceResponse(error=error_proto(error, self._node))
        return pb.ProduceResponse(
            base_offset=result.base_offset,
            last_offset=result.last_offset,
            high_watermark=result.high_watermark,
            log_append_time_ms=-1,
        )

    async def Fetch(
        self, request: pb.FetchRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.FetchResponse:
        await _check_partition(context, request.topic, request.partition)
        if request.offset < 0:
            await _invalid(context, f"offset: must be >= 0, got {request.offset}")
        if not 0 < request.max_bytes <= FETCH_BYTES_MAX:
            await _invalid(context, f"max_bytes: must be in [1, {FETCH_BYTES_MAX}]")
        if not 0 <= request.max_wait_ms <= WAIT_MS_MAX:
            await _invalid(context, f"max_wait_ms: must be in [0, {WAIT_MS_MAX}]")
        if request.isolation_level not in (0, 1):
            await _invalid(
                context, f"isolation_level: must be 0 or 1, got {request.isolation_level}"
            )
        try:
            result = await self._node.fetch(
                request.topic,
                request.partition,
                request.offset,
                bytes_max=request.max_bytes,
                wait_ms_max=request.max_wait_ms,
                bytes_min=max(1, request.min_bytes),
                allow_follower=request.read_from_follower,
                read_committed=request.isolation_level == 1,
            )
        except errors.RaftlogError as error:
            return pb.FetchResponse(error=error_proto(error, self._node))
        return pb.FetchResponse(
            batches=result.batches,
            high_watermark=result.high_watermark,
            log_start_offset=result.log_start_offset,
            leader_epoch=result.leader_epoch,
            last_stable_offset=result.last_stable_offset,
            aborted_transactions=[
                pb.AbortedTransaction(producer_id=a.producer_id, first_offset=a.first_offset)
                for a in result.aborted_transactions or ()
            ],
        )

    async def ListOffsets(
        self, request: pb.ListOffsetsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListOffsetsResponse:
        await _check_partition(context, request.topic, request.partition)
        if request.spec not in (pb.EARLIEST, pb.LATEST, pb.TIMESTAMP):
            await _invalid(context, f"spec: unknown value {request.spec}")
        if request.isolation_level not in (0, 1):
            await _invalid(
                context, f"isolation_level: must be 0 or 1, got {request.isolation_level}"
            )
        try:
            offset = self._node.list_offsets(
                request.topic,
                request.partition,
                request.spec,
                request.timestamp_ms,
                read_committed=request.isolation_level == 1,
            )
        except errors.RaftlogError as error:
            return pb.ListOffsetsResponse(error=error_proto(error, self._node))
        return pb.ListOffsetsResponse(offset=offset)

    async def DeleteRecords(
        self, request: pb.DeleteRecordsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DeleteRecordsResponse:
        await _check_partition(context, request.topic, request.partition)
        if not 0 <= request.timeout_ms <= TIMEOUT_MS_MAX:
            await _invalid(context, f"timeout_ms: must be in [0, {TIMEOUT_MS_MAX}]")
        (answer,) = await self._node.delete_records(
            [(request.topic, request.partition, request.offset)],
            timeout_s=(request.timeout_ms or 30_000) / 1000,
        )
        if isinstance(answer, errors.RaftlogError):
            return pb.DeleteRecordsResponse(error=error_proto(answer, self._node))
        return pb.DeleteRecordsResponse(low_watermark=answer)

    async def Metadata(
        self, request: pb.MetadataRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.MetadataResponse:
        from raftlog.rpc.admin_servicer import metadata_read_refusal, metadata_response

        refusal = await metadata_read_refusal(self._node)
        if refusal is not None:
            return pb.MetadataResponse(error=refusal)
        return metadata_response(self._node, request)

    async def InitProducerId(
        self, request: pb.InitProducerIdRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.InitProducerIdResponse:
        if request.transactional_id:
            return await txn_calls.init_transactional_producer(self.txn_ports, request)
        try:
            producer_id = await self._node.allocate_producer_id(timeout_s=10.0)
        except errors.RaftlogError as error:
            return pb.InitProducerIdResponse(error=error_proto(error, self._node))
        except TimeoutError:
            return pb.InitProducerIdResponse(
                error=pb.Error(code=pb.REQUEST_TIMED_OUT, message="no producer id in time")
            )
        # Ids from 2**62 up belong to clients that derive their own (the Spark sink).
        assert 0 <= producer_id < ALLOCATED_PRODUCER_ID_LIMIT, producer_id
        return pb.InitProducerIdResponse(producer_id=producer_id, producer_epoch=0)

    async def DescribeProducers(
        self, request: pb.DescribeProducersRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DescribeProducersResponse:
        await _check_partition(context, request.topic, request.partition)
        if request.producer_id < 0:
            await _invalid(context, f"producer_id: must be >= 0, got {request.producer_id}")
        try:
            state = self._node.describe_producer(
                request.topic, request.partition, request.producer_id
            )
        except errors.RaftlogError as error:
            return pb.DescribeProducersResponse(error=error_proto(error, self._node))
        if state is None:
            return pb.DescribeProducersResponse(
                known=False, producer_epoch=-1, last_sequence=-1, last_offset=-1
            )
        epoch, last_sequence, last_offset = state
        return pb.DescribeProducersResponse(
            known=True, producer_epoch=epoch, last_sequence=last_sequence, last_offset=last_offset
        )
