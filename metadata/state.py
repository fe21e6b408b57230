"""The metadata state machine: what the metadata quorum (Raft group 0) agrees on.

Theory of operation. Every node holds a `MetadataState` and applies the quorum's committed
commands to it in log order: `apply(offset, command_bytes)`. Apply is a pure function of the
state and the bytes (time arrives inside commands as `now_ms`), so every node that applied the
same prefix holds the same state and `snapshot()` returns the same bytes, which
`MetadataState.restore` turns back into an equal state that behaves the same from then on.

Each command is first checked, then carried out: `check(command)` decides, without touching
anything, what `apply` would return, and only an accepted command changes the state. So a
rejected command (bad user input, a stale plan, malformed bytes) leaves the state as it was
except `applied_offset`, which counts log positions and advances for every command. `apply`
never raises on bad input; it asserts only invariants that no input can break.

What the state holds:
- the cluster id (fixed at bootstrap, carried by snapshots);
- nodes: addresses, incarnation, whether fenced and the `now_ms` of the last heartbeat. A
  node is alive while it is registered and not fenced; FenceNode marks a node whose lease
  expired, a heartbeat or re-registration brings it back. A node's `status` is "active",
  "decommissioning" (DecommissionNode: no replica is placed on it again, the controller
  moves its replicas off) or "decommissioned" (CompleteDecommission, once it hosts nothing:
  it is no longer alive and may never register or heartbeat again);
- topics: name, id, replication factor, config, and their partitions in index order;
- partitions: Raft group id (unique for ever: ids are never reused, so a late message from a
  deleted topic's group cannot touch its successor), replicas (the first is the preferred
  leader), the leader with the highest epoch that reported itself and, while a move is under
  way (KIP-455), its target replicas. During a move every node of replicas and target hosts
  the group (`hosts`); the partition leader changes the group's membership one node at a
  time and reports CompleteReassignment, which makes the target the replicas, and only
  then do the removed nodes drop their copy;
- the next group id and the next producer id to hand out;
- consumer groups' committed offsets: group name -> (topic, partition) -> the next offset to
  consume, with the leader epoch and metadata string the commit carried (`CommittedOffset`).
  Offsets of a deleted topic are dropped with it (a topic re-created under the same name
  starts over); a group whose last offset went is forgotten;
- transactional ids (the transaction coordinator's state, `transactions.py`) and the pending
  transactional offsets per (consumer group, producer id), which join the group's committed
  offsets when their transaction's commit completes (`transaction_table.py`).

Lookups by group id and by node scan the partitions (O(partitions)): the metadata of one
cluster is small, and a derived index would be one more thing to keep consistent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from raftlog.metadata import checks, transaction_checks
from raftlog.metadata.commands import (
    OK,
    AddToTransaction,
    AllocateProducerIds,
    AlterTopicConfig,
    ApplyResult,
    AutoCreateTopic,
    Command,
    CommitGroupOffsets,
    CommitTransactionOffsets,
    CompleteDecommission,
    CompleteEndTransaction,
    CompleteReassignment,
    CreatePartitions,
    CreateTopic,
    DecommissionNode,
    DeleteGroup,
    DeleteGroupOffsets,
    DeleteRecords,
    DeleteTopic,
    ErrorCode,
    ExpireTransactionalId,
    FenceNode,
    InitTransaction,
    MetadataDecodeError,
    NodeHeartbeat,
    PrepareEndTransaction,
    ReassignPartition,
    RegisterNode,
    ReportLeader,
    committed_offsets_of,
    decode_command,
    reject,
)
from raftlog.metadata.model import (
    ALLOCATED_PRODUCER_ID_LIMIT,
    FIRST_PARTITION_RAFT_GROUP_ID,
    METADATA_RAFT_GROUP_ID,
    NO_EPOCH,
    NODE_ACTIVE,
    NODE_DECOMMISSIONED,
    NODE_DECOMMISSIONING,
    NODE_STATUSES,
    CommittedOffset,
    NodeInfo,
    PartitionInfo,
    TopicInfo,
)
from raftlog.metadata.snapshot_codec import SnapshotContents, decode_snapshot, encode_snapshot
from raftlog.metadata.transaction_table import TransactionTable
from raftlog.metadata.transactions import TransactionState
from raftlog.types import NodeId, PartitionId, RaftGroupId

# The records and constants live in raftlog.metadata.model; importers of this module keep
# finding them here.
__all__ = [
    "ALLOCATED_PRODUCER_ID_LIMIT",
    "FIRST_PARTITION_RAFT_GROUP_ID",
    "METADATA_RAFT_GROUP_ID",
    "NODE_ACTIVE",
    "NODE_DECOMMISSIONED",
    "NODE_DECOMMISSIONING",
    "NODE_STATUSES",
    "NO_EPOCH",
    "MetadataState",
    "NodeInfo",
    "PartitionInfo",
    "TopicInfo",
]


class MetadataState:
    """The replicated metadata. Only `apply` and `restore` change it."""

    def __init__(self, cluster_id: str) -> None:
        assert cluster_id, "a cluster id is fixed at bootstrap"
        self._cluster_id = cluster_id
        self._applied_offset = -1
        self._next_raft_group_id = int(FIRST_PARTITION_RAFT_GROUP_ID)
        self._next_producer_id = 0
        # The highest leader epoch ever reported, of partitions deleted since too.
        self._leader_epoch_high = 0
        self._nodes: dict[NodeId, NodeInfo] = {}
        self._topics: dict[str, TopicInfo] = {}
        self._partitions: dict[str, tuple[PartitionInfo, ...]] = {}
        self._group_offsets: dict[str, dict[tuple[str, int], CommittedOffset]] = {}
        self._transactions = TransactionTable()
        # What `transactions()` answers (None: to build), and the states in id order with each
        # id's place (None: to sort), kept until the set of ids changes; a changed state takes
        # its id's place. The controller's marker duty reads it at every metadata change and
        # every tick: sorting every id each time cost ~4 ms at 10,000 ids and ~170 ms at
        # TRANSACTIONAL_IDS_MAX (100,000), against 0.6 ms to rebuild after one change there.
        self._transactions_by_id: tuple[TransactionState, ...] | None = None
        self._transactions_sorted: list[TransactionState] | None = None
        self._transaction_places: dict[str, int] = {}

    # ---- read accessors ----------------------------------------------------------------

    @property
    def cluster_id(self) -> str:
        return self._cluster_id

    @property
    def applied_offset(self) -> int:
        """Offset of the last command applied (-1 before the first)."""
        return self._applied_offset

    @property
    def next_raft_group_id(self) -> RaftGroupId:
        return RaftGroupId(self._next_raft_group_id)

    @property
    def next_producer_id(self) -> int:
        return self._next_producer_id

    @property
    def leader_epoch_high(self) -> int:
        """The highest leader epoch any partition reported, deleted ones included: new
        partitions start their Raft groups at this term (`PartitionInfo.first_term`)."""
        return self._leader_epoch_high

    def nodes(self) -> tuple[NodeInfo, ...]:
        return tuple(self._nodes[n] for n in sorted(self._nodes))

    def node(self, node_id: NodeId) -> NodeInfo | None:
        return self._nodes.get(node_id)

    def alive_node_ids(self) -> tuple[NodeId, ...]:
        """Registered, unfenced nodes in id order."""
        return tuple(n.node_id for n in self.nodes() if n.alive)

    def placeable_node_ids(self) -> tuple[NodeId, ...]:
        """Alive nodes that are not being decommissioned, in id order (placement targets)."""
        return tuple(n.node_id for n in self.nodes() if n.placeable)

    def decommissioning_node_ids(self) -> tuple[NodeId, ...]:
        return tuple(n.node_id for n in self.nodes() if n.status == NODE_DECOMMISSIONING)

    def partitions_hosted_by(self, node_id: NodeId) -> tuple[PartitionInfo, ...]:
        """Partitions whose group `node_id` holds (replicas or a move's target)."""
        return tuple(p for p in self.all_partitions() if node_id in p.hosts)

    def topics(self) -> tuple[TopicInfo, ...]:
        return tuple(self._topics[name] for name in sorted(self._topics))

    def topic(self, name: str) -> TopicInfo | None:
        return self._topics.get(name)

    def partitions(self, topic: str) -> tuple[PartitionInfo, ...]:
        """The topic's partitions in index order; empty for an unknown topic."""
        return self._partitions.get(topic, ())

    def partition(self, topic: str, partition: int) -> PartitionInfo | None:
        partitions = self._partitions.get(topic, ())
        return partitions[partition] if 0 <= partition < len(partitions) else None

    def all_partitions(self) -> Iterator[PartitionInfo]:
        """Every partition, by topic name then index."""
        for name in sorted(self._partitions):
            yield from self._partitions[name]

    def partition_by_raft_group(self, raft_group_id: RaftGroupId) -> PartitionInfo | None:
        return next((p for p in self.all_partitions() if p.raft_group_id == raft_group_id), None)

    def consumer_group_ids(self) -> tuple[str, ...]:
        """Consumer groups with committed offsets, by name."""
        return tuple(sorted(self._group_offsets))

    def committed_offsets(self, group_id: str) -> dict[tuple[str, int], int]:
        """A consumer group's committed offsets by (topic, partition); empty if none."""
        return {tp: c.offset for tp, c in self.committed(group_id).items()}

    def committed(self, group_id: str) -> dict[tuple[str, int], CommittedOffset]:
        """A consumer group's committed offsets by (topic, partition), with the leader epoch
        and metadata each commit carried; empty if none."""
        return dict(sorted(self._group_offsets.get(group_id, {}).items()))

    def has_consumer_group(self, group_id: str) -> bool:
        """True while consumer group `group_id` has committed offsets."""
        return group_id in self._group_offsets

    def consumer_group_count(self) -> int:
        """How many consumer groups have committed offsets."""
        return len(self._group_offsets)

    def committed_offset(self, group_id: str, topic: str, partition: int) -> int | None:
        committed = self._group_offsets.get(group_id, {}).get((topic, partition))
        return None if committed is None else committed.offset

    def transaction(self, transactional_id: str) -> TransactionState | None:
        """The transaction coordinator's state of `transactional_id`; None if unknown."""
        return self._transactions.get(transactional_id)

    def transactions(self) -> tuple[TransactionState, ...]:
        """Every transactional id's state, by id."""
        if self._transactions_by_id is None:
            if self._transactions_sorted is None:
                table = self._transactions.transactions
                ids = sorted(table)
                self._transactions_sorted = [table[t] for t in ids]
                self._transaction_places = {t: place for place, t in enumerate(ids)}
            self._transactions_by_id = tuple(self._transactions_sorted)
        return self._transactions_by_id

    def transaction_count(self) -> int:
        """How many transactional ids the state holds."""
        return len(self._transactions.transactions)

    def transaction_of_producer(self, producer_id: int) -> TransactionState | None:
        """The transactional id holding `producer_id`, if a transactional producer has it."""
        return self._transactions.of_producer(producer_id)

    def pending_transaction_offsets(
        self,
    ) -> dict[tuple[str, int], dict[tuple[str, int], CommittedOffset]]:
        """Transactional offsets waiting for their transaction's end, by (consumer group,
        producer id), then (topic, partition)."""
        pending = self._transactions.pending_offsets
        return {key: dict(sorted(pending[key].items())) for key in sorted(pending)}

    def has_pending_transaction_offsets(self, group_id: str) -> bool:
        """Whether an open transaction holds offsets of `group_id` (OffsetFetch with
        require_stable answers UNSTABLE_OFFSET_COMMIT meanwhile, KIP-447)."""
        return self._transactions.has_pending_offsets(group_id)

    def raft_group_ids_for_node(self, node_id: NodeId) -> frozenset[RaftGroupId]:
        """The partition groups `node_id` must host (its replicas and the targets of moves
        under way; fenced or not)."""
        return frozenset(p.raft_group_id for p in self.all_partitions() if node_id in p.hosts)

    def moving_partitions(self) -> tuple[PartitionInfo, ...]:
        """Partitions with a move under way, by topic then index."""
        return tuple(p for p in self.all_partitions() if p.target is not None)

    # ---- apply -------------------------------------------------------------------------

    def apply(self, offset: int, command: bytes) -> ApplyResult:
        """Applies the committed command at `offset`; never raises on bad input."""
        assert offset > self._applied_offset, (offset, self._applied_offset)
        try:
            decoded = decode_command(command)
        except MetadataDecodeError as error:
            result = reject(ErrorCode.INVALID_REQUEST, str(error))
        else:
            result = self.check(decoded)
            if result.ok:
                result = _HANDLERS[type(decoded)][1](self, decoded)
        self._applied_offset = offset
        assert self._applied_offset == offset
        return result

    def check(self, command: Command) -> ApplyResult:
        """What `apply` would return for `command` (its producer ids aside); changes nothing.

        The controller calls it before proposing, so user errors come back at once."""
        rejection = _HANDLERS[type(command)][0](self, command)
        assert rejection is None or not rejection.ok, rejection
        return OK if rejection is None else rejection

    # ---- effects (run only after their check passed) ------------------------------------

    def _register_node(self, command: RegisterNode) -> ApplyResult:
        known = self._nodes.get(command.node_id)
        self._nodes[command.node_id] = NodeInfo(
            node_id=command.node_id,
            client_address=command.client_address,
            raft_address=command.raft_address,
            incarnation=command.incarnation,
            fenced=False,
            last_heartbeat_ms=command.now_ms,
            # A decommissioning node that restarts is still leaving.
            status=NODE_ACTIVE if known is None else known.status,
            kafka_address=command.kafka_address,
        )
        return OK

    def _never_applied(self, command: AutoCreateTopic) -> ApplyResult:
        raise AssertionError(f"{command} is refused by its check; nothing applies it")

    def _decommission(self, command: DecommissionNode) -> ApplyResult:
        # Repeating it while the node is leaving changes nothing.
        known = self._nodes[command.node_id]
        self._nodes[command.node_id] = replace(known, status=NODE_DECOMMISSIONING)
        return OK

    def _complete_decommission(self, command: CompleteDecommission) -> ApplyResult:
        known = self._nodes[command.node_id]
        assert not self.partitions_hosted_by(command.node_id), command
        self._nodes[command.node_id] = replace(known, status=NODE_DECOMMISSIONED)
        return OK

    def _heartbeat(self, command: NodeHeartbeat) -> ApplyResult:
        known = self._nodes[command.node_id]
        # The proposer's clock: a new controller's may be behind the old one's, so the time
        # is replaced, not maxed (expired_nodes measures silence on the current clock).
        self._nodes[command.node_id] = replace(
            known, fenced=False, last_heartbeat_ms=command.now_ms
        )
        return OK

    def _fence(self, command: FenceNode) -> ApplyResult:
        self._nodes[command.node_id] = replace(self._nodes[command.node_id], fenced=True)
        return OK

    def _create_topic(self, command: CreateTopic) -> ApplyResult:
        self._topics[command.name] = TopicInfo(
            name=command.name,
            topic_id=command.topic_id,
            partition_count=command.partition_count,
            replication_factor=command.replication_factor,
            config=dict(sorted(command.config.items())),
        )
        self._partitions[command.name] = ()
        self._add_partitions(command.name, command.assignments, command.raft_group_ids)
        assert len(self._partitions[command.name]) == command.partition_count
        return OK

    def _add_partitions(
        self,
        topic: str,
        assignments: tuple[tuple[NodeId, ...], ...],
        raft_group_ids: tuple[RaftGroupId, ...],
    ) -> None:
        existing = self._partitions[topic]
        added = tuple(
            PartitionInfo(
                topic=topic,
                partition=PartitionId(len(existing) + i),
                raft_group_id=raft_group_id,
                replicas=tuple(replicas),
                leader_id=None,
                leader_epoch=NO_EPOCH,
                first_term=self._leader_epoch_high,
            )
            for i, (replicas, raft_group_id) in enumerate(
                zip(assignments, raft_group_ids, strict=True)
            )
        )
        assert added and added[0].raft_group_id >= self._next_raft_group_id
        self._partitions[topic] = existing + added
        self._next_raft_group_id = added[-1].raft_group_id + 1

    def _alter_topic_config(self, command: AlterTopicConfig) -> ApplyResult:
        topic = self._topics[command.name]
        config = checks.merged_topic_config(self, command)
        self._topics[command.name] = replace(topic, config=config)
        return OK

    def _delete_topic(self, command: DeleteTopic) -> ApplyResult:
        # Raft group ids are not handed back: next_raft_group_id only grows.
        del self._topics[command.name]
        del self._partitions[command.name]
        self._transactions.drop_topic(command.name)
        for group_id, offsets in list(self._group_offsets.items()):
            kept = {tp: o for tp, o in offsets.items() if tp[0] != command.name}
            if kept:
                self._group_offsets[group_id] = kept
            else:
                del self._group_offsets[group_id]
        return OK

    def _commit_group_offsets(self, command: CommitGroupOffsets) -> ApplyResult:
        offsets = self._group_offsets.setdefault(command.group_id, {})
        offsets.update(committed_offsets_of(command))
        assert offsets, command
        return OK

    def _delete_group(self, command: DeleteGroup) -> ApplyResult:
        del self._group_offsets[command.group_id]
        assert command.group_id not in self._group_offsets
        return OK

    def _delete_group_offsets(self, command: DeleteGroupOffsets) -> ApplyResult:
        offsets = self._group_offsets[command.group_id]
        for topic, partition in command.partitions:
            offsets.pop((topic, int(partition)), None)
        if not offsets:
            del self._group_offsets[command.group_id]
        return OK

    def _create_partitions(self, command: CreatePartitions) -> ApplyResult:
        topic = self._topics[command.name]
        self._add_partitions(command.name, command.assignments, command.raft_group_ids)
        count = len(self._partitions[command.name])
        assert count == topic.partition_count + len(command.assignments)
        self._topics[command.name] = replace(topic, partition_count=count)
        return OK

    def _replace_partition(self, updated: PartitionInfo) -> None:
        partitions = list(self._partitions[updated.topic])
        assert partitions[updated.partition].raft_group_id == updated.raft_group_id
        partitions[updated.partition] = updated
        self._partitions[updated.topic] = tuple(partitions)

    def _delete_records(self, command: DeleteRecords) -> ApplyResult:
        for topic, partition, offset in command.offsets:
            current = self._partitions[topic][partition]
            if offset > current.log_start_floor:
                self._replace_partition(replace(current, log_start_floor=offset))
        return OK

    def _reassign(self, command: ReassignPartition) -> ApplyResult:
        current = self._partitions[command.topic][command.partition]
        if set(command.replicas) == set(current.replicas):
            # Same nodes: only the preferred leader changes, no membership change needed.
            self._replace_partition(replace(current, replicas=tuple(command.replicas)))
        else:
            self._replace_partition(replace(current, target=tuple(command.replicas)))
        return OK

    def _complete_reassignment(self, command: CompleteReassignment) -> ApplyResult:
        current = self._partitions[command.topic][command.partition]
        assert current.target == command.replicas, (current, command)
        self._replace_partition(replace(current, replicas=current.target, target=None))
        return OK

    def _report_leader(self, command: ReportLeader) -> ApplyResult:
        current = self._partitions[command.topic][command.partition]
        updated = replace(current, leader_id=command.leader_id, leader_epoch=command.epoch)
        self._leader_epoch_high = max(self._leader_epoch_high, command.epoch)
        self._replace_partition(updated)
        return OK

    def _allocate_producer_ids(self, command: AllocateProducerIds) -> ApplyResult:
        first = self._next_producer_id
        self._next_producer_id += command.count
        assert first < self._next_producer_id <= ALLOCATED_PRODUCER_ID_LIMIT
        return ApplyResult(ErrorCode.NONE, producer_id_first=first)

    def _transaction_changed(self, transactional_id: str) -> None:
        """What `transactions()` kept, after the state of `transactional_id` changed (an id
        new or gone: its order is sorted again at the next read)."""
        self._transactions_by_id = None
        if self._transactions_sorted is None:
            return
        place = self._transaction_places.get(transactional_id)
        txn = self._transactions.get(transactional_id)
        if place is None or txn is None:
            self._transactions_sorted = None
        else:
            self._transactions_sorted[place] = txn

    def _init_transaction(self, command: InitTransaction) -> ApplyResult:
        self._transactions.init(command)
        self._transaction_changed(command.transactional_id)
        return OK

    def _add_to_transaction(self, command: AddToTransaction) -> ApplyResult:
        self._transactions.add(command)
        self._transaction_changed(command.transactional_id)
        return OK

    def _prepare_end_transaction(self, command: PrepareEndTransaction) -> ApplyResult:
        self._transactions.prepare_end(command)
        self._transaction_changed(command.transactional_id)
        return OK

    def _complete_end_transaction(self, command: CompleteEndTransaction) -> ApplyResult:
        self._transactions.complete_end(command, self._group_offsets)
        self._transaction_changed(command.transactional_id)
        return OK

    def _expire_transactional_id(self, command: ExpireTransactionalId) -> ApplyResult:
        self._transactions.expire(command)
        self._transaction_changed(command.transactional_id)
        return OK

    def _commit_transaction_offsets(self, command: CommitTransactionOffsets) -> ApplyResult:
        self._transactions.commit_offsets(command)
        return OK

    # ---- snapshots ---------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """The whole state as canonical bytes (equal states give equal bytes)."""
        return encode_snapshot(self)

    @classmethod
    def restore(cls, data: bytes) -> MetadataState:
        """The state `snapshot()` saved; raises MetadataDecodeError on malformed bytes."""
        state = cls._from_snapshot(decode_snapshot(data))
        violations = state.invariant_violations()
        if violations:
            raise MetadataDecodeError(f"snapshot breaks invariants: {violations}")
        return state

    @classmethod
    def _from_snapshot(cls, contents: SnapshotContents) -> MetadataState:
        state = cls(contents.cluster_id)
        state._applied_offset = contents.applied_offset
        state._next_raft_group_id = contents.next_raft_group_id
        state._next_producer_id = contents.next_producer_id
        state._leader_epoch_high = contents.leader_epoch_high
        state._nodes = contents.nodes
        state._topics = contents.topics
        state._partitions = contents.partitions
        state._group_offsets = contents.group_offsets
        state._transactions.restore(contents.transactions, contents.pending_offsets)
        return state

    # ---- invariants --------------------------------------------------------------------

    def invariant_violations(self) -> list[str]:
        """Every broken invariant, in words (empty when the state is sound)."""
        violations: list[str] = []
        raft_group_ids: set[int] = set()
        for name, topic in self._topics.items():
            partitions = self._partitions.get(name, ())
            if len(partitions) != topic.partition_count:
                violations.append(
                    f"topic {name!r} has {len(partitions)} partitions, says {topic.partition_count}"
                )
            for index, p in enumerate(partitions):
                violations += _partition_violations(self, topic, index, p)
                if p.raft_group_id in raft_group_ids:
                    violations.append(f"Raft group id {p.raft_group_id} used twice")
                raft_group_ids.add(p.raft_group_id)
        if set(self._partitions) != set(self._topics):
            violations.append("partitions held for topics that do not exist")
        if len({t.topic_id for t in self._topics.values()}) != len(self._topics):
            violations.append("two topics share a topic id")
        if any(n.node_id != key for key, n in self._nodes.items()):
            violations.append("a node is filed under another id")
        for node in self._nodes.values():
            if node.status not in NODE_STATUSES:
                violations.append(f"node {node.node_id} has status {node.status!r}")
            elif node.status == NODE_DECOMMISSIONED and self.partitions_hosted_by(node.node_id):
                violations.append(f"decommissioned node {node.node_id} hosts partitions")
        for group_id, offsets in self._group_offsets.items():
            unknown = [tp for tp in offsets if self.partition(*tp) is None]
            if not offsets or unknown:
                violations.append(f"consumer group {group_id!r} offsets of {unknown or 'nothing'}")
        violations += self._transactions.violations()
        table = self._transactions.transactions
        by_id = [table[t] for t in sorted(table)]
        for kept in (self._transactions_sorted, self._transactions_by_id):
            if kept is not None and list(kept) != by_id:
                violations.append("transactions() kept states the table no longer holds")
        for (group_id, _), offsets in self._transactions.pending_offsets.items():
            if any(self.partition(*tp) is None for tp in offsets):
                violations.append(f"pending offsets of {group_id!r} for unknown partitions")
        return violations

    def check_invariants(self) -> None:
        violations = self.invariant_violations()
        assert not violations, violations


def _partition_violations(
    state: MetadataState, topic: TopicInfo, index: int, p: PartitionInfo
) -> list[str]:
    where = f"{topic.name!r} partition {index}"
    violations = []
    if p.topic != topic.name or p.partition != index:
        violations.append(f"{where} is filed as {p.topic!r} partition {p.partition}")
    if not FIRST_PARTITION_RAFT_GROUP_ID <= p.raft_group_id < state.next_raft_group_id:
        violations.append(
            f"{where} Raft group id {p.raft_group_id} outside [1, {state.next_raft_group_id})"
        )
    if len(p.replicas) != topic.replication_factor or len(set(p.replicas)) != len(p.replicas):
        violations.append(
            f"{where} replicas {list(p.replicas)} for replication factor {topic.replication_factor}"
        )
    if any(state.node(n) is None for n in p.replicas):
        violations.append(f"{where} replicas {list(p.replicas)} name unregistered nodes")
    if (p.leader_id is None) != (p.leader_epoch == NO_EPOCH):
        violations.append(f"{where} leader {p.leader_id} with epoch {p.leader_epoch}")
    if not 0 <= p.first_term <= state.leader_epoch_high or p.leader_epoch > state.leader_epoch_high:
        violations.append(
            f"{where} first term {p.first_term}, leader epoch {p.leader_epoch}, above the "
            f"highest reported ({state.leader_epoch_high})"
        )
    if p.target is not None and (
        len(p.target) != topic.replication_factor
        or len(set(p.target)) != len(p.target)
        or set(p.target) == set(p.replicas)
        or any(state.node(n) is None for n in p.target)
    ):
        violations.append(f"{where} moves from {list(p.replicas)} to {list(p.target)}")
    return violations


# Command type -> (check, effect): the dispatch table of apply.
_HANDLERS: dict[
    type[Any], tuple[Callable[[Any, Any], ApplyResult | None], Callable[[Any, Any], ApplyResult]]
] = {
    RegisterNode: (checks.check_register_node, MetadataState._register_node),
    NodeHeartbeat: (checks.check_heartbeat, MetadataState._heartbeat),
    FenceNode: (checks.check_fence, MetadataState._fence),
    CreateTopic: (checks.check_create_topic, MetadataState._create_topic),
    AutoCreateTopic: (checks.check_auto_create_topic, MetadataState._never_applied),
    DeleteTopic: (checks.check_delete_topic, MetadataState._delete_topic),
    AlterTopicConfig: (checks.check_alter_topic_config, MetadataState._alter_topic_config),
    CreatePartitions: (checks.check_create_partitions, MetadataState._create_partitions),
    ReassignPartition: (checks.check_reassign, MetadataState._reassign),
    CompleteReassignment: (
        checks.check_complete_reassignment,
        MetadataState._complete_reassignment,
    ),
    ReportLeader: (checks.check_report_leader, MetadataState._report_leader),
    AllocateProducerIds: (
        checks.check_allocate_producer_ids,
        MetadataState._allocate_producer_ids,
    ),
    CommitGroupOffsets: (
        checks.check_commit_group_offsets,
        MetadataState._commit_group_offsets,
    ),
    DeleteGroup: (checks.check_delete_group, MetadataState._delete_group),
    DeleteGroupOffsets: (
        checks.check_delete_group_offsets,
        MetadataState._delete_group_offsets,
    ),
    DeleteRecords: (checks.check_delete_records, MetadataState._delete_records),
    DecommissionNode: (checks.check_decommission, MetadataState._decommission),
    CompleteDecommission: (
        checks.check_complete_decommission,
        MetadataState._complete_decommission,
    ),
    InitTransaction: (transaction_checks.check_init_transaction, MetadataState._init_transaction),
    AddToTransaction: (
        transaction_checks.check_add_to_transaction,
        MetadataState._add_to_transaction,
    ),
    PrepareEndTransaction: (
        transaction_checks.check_prepare_end_transaction,
        MetadataState._prepare_end_transaction,
    ),
    CompleteEndTransaction: (
        transaction_checks.check_complete_end_transaction,
        MetadataState._complete_end_transaction,
    ),
    CommitTransactionOffsets: (
        transaction_checks.check_commit_transaction_offsets,
        MetadataState._commit_transaction_offsets,
    ),
    ExpireTransactionalId: (
        transaction_checks.check_expire_transactional_id,
        MetadataState._expire_transactional_id,
    ),
}
