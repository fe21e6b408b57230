"""The metadata quorum: a Raft-replicated controller (raftlog.metadata).

The metadata quorum is Raft group 0. Its state machine (`MetadataState`, `state.py`)
applies commands (`commands.py`: nodes, topics, partitions, leaders, producer ids)
deterministically: each is first checked (`checks.py`, read only) then carried out, over the
records of `model.py`; it snapshots to canonical bytes (`snapshot_codec.py`). The
controller's decisions (`controller.py`, `assignment.py`) are pure functions from that state
and the time to commands, and `reassignment.py` is the partition leader's next step of a
replica move. The transaction coordinator's state (`transactions.py`, one `TransactionState`
per transactional id, and pending transactional offsets) lives here too, changed by its own
commands (`transaction_checks.py`, `transaction_table.py`) and planned by
`transaction_plans.py`. Nothing here does I/O: the node runtime proposes, commits and applies, and
calls these functions.
"""

from raftlog.metadata.assignment import NodeLoad, assign_replicas
from raftlog.metadata.catch_up import caught_up_since_start
from raftlog.metadata.checks import check_new_topic_name
from raftlog.metadata.commands import (
    AllocateProducerIds,
    AlterTopicConfig,
    ApplyResult,
    AssignmentError,
    AutoCreateTopic,
    Command,
    CompleteDecommission,
    CompleteReassignment,
    CreatePartitions,
    CreateTopic,
    DecommissionNode,
    DeleteRecords,
    DeleteTopic,
    ErrorCode,
    FenceNode,
    MetadataDecodeError,
    MetadataError,
    NodeHeartbeat,
    ReassignPartition,
    RegisterNode,
    ReportLeader,
    decode_command,
    encode_command,
)
from raftlog.metadata.controller import (
    CreateTopicRequest,
    LeaderMove,
    auto_rebalance_step,
    decommission_step,
    expired_nodes,
    fences_by_silence,
    live_node_ids,
    node_loads,
    plan_create_partitions,
    plan_create_topic,
    plan_decommission,
    preferred_leader_moves,
    rebalance_plan,
)
from raftlog.metadata.state import (
    METADATA_RAFT_GROUP_ID,
    MetadataState,
    NodeInfo,
    PartitionInfo,
    TopicInfo,
)

__all__ = [
    "METADATA_RAFT_GROUP_ID",
    "AllocateProducerIds",
    "AlterTopicConfig",
    "ApplyResult",
    "AssignmentError",
    "AutoCreateTopic",
    "Command",
    "CompleteDecommission",
    "CompleteReassignment",
    "CreatePartitions",
    "CreateTopic",
    "CreateTopicRequest",
    "DecommissionNode",
    "DeleteRecords",
    "DeleteTopic",
    "ErrorCode",
    "FenceNode",
    "LeaderMove",
    "MetadataDecodeError",
    "MetadataError",
    "MetadataState",
    "NodeHeartbeat",
    "NodeInfo",
    "NodeLoad",
    "PartitionInfo",
    "ReassignPartition",
    "RegisterNode",
    "ReportLeader",
    "TopicInfo",
    "assign_replicas",
    "auto_rebalance_step",
    "caught_up_since_start",
    "check_new_topic_name",
    "decode_command",
    "decommission_step",
    "encode_command",
    "expired_nodes",
    "fences_by_silence",
    "live_node_ids",
    "node_loads",
    "plan_create_partitions",
    "plan_create_topic",
    "plan_decommission",
    "preferred_leader_moves",
    "rebalance_plan",
]
