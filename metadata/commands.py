"""The metadata log's vocabulary: the commands the controller proposes and every node applies.

Theory of operation. The metadata quorum is Raft group 0; each of its DATA entries carries one
command, encoded here. Every node applies the same committed commands in the same order, so the
encoding is deterministic (equal commands give equal bytes) and decoding is strict: a command
may come from an older or a buggy node, and a node that guessed at its meaning would diverge.

Encoding (format version 1): one version byte, then UTF-8 JSON with sorted keys and no
whitespace: `{"type": "<class name>", "<field>": <value>, ...}`. Each command type lists its
fields and their kinds in `_FIELD_KINDS` (a table, not code): `int` is a JSON integer in
[0, 2**63) and never a boolean, `bool` a JSON boolean, `str` a string, `ints` a list of
them, `int_lists` a list of lists, `str_map` an object of strings, `strs` a list of strings,
`epochs` a list of integers in [-1, 2**31) (-1: none), `offsets` a list of [topic, partition,
offset], `partitions` a list of [topic, partition], `producer_id` an `int` or -1 (none).
A field added to a command after it was first written is left out while it holds its default
(`_OPTIONAL_FIELDS`), so older commands keep their bytes and decode as they always did.
Decode demands exactly the listed fields; anything else raises `MetadataDecodeError` naming
the field and value, and `MetadataState.apply` turns that into an `INVALID_REQUEST` result
instead of guessing.

Time is an input: commands that need it carry `now_ms`, read by the proposing controller from
its clock, so every node applies the same instant.

This module also holds the checks that depend on a command alone and not on the state (Kafka's
topic-name rule, topic config keys and values, addresses) and the protocol limits every node
enforces identically. The controller's own, tighter limits live in `MetadataConfig`: those
gate what it proposes, while these decide what every node applies, so they must never differ
between nodes (changing one means a new format version).

    RaftlogError (raftlog.errors)
    └── MetadataError
        ├── MetadataDecodeError     bytes that are not a command or snapshot (names the field)
        └── AssignmentError         replicas cannot be placed (e.g. too few live nodes)
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, TypeAlias

from raftlog.errors import RaftlogError
from raftlog.metadata.model import NO_EPOCH, CommittedOffset
from raftlog.types import NodeId, PartitionId, RaftGroupId

__all__ = [
    "COMMAND_BYTES_MAX",
    "COMMAND_FORMAT_VERSION",
    "NO_PRODUCER_ID",
    "OFFSET_METADATA_CHARS_MAX",
    "PARTITIONS_PER_TOPIC_MAX",
    "PRODUCER_ID_BLOCK_MAX",
    "REPLICATION_FACTOR_MAX",
    "TOPIC_CONFIG_KEYS",
    "TOPIC_NAME_CHARS_MAX",
    "AddToTransaction",
    "AllocateProducerIds",
    "AlterTopicConfig",
    "ApplyResult",
    "AssignmentError",
    "AutoCreateTopic",
    "Command",
    "CommitGroupOffsets",
    "CommitTransactionOffsets",
    "CompleteDecommission",
    "CompleteEndTransaction",
    "CompleteReassignment",
    "CreatePartitions",
    "CreateTopic",
    "DecommissionNode",
    "DeleteGroup",
    "DeleteGroupOffsets",
    "DeleteRecords",
    "DeleteTopic",
    "ErrorCode",
    "ExpireTransactionalId",
    "FenceNode",
    "InitTransaction",
    "MetadataDecodeError",
    "MetadataError",
    "NodeHeartbeat",
    "PrepareEndTransaction",
    "ReassignPartition",
    "RegisterNode",
    "ReportLeader",
    "check_address",
    "check_topic_config",
    "check_topic_name",
    "commit_group_offsets",
    "committed_offsets_of",
    "decode_command",
    "encode_command",
    "offset_metadata_chars",
]

COMMAND_FORMAT_VERSION = 1
# Protocol limits: every node enforces them when applying, so they are constants, not config.
COMMAND_BYTES_MAX = 1024 * 1024  # one metadata entry fits in the default batch_bytes_max
TOPIC_NAME_CHARS_MAX = 249  # Kafka's limit: leaves room for ".partition" in file names
PARTITIONS_PER_TOPIC_MAX = 10_000
REPLICATION_FACTOR_MAX = 15
PRODUCER_ID_BLOCK_MAX = 1 << 20
ADDRESS_CHARS_MAX = 255
TOPIC_ID_CHARS_MAX = 64
CONFIG_VALUE_CHARS_MAX = 255
RAFT_GROUP_ID_LIMIT = 1 << 31  # Raft group ids travel as 32-bit values between nodes
INT_LIMIT = 1 << 63  # every integer field is a non-negative signed 64-bit value
CONSUMER_GROUP_ID_CHARS_MAX = 255
OFFSETS_PER_COMMIT_MAX = 10_000
CONSUMER_GROUPS_MAX = 100_000  # groups with committed offsets
# A committed offset's metadata string, counted as Kafka counts it (offset.metadata.max.bytes
# compares Java's String.length(): UTF-16 code units). The coordinator's own bound,
# MetadataConfig.group_offset_metadata_chars_max, is at most this.
OFFSET_METADATA_CHARS_MAX = 32_768
NO_PRODUCER_ID = -1  # the wire's "none" for a producer id (Kafka's RecordBatch.NO_PRODUCER_ID)
LEADER_EPOCH_LIMIT = 1 << 31  # a committed leader epoch is Kafka's int32, or -1 for none
# What one CommitGroupOffsets may hold of offsets' encoded bytes: the rest of COMMAND_BYTES_MAX
# is room for the group id and the JSON around them (`commit_group_offsets` splits by it).
_COMMIT_BYTES_BUDGET = COMMAND_BYTES_MAX // 2


class MetadataError(RaftlogError):
    """A failure of the metadata layer (raftlog.metadata)."""


class MetadataDecodeError(MetadataError, ValueError):
    """Bytes that are not a valid metadata command or snapshot; the message names what."""


class AssignmentError(MetadataError, ValueError):
    """Replicas cannot be placed as asked (for example more replicas than live nodes)."""


class ErrorCode(enum.Enum):
    """Why a command was rejected. Names follow the raftlog.v1 API's ErrorCode where it has
    one; the rpc layer maps the others (INVALID_TOPIC_NAME, ...) onto INVALID_REQUEST."""

    NONE = "NONE"
    INVALID_REQUEST = "INVALID_REQUEST"  # malformed bytes, bad address, out-of-range value
    TOPIC_ALREADY_EXISTS = "TOPIC_ALREADY_EXISTS"
    UNKNOWN_TOPIC = "UNKNOWN_TOPIC"
    UNKNOWN_PARTITION = "UNKNOWN_PARTITION"  # no such index, or a report from an older group
    INVALID_TOPIC_NAME = "INVALID_TOPIC_NAME"
    INVALID_PARTITIONS = "INVALID_PARTITIONS"
    INVALID_REPLICATION_FACTOR = "INVALID_REPLICATION_FACTOR"
    INVALID_REPLICA_ASSIGNMENT = "INVALID_REPLICA_ASSIGNMENT"
    INVALID_CONFIG = "INVALID_CONFIG"
    INVALID_GROUP_ID = "INVALID_GROUP_ID"  # group ids already handed out: the plan is stale
    UNKNOWN_NODE = "UNKNOWN_NODE"
    STALE_INCARNATION = "STALE_INCARNATION"  # an older process of a node that restarted
    LEASE_NOT_EXPIRED = "LEASE_NOT_EXPIRED"  # a heartbeat was applied after the fence was planned
    STALE_LEADER_EPOCH = "STALE_LEADER_EPOCH"
    UNKNOWN_GROUP = "UNKNOWN_GROUP"  # a consumer group with no committed offsets
    REASSIGNMENT_IN_PROGRESS = "REASSIGNMENT_IN_PROGRESS"  # one move per partition at a time
    NO_REASSIGNMENT_IN_PROGRESS = "NO_REASSIGNMENT_IN_PROGRESS"  # a late or stale completion
    NODE_DECOMMISSIONED = "NODE_DECOMMISSIONED"  # a decommissioned node may never come back
    DECOMMISSION_REFUSED = "DECOMMISSION_REFUSED"  # a metadata voter, or too few nodes left
    DECOMMISSION_INCOMPLETE = "DECOMMISSION_INCOMPLETE"  # the node still hosts replicas
    # Transactions (Kafka's codes of the same names):
    PRODUCER_FENCED = "PRODUCER_FENCED"  # an epoch older than the transactional id's
    INVALID_PRODUCER_EPOCH = "INVALID_PRODUCER_EPOCH"  # an epoch newer than it, or unknown
    INVALID_PRODUCER_ID_MAPPING = "INVALID_PRODUCER_ID_MAPPING"  # not the id's producer id
    INVALID_TXN_STATE = "INVALID_TXN_STATE"  # a request its state cannot serve
    CONCURRENT_TRANSACTIONS = "CONCURRENT_TRANSACTIONS"  # a commit or abort still completing
    INVALID_TRANSACTION_TIMEOUT = "INVALID_TRANSACTION_TIMEOUT"


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """The outcome of one command. `producer_id_first` is set by AllocateProducerIds only."""

    code: ErrorCode
    message: str = ""
    producer_id_first: int | None = None

    @property
    def ok(self) -> bool:
        return self.code is ErrorCode.NONE


OK = ApplyResult(ErrorCode.NONE)


def reject(code: ErrorCode, message: str) -> ApplyResult:
    assert code is not ErrorCode.NONE and message, (code, message)
    return ApplyResult(code, message)


# ---- commands ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RegisterNode:
    """A node (re)starting: its addresses and incarnation (higher on every restart)."""

    node_id: NodeId
    client_address: str  # host:port of the client API
    raft_address: str  # host:port of the node-to-node transport
    incarnation: int
    now_ms: int
    kafka_address: str = ""  # host:port of the Kafka listener; "" when it has none


@dataclass(frozen=True, slots=True)
class NodeHeartbeat:
    """Renews a node's lease; also unfences a node that was fenced and came back."""

    node_id: NodeId
    incarnation: int
    now_ms: int


@dataclass(frozen=True, slots=True)
class FenceNode:
    """The node's lease expired. `lease_ms` travels with it so apply re-checks the expiry
    against the latest heartbeat: one applied after the controller decided wins."""

    node_id: NodeId
    now_ms: int
    lease_ms: int


@dataclass(frozen=True, slots=True)
class CreateTopic:
    """A new topic with its replica assignment (first replica = preferred leader) and one
    fresh Raft group id per partition."""

    name: str
    topic_id: str
    partition_count: int
    replication_factor: int
    config: Mapping[str, str] = field(hash=False)
    assignments: tuple[tuple[NodeId, ...], ...]
    raft_group_ids: tuple[RaftGroupId, ...]


@dataclass(frozen=True, slots=True)
class AutoCreateTopic:
    """A topic a node asks the controller to create with these defaults, for a Kafka client
    (Kafka's topic auto-creation). It is a request, never a metadata log entry: the
    controller plans it into a `CreateTopic` as it receives it
    (`raftlog.node.metadata_calls.MetadataCalls.submit`), and `apply` refuses it."""

    name: str
    partition_count: int
    replication_factor: int


@dataclass(frozen=True, slots=True)
class DeleteTopic:
    name: str


@dataclass(frozen=True, slots=True)
class AlterTopicConfig:
    """Sets `set_config` and removes `delete_keys` (back to their defaults) in a topic's
    config, as one change (Kafka's IncrementalAlterConfigs); the result must pass the same
    checks as a config at create."""

    name: str
    set_config: Mapping[str, str] = field(hash=False)
    delete_keys: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CreatePartitions:
    """Appends partitions to a topic: one replica list and one fresh group id each."""

    name: str
    assignments: tuple[tuple[NodeId, ...], ...]
    raft_group_ids: tuple[RaftGroupId, ...]


@dataclass(frozen=True, slots=True)
class ReassignPartition:
    """Starts moving a partition to new replicas (KIP-455): the state records them as the
    partition's target, the partition leader reaches it by single-node membership changes of
    the group and reports `CompleteReassignment`. A target naming the same nodes in another
    order only changes the preferred leader and takes effect at once (no data moves)."""

    topic: str
    partition: PartitionId
    replicas: tuple[NodeId, ...]


@dataclass(frozen=True, slots=True)
class CompleteReassignment:
    """The partition leader saw its group's committed voters equal the target `replicas`:
    the target becomes the assignment, and only now may removed nodes delete their copy."""

    topic: str
    partition: PartitionId
    raft_group_id: RaftGroupId
    replicas: tuple[NodeId, ...]


@dataclass(frozen=True, slots=True)
class ReportLeader:
    """A partition leader announcing itself. `raft_group_id` tells a late report from a
    deleted topic's group apart from the same-named topic that replaced it."""

    topic: str
    partition: PartitionId
    raft_group_id: RaftGroupId
    leader_id: NodeId
    epoch: int


@dataclass(frozen=True, slots=True)
class AllocateProducerIds:
    """Hands out the next `count` producer ids (Kafka KRaft's AllocateProducerIds)."""

    count: int


@dataclass(frozen=True, slots=True)
class CommitGroupOffsets:
    """A consumer group's committed offsets: (topic, partition, next offset to consume), and per
    offset, in the same order, what Kafka's OffsetCommit carries besides: the leader epoch of
    the last record consumed (KIP-320; -1 for none) and the client's metadata string. Both
    tuples are empty when every epoch is -1 and every metadata "" (`commit_group_offsets`
    builds them so), which keeps the bytes of such commits as they were before these fields.
    The coordinator checked the committing member before proposing."""

    group_id: str  # a consumer group's name (not a Raft RaftGroupId)
    offsets: tuple[tuple[str, PartitionId, int], ...]
    leader_epochs: tuple[int, ...] = ()
    metadata: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DeleteGroup:
    """Forget a consumer group's committed offsets (the group has no members)."""

    group_id: str


@dataclass(frozen=True, slots=True)
class DeleteGroupOffsets:
    """Forget some of a consumer group's committed offsets (Kafka's OffsetDelete): partitions
    with none are skipped; a group left with none is forgotten. The coordinator checked that
    no member consumes these topics before proposing."""

    group_id: str
    partitions: tuple[tuple[str, PartitionId], ...]


@dataclass(frozen=True, slots=True)
class DeleteRecords:
    """Kafka's DeleteRecords: each partition's log start offset moves up to `offset` (a Kafka
    offset; a lower one than the partition has changes nothing). `raft_group_ids` names each
    partition's group, in the same order, so a command for a topic deleted and created again
    meanwhile is refused instead of deleting the new topic's records. The partition's leader
    checked each offset against its high watermark before proposing."""

    offsets: tuple[tuple[str, PartitionId, int], ...]
    raft_group_ids: tuple[RaftGroupId, ...]


@dataclass(frozen=True, slots=True)
class DecommissionNode:
    """Starts taking a node out of the cluster: no replica is placed on it again, and the
    controller moves its replicas off one move at a time (`controller.decommission_step`)."""

    node_id: NodeId


@dataclass(frozen=True, slots=True)
class CompleteDecommission:
    """A decommissioning node hosts nothing any more and the controller removed it from the
    metadata quorum's learners: it is decommissioned, and may never register again."""

    node_id: NodeId


@dataclass(frozen=True, slots=True)
class InitTransaction:
    """InitProducerId of a transactional id: a new id's first producer id at epoch 0, or a
    known id's next epoch (or, its epochs exhausted, a new producer id at epoch 0), with the
    producer's transaction timeout. The id must have no transaction open."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    now_ms: int


@dataclass(frozen=True, slots=True)
class AddToTransaction:
    """AddPartitionsToTxn and AddOffsetsToTxn: partitions and consumer groups join the
    producer's transaction, which starts (Ongoing, its timeout from `now_ms`) if none was."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: tuple[tuple[str, PartitionId], ...]
    groups: tuple[str, ...]
    now_ms: int


@dataclass(frozen=True, slots=True)
class PrepareEndTransaction:
    """EndTxn, a fencing InitProducerId or a timeout: Ongoing -> PrepareCommit/PrepareAbort,
    with the epoch bumped when `bump_epoch` (EndTxn v5+, KIP-890 part 2; and always when the
    coordinator aborts on its own, fencing the producer). Markers follow. `next_producer_id`
    (an EndTxn that bumps at a spent epoch) is the freshly allocated producer id the
    transactional id moves to at epoch 0 when the transaction completes."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    bump_epoch: bool
    now_ms: int
    next_producer_id: int = NO_PRODUCER_ID


@dataclass(frozen=True, slots=True)
class CompleteEndTransaction:
    """Every marker of the transaction is written: PrepareX -> CompleteX; a commit's pending
    transactional offsets become their groups' committed offsets, an abort's are dropped."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    now_ms: int


@dataclass(frozen=True, slots=True)
class ExpireTransactionalId:
    """A transactional id unused for `expiration_ms` with no transaction open is forgotten
    (Kafka's transactional.id.expiration.ms: the id goes Dead and is removed); its next
    InitProducerId starts it afresh with a new producer id."""

    transactional_id: str
    expiration_ms: int
    now_ms: int


@dataclass(frozen=True, slots=True)
class CommitTransactionOffsets:
    """TxnOffsetCommit: offsets of a consumer group held pending in the producer's open
    transaction (same fields as CommitGroupOffsets; epochs and metadata empty when all
    default)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    group_id: str
    offsets: tuple[tuple[str, PartitionId, int], ...]
    leader_epochs: tuple[int, ...] = ()
    metadata: tuple[str, ...] = ()


Command: TypeAlias = (
    RegisterNode
    | NodeHeartbeat
    | FenceNode
    | CreateTopic
    | AutoCreateTopic
    | DeleteTopic
    | AlterTopicConfig
    | CreatePartitions
    | ReassignPartition
    | CompleteReassignment
    | ReportLeader
    | AllocateProducerIds
    | CommitGroupOffsets
    | DeleteGroup
    | DeleteGroupOffsets
    | DeleteRecords
    | DecommissionNode
    | CompleteDecommission
    | InitTransaction
    | AddToTransaction
    | PrepareEndTransaction
    | CompleteEndTransaction
    | CommitTransactionOffsets
    | ExpireTransactionalId
)

# The wire schema, as data: command type -> field -> kind.
_FIELD_KINDS: dict[type[Any], dict[str, str]] = {
    RegisterNode: {
        "node_id": "int",
        "client_address": "str",
        "raft_address": "str",
        "incarnation": "int",
        "now_ms": "int",
        "kafka_address": "str",
    },
    NodeHeartbeat: {"node_id": "int", "incarnation": "int", "now_ms": "int"},
    FenceNode: {"node_id": "int", "now_ms": "int", "lease_ms": "int"},
    CreateTopic: {
        "name": "str",
        "topic_id": "str",
        "partition_count": "int",
        "replication_factor": "int",
        "config": "str_map",
        "assignments": "int_lists",
        "raft_group_ids": "ints",
    },
    AutoCreateTopic: {"name": "str", "partition_count": "int", "replication_factor": "int"},
    DeleteTopic: {"name": "str"},
    AlterTopicConfig: {"name": "str", "set_config": "str_map", "delete_keys": "strs"},
    CreatePartitions: {"name": "str", "assignments": "int_lists", "raft_group_ids": "ints"},
    ReassignPartition: {"topic": "str", "partition": "int", "replicas": "ints"},
    CompleteReassignment: {
        "topic": "str",
        "partition": "int",
        "raft_group_id": "int",
        "replicas": "ints",
    },
    ReportLeader: {
        "topic": "str",
        "partition": "int",
        "raft_group_id": "int",
        "leader_id": "int",
        "epoch": "int",
    },
    AllocateProducerIds: {"count": "int"},
    CommitGroupOffsets: {
        "group_id": "str",
        "offsets": "offsets",
        "leader_epochs": "epochs",
        "metadata": "strs",
    },
    DeleteGroup: {"group_id": "str"},
    DeleteGroupOffsets: {"group_id": "str", "partitions": "partitions"},
    DeleteRecords: {"offsets": "offsets", "raft_group_ids": "ints"},
    DecommissionNode: {"node_id": "int"},
    CompleteDecommission: {"node_id": "int"},
    InitTransaction: {
        "transactional_id": "str",
        "producer_id": "int",
        "producer_epoch": "int",
        "timeout_ms": "int",
        "now_ms": "int",
    },
    AddToTransaction: {
        "transactional_id": "str",
        "producer_id": "int",
        "producer_epoch": "int",
        "partitions": "partitions",
        "groups": "strs",
        "now_ms": "int",
    },
    PrepareEndTransaction: {
        "transactional_id": "str",
        "producer_id": "int",
        "producer_epoch": "int",
        "commit": "bool",
        "bump_epoch": "bool",
        "now_ms": "int",
        "next_producer_id": "producer_id",
    },
    CompleteEndTransaction: {
        "transactional_id": "str",
        "producer_id": "int",
        "producer_epoch": "int",
        "now_ms": "int",
    },
    ExpireTransactionalId: {"transactional_id": "str", "expiration_ms": "int", "now_ms": "int"},
    CommitTransactionOffsets: {
        "transactional_id": "str",
        "producer_id": "int",
        "producer_epoch": "int",
        "group_id": "str",
        "offsets": "offsets",
        "leader_epochs": "epochs",
        "metadata": "strs",
    },
}
# Fields added after a command was first written: left out while they hold this default, so
# the bytes of every command written before them (and their meaning) stay as they were.
_OPTIONAL_FIELDS: dict[type[Any], dict[str, Any]] = {
    RegisterNode: {"kafka_address": ""},
    CommitGroupOffsets: {"leader_epochs": (), "metadata": ()},
    PrepareEndTransaction: {"next_producer_id": NO_PRODUCER_ID},
}
# Fields renamed since they were first written: the wire keeps the old key (the commands in a
# metadata log written before decode as they always did).
_WIRE_KEYS: dict[type[Any], dict[str, str]] = {
    CreateTopic: {"raft_group_ids": "group_ids"},
    CreatePartitions: {"raft_group_ids": "group_ids"},
    CompleteReassignment: {"raft_group_id": "group_id"},
    ReportLeader: {"raft_group_id": "group_id"},
}
_TYPES_BY_NAME: dict[str, type[Any]] = {t.__name__: t for t in _FIELD_KINDS}
assert all(tuple(f.name for f in fields(t)) == tuple(k) for t, k in _FIELD_KINDS.items())


def encode_command(command: Command) -> bytes:
    """The canonical bytes of `command` (equal commands give equal bytes)."""
    kinds = _FIELD_KINDS[type(command)]
    body: dict[str, Any] = {"type": type(command).__name__}
    optional = _OPTIONAL_FIELDS.get(type(command), {})
    wire_keys = _WIRE_KEYS.get(type(command), {})
    for name, kind in kinds.items():
        value = getattr(command, name)
        if name in optional and value == optional[name]:
            continue
        if kind == "int_lists":
            value = [list(replicas) for replicas in value]
        elif kind in ("ints", "strs", "epochs", "offsets", "partitions"):
            nested = kind in ("offsets", "partitions")
            value = [list(item) for item in value] if nested else list(value)
        elif kind == "str_map":
            value = dict(value)
        body[wire_keys.get(name, name)] = value
    data = bytes([COMMAND_FORMAT_VERSION]) + canonical_json(body)
    assert data[0] == COMMAND_FORMAT_VERSION and len(data) > 1
    return data


def canonical_json(value: object) -> bytes:
    """Deterministic JSON: sorted keys, no whitespace, ASCII only."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def decode_command(data: bytes) -> Command:
    """Parses bytes made by `encode_command`; raises MetadataDecodeError on anything else."""
    if len(data) > COMMAND_BYTES_MAX:
        raise MetadataDecodeError(f"command of {len(data)} bytes exceeds {COMMAND_BYTES_MAX}")
    if not data or data[0] != COMMAND_FORMAT_VERSION:
        version = data[0] if data else None
        raise MetadataDecodeError(f"unknown command format version {version}")
    body = parse_json_object(data[1:], what="command")
    type_name = body.pop("type", None)
    command_type = _TYPES_BY_NAME.get(type_name) if isinstance(type_name, str) else None
    if command_type is None:
        raise MetadataDecodeError(f"unknown command type {type_name!r}")
    kinds = _FIELD_KINDS[command_type]
    for name, key in _WIRE_KEYS.get(command_type, {}).items():
        if key in body:
            body[name] = body.pop(key)
    for name, default in _OPTIONAL_FIELDS.get(command_type, {}).items():
        body.setdefault(name, list(default) if isinstance(default, tuple) else default)
    if set(body) != set(kinds):
        raise MetadataDecodeError(f"{type_name} needs fields {sorted(kinds)}, got {sorted(body)}")
    wire_keys = _WIRE_KEYS.get(command_type, {})
    values = {
        name: _decode_field(f"{type_name}.{wire_keys.get(name, name)}", kind, body[name])
        for name, kind in kinds.items()
    }
    command: Command = command_type(**values)
    return command


def parse_json_object(data: bytes, *, what: str) -> dict[str, Any]:
    """Strict JSON: UTF-8, no NaN/Infinity, a top-level object."""

    def no_constants(token: str) -> None:
        raise MetadataDecodeError(f"{what}: {token} is not a number")

    try:
        body = json.loads(data.decode("utf-8"), parse_constant=no_constants)
    # ValueError also covers integers too long for int() (Python's 4300-digit limit).
    except (ValueError, RecursionError) as error:
        raise MetadataDecodeError(f"{what}: not UTF-8 JSON ({error})") from None
    if not isinstance(body, dict):
        raise MetadataDecodeError(f"{what}: expected a JSON object, got {type(body).__name__}")
    return body


def decode_int(where: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < INT_LIMIT:
        raise MetadataDecodeError(f"{where}: expected an integer in [0, 2**63), got {value!r}")
    return value


def decode_str(where: str, value: object) -> str:
    if not isinstance(value, str):
        raise MetadataDecodeError(f"{where}: expected a string, got {value!r}")
    return value


def decode_list(where: str, value: object) -> list[object]:
    if not isinstance(value, list):
        raise MetadataDecodeError(f"{where}: expected a list, got {value!r}")
    return value


def _decode_ints(where: str, value: object) -> tuple[int, ...]:
    return tuple(
        decode_int(f"{where}[{i}]", item) for i, item in enumerate(decode_list(where, value))
    )


def decode_topic_partition(
    where: str, raw: object, widths: tuple[int, ...], form: str
) -> tuple[str, PartitionId, list[object]]:
    """One [topic, partition, ...] entry of one of `widths` lengths (`form` names them in the
    error): its topic, its partition and the whole entry, for the caller to read the rest."""
    entry = decode_list(where, raw)
    if len(entry) not in widths:
        raise MetadataDecodeError(f"{where}: expected {form}")
    topic = decode_str(f"{where}[0]", entry[0])
    return topic, PartitionId(decode_int(f"{where}[1]", entry[1])), entry


def decode_offsets(where: str, value: object) -> tuple[tuple[str, PartitionId, int], ...]:
    """A list of [topic, partition, offset] triples."""
    triples = []
    for i, raw in enumerate(decode_list(where, value)):
        at = f"{where}[{i}]"
        topic, partition, entry = decode_topic_partition(
            at, raw, (3,), "[topic, partition, offset]"
        )
        triples.append((topic, partition, decode_int(f"{at}[2]", entry[2])))
    return tuple(triples)


def _decode_partitions(where: str, value: object) -> tuple[tuple[str, PartitionId], ...]:
    """A list of [topic, partition] pairs."""
    return tuple(
        decode_topic_partition(f"{where}[{i}]", raw, (2,), "[topic, partition]")[:2]
        for i, raw in enumerate(decode_list(where, value))
    )


def _decode_epochs(where: str, value: object) -> tuple[int, ...]:
    epochs = []
    for i, item in enumerate(decode_list(where, value)):
        if type(item) is not int or not -1 <= item < LEADER_EPOCH_LIMIT:
            raise MetadataDecodeError(
                f"{where}[{i}]: expected an epoch in [-1, 2**31), got {item!r}"
            )
        epochs.append(item)
    return tuple(epochs)


def decode_producer_id(where: str, value: object) -> int:
    """A producer id, or NO_PRODUCER_ID for none."""
    if type(value) is int and value == NO_PRODUCER_ID:
        return NO_PRODUCER_ID
    return decode_int(where, value)


def _decode_bool(where: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise MetadataDecodeError(f"{where}: expected a boolean, got {value!r}")
    return value


def _decode_str_map(where: str, value: object) -> dict[str, str]:
    if not isinstance(value, dict):
        raise MetadataDecodeError(f"{where}: expected an object, got {value!r}")
    return {
        decode_str(f"{where} key", k): decode_str(f"{where}[{k!r}]", v) for k, v in value.items()
    }


def _decode_field(where: str, kind: str, value: object) -> object:
    decoders: dict[str, Callable[[str, object], object]] = {
        "int": decode_int,
        "bool": _decode_bool,
        "str": decode_str,
        "ints": _decode_ints,
        "int_lists": lambda w, v: tuple(
            _decode_ints(f"{w}[{i}]", item) for i, item in enumerate(decode_list(w, v))
        ),
        "str_map": _decode_str_map,
        "strs": lambda w, v: tuple(
            decode_str(f"{w}[{i}]", item) for i, item in enumerate(decode_list(w, v))
        ),
        "offsets": decode_offsets,
        "epochs": _decode_epochs,
        "partitions": _decode_partitions,
        "producer_id": decode_producer_id,
    }
    return decoders[kind](where, value)


# ---- building commands ---------------------------------------------------------------------


def offset_metadata_chars(metadata: str) -> int:
    """`metadata`'s length as Kafka measures it against offset.metadata.max.bytes: Java's
    String.length(), UTF-16 code units (a character outside the BMP counts two)."""
    return len(metadata.encode("utf-16-le", "surrogatepass")) // 2


def commit_group_offsets(
    group_id: str, entries: Sequence[tuple[str, PartitionId, int, int, str]]
) -> list[CommitGroupOffsets]:
    """Commands committing `entries` ((topic, partition, offset, leader epoch, metadata)), in
    order: as few as hold at most OFFSETS_PER_COMMIT_MAX offsets and fit COMMAND_BYTES_MAX
    each. A command whose epochs are all -1 and metadata all "" leaves both tuples empty."""
    commands: list[CommitGroupOffsets] = []
    chunk: list[tuple[str, PartitionId, int, int, str]] = []
    chunk_bytes = 0
    for entry in entries:
        topic, partition, offset, epoch, metadata = entry
        entry_bytes = len(canonical_json([topic, partition, offset, epoch, metadata]))
        full = (
            len(chunk) >= OFFSETS_PER_COMMIT_MAX or chunk_bytes + entry_bytes > _COMMIT_BYTES_BUDGET
        )
        if chunk and full:
            commands.append(_commit_command(group_id, chunk))
            chunk, chunk_bytes = [], 0
        chunk.append(entry)
        chunk_bytes += entry_bytes
    if chunk:
        commands.append(_commit_command(group_id, chunk))
    assert sum(len(c.offsets) for c in commands) == len(entries)
    return commands


def committed_offsets_of(
    command: CommitGroupOffsets | CommitTransactionOffsets,
) -> list[tuple[tuple[str, int], CommittedOffset]]:
    """The command's offsets by (topic, partition), each with its leader epoch and metadata
    (the defaults where the command leaves those tuples empty)."""
    count = len(command.offsets)
    epochs = command.leader_epochs or (NO_EPOCH,) * count
    metadata = command.metadata or ("",) * count
    return [
        ((topic, int(partition)), CommittedOffset(offset, epoch, text))
        for (topic, partition, offset), epoch, text in zip(
            command.offsets, epochs, metadata, strict=True
        )
    ]


def _commit_command(
    group_id: str, chunk: Sequence[tuple[str, PartitionId, int, int, str]]
) -> CommitGroupOffsets:
    epochs = tuple(epoch for _, _, _, epoch, _ in chunk)
    metadata = tuple(text for *_, text in chunk)
    return CommitGroupOffsets(
        group_id,
        tuple((topic, partition, offset) for topic, partition, offset, _, _ in chunk),
        epochs if any(epoch != -1 for epoch in epochs) else (),
        metadata if any(metadata) else (),
    )


# ---- checks that depend on a command alone -------------------------------------------------

_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")
_TOPIC_ID = re.compile(r"[a-zA-Z0-9_-]+")
_CANONICAL_INT = re.compile(r"-?(0|[1-9][0-9]*)")
_INT32_MAX = (1 << 31) - 1


def check_topic_name(name: str) -> ApplyResult | None:
    """Kafka's rule: 1-249 characters of [a-zA-Z0-9._-], and not "." or ".."."""
    if not 1 <= len(name) <= TOPIC_NAME_CHARS_MAX:
        return reject(
            ErrorCode.INVALID_TOPIC_NAME,
            f"topic name must be 1-{TOPIC_NAME_CHARS_MAX} characters, got {len(name)}",
        )
    if name in (".", "..") or not _TOPIC_NAME.fullmatch(name):
        return reject(
            ErrorCode.INVALID_TOPIC_NAME,
            f"topic name {name!r} must use only [a-zA-Z0-9._-] and not be '.' or '..'",
        )
    return None


def check_topic_id(topic_id: str) -> ApplyResult | None:
    if not 1 <= len(topic_id) <= TOPIC_ID_CHARS_MAX or not _TOPIC_ID.fullmatch(topic_id):
        return reject(
            ErrorCode.INVALID_REQUEST,
            f"topic id {topic_id!r} must be 1-{TOPIC_ID_CHARS_MAX} characters of [a-zA-Z0-9_-]",
        )
    return None


def topic_name_collision_key(name: str) -> str:
    """Kafka refuses topics that differ only in '.' versus '_' (their metric names collide)."""
    return name.replace(".", "_")


def _int_in(low: int, high: int) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        if not _CANONICAL_INT.fullmatch(value) or value == "-0":
            return "must be a decimal integer without sign '+', spaces or leading zeros"
        if not low <= int(value) <= high:
            return f"must be in [{low}, {high}]"
        return None

    return check


def _one_of(*allowed: str) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        return None if value in allowed else f"must be one of {list(allowed)}"

    return check


def _ratio(value: str) -> str | None:
    try:
        ratio = float(value)
    except ValueError:
        ratio = -1.0
    if not _RATIO.fullmatch(value) or not 0.0 <= ratio <= 1.0:
        return "must be a decimal number in [0, 1], such as 0.5"
    return None


_RATIO = re.compile(r"(0|1)(\.[0-9]{1,6})?")


_compression_type = _one_of("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd")


# Topic config keys and their value checks (Kafka's names). -1 means "unlimited" for
# retention. min.insync.replicas is refused on purpose: a Raft group commits on a majority,
# so acks=all already means "a majority"; a second, different quorum knob would mislead.
# cleanup.policy: delete (retention), compact (raftlog.partition.cleaning) or both, as Kafka
# spells them ("compact,delete" in either order).
TOPIC_CONFIG_KEYS: dict[str, Callable[[str], str | None]] = {
    "retention.bytes": _int_in(-1, INT_LIMIT - 1),
    "retention.ms": _int_in(-1, INT_LIMIT - 1),
    "segment.bytes": _int_in(1024, _INT32_MAX),
    "segment.ms": _int_in(1, INT_LIMIT - 1),
    "max.message.bytes": _int_in(1, _INT32_MAX),
    "cleanup.policy": _one_of("delete", "compact", "compact,delete", "delete,compact"),
    "min.cleanable.dirty.ratio": _ratio,
    "min.compaction.lag.ms": _int_in(0, INT_LIMIT - 1),
    "max.compaction.lag.ms": _int_in(1, INT_LIMIT - 1),
    "delete.retention.ms": _int_in(0, INT_LIMIT - 1),
    # producer: batches keep the producer's codec; any other: the leader recompresses each
    # batch in another codec on produce (partition/policy.py).
    "compression.type": _compression_type,
}
_REFUSED_CONFIG_KEYS = {
    "min.insync.replicas": "not supported: a Raft group commits on a majority of its replicas",
}


def check_topic_config(config: Mapping[str, str]) -> ApplyResult | None:
    """Known keys with typed values (max.message.bytes may exceed segment.bytes, as on Kafka:
    each bounds a produced batch on its own)."""
    for key in sorted(config):
        value = config[key]
        if len(value) > CONFIG_VALUE_CHARS_MAX:
            return reject(
                ErrorCode.INVALID_CONFIG,
                f"config {key}: value of {len(value)} characters exceeds {CONFIG_VALUE_CHARS_MAX}",
            )
        if key in _REFUSED_CONFIG_KEYS:
            return reject(
                ErrorCode.INVALID_CONFIG, f"config {key}={value!r}: {_REFUSED_CONFIG_KEYS[key]}"
            )
        check = TOPIC_CONFIG_KEYS.get(key)
        if check is None:
            return reject(
                ErrorCode.INVALID_CONFIG,
                f"unknown config key {key[:CONFIG_VALUE_CHARS_MAX]!r} "
                f"(known: {sorted(TOPIC_CONFIG_KEYS)})",
            )
        problem = check(value)
        if problem is not None:
            return reject(ErrorCode.INVALID_CONFIG, f"config {key}={value!r}: {problem}")
    if int(config.get("min.compaction.lag.ms", "0")) > int(
        config.get("max.compaction.lag.ms", str(INT_LIMIT - 1))
    ):
        return reject(
            ErrorCode.INVALID_CONFIG,
            "config min.compaction.lag.ms exceeds max.compaction.lag.ms "
            f"({config['min.compaction.lag.ms']} > {config.get('max.compaction.lag.ms')})",
        )
    return None


def check_address(what: str, address: str) -> ApplyResult | None:
    """host:port with a port in 1-65535 (IPv6 hosts in brackets)."""
    host, colon, port = address.rpartition(":")
    problem = None
    if len(address) > ADDRESS_CHARS_MAX:
        problem = f"longer than {ADDRESS_CHARS_MAX} characters"
    elif not colon or not host or any(c.isspace() for c in address):
        problem = "expected host:port"
    elif not port.isascii() or not port.isdigit() or not 1 <= int(port) <= 65535:
        problem = "port must be 1-65535"
    if problem is None:
        return None
    return reject(ErrorCode.INVALID_REQUEST, f"{what} {address!r}: {problem}")
