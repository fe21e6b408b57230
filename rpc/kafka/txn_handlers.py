"""The transaction coordinator on the Kafka wire: InitProducerId with a transactional id,
AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit, DescribeTransactions and
ListTransactions (KIP-98, KIP-447, KIP-664, KIP-890).

Theory of operation. The controller is every transactional id's coordinator
(FindCoordinator with key type TRANSACTION names it). A request is planned against the
controller's metadata copy (`raftlog.metadata.transaction_plans`), its command committed by
Raft through the node port's `submit`, and answered from the command's result: the checks of
`raftlog.metadata.transaction_checks` run again at apply, so the codes a client sees are
decided against the committed state, and a rejected command writes nothing. EndTxn is
answered once its PrepareCommit/PrepareAbort is committed; the controller's marker duty
(`raftlog.node.txn_markers`) writes the markers and completes it. The producer's next
AddPartitionsToTxn/AddOffsetsToTxn, sent meanwhile, is held until that completion and
proposed right behind it (`raftlog.rpc.txn_completions.wait_until_completed`, shared with the
gRPC coordinator), not refused CONCURRENT_TRANSACTIONS as Kafka does. EndTxn v5 at a spent
epoch rotates the producer id (Kafka's nextProducerId): it answers the new id at epoch 0.

Authorization: with a token file, a transactional id is used by a principal granted `write`
on the name `transactional_id:<id>` (a "*" grant covers it; topics cannot contain ':', so
the two namespaces never meet); anything else is TRANSACTIONAL_ID_AUTHORIZATION_FAILED.
AddPartitionsToTxn also needs `write` on each topic (TOPIC_AUTHORIZATION_FAILED), and its
v4+ form, which Kafka reserves for brokers, needs `cluster` (CLUSTER_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Sequence
from typing import Any

from kio.schema.errors import ErrorCode
from kio.static.primitive import i32Timedelta

from raftlog import errors
from raftlog.metadata import ErrorCode as MetadataErrorCode
from raftlog.metadata.commands import (
    AddToTransaction,
    Command,
    CommitTransactionOffsets,
    InitTransaction,
)
from raftlog.metadata.consumer_groups import GroupErrorCode
from raftlog.metadata.model import NO_EPOCH
from raftlog.metadata.transaction_checks import check_transactional_id
from raftlog.metadata.transaction_plans import (
    NO_PRODUCER_ID,
    Answer,
    needs_new_producer_id,
    needs_next_producer_id,
    plan_end_txn,
    plan_init,
)
from raftlog.metadata.transactions import (
    TRANSACTION_TIMEOUT_MS_MAX,
    TxnState,
    partition_in_transaction,
)
from raftlog.rpc.kafka.classic_group_handlers import consumer_group_has_members, coordinating
from raftlog.rpc.kafka.consumer_group_handlers import commit_error
from raftlog.rpc.kafka.context import KafkaContext
from raftlog.rpc.kafka.schema import NO_THROTTLE, build, response_module
from raftlog.rpc.security import TRANSACTIONAL_ID_RESOURCE_PREFIX, Permission
from raftlog.rpc.txn_completions import wait_until_completed
from raftlog.types import PartitionId

__all__ = [
    "ADD_OFFSETS_TO_TXN",
    "ADD_PARTITIONS_TO_TXN",
    "DESCRIBE_TRANSACTIONS",
    "END_TXN",
    "LIST_TRANSACTIONS",
    "TRANSACTIONAL_ID_RESOURCE_PREFIX",
    "TXN_OFFSET_COMMIT",
    "add_offsets_to_txn",
    "add_partitions_to_txn",
    "describe_transactions",
    "end_txn",
    "init_transactional_producer",
    "list_transactions",
    "txn_offset_commit",
]

ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT = 24, 25, 26, 28
DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 65, 66
_SUBMIT_TIMEOUT_S = 10.0
_BATCHED_VERSION = 4  # AddPartitionsToTxn v4+: several transactions, verify_only (KIP-890)
_BUMPING_END_VERSION = 5  # EndTxn v5+: the epoch is bumped at every end (KIP-890 part 2)

_CODES = {
    MetadataErrorCode.NONE: ErrorCode.none,
    MetadataErrorCode.PRODUCER_FENCED: ErrorCode.producer_fenced,
    MetadataErrorCode.INVALID_PRODUCER_EPOCH: ErrorCode.invalid_producer_epoch,
    MetadataErrorCode.INVALID_PRODUCER_ID_MAPPING: ErrorCode.invalid_producer_id_mapping,
    MetadataErrorCode.INVALID_TXN_STATE: ErrorCode.invalid_txn_state,
    MetadataErrorCode.CONCURRENT_TRANSACTIONS: ErrorCode.concurrent_transactions,
    MetadataErrorCode.INVALID_TRANSACTION_TIMEOUT: ErrorCode.invalid_transaction_timeout,
    MetadataErrorCode.UNKNOWN_TOPIC: ErrorCode.unknown_topic_or_partition,
    MetadataErrorCode.UNKNOWN_PARTITION: ErrorCode.unknown_topic_or_partition,
}


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _code(code: MetadataErrorCode) -> ErrorCode:
    """Kafka's code for a command's result (INVALID_REQUEST for one Kafka has no name for)."""
    return _CODES.get(code, ErrorCode.invalid_request)


async def _submit(ctx: KafkaContext, command: Command) -> ErrorCode:
    """Commits `command`; its result's code. A controller that lost its term meanwhile is
    NOT_COORDINATOR; other failures COORDINATOR_NOT_AVAILABLE, retriable for every client (the
    command may have applied: each request is safe to repeat, see `plan_end_txn`)."""
    try:
        result = await ctx.node.submit(command, timeout_s=_SUBMIT_TIMEOUT_S)
    except errors.NotLeaderError:
        return ErrorCode.not_coordinator
    except (errors.RaftlogError, TimeoutError):
        return ErrorCode.coordinator_not_available
    return _code(result.code)


def _refusal(ctx: KafkaContext, transactional_id: str) -> ErrorCode | None:
    """What refuses any request of `transactional_id` here, before looking at it."""
    if not ctx.allowed(Permission.WRITE, TRANSACTIONAL_ID_RESOURCE_PREFIX + transactional_id):
        return ErrorCode.transactional_id_authorization_failed
    if check_transactional_id(transactional_id) is not None:
        return ErrorCode.invalid_request
    if not coordinating(ctx):
        return ErrorCode.not_coordinator
    return None


# ---- InitProducerId ------------------------------------------------------------------------


async def init_transactional_producer(
    ctx: KafkaContext, request: Any, version: int
) -> tuple[ErrorCode, int, int]:
    """InitProducerId with a transactional id: (code, producer id, epoch). A new id gets a
    fresh producer id at epoch 0, a known one its next epoch (a new producer id once its
    epochs are spent); an open transaction is aborted first at a bumped epoch, fencing the
    older instance, and the answer is CONCURRENT_TRANSACTIONS until that completed (the client
    retries). A client passing its producer id and epoch (v3+, KIP-360) that is not the id's
    producer gets PRODUCER_FENCED."""
    transactional_id = str(request.transactional_id)
    refusal = _refusal(ctx, transactional_id)
    if refusal is not None:
        return refusal, NO_PRODUCER_ID, -1
    timeout_ms = int(request.transaction_timeout.total_seconds() * 1000)
    if not 1 <= timeout_ms <= TRANSACTION_TIMEOUT_MS_MAX:
        # Checked first, as Kafka does: before any open transaction is aborted for it.
        return ErrorCode.invalid_transaction_timeout, NO_PRODUCER_ID, -1
    passed_id = int(getattr(request, "producer_id", NO_PRODUCER_ID))
    passed_epoch = int(getattr(request, "producer_epoch", -1))
    expected = (passed_id, passed_epoch) if passed_id != NO_PRODUCER_ID else None
    state = ctx.node.metadata.state
    new_producer_id = None
    if needs_new_producer_id(state, transactional_id):
        try:
            new_producer_id = await ctx.node.allocate_producer_id(timeout_s=_SUBMIT_TIMEOUT_S)
        except (errors.RaftlogError, TimeoutError):
            return ErrorCode.coordinator_not_available, NO_PRODUCER_ID, -1
        state = ctx.node.metadata.state
    plan = plan_init(state, transactional_id, timeout_ms, expected, new_producer_id, _now_ms())
    if isinstance(plan, Answer):
        return _code(plan.code), plan.producer_id, plan.producer_epoch
    ctx.node.txn_completions.expect(transactional_id)
    code = await _submit(ctx, plan.command)
    if code is not ErrorCode.none or plan.then is not MetadataErrorCode.NONE:
        return (code if code is not ErrorCode.none else _code(plan.then)), NO_PRODUCER_ID, -1
    assert isinstance(plan.command, InitTransaction)
    return ErrorCode.none, plan.command.producer_id, plan.command.producer_epoch


# ---- AddPartitionsToTxn --------------------------------------------------------------------


async def add_partitions_to_txn(ctx: KafkaContext, request: Any, version: int) -> Any:
    """AddPartitionsToTxn v0 to v5. v0-v3 (clients): one transaction's partitions join it.
    v4+ (brokers): several transactions, each either joined the same way or, with
    `verify_only`, only checked: a partition not in the producer's ongoing transaction at
    that epoch is INVALID_TXN_STATE (KIP-890's check, the one a partition leader makes).
    Per partition: TOPIC_AUTHORIZATION_FAILED without write, UNKNOWN_TOPIC_OR_PARTITION for
    an unknown one, and OPERATION_NOT_ATTEMPTED for the others when any partition failed so;
    else the transaction's code."""
    module = response_module(ADD_PARTITIONS_TO_TXN, version)
    if version < _BATCHED_VERSION:
        results = await _add_partitions(
            ctx,
            module,
            request.v3_and_below_transactional_id,
            int(request.v3_and_below_producer_id),
            int(request.v3_and_below_producer_epoch),
            request.v3_and_below_topics,
            verify_only=False,
        )
        return build(
            module.AddPartitionsToTxnResponse,
            throttle_time=NO_THROTTLE,
            results_by_topic_v3_and_below=results,
        )
    if not ctx.allowed(Permission.CLUSTER, ""):
        return build(
            module.AddPartitionsToTxnResponse,
            throttle_time=NO_THROTTLE,
            error_code=ErrorCode.cluster_authorization_failed,
            results_by_transaction=(),
        )
    answers = []
    for txn in request.transactions:
        results = await _add_partitions(
            ctx,
            module,
            txn.transactional_id,
            int(txn.producer_id),
            int(txn.producer_epoch),
            txn.topics,
            verify_only=bool(txn.verify_only),
        )
        answers.append(
            build(
                module.AddPartitionsToTxnResult,
                transactional_id=txn.transactional_id,
                topic_results=results,
            )
        )
    return build(
        module.AddPartitionsToTxnResponse,
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        results_by_transaction=tuple(answers),
    )


async def _add_partitions(
    ctx: KafkaContext,
    module: Any,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    topics: Sequence[Any],
    *,
    verify_only: bool,
) -> tuple[Any, ...]:
    wanted = [(str(t.name), int(p)) for t in topics for p in t.partitions]
    refusals = _add_codes(ctx, transactional_id, wanted)
    codes: list[ErrorCode]
    if all(refusal is None for refusal in refusals):
        state = ctx.node.metadata.state
        if verify_only:
            codes = [
                ErrorCode.none
                if partition_in_transaction(state, producer_id, producer_epoch, topic, partition)
                else ErrorCode.invalid_txn_state
                for topic, partition in wanted
            ]
        else:
            await wait_until_completed(ctx.node, transactional_id, producer_id, producer_epoch)
            command = AddToTransaction(
                transactional_id,
                producer_id,
                producer_epoch,
                tuple((topic, PartitionId(partition)) for topic, partition in wanted),
                (),
                _now_ms(),
            )
            code = await _submit(ctx, command)
            codes = [code] * len(wanted)
    else:
        codes = [ErrorCode.operation_not_attempted if r is None else r for r in refusals]
    by_topic: dict[str, list[Any]] = {}
    for (topic, partition), partition_code in zip(wanted, codes, strict=True):
        by_topic.setdefault(topic, []).append(
            build(
                module.AddPartitionsToTxnPartitionResult,
                partition_index=partition,
                partition_error_code=partition_code,
            )
        )
    return tuple(
        build(module.AddPartitionsToTxnTopicResult, name=name, results_by_partition=tuple(parts))
        for name, parts in by_topic.items()
    )


def _add_codes(
    ctx: KafkaContext, transactional_id: str, wanted: list[tuple[str, int]]
) -> list[ErrorCode | None]:
    """Per partition, what refuses it before the transaction is looked at (None: nothing)."""
    refusal = _refusal(ctx, transactional_id)
    if refusal is not None:
        return [refusal] * len(wanted)
    state = ctx.node.metadata.state
    codes: list[ErrorCode | None] = []
    for topic, partition in wanted:
        if not ctx.allowed(Permission.WRITE, topic):
            codes.append(ErrorCode.topic_authorization_failed)
        elif state.partition(topic, partition) is None:
            codes.append(ErrorCode.unknown_topic_or_partition)
        else:
            codes.append(None)
    return codes


# ---- AddOffsetsToTxn, TxnOffsetCommit ------------------------------------------------------


async def add_offsets_to_txn(ctx: KafkaContext, request: Any, version: int) -> Any:
    """AddOffsetsToTxn v0 to v4: the consumer group joins the transaction, so the offsets
    TxnOffsetCommit holds for it are committed or dropped with it. Codes as AddPartitionsToTxn
    (INVALID_GROUP_ID for an empty group id)."""
    module = response_module(ADD_OFFSETS_TO_TXN, version)
    code = _refusal(ctx, request.transactional_id)
    if code is None and not request.group_id:
        code = ErrorCode.invalid_group_id
    if code is None:
        await wait_until_completed(
            ctx.node,
            request.transactional_id,
            int(request.producer_id),
            int(request.producer_epoch),
        )
        command = AddToTransaction(
            request.transactional_id,
            int(request.producer_id),
            int(request.producer_epoch),
            (),
            (str(request.group_id),),
            _now_ms(),
        )
        code = await _submit(ctx, command)
    return build(module.AddOffsetsToTxnResponse, throttle_time=NO_THROTTLE, error_code=code)


async def txn_offset_commit(ctx: KafkaContext, request: Any, version: int) -> Any:
    """TxnOffsetCommit v0 to v4: offsets held pending in the producer's transaction, committed
    with it (KIP-98; classic and KIP-848 groups alike, since both keep their offsets in the
    metadata state). Per partition: TOPIC_AUTHORIZATION_FAILED without read, else the member
    check's code (`_member_refusal`) or the transaction's (INVALID_TXN_STATE when the group
    was not added by AddOffsetsToTxn)."""
    module = response_module(TXN_OFFSET_COMMIT, version)
    wanted = [(str(t.name), p) for t in request.topics for p in t.partitions]
    refusal = _refusal(ctx, request.transactional_id)
    allowed = [ctx.allowed(Permission.READ, name) for name, _ in wanted]
    committed = [w for w, ok in zip(wanted, allowed, strict=True) if ok]
    code = refusal or _member_refusal(ctx, request, committed)
    if code is None and committed:
        # v2 on carries the leader epoch of the last record consumed; before it, none.
        epochs = tuple(
            max(int(getattr(p, "committed_leader_epoch", NO_EPOCH)), NO_EPOCH) for _, p in committed
        )
        metadata = tuple(p.committed_metadata or "" for _, p in committed)
        command = CommitTransactionOffsets(
            request.transactional_id,
            int(request.producer_id),
            int(request.producer_epoch),
            str(request.group_id),
            tuple(
                (n, PartitionId(int(p.partition_index)), int(p.committed_offset))
                for n, p in committed
            ),
            epochs if any(e != NO_EPOCH for e in epochs) else (),
            metadata if any(metadata) else (),
        )
        code = await _submit(ctx, command)
    by_topic: dict[str, list[Any]] = {}
    for (name, partition), ok in zip(wanted, allowed, strict=True):
        by_topic.setdefault(name, []).append(
            build(
                module.TxnOffsetCommitResponsePartition,
                partition_index=partition.partition_index,
                error_code=(code or ErrorCode.none) if ok else ErrorCode.topic_authorization_failed,
            )
        )
    return build(
        module.TxnOffsetCommitResponse,
        throttle_time=NO_THROTTLE,
        topics=tuple(
            build(module.TxnOffsetCommitResponseTopic, name=name, partitions=tuple(parts))
            for name, parts in by_topic.items()
        ),
    )


def _member_refusal(
    ctx: KafkaContext, request: Any, committed: list[tuple[str, Any]]
) -> ErrorCode | None:
    """KIP-447: a producer committing for a group member (v3+: its member id, generation and
    instance id) is checked as that member's OffsetCommit would be, so a zombie of a
    rebalanced-away member cannot commit (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION,
    FENCED_INSTANCE_ID; for a KIP-848 group its epoch, STALE_MEMBER_EPOCH). Without a member
    id (older clients, assign()ed consumers) there is nothing to check, as on Kafka."""
    member_id = str(getattr(request, "member_id", "") or "")
    if not member_id:
        return None
    generation = int(getattr(request, "generation_id", -1))
    group_id = str(request.group_id)
    if consumer_group_has_members(ctx, group_id):
        partitions = [(name, int(p.partition_index)) for name, p in committed]
        refusal, _ = ctx.consumer_groups.coordinator.check_commit(
            group_id, member_id, generation, partitions
        )
        return None if refusal is GroupErrorCode.NONE else commit_error(refusal)
    instance_id = getattr(request, "group_instance_id", None) or None
    code = ctx.groups.check_member(group_id, member_id, generation, instance_id)
    return None if code is ErrorCode.none else code


# ---- EndTxn --------------------------------------------------------------------------------


async def end_txn(ctx: KafkaContext, request: Any, version: int) -> Any:
    """EndTxn v0 to v5: Ongoing -> PrepareCommit/PrepareAbort, committed before the answer;
    the markers follow. v5+ bumps the epoch and answers the producer id and new epoch
    (KIP-890 part 2); at a spent epoch it rotates, answering a new producer id at epoch 0. A
    retry of an end already decided gets NONE (also from the producer id before a rotation);
    CONCURRENT_TRANSACTIONS while a previous end completes, INVALID_TXN_STATE with nothing
    open, PRODUCER_FENCED for an older epoch."""
    module = response_module(END_TXN, version)
    bump = version >= _BUMPING_END_VERSION
    producer_id, epoch = int(request.producer_id), int(request.producer_epoch)
    code = _refusal(ctx, request.transactional_id)
    next_producer_id = None
    if code is None and needs_next_producer_id(
        ctx.node.metadata.state, request.transactional_id, bump
    ):
        try:
            next_producer_id = await ctx.node.allocate_producer_id(timeout_s=_SUBMIT_TIMEOUT_S)
        except (errors.RaftlogError, TimeoutError):
            code = ErrorCode.coordinator_not_available
    if code is None:
        plan = plan_end_txn(
            ctx.node.metadata.state,
            request.transactional_id,
            producer_id,
            epoch,
            bool(request.committed),
            bump,
            _now_ms(),
            next_producer_id,
        )
        if isinstance(plan, Answer):
            code = _code(plan.code)
        else:
            ctx.node.txn_completions.expect(request.transactional_id)
            code = await _submit(ctx, plan.command)
    txn = ctx.node.metadata.state.transaction(request.transactional_id)
    fields: dict[str, Any] = {}
    if hasattr(module.EndTxnResponse, "producer_epoch"):
        done = code is ErrorCode.none and txn is not None
        after = txn.producer_after_end() if done and txn else (NO_PRODUCER_ID, -1)
        fields = {"producer_id": after[0], "producer_epoch": after[1]}
    return build(module.EndTxnResponse, throttle_time=NO_THROTTLE, error_code=code, **fields)


# ---- DescribeTransactions, ListTransactions ------------------------------------------------


async def describe_transactions(ctx: KafkaContext, request: Any, version: int) -> Any:
    """DescribeTransactions v0: each id's state, producer, timeout, start time and partitions;
    TRANSACTIONAL_ID_NOT_FOUND for an unknown id, TRANSACTIONAL_ID_AUTHORIZATION_FAILED for
    one the principal may not use, NOT_COORDINATOR off the controller."""
    module = response_module(DESCRIBE_TRANSACTIONS, version)
    answers = []
    for transactional_id in request.transactional_ids:
        txn = ctx.node.metadata.state.transaction(transactional_id)
        code = _refusal(ctx, transactional_id)
        if code is None and txn is None:
            code = ErrorCode.transactional_id_not_found
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(txn.partitions if txn and code is None else ()):
            by_topic.setdefault(topic, []).append(partition)
        started_ms = txn.started_ms if txn and txn.state is TxnState.ONGOING else -1
        answers.append(
            build(
                module.TransactionState,
                error_code=code or ErrorCode.none,
                transactional_id=transactional_id,
                transaction_state=txn.state.value if txn and code is None else "",
                transaction_timeout=i32Timedelta.parse(
                    datetime.timedelta(milliseconds=txn.timeout_ms if txn else 0)
                ),
                transaction_start_time=_instant(started_ms),
                producer_id=txn.producer_id if txn and code is None else NO_PRODUCER_ID,
                producer_epoch=txn.producer_epoch if txn and code is None else -1,
                topics=tuple(
                    build(module.TopicData, topic=topic, partitions=tuple(parts))
                    for topic, parts in by_topic.items()
                ),
            )
        )
    return build(
        module.DescribeTransactionsResponse,
        throttle_time=NO_THROTTLE,
        transaction_states=tuple(answers),
    )


def _instant(ms: int) -> datetime.datetime:
    """Kafka's datetime_i64 field; -1 (none) is one millisecond before the epoch."""
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)


async def list_transactions(ctx: KafkaContext, request: Any, version: int) -> Any:
    """ListTransactions v0 to v1: the ids the principal may use, filtered by state names (an
    unknown name is listed back in unknown_state_filters), producer ids and (v1) a minimum
    running time in ms; NOT_COORDINATOR off the controller."""
    module = response_module(LIST_TRANSACTIONS, version)
    known = {s.value for s in TxnState}
    states = set(request.state_filters)
    producers = {int(p) for p in request.producer_id_filters}
    running_ms_min = int(getattr(request, "duration_filter", -1))
    now_ms = _now_ms()
    listed = []
    code = ErrorCode.none if coordinating(ctx) else ErrorCode.not_coordinator
    for txn in ctx.node.metadata.state.transactions() if code is ErrorCode.none else ():
        resource = TRANSACTIONAL_ID_RESOURCE_PREFIX + txn.transactional_id
        if (
            ctx.allowed(Permission.WRITE, resource)
            and (not states or txn.state.value in states)
            and (not producers or txn.producer_id in producers)
            and (running_ms_min < 0 or now_ms - txn.started_ms >= running_ms_min)
        ):
            listed.append(
                build(
                    module.TransactionState,
                    transactional_id=txn.transactional_id,
                    producer_id=txn.producer_id,
                    transaction_state=txn.state.value,
                )
            )
    return build(
        module.ListTransactionsResponse,
        throttle_time=NO_THROTTLE,
        error_code=code,
        unknown_state_filters=tuple(sorted(states - known)),
        transaction_states=tuple(listed),
    )
