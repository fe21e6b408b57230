"""The transaction coordinator on gRPC, for raftlog's own transactional Producer:
InitProducerId with a transactional id, AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit
and EndTxn on the Log service.

Theory of operation. The same coordinator as on the Kafka wire (`rpc/kafka/txn_handlers.py`):
each request is planned against the controller's metadata copy
(`raftlog.metadata.transaction_plans`) and its command committed through the node port's
`submit`; the command's checks run again at apply, so the code a client sees is judged
against the committed state, and a rejected command writes nothing. Codes are Kafka's, under
the raftlog.v1 names of the same meaning. A node that is not the controller answers
NOT_CONTROLLER naming it (the client follows the hint, as Admin calls do). EndTxn bumps
the epoch at every end and answers it (KIP-890 part 2, as Kafka's EndTxn v5+): the markers
and the next transaction use the new epoch, so a late produce of the ended transaction is
refused INVALID_PRODUCER_EPOCH by the partition instead of joining the next transaction;
at a spent epoch it rotates to a new producer id at epoch 0 (Kafka's nextProducerId). An
AddPartitionsToTxn/AddOffsetsToTxn arriving while the previous end still completes is held
for that completion (`raftlog.rpc.txn_completions.wait_until_completed`, the Kafka
coordinator's hold) instead of being refused CONCURRENT_TRANSACTIONS.
TxnOffsetCommit with a member id is checked against the group coordinator's membership
(KIP-447), as that member's OffsetCommit on the Groups service would be.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from raftlog import errors
from raftlog.metadata.commands import (
    AddToTransaction,
    Command,
    CommitTransactionOffsets,
    ErrorCode,
    InitTransaction,
)
from raftlog.metadata.consumer_groups import GroupErrorCode
from raftlog.metadata.transaction_checks import check_transactional_id
from raftlog.metadata.transaction_plans import (
    NO_PRODUCER_ID,
    Answer,
    needs_new_producer_id,
    needs_next_producer_id,
    plan_end_txn,
    plan_init,
)
from raftlog.metadata.transactions import TRANSACTION_TIMEOUT_MS_MAX
from raftlog.rpc.txn_completions import wait_until_completed
from raftlog.rpc.v1 import raftlog_pb2 as pb
from raftlog.types import PartitionId

if TYPE_CHECKING:
    from raftlog.metadata.consumer_group_service import ConsumerGroupService
    from raftlog.rpc.port import NodePort

__all__ = [
    "TxnPorts",
    "add_offsets_to_txn",
    "add_partitions_to_txn",
    "end_txn",
    "init_transactional_producer",
    "txn_offset_commit",
]

_SUBMIT_TIMEOUT_S = 10.0
_RETRIABLE = frozenset({pb.NOT_CONTROLLER, pb.REQUEST_TIMED_OUT, pb.CONCURRENT_TRANSACTIONS})
# The Groups service's names for the group coordinator's refusals of a member's commit.
_MEMBER_CODES = {
    GroupErrorCode.UNKNOWN_MEMBER_ID: pb.UNKNOWN_MEMBER,
    GroupErrorCode.FENCED_MEMBER_EPOCH: pb.FENCED_MEMBER_EPOCH,
    GroupErrorCode.NOT_OWNER: pb.NOT_PARTITION_OWNER,
}


@dataclass(frozen=True, slots=True)
class TxnPorts:
    """What the coordinator's calls use: the node (its metadata copy, `submit`, the producer id
    allocator) and the consumer-group coordinator (TxnOffsetCommit's member check)."""

    node: NodePort
    groups: ConsumerGroupService


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _error(code: int, message: str, node: NodePort | None = None) -> pb.Error:
    controller = None if node is None else node.controller_id
    return pb.Error(
        code=code,  # type: ignore[arg-type]
        message=message,
        retriable=code in _RETRIABLE,
        leader_id=-1 if controller is None else int(controller),
        leader_address="" if node is None else node.leader_address(controller),
    )


def _result_error(code: ErrorCode, message: str) -> pb.Error | None:
    """The raftlog.v1 code of the metadata code's name (INVALID_REQUEST for one it lacks)."""
    if code is ErrorCode.NONE:
        return None
    names = pb.ErrorCode.keys()
    number = pb.ErrorCode.Value(code.value) if code.value in names else pb.INVALID_REQUEST
    if code in (ErrorCode.UNKNOWN_TOPIC, ErrorCode.UNKNOWN_PARTITION):
        number = pb.UNKNOWN_TOPIC_OR_PARTITION
    return _error(number, f"{code.value}: {message}" if message else code.value)


def _refusal(node: NodePort, transactional_id: str) -> pb.Error | None:
    problem = check_transactional_id(transactional_id)
    if problem is not None:
        return _error(pb.INVALID_REQUEST, problem.message)
    if not node.is_controller():
        return _error(pb.NOT_CONTROLLER, "the controller coordinates transactions", node)
    return None


async def _submit(node: NodePort, command: Command) -> pb.Error | None:
    try:
        result = await node.submit(command, timeout_s=_SUBMIT_TIMEOUT_S)
    except errors.NotLeaderError:
        return _error(pb.NOT_CONTROLLER, "the controller changed", node)
    except (errors.RaftlogError, TimeoutError) as error:
        # The command may have applied: every request here is safe to repeat.
        return _error(pb.REQUEST_TIMED_OUT, f"not committed in time: {error}")
    return _result_error(result.code, result.message)


async def init_transactional_producer(
    ports: TxnPorts, request: pb.InitProducerIdRequest
) -> pb.InitProducerIdResponse:
    """As Kafka's InitProducerId with a transactional id (`rpc/kafka/txn_handlers.py`)."""
    node = ports.node
    refusal = _refusal(node, request.transactional_id)
    timeout_ms = request.transaction_timeout_ms
    if refusal is None and not 1 <= timeout_ms <= TRANSACTION_TIMEOUT_MS_MAX:
        refusal = _error(
            pb.INVALID_TRANSACTION_TIMEOUT,
            f"transaction_timeout_ms must be in [1, {TRANSACTION_TIMEOUT_MS_MAX}], "
            f"got {timeout_ms}",
        )
    if refusal is not None:
        return pb.InitProducerIdResponse(error=refusal)
    state = node.metadata.state
    new_producer_id = None
    if needs_new_producer_id(state, request.transactional_id):
        try:
            new_producer_id = await node.allocate_producer_id(timeout_s=_SUBMIT_TIMEOUT_S)
        except (errors.RaftlogError, TimeoutError) as failure:
            return pb.InitProducerIdResponse(error=_error(pb.REQUEST_TIMED_OUT, str(failure)))
        state = node.metadata.state
    plan = plan_init(state, request.transactional_id, timeout_ms, None, new_producer_id, _now_ms())
    if isinstance(plan, Answer):
        error = _result_error(plan.code, "")
        if error is not None:
            return pb.InitProducerIdResponse(error=error)
        return pb.InitProducerIdResponse(
            producer_id=plan.producer_id, producer_epoch=plan.producer_epoch
        )
    node.txn_completions.expect(request.transactional_id)
    error = await _submit(node, plan.command)
    if error is None and plan.then is not ErrorCode.NONE:
        error = _result_error(plan.then, "the open transaction of an older instance is aborting")
    if error is not None:
        return pb.InitProducerIdResponse(error=error)
    assert isinstance(plan.command, InitTransaction)
    return pb.InitProducerIdResponse(
        producer_id=plan.command.producer_id, producer_epoch=plan.command.producer_epoch
    )


async def add_partitions_to_txn(
    ports: TxnPorts, request: pb.AddPartitionsToTxnRequest
) -> pb.AddPartitionsToTxnResponse:
    refusal = _refusal(ports.node, request.transactional_id)
    if refusal is not None:
        return pb.AddPartitionsToTxnResponse(error=refusal)
    wanted = tuple((tp.topic, PartitionId(p)) for tp in request.partitions for p in tp.partitions)
    await wait_until_completed(
        ports.node, request.transactional_id, request.producer_id, request.producer_epoch
    )
    command = AddToTransaction(
        request.transactional_id,
        request.producer_id,
        request.producer_epoch,
        wanted,
        (),
        _now_ms(),
    )
    return pb.AddPartitionsToTxnResponse(error=await _submit(ports.node, command))


async def add_offsets_to_txn(
    ports: TxnPorts, request: pb.AddOffsetsToTxnRequest
) -> pb.AddOffsetsToTxnResponse:
    refusal = _refusal(ports.node, request.transactional_id)
    if refusal is None and not request.group_id:
        refusal = _error(pb.INVALID_REQUEST, "group_id: must not be empty")
    if refusal is not None:
        return pb.AddOffsetsToTxnResponse(error=refusal)
    await wait_until_completed(
        ports.node, request.transactional_id, request.producer_id, request.producer_epoch
    )
    command = AddToTransaction(
        request.transactional_id,
        request.producer_id,
        request.producer_epoch,
        (),
        (request.group_id,),
        _now_ms(),
    )
    return pb.AddOffsetsToTxnResponse(error=await _submit(ports.node, command))


async def txn_offset_commit(
    ports: TxnPorts, request: pb.TxnOffsetCommitRequest
) -> pb.TxnOffsetCommitResponse:
    """Offsets held pending in the transaction (INVALID_TXN_STATE when its group was not
    added by AddOffsetsToTxn), after the member check (`_member_refusal`)."""
    refusal = _refusal(ports.node, request.transactional_id)
    if refusal is None:
        refusal = _member_refusal(ports, request)
    if refusal is not None:
        return pb.TxnOffsetCommitResponse(error=refusal)
    if not request.offsets:
        return pb.TxnOffsetCommitResponse()
    command = CommitTransactionOffsets(
        request.transactional_id,
        request.producer_id,
        request.producer_epoch,
        request.group_id,
        tuple((o.topic, PartitionId(o.partition), o.offset) for o in request.offsets),
        (),
        (),
    )
    return pb.TxnOffsetCommitResponse(error=await _submit(ports.node, command))


def _member_refusal(ports: TxnPorts, request: pb.TxnOffsetCommitRequest) -> pb.Error | None:
    """KIP-447: a producer committing for a group member (its member id and epoch, from
    `Consumer.group_metadata()`) is checked as that member's OffsetCommit would be
    (`ConsumerGroupCoordinator.check_commit`), so a zombie of a member whose partitions moved
    on cannot commit offsets for them. Without a member id (an assign()ed consumer, or a
    client outside the group) there is nothing to check, as on Kafka."""
    if not request.member_id:
        return None
    if not ports.groups.coordinating():
        # A new controller's membership is rebuilt by the members' next heartbeats.
        return _error(pb.NOT_CONTROLLER, "the group coordinator is not ready", ports.node)
    code, message = ports.groups.coordinator.check_commit(
        request.group_id,
        request.member_id,
        request.member_epoch,
        [(o.topic, o.partition) for o in request.offsets],
    )
    if code is GroupErrorCode.NONE:
        return None
    return _error(_MEMBER_CODES.get(code, pb.INVALID_REQUEST), f"{code.value}: {message}")


async def end_txn(ports: TxnPorts, request: pb.EndTxnRequest) -> pb.EndTxnResponse:
    """EndTxn with the epoch bumped (module docstring); answers the producer id and the epoch
    the next transaction uses (a new producer id at epoch 0 when the epoch was spent)."""
    node = ports.node
    refusal = _refusal(node, request.transactional_id)
    if refusal is not None:
        return pb.EndTxnResponse(error=refusal, producer_id=NO_PRODUCER_ID, producer_epoch=-1)
    next_producer_id = None
    if needs_next_producer_id(node.metadata.state, request.transactional_id, True):
        try:
            next_producer_id = await node.allocate_producer_id(timeout_s=_SUBMIT_TIMEOUT_S)
        except (errors.RaftlogError, TimeoutError) as failure:
            timed_out = _error(pb.REQUEST_TIMED_OUT, str(failure))
            return pb.EndTxnResponse(error=timed_out, producer_id=NO_PRODUCER_ID, producer_epoch=-1)
    plan = plan_end_txn(
        node.metadata.state,
        request.transactional_id,
        request.producer_id,
        request.producer_epoch,
        request.commit,
        True,
        _now_ms(),
        next_producer_id,
    )
    if isinstance(plan, Answer):
        error = _result_error(plan.code, "end of the transaction")
    else:
        node.txn_completions.expect(request.transactional_id)
        error = await _submit(node, plan.command)
    txn = node.metadata.state.transaction(request.transactional_id)
    if error is None and txn is None:
        error = _error(pb.TRANSACTIONAL_ID_NOT_FOUND, "the transactional id expired meanwhile")
    if error is not None or txn is None:
        return pb.EndTxnResponse(error=error, producer_id=NO_PRODUCER_ID, producer_epoch=-1)
    producer_id, producer_epoch = txn.producer_after_end()
    return pb.EndTxnResponse(producer_id=producer_id, producer_epoch=producer_epoch)
