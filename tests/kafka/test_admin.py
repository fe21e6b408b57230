"""confluent-kafka's AdminClient: topics created, grown, described and deleted over Kafka; node
and group configs described; authorized operations."""

from __future__ import annotations

import datetime
import time
from typing import Any

import pytest
from kio.schema.create_topics.v7 import request as ct
from kio.schema.describe_configs.v4 import request as dc
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12 import request as md
from kio.static.primitive import i8, i16, i32, i32Timedelta

from raftlog.client import Admin
from raftlog.local_cluster import LocalCluster
from tests.kafka.kafka_wire import kafka_call, wait_for_preferred_leaders

kafka = pytest.importorskip("confluent_kafka")
admin_module = pytest.importorskip("confluent_kafka.admin")


def _client(cluster: LocalCluster) -> object:
    return admin_module.AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})


def test_create_grow_describe_and_delete_a_topic(kafka_cluster: LocalCluster) -> None:
    client = _client(kafka_cluster)
    new = admin_module.NewTopic(
        "admin-t", num_partitions=2, replication_factor=3, config={"retention.ms": "60000"}
    )
    client.create_topics([new], operation_timeout=30)["admin-t"].result(timeout=40)  # type: ignore[attr-defined]
    with Admin(kafka_cluster.bootstrap) as admin:
        described = admin.describe_topic("admin-t")
    assert len(described.partitions) == 2 and described.config["retention.ms"] == "60000"

    grow = admin_module.NewPartitions("admin-t", 3)
    client.create_partitions([grow], operation_timeout=30)["admin-t"].result(timeout=40)  # type: ignore[attr-defined]
    listed = client.list_topics(timeout=10)  # type: ignore[attr-defined]
    assert len(listed.topics["admin-t"].partitions) == 3

    resource = admin_module.ConfigResource(admin_module.ResourceType.TOPIC, "admin-t")
    configs = client.describe_configs([resource])[resource].result(timeout=20)  # type: ignore[attr-defined]
    assert configs["retention.ms"].value == "60000" and not configs["retention.ms"].is_default
    assert configs["cleanup.policy"].value == "delete" and configs["cleanup.policy"].is_default

    client.delete_topics(["admin-t"], operation_timeout=30)["admin-t"].result(timeout=40)  # type: ignore[attr-defined]
    deadline = time.monotonic() + 20
    while "admin-t" in client.list_topics(timeout=10).topics:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, "topic still listed after its deletion"
        time.sleep(0.1)


def test_bad_requests_get_kafka_errors_and_validate_only_creates_nothing(
    kafka_cluster: LocalCluster,
) -> None:
    client = _client(kafka_cluster)
    checked = admin_module.NewTopic("admin-dry", num_partitions=1, replication_factor=3)
    client.create_topics([checked], validate_only=True)["admin-dry"].result(timeout=40)  # type: ignore[attr-defined]
    assert "admin-dry" not in client.list_topics(timeout=10).topics  # type: ignore[attr-defined]

    bad = admin_module.NewTopic(
        "admin-bad", num_partitions=1, replication_factor=3, config={"no.such.key": "1"}
    )
    with pytest.raises(kafka.KafkaException) as raised:
        client.create_topics([bad])["admin-bad"].result(timeout=40)  # type: ignore[attr-defined]
    assert raised.value.args[0].code() == kafka.KafkaError.INVALID_CONFIG
    assert "no.such.key" in raised.value.args[0].str()

    with pytest.raises(kafka.KafkaException) as raised:
        client.delete_topics(["admin-missing"])["admin-missing"].result(timeout=40)  # type: ignore[attr-defined]
    assert raised.value.args[0].code() == kafka.KafkaError.UNKNOWN_TOPIC_OR_PART


def _placed(name: str, assignments: dict[int, tuple[int, ...]], **sizes: int) -> Any:
    """A CreateTopics request with manual replica assignments (partition -> node ids)."""
    return ct.CreateTopicsRequest(
        topics=(
            ct.CreatableTopic(
                name=ct.TopicName(name),
                num_partitions=i32(sizes.get("num_partitions", -1)),
                replication_factor=i16(sizes.get("replication_factor", -1)),
                assignments=tuple(
                    ct.CreatableReplicaAssignment(
                        partition_index=i32(p), broker_ids=tuple(ct.BrokerId(n) for n in nodes)
                    )
                    for p, nodes in assignments.items()
                ),
                configs=(),
            ),
        ),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)),
        validate_only=False,
    )


def test_manual_replica_assignments_place_partitions_and_bad_ones_get_kafka_errors(
    kafka_cluster: LocalCluster,
) -> None:
    # kafka-topics.sh --replica-assignment, through confluent-kafka: the first replica of
    # each partition is its preferred leader.
    client = _client(kafka_cluster)
    placed = admin_module.NewTopic(
        "admin-placed",
        num_partitions=2,  # confluent-kafka's rule; the request carries -1
        replica_assignment=[[3, 1], [2, 3]],
    )
    client.create_topics([placed], operation_timeout=30)["admin-placed"].result(timeout=40)  # type: ignore[attr-defined]
    grow = admin_module.NewPartitions("admin-placed", 3, replica_assignment=[[1, 2]])
    client.create_partitions([grow], operation_timeout=30)["admin-placed"].result(timeout=40)  # type: ignore[attr-defined]
    with Admin(kafka_cluster.bootstrap) as admin:
        wait_for_preferred_leaders(admin, "admin-placed")
        described = admin.describe_topic("admin-placed")
        controller = admin.describe_cluster().controller_id
    assert [p.replicas for p in described.partitions] == [(3, 1), (2, 3), (1, 2)]
    assert [p.leader for p in described.partitions] == [3, 2, 1]

    address = f"127.0.0.1:{kafka_cluster.nodes[controller].kafka_port}"
    refusals = {
        "both": (_placed("admin-both", {0: (1, 2)}, num_partitions=1), ErrorCode.invalid_request),
        "gap": (_placed("admin-gap", {0: (1, 2), 2: (2, 3)}), ErrorCode.invalid_replica_assignment),
        "uneven": (
            _placed("admin-uneven", {0: (1, 2), 1: (3,)}),
            ErrorCode.invalid_replica_assignment,
        ),
        "twice": (_placed("admin-twice", {0: (1, 1)}), ErrorCode.invalid_replica_assignment),
        "unknown": (_placed("admin-unknown", {0: (1, 9)}), ErrorCode.invalid_replica_assignment),
        "empty": (_placed("admin-empty", {0: ()}), ErrorCode.invalid_replica_assignment),
    }
    for case, (request, code) in refusals.items():
        (result,) = kafka_call(address, request).topics
        assert result.error_code == code, (case, result)
        assert result.error_message, case
    listed = client.list_topics(timeout=10).topics  # type: ignore[attr-defined]
    assert not set(listed) & {f"admin-{case}" for case in refusals}
    short = admin_module.NewPartitions("admin-placed", 5, replica_assignment=[[1, 2]])
    with pytest.raises(kafka.KafkaException) as raised:
        client.create_partitions([short])["admin-placed"].result(timeout=40)  # type: ignore[attr-defined]
    assert raised.value.args[0].code() == kafka.KafkaError.INVALID_REPLICA_ASSIGNMENT


def test_topic_configs_are_altered_over_kafka_and_compacted_topics_want_keys(
    kafka_cluster: LocalCluster,
) -> None:
    client = _client(kafka_cluster)
    new = admin_module.NewTopic("admin-compact", num_partitions=1, replication_factor=3)
    client.create_topics([new], operation_timeout=30)["admin-compact"].result(timeout=40)  # type: ignore[attr-defined]
    resource = admin_module.ConfigResource(
        admin_module.ResourceType.TOPIC,
        "admin-compact",
        incremental_configs=[
            admin_module.ConfigEntry(
                "cleanup.policy", "compact",
                incremental_operation=admin_module.AlterConfigOpType.SET,
            ),
            admin_module.ConfigEntry(
                "min.cleanable.dirty.ratio", "0.1",
                incremental_operation=admin_module.AlterConfigOpType.SET,
            ),
        ],
    )  # fmt: skip
    client.incremental_alter_configs([resource])[resource].result(timeout=40)  # type: ignore[attr-defined]
    described = admin_module.ConfigResource(admin_module.ResourceType.TOPIC, "admin-compact")
    configs = client.describe_configs([described])[described].result(timeout=20)  # type: ignore[attr-defined]
    assert configs["cleanup.policy"].value == "compact"
    assert configs["min.cleanable.dirty.ratio"].value == "0.1"
    assert configs["delete.retention.ms"].is_default

    bad = admin_module.ConfigResource(
        admin_module.ResourceType.TOPIC,
        "admin-compact",
        incremental_configs=[
            admin_module.ConfigEntry(
                "delete.retention.ms", "-5",
                incremental_operation=admin_module.AlterConfigOpType.SET,
            )
        ],
    )  # fmt: skip
    with pytest.raises(kafka.KafkaException, match=r"delete\.retention\.ms='-5'"):
        client.incremental_alter_configs([bad])[bad].result(timeout=40)  # type: ignore[attr-defined]

    producer = kafka.Producer({"bootstrap.servers": kafka_cluster.kafka_bootstrap})
    errors: list[object] = []
    producer.produce("admin-compact", value=b"v", on_delivery=lambda e, m: errors.append(e))
    producer.flush(30)  # apart: the keyless record's whole batch is refused
    producer.produce(
        "admin-compact", key=b"k", value=b"v", on_delivery=lambda e, m: errors.append(e)
    )
    producer.flush(30)
    codes = [None if e is None else e.code() for e in errors]  # type: ignore[attr-defined]
    assert codes == [kafka.KafkaError.INVALID_RECORD, None], errors


def _create(client: object, name: str) -> None:
    """Create topic `name` (one partition, three replicas) through `client`, an AdminClient."""
    topic = admin_module.NewTopic(name, num_partitions=1, replication_factor=3)
    client.create_topics([topic], operation_timeout=30)[name].result(timeout=40)  # type: ignore[attr-defined]


def _outcome(future: object) -> int | None:
    """None if an admin future succeeded, else its Kafka error code."""
    try:
        future.result(timeout=60)  # type: ignore[attr-defined]
    except kafka.KafkaException as error:
        return int(error.args[0].code())
    return None


def test_concurrent_creates_and_partition_additions_all_succeed(
    kafka_cluster: LocalCluster,
) -> None:
    """Twelve CreateTopics in flight at once on one connection (as a stream processor sends them
    at start) all succeed, and a second create of one of the names gets TOPIC_ALREADY_EXISTS;
    then six CreatePartitions in flight at once all succeed."""
    client = _client(kafka_cluster)
    names = [f"admin-burst-{i}" for i in range(12)]
    futures = [
        client.create_topics(  # type: ignore[attr-defined]
            [admin_module.NewTopic(name, num_partitions=1, replication_factor=3)],
            operation_timeout=30,
        )[name]
        for name in [*names, names[0]]
    ]
    outcomes = [_outcome(future) for future in futures]
    assert sorted(outcomes, key=str) == sorted(
        [None] * 12 + [kafka.KafkaError.TOPIC_ALREADY_EXISTS], key=str
    ), outcomes

    grown = names[:6]
    futures = [
        client.create_partitions(  # type: ignore[attr-defined]
            [admin_module.NewPartitions(name, 2)], operation_timeout=30
        )[name]
        for name in grown
    ]
    assert [_outcome(future) for future in futures] == [None] * 6
    listed = client.list_topics(timeout=10).topics  # type: ignore[attr-defined]
    assert {name: len(listed[name].partitions) for name in names} == {
        name: 2 if name in grown else 1 for name in names
    }


def test_the_topics_of_one_request_are_created_and_deleted_together(
    kafka_cluster: LocalCluster,
) -> None:
    """Twenty topics in one CreateTopics request are all created, and one DeleteTopics request
    deletes them all (one after another: twenty deletes at once would overrun the metadata
    group's proposals_max, as librdkafka's 100 did). That the creates of one request overlap
    (librdkafka's 0045_subscribe_many_updates creates 100 topics in one request within 30 s)
    is shown without a clock by tests/unit/rpc/test_kafka_create_topics_together.py."""
    client = _client(kafka_cluster)
    names = [f"one-request-{i}" for i in range(20)]
    topics = [admin_module.NewTopic(n, num_partitions=1, replication_factor=3) for n in names]
    futures = client.create_topics(topics, operation_timeout=60, request_timeout=90)  # type: ignore[attr-defined]
    assert [_outcome(futures[n]) for n in names] == [None] * len(names)
    listed = client.list_topics(timeout=10).topics  # type: ignore[attr-defined]
    assert set(names) <= set(listed)

    futures = client.delete_topics(names, operation_timeout=60)  # type: ignore[attr-defined]
    assert [_outcome(futures[n]) for n in names] == [None] * len(names)
    listed = client.list_topics(timeout=10).topics  # type: ignore[attr-defined]
    assert not set(names) & set(listed)


def _metadata_errors(cluster: LocalCluster, names: list[str]) -> list[ErrorCode]:
    request = md.MetadataRequest(
        topics=tuple(md.MetadataRequestTopic(topic_id=None, name=md.TopicName(n)) for n in names),
        allow_auto_topic_creation=True,
        include_topic_authorized_operations=False,
    )
    node = next(iter(cluster.nodes.values()))
    response = kafka_call(f"127.0.0.1:{node.kafka_port}", request)
    return [topic.error_code for topic in response.topics]


def test_an_invalid_topic_name_gets_invalid_topic_exception(kafka_cluster: LocalCluster) -> None:
    """CreateTopics, Metadata and so a producer answer an invalid name (or one colliding with
    an existing topic's by '.' and '_') with INVALID_TOPIC_EXCEPTION, at once (librdkafka's
    0057); an unknown valid name stays UNKNOWN_TOPIC_OR_PARTITION (no auto-creation by
    default)."""
    client = _client(kafka_cluster)
    _create(client, "admin.dotted")
    for name in ("admin|piped", "admin_dotted"):
        created = client.create_topics(  # type: ignore[attr-defined]
            [admin_module.NewTopic(name, num_partitions=1, replication_factor=3)]
        )[name]
        assert _outcome(created) == kafka.KafkaError.TOPIC_EXCEPTION, name

    assert _metadata_errors(kafka_cluster, ["admin|piped", "admin-unknown"]) == [
        ErrorCode.invalid_topic_exception,
        ErrorCode.unknown_topic_or_partition,
    ]

    producer = kafka.Producer(
        {"bootstrap.servers": kafka_cluster.kafka_bootstrap, "message.timeout.ms": 60_000}
    )
    failed: list[object] = []
    started = time.monotonic()
    producer.produce("admin|piped", value=b"v", on_delivery=lambda e, m: failed.append(e))
    producer.flush(20)
    assert [e.code() for e in failed] == [kafka.KafkaError.TOPIC_EXCEPTION], failed  # type: ignore[attr-defined]
    assert time.monotonic() - started < 20


def _alter(client: object, topic: str, name: str, value: str, operation: object) -> object:
    resource = admin_module.ConfigResource(
        admin_module.ResourceType.TOPIC,
        topic,
        incremental_configs=[
            admin_module.ConfigEntry(name, value, incremental_operation=operation)
        ],
    )
    return client.incremental_alter_configs([resource])[resource]  # type: ignore[attr-defined]


def test_cleanup_policy_is_a_list_to_append_to_and_subtract_from(
    kafka_cluster: LocalCluster,
) -> None:
    """IncrementalAlterConfigs APPEND and SUBTRACT work on cleanup.policy as on Kafka's list
    settings (from the default when the topic sets none); on a setting that is no list they
    get INVALID_CONFIG."""
    client = _client(kafka_cluster)
    _create(client, "admin-policy")
    ops = admin_module.AlterConfigOpType
    described = admin_module.ConfigResource(admin_module.ResourceType.TOPIC, "admin-policy")

    def policy() -> str:
        configs = client.describe_configs([described])[described].result(timeout=20)  # type: ignore[attr-defined]
        return str(configs["cleanup.policy"].value)

    _alter(client, "admin-policy", "cleanup.policy", "compact", ops.APPEND).result(timeout=40)  # type: ignore[attr-defined]
    assert policy() == "delete,compact"
    _alter(client, "admin-policy", "cleanup.policy", "compact", ops.APPEND).result(timeout=40)  # type: ignore[attr-defined]
    assert policy() == "delete,compact"  # already there
    _alter(client, "admin-policy", "cleanup.policy", "delete", ops.SUBTRACT).result(timeout=40)  # type: ignore[attr-defined]
    assert policy() == "compact"
    refused = _alter(client, "admin-policy", "retention.ms", "1000", ops.APPEND)
    assert _outcome(refused) == kafka.KafkaError.INVALID_CONFIG


def test_broker_and_group_configs_are_described(kafka_cluster: LocalCluster) -> None:
    """DescribeConfigs of a BROKER resource answers the node's settings under Kafka's broker
    config names, with their sources; a GROUP resource the consumer-group settings (Kafka
    3.9's group configs); another node's id gets INVALID_REQUEST."""
    client = _client(kafka_cluster)
    broker = admin_module.ConfigResource(admin_module.ResourceType.BROKER, "1")
    configs = client.describe_configs([broker])[broker].result(timeout=20)  # type: ignore[attr-defined]
    values = {name: entry.value for name, entry in configs.items()}
    assert values["auto.create.topics.enable"] == "false"
    assert values["num.partitions"] == "1"
    assert values["default.replication.factor"] == "3"
    assert values["message.max.bytes"] == str(1024 * 1024)
    assert values["log.segment.bytes"] == str(128 * 1024 * 1024)
    assert values["log.retention.ms"] == "-1"
    assert values["offsets.retention.minutes"] == str(2**31 - 1)
    assert values["node.id"] == values["broker.id"] == "1"
    default = admin_module.ConfigSource.DEFAULT_CONFIG
    assert configs["num.partitions"].source == default.value
    assert configs["num.partitions"].is_default and configs["num.partitions"].is_read_only

    group = admin_module.ConfigResource(admin_module.ResourceType.GROUP, "admin-any-group")
    configs = client.describe_configs([group])[group].result(timeout=20)  # type: ignore[attr-defined]
    assert {name: entry.value for name, entry in configs.items()} == {
        "consumer.session.timeout.ms": "10000",
        "consumer.heartbeat.interval.ms": "1000",
    }

    request = dc.DescribeConfigsRequest(
        resources=(
            dc.DescribeConfigsResource(
                resource_type=i8(4), resource_name="2", configuration_keys=None
            ),
        ),
        include_synonyms=False,
        include_documentation=False,
    )
    node = kafka_cluster.nodes[1]  # type: ignore[index]
    (result,) = kafka_call(f"127.0.0.1:{node.kafka_port}", request).results
    assert result.error_code == ErrorCode.invalid_request and not result.configs


def test_authorized_operations_are_answered_when_asked(kafka_cluster: LocalCluster) -> None:
    """Metadata and DescribeCluster answer the principal's authorized operations when asked
    (KIP-430): without a token file every operation Kafka defines for a topic and a cluster."""
    client = _client(kafka_cluster)
    _create(client, "admin-ops")
    acl = admin_module.AclOperation
    described = client.describe_cluster(include_authorized_operations=True).result(timeout=20)  # type: ignore[attr-defined]
    assert set(described.authorized_operations) == {
        acl.CREATE, acl.ALTER, acl.DESCRIBE, acl.CLUSTER_ACTION, acl.DESCRIBE_CONFIGS,
        acl.ALTER_CONFIGS, acl.IDEMPOTENT_WRITE,
    }  # fmt: skip
    topics = kafka.TopicCollection(["admin-ops"])
    futures = client.describe_topics(topics, include_authorized_operations=True)  # type: ignore[attr-defined]
    topic = futures["admin-ops"].result(timeout=20)
    assert set(topic.authorized_operations) == {
        acl.READ, acl.WRITE, acl.CREATE, acl.DELETE, acl.ALTER, acl.DESCRIBE,
        acl.DESCRIBE_CONFIGS, acl.ALTER_CONFIGS,
    }  # fmt: skip
