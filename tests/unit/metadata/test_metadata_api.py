"""Pins the public API of raftlog.metadata: the node runtime and the rpc layer call these
names, so a change here is a deliberate, reviewed change."""

from __future__ import annotations

import raftlog.metadata

PUBLIC = {
    "METADATA_RAFT_GROUP_ID",
    "AllocateProducerIds",
    "ApplyResult",
    "AssignmentError",
    "AutoCreateTopic",
    "Command",
    "CompleteDecommission",
    "AlterTopicConfig",
    "CreatePartitions",
    "CompleteReassignment",
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
}


def test_public_api_is_pinned() -> None:
    assert set(raftlog.metadata.__all__) == PUBLIC
    assert len(raftlog.metadata.__all__) == len(PUBLIC)
    for name in PUBLIC:
        assert getattr(raftlog.metadata, name) is not None


def test_metadata_errors_join_the_raftlog_tree() -> None:
    from raftlog.errors import RaftlogError

    assert issubclass(raftlog.metadata.MetadataError, RaftlogError)
    assert issubclass(raftlog.metadata.MetadataDecodeError, raftlog.metadata.MetadataError)
    assert issubclass(raftlog.metadata.AssignmentError, ValueError)
