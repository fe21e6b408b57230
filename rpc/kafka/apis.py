"""The Kafka APIs this listener implements, at which versions, and ApiVersions.

ApiVersions advertises exactly this table; a request for any other API or version closes
its connection (Kafka's behaviour for requests it cannot parse), except an ApiVersions of a
version newer than ours, which gets Kafka's UNSUPPORTED_VERSION answer in the v0 layout with
the table, so the client can retry at a version both know (KIP-511).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from raftlog.rpc.kafka import (
    admin_handlers,
    auth,
    classic_group_handlers,
    cluster_handlers,
    config_handlers,
    consumer_group_handlers,
    group_offset_handlers,
    log_handlers,
    producer_id_handlers,
    txn_handlers,
)
from raftlog.rpc.kafka.context import KafkaContext
from raftlog.rpc.kafka.schema import NO_THROTTLE, build, response_module

__all__ = ["APIS", "API_VERSIONS", "Api", "api_versions"]

API_VERSIONS = 18

Handler = Callable[[KafkaContext, Any, int], Coroutine[Any, Any, Any | None]]


@dataclass(frozen=True, slots=True)
class Api:
    key: int
    name: str
    version_min: int
    version_max: int
    handler: Handler

    def supports(self, version: int) -> bool:
        """Whether this listener serves `version` of the API (both bounds inclusive)."""
        return self.version_min <= version <= self.version_max


async def api_versions(ctx: KafkaContext, request: Any, version: int) -> Any:
    """ApiVersions (v0 to v3): the table of every API and version this listener serves, with error
    code NONE; never reaches the node port."""
    return api_versions_response(version, ErrorCode.none)


def api_versions_response(version: int, code: ErrorCode) -> Any:
    """An ApiVersions response in `version`'s layout with error `code` and the full API table; also
    used in the v0 layout to answer UNSUPPORTED_VERSION (KIP-511)."""
    module = response_module(API_VERSIONS, version)
    return build(
        module.ApiVersionsResponse,
        error_code=code,
        api_keys=tuple(
            build(
                module.ApiVersion,
                api_key=api.key,
                min_version=api.version_min,
                max_version=api.version_max,
            )
            for api in APIS.values()
        ),
        throttle_time=NO_THROTTLE,
        supported_features=(),
        finalized_features_epoch=-1,
        finalized_features=(),
        zk_migration_ready=False,
    )


def _group_apis() -> list[Api]:
    g, c, o = classic_group_handlers, consumer_group_handlers, group_offset_handlers
    return [
        # v9 of both: the commit names a KIP-848 member and its epoch (KIP-848).
        Api(o.OFFSET_COMMIT, "OffsetCommit", 2, 9, o.offset_commit),
        Api(o.OFFSET_FETCH, "OffsetFetch", 1, 9, o.offset_fetch),
        Api(g.FIND_COORDINATOR, "FindCoordinator", 0, 4, g.find_coordinator),
        Api(g.JOIN_GROUP, "JoinGroup", 2, 9, g.join_group),
        Api(g.HEARTBEAT, "Heartbeat", 0, 4, g.heartbeat),
        Api(g.LEAVE_GROUP, "LeaveGroup", 0, 5, g.leave_group),
        Api(g.SYNC_GROUP, "SyncGroup", 0, 5, g.sync_group),
        Api(g.DESCRIBE_GROUPS, "DescribeGroups", 0, 5, g.describe_groups),
        Api(g.LIST_GROUPS, "ListGroups", 0, 4, g.list_groups),
        Api(o.DELETE_GROUPS, "DeleteGroups", 0, 2, o.delete_groups),
        Api(o.OFFSET_DELETE, "OffsetDelete", 0, 0, o.offset_delete),
        Api(
            c.CONSUMER_GROUP_HEARTBEAT,
            "ConsumerGroupHeartbeat",
            0,
            1,
            c.consumer_group_heartbeat,
        ),
        Api(
            c.CONSUMER_GROUP_DESCRIBE,
            "ConsumerGroupDescribe",
            0,
            1,
            c.consumer_group_describe,
        ),
    ]


def _transaction_apis() -> list[Api]:
    t = txn_handlers
    return [
        # v4+ is the brokers' batched form with verify_only (KIP-890 part 1).
        Api(t.ADD_PARTITIONS_TO_TXN, "AddPartitionsToTxn", 0, 5, t.add_partitions_to_txn),
        Api(t.ADD_OFFSETS_TO_TXN, "AddOffsetsToTxn", 0, 4, t.add_offsets_to_txn),
        # v5 bumps the epoch at every end (KIP-890 part 2).
        Api(t.END_TXN, "EndTxn", 0, 5, t.end_txn),
        Api(t.TXN_OFFSET_COMMIT, "TxnOffsetCommit", 0, 4, t.txn_offset_commit),
        Api(
            t.DESCRIBE_TRANSACTIONS,
            "DescribeTransactions",
            0,
            0,
            t.describe_transactions,
        ),
        Api(t.LIST_TRANSACTIONS, "ListTransactions", 0, 1, t.list_transactions),
    ]


APIS: dict[int, Api] = {
    api.key: api
    for api in (
        Api(log_handlers.PRODUCE, "Produce", 3, 9, log_handlers.produce),
        Api(log_handlers.FETCH, "Fetch", 4, 12, log_handlers.fetch),
        Api(log_handlers.LIST_OFFSETS, "ListOffsets", 1, 6, log_handlers.list_offsets),
        Api(
            log_handlers.DESCRIBE_PRODUCERS,
            "DescribeProducers",
            0,
            0,
            log_handlers.describe_producers,
        ),
        Api(cluster_handlers.METADATA, "Metadata", 1, 12, cluster_handlers.metadata),
        Api(API_VERSIONS, "ApiVersions", 0, 3, api_versions),
        *_group_apis(),
        Api(auth.SASL_HANDSHAKE, "SaslHandshake", 1, 1, auth.sasl_handshake),
        Api(auth.SASL_AUTHENTICATE, "SaslAuthenticate", 0, 2, auth.sasl_authenticate),
        Api(admin_handlers.CREATE_TOPICS, "CreateTopics", 2, 7, admin_handlers.create_topics),
        Api(admin_handlers.DELETE_TOPICS, "DeleteTopics", 1, 6, admin_handlers.delete_topics),
        Api(admin_handlers.DELETE_RECORDS, "DeleteRecords", 0, 2, admin_handlers.delete_records),
        Api(
            admin_handlers.CREATE_PARTITIONS,
            "CreatePartitions",
            0,
            3,
            admin_handlers.create_partitions,
        ),
        Api(
            config_handlers.DESCRIBE_CONFIGS,
            "DescribeConfigs",
            1,
            4,
            config_handlers.describe_configs,
        ),
        Api(config_handlers.ALTER_CONFIGS, "AlterConfigs", 0, 2, config_handlers.alter_configs),
        Api(
            config_handlers.INCREMENTAL_ALTER_CONFIGS,
            "IncrementalAlterConfigs",
            0,
            1,
            config_handlers.incremental_alter_configs,
        ),
        Api(
            producer_id_handlers.INIT_PRODUCER_ID,
            "InitProducerId",
            0,
            5,
            producer_id_handlers.init_producer_id,
        ),
        Api(
            log_handlers.OFFSET_FOR_LEADER_EPOCH,
            "OffsetForLeaderEpoch",
            2,
            4,
            log_handlers.offset_for_leader_epoch,
        ),
        Api(
            cluster_handlers.DESCRIBE_CLUSTER,
            "DescribeCluster",
            0,
            1,
            cluster_handlers.describe_cluster,
        ),
        *_transaction_apis(),
    )
}
