"""The metadata snapshot codec: a `MetadataState` as canonical bytes and back.

 Format version 1: one version byte, then canonical JSON (sorted keys, no whitespace) of
  {"applied_offset", "cluster_id", "next_group_id", "next_producer_id",
   "nodes": [{node fields}] by id,
   "topics": [{"name", "topic_id", "replication_factor", "config",
               "partitions": [{"group_id", "replicas", "leader_id", "leader_epoch"}]}] by name}
where leader_id and leader_epoch are -1 while no leader has reported, and applied_offset is
-1 before the first command. Decoding is as strict as for commands. When consumer groups
have committed offsets the root also holds
  "group_offsets": [{"group_id", "offsets": [[topic, partition, offset], ...]}] by group,
and only then, so snapshots taken before consumer groups existed still decode. Once a leader
reported an epoch above 0 the root holds "leader_epoch_high", and a partition created after
that its "first_term", each only then. An offset
committed with a leader epoch or metadata is [topic, partition, offset, leader_epoch,
metadata] (leader_epoch -1 for none), and only then, so snapshots taken before those were
kept decode as they did, and still encode to the same bytes. Likewise a
partition with a move under way also holds "target": [node ids], and only then, a partition
whose log start DeleteRecords moved holds "log_start_floor", and only then, and a node
that is not active holds "status" ("decommissioning" or "decommissioned"), and only then.
Transactions, only when some transactional id is known:
  "transactions": [{"transactional_id", "producer_id", "producer_epoch",
                    "last_producer_epoch", "timeout_ms", "state", "partitions": [[topic,
                    partition], ...] sorted, "groups": [group ids] sorted, "started_ms",
                    "updated_ms"}] by id (and "next_producer_id", "previous_producer_id"
                    each only when set, so earlier snapshots decode as they did),
and only when some are pending,
  "pending_txn_offsets": [{"group_id", "producer_id", "offsets": [offset entries as above]}]
by (group id, producer id).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raftlog.metadata.commands import (
    LEADER_EPOCH_LIMIT,
    NO_PRODUCER_ID,
    MetadataDecodeError,
    canonical_json,
    check_topic_config,
    check_topic_id,
    check_topic_name,
    decode_int,
    decode_list,
    decode_producer_id,
    decode_str,
    decode_topic_partition,
    parse_json_object,
)
from raftlog.metadata.model import (
    NO_EPOCH,
    NODE_ACTIVE,
    NODE_STATUSES,
    CommittedOffset,
    NodeInfo,
    PartitionInfo,
    TopicInfo,
)
from raftlog.metadata.transactions import NO_PRODUCER_EPOCH, TransactionState, TxnState
from raftlog.types import NodeId, PartitionId, RaftGroupId

if TYPE_CHECKING:
    from raftlog.metadata.state import MetadataState

__all__ = ["SNAPSHOT_FORMAT_VERSION", "SnapshotContents", "decode_snapshot", "encode_snapshot"]


@dataclass(slots=True)
class SnapshotContents:
    """A decoded snapshot, before `MetadataState.restore` checks its invariants."""

    cluster_id: str
    applied_offset: int
    next_raft_group_id: int
    next_producer_id: int
    leader_epoch_high: int = 0
    nodes: dict[NodeId, NodeInfo] = field(default_factory=dict)
    topics: dict[str, TopicInfo] = field(default_factory=dict)
    partitions: dict[str, tuple[PartitionInfo, ...]] = field(default_factory=dict)
    group_offsets: dict[str, dict[tuple[str, int], CommittedOffset]] = field(default_factory=dict)
    transactions: dict[str, TransactionState] = field(default_factory=dict)
    pending_offsets: dict[tuple[str, int], dict[tuple[str, int], CommittedOffset]] = field(
        default_factory=dict
    )


SNAPSHOT_FORMAT_VERSION = 1


def encode_snapshot(state: MetadataState) -> bytes:
    """The whole state as canonical bytes (equal states give equal bytes)."""
    body = {
        "applied_offset": state.applied_offset,
        "cluster_id": state.cluster_id,
        "next_group_id": int(state.next_raft_group_id),
        "next_producer_id": state.next_producer_id,
        "nodes": [
            {
                "node_id": n.node_id,
                "client_address": n.client_address,
                "raft_address": n.raft_address,
                "incarnation": n.incarnation,
                "fenced": n.fenced,
                "last_heartbeat_ms": n.last_heartbeat_ms,
            }
            | ({} if n.status == NODE_ACTIVE else {"status": n.status})
            | ({"kafka_address": n.kafka_address} if n.kafka_address else {})
            for n in state.nodes()
        ],
        "topics": [_encode_topic(t, state.partitions(t.name)) for t in state.topics()],
    }
    if state.leader_epoch_high:
        body["leader_epoch_high"] = state.leader_epoch_high
    if state.consumer_group_ids():
        body["group_offsets"] = [
            {
                "group_id": group_id,
                "offsets": [
                    _encode_offset(t, p, c) for (t, p), c in state.committed(group_id).items()
                ],
            }
            for group_id in state.consumer_group_ids()
        ]
    if state.transactions():
        body["transactions"] = [_encode_transaction(t) for t in state.transactions()]
    pending = state.pending_transaction_offsets()
    if pending:
        body["pending_txn_offsets"] = [
            {
                "group_id": group_id,
                "producer_id": producer_id,
                "offsets": [_encode_offset(t, p, c) for (t, p), c in offsets.items()],
            }
            for (group_id, producer_id), offsets in pending.items()
        ]
    return bytes([SNAPSHOT_FORMAT_VERSION]) + canonical_json(body)


_TRANSACTION_KEYS = (
    "transactional_id",
    "producer_id",
    "producer_epoch",
    "last_producer_epoch",
    "timeout_ms",
    "state",
    "partitions",
    "groups",
    "started_ms",
    "updated_ms",
)


# Keys added later, written only when they hold something (NO_PRODUCER_ID otherwise).
_TRANSACTION_OPTIONAL_KEYS = ("next_producer_id", "previous_producer_id")


def _encode_transaction(txn: TransactionState) -> dict[str, Any]:
    optional = {key: getattr(txn, key) for key in _TRANSACTION_OPTIONAL_KEYS}
    return {k: v for k, v in optional.items() if v != NO_PRODUCER_ID} | {
        "transactional_id": txn.transactional_id,
        "producer_id": txn.producer_id,
        "producer_epoch": txn.producer_epoch,
        "last_producer_epoch": txn.last_producer_epoch,
        "timeout_ms": txn.timeout_ms,
        "state": txn.state.value,
        "partitions": [list(tp) for tp in sorted(txn.partitions)],
        "groups": sorted(txn.groups),
        "started_ms": txn.started_ms,
        "updated_ms": txn.updated_ms,
    }


def _decode_transaction(where: str, raw: object) -> TransactionState:
    present = raw if isinstance(raw, dict) else {}
    optional = {k: present[k] for k in _TRANSACTION_OPTIONAL_KEYS if k in present}
    fields_ = _object(where, raw, _TRANSACTION_KEYS + tuple(optional))
    producer_ids = {
        key: decode_producer_id(f"{where}.{key}", optional.get(key, NO_PRODUCER_ID))
        for key in _TRANSACTION_OPTIONAL_KEYS
    }
    state_name = decode_str(f"{where}.state", fields_["state"])
    states = {s.value: s for s in TxnState}
    if state_name not in states:
        raise MetadataDecodeError(f"snapshot {where}.state: unknown state {state_name!r}")
    epoch = decode_int(f"{where}.producer_epoch", fields_["producer_epoch"])
    last_epoch = fields_["last_producer_epoch"]
    if last_epoch != NO_PRODUCER_EPOCH:
        last_epoch = decode_int(f"{where}.last_producer_epoch", last_epoch)
    partitions = [
        decode_topic_partition(f"{where}.partitions[{i}]", p, (2,), "[topic, partition]")[:2]
        for i, p in enumerate(decode_list(f"{where}.partitions", fields_["partitions"]))
    ]
    groups = [
        decode_str(f"{where}.groups[{i}]", g)
        for i, g in enumerate(decode_list(f"{where}.groups", fields_["groups"]))
    ]
    txn_state = states[state_name]
    producer_id = decode_int(f"{where}.producer_id", fields_["producer_id"])
    if (
        epoch >= 1 << 15
        or last_epoch >= 1 << 15
        or (txn_state.ended and (partitions or groups))
        or (producer_ids["next_producer_id"] != NO_PRODUCER_ID and not txn_state.preparing)
        or producer_id in producer_ids.values()
    ):
        raise MetadataDecodeError(f"snapshot {where}: epochs, producer ids or contents invalid")
    return TransactionState(
        transactional_id=decode_str(f"{where}.transactional_id", fields_["transactional_id"]),
        producer_id=producer_id,
        producer_epoch=epoch,
        last_producer_epoch=last_epoch,
        timeout_ms=decode_int(f"{where}.timeout_ms", fields_["timeout_ms"]),
        state=txn_state,
        partitions=frozenset((t, int(p)) for t, p in partitions),
        groups=frozenset(groups),
        started_ms=decode_int(f"{where}.started_ms", fields_["started_ms"]),
        updated_ms=decode_int(f"{where}.updated_ms", fields_["updated_ms"]),
        **producer_ids,
    )


def _decode_transactions(contents: SnapshotContents, raw: object) -> None:
    for i, item in enumerate(decode_list("transactions", raw)):
        txn = _decode_transaction(f"transactions[{i}]", item)
        if txn.transactional_id in contents.transactions:
            raise MetadataDecodeError(f"snapshot transactions[{i}]: {txn.transactional_id!r} twice")
        contents.transactions[txn.transactional_id] = txn


def _decode_pending_offsets(contents: SnapshotContents, raw: object) -> None:
    for i, item in enumerate(decode_list("pending_txn_offsets", raw)):
        where = f"pending_txn_offsets[{i}]"
        fields_ = _object(where, item, ("group_id", "producer_id", "offsets"))
        key = (
            decode_str(f"{where}.group_id", fields_["group_id"]),
            decode_int(f"{where}.producer_id", fields_["producer_id"]),
        )
        entries = decode_list(f"{where}.offsets", fields_["offsets"])
        offsets = dict(_decode_offset(f"{where}.offsets[{j}]", e) for j, e in enumerate(entries))
        if key in contents.pending_offsets or not offsets or len(offsets) != len(entries):
            raise MetadataDecodeError(f"snapshot {where}: {key} twice or empty")
        contents.pending_offsets[key] = offsets


def _encode_offset(topic: str, partition: int, committed: CommittedOffset) -> list[object]:
    entry: list[object] = [topic, partition, committed.offset]
    if committed.leader_epoch != NO_EPOCH or committed.metadata:
        entry += [committed.leader_epoch, committed.metadata]
    return entry


def _encode_topic(topic: TopicInfo, partitions: tuple[PartitionInfo, ...]) -> dict[str, Any]:
    return {
        "name": topic.name,
        "topic_id": topic.topic_id,
        "replication_factor": topic.replication_factor,
        "config": dict(topic.config),
        "partitions": [_encode_partition(p) for p in partitions],
    }


def _encode_partition(p: PartitionInfo) -> dict[str, Any]:
    encoded: dict[str, Any] = {
        "group_id": p.raft_group_id,
        "replicas": list(p.replicas),
        "leader_id": NO_EPOCH if p.leader_id is None else p.leader_id,
        "leader_epoch": p.leader_epoch,
    }
    if p.target is not None:
        encoded["target"] = list(p.target)
    if p.first_term:
        encoded["first_term"] = p.first_term
    if p.log_start_floor:
        encoded["log_start_floor"] = p.log_start_floor
    return encoded


def _object(where: str, value: object, keys: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict) or set(value) != set(keys):
        found = sorted(value) if isinstance(value, dict) else type(value).__name__
        raise MetadataDecodeError(f"snapshot {where}: expected fields {sorted(keys)}, got {found}")
    return value


def _int_or_none(where: str, value: object) -> int:
    """An int field that may also hold -1 (none yet)."""
    if type(value) is int and value == NO_EPOCH:
        return NO_EPOCH
    return decode_int(where, value)


def decode_snapshot(data: bytes) -> SnapshotContents:
    """What `encode_snapshot` wrote; raises MetadataDecodeError on malformed bytes."""
    if not data or data[0] != SNAPSHOT_FORMAT_VERSION:
        version = data[0] if data else None
        raise MetadataDecodeError(f"unknown metadata snapshot format version {version}")
    keys = ("applied_offset", "cluster_id", "next_group_id", "next_producer_id", "nodes", "topics")
    body = parse_json_object(data[1:], what="snapshot")
    group_offsets = body.pop("group_offsets", None)  # present only when there are some
    transactions = body.pop("transactions", None)  # likewise
    pending_offsets = body.pop("pending_txn_offsets", None)  # likewise
    leader_epoch_high = body.pop("leader_epoch_high", 0)  # likewise
    body = _object("root", body, keys)
    cluster_id = decode_str("cluster_id", body["cluster_id"])
    if not cluster_id:
        raise MetadataDecodeError("snapshot cluster_id is empty")
    contents = SnapshotContents(
        cluster_id=cluster_id,
        applied_offset=_int_or_none("applied_offset", body["applied_offset"]),
        next_raft_group_id=decode_int("next_group_id", body["next_group_id"]),
        next_producer_id=decode_int("next_producer_id", body["next_producer_id"]),
        leader_epoch_high=decode_int("leader_epoch_high", leader_epoch_high),
    )
    for i, raw in enumerate(decode_list("nodes", body["nodes"])):
        node = _decode_node(f"nodes[{i}]", raw)
        if node.node_id in contents.nodes:
            raise MetadataDecodeError(f"snapshot nodes[{i}]: node {node.node_id} twice")
        contents.nodes[node.node_id] = node
    for i, raw in enumerate(decode_list("topics", body["topics"])):
        topic, partitions = _decode_topic(f"topics[{i}]", raw)
        if topic.name in contents.topics:
            raise MetadataDecodeError(f"snapshot topics[{i}]: topic {topic.name!r} twice")
        contents.topics[topic.name] = topic
        contents.partitions[topic.name] = partitions
    if group_offsets is not None:
        contents.group_offsets = _decode_group_offsets(group_offsets)
    if transactions is not None:
        _decode_transactions(contents, transactions)
    if pending_offsets is not None:
        _decode_pending_offsets(contents, pending_offsets)
    return contents


def _decode_group_offsets(raw: object) -> dict[str, dict[tuple[str, int], CommittedOffset]]:
    groups: dict[str, dict[tuple[str, int], CommittedOffset]] = {}
    for i, item in enumerate(decode_list("group_offsets", raw)):
        fields_ = _object(f"group_offsets[{i}]", item, ("group_id", "offsets"))
        group_id = decode_str(f"group_offsets[{i}].group_id", fields_["group_id"])
        where = f"group_offsets[{i}].offsets"
        entries = decode_list(where, fields_["offsets"])
        offsets = dict(_decode_offset(f"{where}[{j}]", e) for j, e in enumerate(entries))
        if group_id in groups or not offsets or len(offsets) != len(entries):
            raise MetadataDecodeError(f"snapshot group_offsets[{i}]: {group_id!r} twice or empty")
        groups[group_id] = offsets
    return groups


def _decode_offset(where: str, raw: object) -> tuple[tuple[str, int], CommittedOffset]:
    """[topic, partition, offset] or [topic, partition, offset, leader_epoch, metadata]."""
    form = "[topic, partition, offset(, leader_epoch, metadata)]"
    topic, partition, entry = decode_topic_partition(f"snapshot {where}", raw, (3, 5), form)
    committed = CommittedOffset(decode_int(f"{where}[2]", entry[2]))
    if len(entry) == 5:
        epoch = entry[3]
        if type(epoch) is not int or not NO_EPOCH <= epoch < LEADER_EPOCH_LIMIT:
            raise MetadataDecodeError(f"snapshot {where}[3]: expected an epoch, got {epoch!r}")
        metadata = decode_str(f"{where}[4]", entry[4])
        if epoch == NO_EPOCH and not metadata:
            raise MetadataDecodeError(f"snapshot {where}: details written with nothing in them")
        committed = CommittedOffset(committed.offset, epoch, metadata)
    return (topic, int(partition)), committed


def _decode_node(where: str, raw: object) -> NodeInfo:
    keys: tuple[str, ...] = (
        "node_id",
        "client_address",
        "raft_address",
        "incarnation",
        "fenced",
        "last_heartbeat_ms",
    )
    if isinstance(raw, dict) and "status" in raw:
        keys += ("status",)
    if isinstance(raw, dict) and "kafka_address" in raw:
        keys += ("kafka_address",)
    fields_ = _object(where, raw, keys)
    status = decode_str(f"{where}.status", fields_.get("status", NODE_ACTIVE))
    if status not in NODE_STATUSES or ("status" in fields_ and status == NODE_ACTIVE):
        raise MetadataDecodeError(f"snapshot {where}.status: unknown status {status!r}")
    fenced = fields_["fenced"]
    if not isinstance(fenced, bool):
        raise MetadataDecodeError(f"snapshot {where}.fenced: expected a boolean, got {fenced!r}")
    return NodeInfo(
        node_id=NodeId(decode_int(f"{where}.node_id", fields_["node_id"])),
        client_address=decode_str(f"{where}.client_address", fields_["client_address"]),
        raft_address=decode_str(f"{where}.raft_address", fields_["raft_address"]),
        incarnation=decode_int(f"{where}.incarnation", fields_["incarnation"]),
        fenced=fenced,
        last_heartbeat_ms=decode_int(f"{where}.last_heartbeat_ms", fields_["last_heartbeat_ms"]),
        status=status,
        kafka_address=decode_str(f"{where}.kafka_address", fields_.get("kafka_address", "")),
    )


def _decode_topic(where: str, raw: object) -> tuple[TopicInfo, tuple[PartitionInfo, ...]]:
    keys = ("name", "topic_id", "replication_factor", "config", "partitions")
    fields_ = _object(where, raw, keys)
    name = decode_str(f"{where}.name", fields_["name"])
    config_raw = fields_["config"]
    if not isinstance(config_raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in config_raw.items()
    ):
        raise MetadataDecodeError(f"snapshot {where}.config: expected an object of strings")
    partitions = tuple(
        _decode_partition(f"{where}.partitions[{i}]", name, i, p)
        for i, p in enumerate(decode_list(f"{where}.partitions", fields_["partitions"]))
    )
    topic = TopicInfo(
        name=name,
        topic_id=decode_str(f"{where}.topic_id", fields_["topic_id"]),
        partition_count=len(partitions),
        replication_factor=decode_int(f"{where}.replication_factor", fields_["replication_factor"]),
        config=dict(sorted(config_raw.items())),
    )
    problem = check_topic_name(name) or check_topic_id(topic.topic_id)
    problem = problem or check_topic_config(topic.config)
    if problem is not None:
        raise MetadataDecodeError(f"snapshot {where}: {problem.message}")
    return topic, partitions


def _decode_partition(where: str, topic: str, index: int, raw: object) -> PartitionInfo:
    keys: tuple[str, ...] = ("group_id", "replicas", "leader_id", "leader_epoch")
    if isinstance(raw, dict):
        keys += tuple(k for k in ("target", "first_term", "log_start_floor") if k in raw)
    fields_ = _object(where, raw, keys)
    leader_id = _int_or_none(f"{where}.leader_id", fields_["leader_id"])
    replicas = decode_list(f"{where}.replicas", fields_["replicas"])
    target = None
    if "target" in fields_:
        raw_target = decode_list(f"{where}.target", fields_["target"])
        target = tuple(NodeId(decode_int(f"{where}.target", n)) for n in raw_target)
    return PartitionInfo(
        topic=topic,
        partition=PartitionId(index),
        raft_group_id=RaftGroupId(decode_int(f"{where}.group_id", fields_["group_id"])),
        replicas=tuple(NodeId(decode_int(f"{where}.replicas", n)) for n in replicas),
        leader_id=None if leader_id == NO_EPOCH else NodeId(leader_id),
        leader_epoch=_int_or_none(f"{where}.leader_epoch", fields_["leader_epoch"]),
        target=target,
        first_term=decode_int(f"{where}.first_term", fields_.get("first_term", 0)),
        log_start_floor=decode_int(f"{where}.log_start_floor", fields_.get("log_start_floor", 0)),
    )
