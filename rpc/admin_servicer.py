"""gRPC servicers for cluster metadata: Admin, the Log service's Metadata and InitProducerId,
and the node-to-controller Internal service.

Theory of operation. Reads (Metadata, DescribeTopic, ListTopics, DescribeCluster) answer
from this node's copy of the metadata state, so any node can serve them and a client may
bootstrap anywhere. A node that has just started answers them only once its copy has caught
up (it applied its own registration, `raftlog.metadata.catch_up`): a read waits for that up
to `metadata.catch_up_wait_ms`, then is refused with a retriable NOT_CONTROLLER naming the
controller, so the client asks the controller or another node rather than being told that a
topic created while this node was down does not exist. Writes go to the controller: a node
that is not the controller answers NOT_CONTROLLER with the controller's id and address
(clients retry there), except for node-internal commands (registration, heartbeats, leader
reports), which a node forwards on its own through `Internal.SubmitMetadata`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import TYPE_CHECKING, Any

import grpc

from raftlog import errors
from raftlog.errors import NotControllerError
from raftlog.metadata import (
    AlterTopicConfig,
    ApplyResult,
    CreateTopicRequest,
    ErrorCode,
    MetadataState,
    decode_command,
)
from raftlog.metadata.commands import MetadataDecodeError
from raftlog.rpc.faults import Direction, FaultInjector, LinkFaults
from raftlog.rpc.txn_admin import (
    AbortWait,
    abort_done,
    describe_transaction,
    list_transactions,
    plan_abort,
    transaction_info,
)
from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.rpc.v1 import raftlog_pb2_grpc as pb_grpc
from raftlog.types import NodeId

if TYPE_CHECKING:
    from raftlog.rpc.port import MetadataReadPort, NodePort

__all__ = [
    "AdminServicer",
    "InternalServicer",
    "metadata_read_refusal",
    "metadata_response",
    "result_error",
]

TIMEOUT_MS_DEFAULT = 30_000
TIMEOUT_MS_MAX = 300_000

_RESULT_CODES = {
    ErrorCode.TOPIC_ALREADY_EXISTS: pb.TOPIC_ALREADY_EXISTS,
    ErrorCode.UNKNOWN_TOPIC: pb.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.UNKNOWN_PARTITION: pb.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.INVALID_PARTITIONS: pb.INVALID_PARTITIONS,
    ErrorCode.INVALID_REPLICATION_FACTOR: pb.INVALID_REPLICATION_FACTOR,
    ErrorCode.INVALID_CONFIG: pb.INVALID_CONFIG,
    ErrorCode.INVALID_TXN_STATE: pb.INVALID_TXN_STATE,
}
# How often an abort's answer looks whether the marker duty completed it (a metadata apply).
_ABORT_POLL_S = 0.02


def result_error(result: ApplyResult) -> pb.Error | None:
    if result.ok:
        return None
    return pb.Error(
        code=_RESULT_CODES.get(result.code, pb.INVALID_REQUEST),
        message=f"{result.code.value}: {result.message}",
        retriable=False,
        leader_id=-1,
    )


def _raftlog_error(error: errors.RaftlogError, node: MetadataReadPort) -> pb.Error:
    leader = getattr(error, "leader_hint", None)
    if isinstance(error, NotControllerError):
        code = pb.NOT_CONTROLLER
    elif isinstance(error, errors.RequestTimedOutError | errors.ProposalDroppedError):
        code = pb.REQUEST_TIMED_OUT
    elif isinstance(error, errors.NotLeaderError):
        code = pb.NOT_CONTROLLER
    else:
        code = pb.INVALID_REQUEST
    return pb.Error(
        code=code,
        message=str(error),
        retriable=error.retriable,
        leader_id=-1 if leader is None else leader,
        leader_address="" if leader is None else node.leader_address(leader),
    )


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _timeout_s(timeout_ms: int) -> float:
    return (timeout_ms if 0 < timeout_ms <= TIMEOUT_MS_MAX else TIMEOUT_MS_DEFAULT) / 1000


def topic_proto(node: MetadataReadPort, state: MetadataState, name: str) -> pb.TopicInfo | None:
    topic = state.topic(name)
    if topic is None:
        return None
    partitions = [
        pb.PartitionInfo(
            partition=int(p.partition),
            leader_id=-1 if p.leader_id is None else int(p.leader_id),
            leader_epoch=p.leader_epoch,
            replicas=[int(r) for r in p.replicas],
            high_watermark=node.partition_high_watermark(name, int(p.partition)),
            log_start_offset=node.partition_log_start_offset(name, int(p.partition)),
            adding_replicas=[int(r) for r in p.adding],
            removing_replicas=[int(r) for r in p.removing],
        )
        for p in state.partitions(name)
    ]
    return pb.TopicInfo(
        name=topic.name,
        topic_id=topic.topic_id,
        replication_factor=topic.replication_factor,
        partitions=partitions,
        config=dict(topic.config),
    )


def _nodes(node: MetadataReadPort, state: MetadataState) -> list[pb.Node]:
    return [
        pb.Node(
            node_id=int(n.node_id),
            address=n.client_address,
            alive=n.alive,
            state=n.status,
            metadata_role=node.metadata_role(n.node_id),
        )
        for n in state.nodes()
    ]


def _controller(node: MetadataReadPort) -> int:
    controller = node.controller_id
    return -1 if controller is None else int(controller)


async def metadata_read_refusal(node: MetadataReadPort) -> pb.Error | None:
    """None once this node's copy of the metadata has caught up since it started (waiting
    for that up to `metadata.catch_up_wait_ms`); else a retriable NOT_CONTROLLER naming the
    controller, which Admin clients follow and Metadata clients answer by asking another node.
    """
    if await node.wait_metadata_caught_up():
        return None
    controller = node.controller_id
    return pb.Error(
        code=pb.NOT_CONTROLLER,
        message=(
            f"node {node.node_id} has not caught up with the metadata quorum since it "
            f"started (it has not applied its own registration yet); ask the controller"
        ),
        retriable=True,
        leader_id=-1 if controller is None else int(controller),
        leader_address=node.leader_address(controller),
    )


def metadata_response(node: MetadataReadPort, request: pb.MetadataRequest) -> pb.MetadataResponse:
    state = node.metadata.state
    names = list(request.topics) or [t.name for t in state.topics()]
    topics = [t for t in (topic_proto(node, state, n) for n in names) if t is not None]
    return pb.MetadataResponse(
        cluster_id=state.cluster_id,
        controller_id=_controller(node),
        nodes=_nodes(node, state),
        topics=topics,
    )


class AdminServicer(pb_grpc.AdminServicer):
    def __init__(self, node: NodePort) -> None:
        self._node = node

    async def CreateTopic(
        self, request: pb.CreateTopicRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.CreateTopicResponse:
        try:
            result = await self._node.create_topic(
                CreateTopicRequest(
                    name=request.name,
                    partition_count=request.partitions,
                    replication_factor=request.replication_factor,
                    config=dict(request.config),
                ),
                timeout_s=_timeout_s(request.timeout_ms),
            )
        except errors.RaftlogError as error:
            return pb.CreateTopicResponse(error=_raftlog_error(error, self._node))
        except TimeoutError:
            return pb.CreateTopicResponse(
                error=pb.Error(code=pb.REQUEST_TIMED_OUT, message="create not committed in time")
            )
        error_proto = result_error(result)
        if error_proto is not None:
            return pb.CreateTopicResponse(error=error_proto)
        topic = topic_proto(self._node, self._node.metadata.state, request.name)
        return pb.CreateTopicResponse(topic=topic)

    async def DeleteTopic(
        self, request: pb.DeleteTopicRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DeleteTopicResponse:
        try:
            result = await self._node.delete_topic(
                request.name, timeout_s=_timeout_s(request.timeout_ms)
            )
        except errors.RaftlogError as error:
            return pb.DeleteTopicResponse(error=_raftlog_error(error, self._node))
        except TimeoutError:
            return pb.DeleteTopicResponse(error=pb.Error(code=pb.REQUEST_TIMED_OUT))
        return pb.DeleteTopicResponse(error=result_error(result))

    async def AlterTopicConfig(
        self, request: pb.AlterTopicConfigRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.AlterTopicConfigResponse:
        command = AlterTopicConfig(
            name=request.name,
            set_config=dict(sorted(request.set.items())),
            delete_keys=tuple(sorted(set(request.delete))),
        )
        try:
            result = await self._node.alter_topic_config(
                command, timeout_s=_timeout_s(request.timeout_ms)
            )
        except errors.RaftlogError as error:
            return pb.AlterTopicConfigResponse(error=_raftlog_error(error, self._node))
        except TimeoutError:
            return pb.AlterTopicConfigResponse(error=pb.Error(code=pb.REQUEST_TIMED_OUT))
        error_proto = result_error(result)
        if error_proto is not None:
            return pb.AlterTopicConfigResponse(error=error_proto)
        topic = topic_proto(self._node, self._node.metadata.state, request.name)
        return pb.AlterTopicConfigResponse(topic=topic)

    async def CreatePartitions(
        self, request: pb.CreatePartitionsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.CreatePartitionsResponse:
        try:
            result = await self._node.create_partitions(
                request.name, request.total_count, timeout_s=_timeout_s(request.timeout_ms)
            )
        except errors.RaftlogError as error:
            return pb.CreatePartitionsResponse(error=_raftlog_error(error, self._node))
        except TimeoutError:
            return pb.CreatePartitionsResponse(error=pb.Error(code=pb.REQUEST_TIMED_OUT))
        return pb.CreatePartitionsResponse(error=result_error(result))

    async def DescribeTopic(
        self, request: pb.DescribeTopicRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DescribeTopicResponse:
        refusal = await metadata_read_refusal(self._node)
        if refusal is not None:
            return pb.DescribeTopicResponse(error=refusal)
        topic = topic_proto(self._node, self._node.metadata.state, request.name)
        if topic is None:
            return pb.DescribeTopicResponse(
                error=pb.Error(
                    code=pb.UNKNOWN_TOPIC_OR_PARTITION, message=f"unknown topic {request.name!r}"
                )
            )
        return pb.DescribeTopicResponse(topic=topic)

    async def ListTopics(
        self, request: pb.ListTopicsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListTopicsResponse:
        refusal = await metadata_read_refusal(self._node)
        if refusal is not None:
            return pb.ListTopicsResponse(error=refusal)
        return pb.ListTopicsResponse(
            names=sorted(t.name for t in self._node.metadata.state.topics())
        )

    async def DescribeCluster(
        self, request: pb.DescribeClusterRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DescribeClusterResponse:
        refusal = await metadata_read_refusal(self._node)
        if refusal is not None:
            return pb.DescribeClusterResponse(error=refusal)
        state = self._node.metadata.state
        return pb.DescribeClusterResponse(
            cluster_id=state.cluster_id,
            controller_id=_controller(self._node),
            nodes=_nodes(self._node, state),
        )

    async def DecommissionNode(
        self, request: pb.DecommissionNodeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DecommissionNodeResponse:
        try:
            result = await self._node.decommission_node(
                NodeId(request.node_id), timeout_s=_timeout_s(request.timeout_ms)
            )
        except errors.RaftlogError as error:
            return pb.DecommissionNodeResponse(error=_raftlog_error(error, self._node))
        except TimeoutError:
            return pb.DecommissionNodeResponse(
                error=pb.Error(code=pb.REQUEST_TIMED_OUT, message="decommission not committed")
            )
        return pb.DecommissionNodeResponse(error=result_error(result))

    async def ListTransactions(
        self, request: pb.ListTransactionsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListTransactionsResponse:
        refusal = await metadata_read_refusal(self._node)
        if refusal is not None:
            return pb.ListTransactionsResponse(error=refusal)
        state = self._node.metadata.state
        return list_transactions(state, request, _controller(self._node), _now_ms())

    async def DescribeTransaction(
        self, request: pb.DescribeTransactionRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DescribeTransactionResponse:
        refusal = await metadata_read_refusal(self._node)
        if refusal is not None:
            return pb.DescribeTransactionResponse(error=refusal)
        state = self._node.metadata.state
        return describe_transaction(
            state, request.transactional_id, _controller(self._node), _now_ms()
        )

    async def AbortTransaction(
        self, request: pb.AbortTransactionRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.AbortTransactionResponse:
        """rpc/txn_admin.py: decide the abort (fencing the producer), then wait for the
        marker duty to complete it, so the answer means the markers are written."""
        node, tid = self._node, request.transactional_id
        if not node.is_controller():
            error = NotControllerError(leader_hint=node.controller_id)
            return pb.AbortTransactionResponse(error=_raftlog_error(error, node))
        deadline = time.monotonic() + _timeout_s(request.timeout_ms)
        plan = plan_abort(node.metadata.state, tid, _now_ms())
        if isinstance(plan, pb.Error):
            return pb.AbortTransactionResponse(error=plan)
        if not isinstance(plan, AbortWait):
            try:
                result = await node.submit(plan, timeout_s=_timeout_s(request.timeout_ms))
            except errors.RaftlogError as error:
                return pb.AbortTransactionResponse(error=_raftlog_error(error, node))
            except TimeoutError:
                return pb.AbortTransactionResponse(error=pb.Error(code=pb.REQUEST_TIMED_OUT))
            error_proto = result_error(result)
            if error_proto is not None:
                return pb.AbortTransactionResponse(error=error_proto)
            plan = AbortWait(plan.producer_id)
        while not abort_done(node.metadata.state, tid, plan):
            if time.monotonic() >= deadline:
                message = "abort decided (producer fenced); its ABORT markers not all written yet"
                return pb.AbortTransactionResponse(
                    error=pb.Error(code=pb.REQUEST_TIMED_OUT, message=message, retriable=True)
                )
            await asyncio.sleep(_ABORT_POLL_S)
        txn = node.metadata.state.transaction(tid)
        info = None if txn is None else transaction_info(txn, _controller(node))
        return pb.AbortTransactionResponse(transaction=info, now_ms=_now_ms())


class InternalServicer(pb_grpc.InternalServicer):
    def __init__(self, node: NodePort) -> None:
        self._node = node

    async def SubmitMetadata(
        self, request: pb.SubmitMetadataRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.SubmitMetadataResponse:
        try:
            command = decode_command(request.command)
        except MetadataDecodeError as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"command: {error}")
            raise
        if not self._node.is_controller():
            controller = self._node.controller_id
            return pb.SubmitMetadataResponse(
                error=_raftlog_error(NotControllerError(leader_hint=controller), self._node)
            )
        try:
            result = await self._node.submit(command, timeout_s=_timeout_s(request.timeout_ms))
        except errors.RaftlogError as error:
            return pb.SubmitMetadataResponse(error=_raftlog_error(error, self._node))
        except TimeoutError:
            return pb.SubmitMetadataResponse(error=pb.Error(code=pb.REQUEST_TIMED_OUT))
        return pb.SubmitMetadataResponse(
            result_code=result.code.value,
            result_message=result.message,
            producer_id_first=-1 if result.producer_id_first is None else result.producer_id_first,
        )

    async def SetFaults(
        self, request: pb.SetFaultsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.SetFaultsResponse:
        injector = self._node.faults
        if injector is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"node {self._node.node_id} was not started with --chaos",
            )
            raise AssertionError("unreachable")
        try:
            rules = json.loads(request.rules_json)
            if not isinstance(rules, dict):
                raise ValueError("rules_json: expected a JSON object")
            apply_fault_rules(injector, rules)
        except (ValueError, TypeError, errors.ConfigError) as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"rules_json: {error}")
        return pb.SetFaultsResponse(state_json=fault_state_json(injector))


def apply_fault_rules(injector: FaultInjector, rules: dict[str, object]) -> None:
    """Apply one SetFaults rule object (see rpc/v1/raftlog.proto) to `injector`."""
    directions = {
        "both": Direction.BOTH,
        "outgoing": Direction.OUTGOING,
        "incoming": Direction.INCOMING,
    }
    direction = directions.get(str(rules.get("direction", "both")))
    if direction is None:
        raise ValueError(
            f"direction: expected one of {sorted(directions)}, got {rules.get('direction')!r}"
        )
    if rules.get("heal"):
        injector.heal()
    for peer in _peer_list(rules, "block"):
        injector.block(peer, direction=direction)
    for peer in _peer_list(rules, "unblock"):
        injector.unblock(peer, direction=direction)
    link = rules.get("link")
    if link is not None:
        if not isinstance(link, dict):
            raise ValueError("link: expected an object")
        fields = dict(link)
        peer = fields.pop("peer", None)
        injector.set_link(None if peer is None else NodeId(int(peer)), LinkFaults(**fields))
    hold = rules.get("hold_txn_markers")  # {"hold_txn_markers": true|false} (tests)
    if hold is not None:
        if not isinstance(hold, bool):
            raise ValueError(f"hold_txn_markers: expected true or false, got {hold!r}")
        injector.hold_txn_markers(hold)
    clock = rules.get("clock")  # {"clock": {"offset_ms": N, "rate": R}} (the chaos suite)
    if clock is not None:
        if not isinstance(clock, dict) or not set(clock) <= {"offset_ms", "rate"}:
            raise ValueError(f"clock: expected an object with offset_ms and/or rate, got {clock!r}")
        offset_ms, rate = clock.get("offset_ms"), clock.get("rate")
        if not isinstance(offset_ms, int | None) or not isinstance(rate, int | float | None):
            raise ValueError(f"clock: offset_ms must be an integer, rate a number: {clock!r}")
        injector.set_clock(offset_ms=offset_ms, rate=None if rate is None else float(rate))


def _peer_list(rules: dict[str, object], key: str) -> list[NodeId]:
    value = rules.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, int) for v in value):
        raise ValueError(f"{key}: expected a list of node ids, got {value!r}")
    return [NodeId(v) for v in value]


def fault_state_json(injector: FaultInjector) -> str:
    state = injector.state()
    return json.dumps(
        {
            "blocked_outgoing": sorted(state.blocked_outgoing),
            "blocked_incoming": sorted(state.blocked_incoming),
            "default_link": dataclasses.asdict(state.default_link),
            "links": {str(k): dataclasses.asdict(v) for k, v in sorted(state.links.items())},
            "counters": dataclasses.asdict(injector.counters),
            "clock": {"offset_ms": injector.clock.offset_ms, "rate": injector.clock.rate},
            "hold_txn_markers": injector.holds_txn_markers,
        },
        sort_keys=True,
    )
