"""A consumer group of confluent-kafka consumers over KIP-848's consumer group protocol
(`group.protocol=consumer`: ConsumerGroupHeartbeat, the server assigns): every record exactly
once between two members, offsets committed through the metadata quorum, a member's partitions
taken over from the committed offsets when it leaves, a restart resuming there; and the same
group described by ConsumerGroupDescribe and listed by ListGroups."""

from __future__ import annotations

import datetime
import time
from typing import Any

import pytest
from kio.schema.consumer_group_describe.v0.request import ConsumerGroupDescribeRequest
from kio.schema.consumer_group_heartbeat.v1.request import ConsumerGroupHeartbeatRequest
from kio.schema.errors import ErrorCode
from kio.schema.types import GroupId, TopicName
from kio.static.primitive import i8, i32, i32Timedelta, i64

from raftlog.local_cluster import LocalCluster
from tests.kafka.confluent_groups import reads_once_commits_takes_over_and_resumes
from tests.kafka.kafka_wire import create_topic, kafka_call

kafka = pytest.importorskip("confluent_kafka")
admin_module = pytest.importorskip("confluent_kafka.admin")

TOPIC, GROUP, PARTITIONS = "kip848", "kip848-1", 4


def _consumer(boot: str, group: str = GROUP) -> Any:
    return kafka.Consumer(
        {
            "bootstrap.servers": boot,
            "group.id": group,
            "group.protocol": "consumer",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )


def _described(boot: str) -> Any:
    client = admin_module.AdminClient({"bootstrap.servers": boot})
    return client.describe_consumer_groups([GROUP])[GROUP].result(timeout=20)


def test_kip848_group_reads_once_commits_takes_over_and_resumes(
    kafka_cluster: LocalCluster,
) -> None:
    create_topic(kafka_cluster, TOPIC, partitions=PARTITIONS)
    boot = kafka_cluster.kafka_bootstrap

    def described_by_the_server() -> None:
        described = _described(boot)  # ConsumerGroupDescribe: the server's assignment
        assert str(described.type) == str(kafka.ConsumerGroupType.CONSUMER)
        assert sorted(
            p.partition for m in described.members for p in m.assignment.topic_partitions
        ) == list(range(PARTITIONS))

    def listed() -> None:
        client = admin_module.AdminClient({"bootstrap.servers": boot})
        listed = client.list_consumer_groups(request_timeout=10).result(timeout=20)
        assert GROUP in {g.group_id for g in listed.valid}

    reads_once_commits_takes_over_and_resumes(
        boot,
        TOPIC,
        PARTITIONS,
        lambda: _consumer(boot),
        once_assigned=described_by_the_server,
        once_resumed=listed,
    )


def test_one_group_shared_by_a_kafka_and_a_raftlog_consumer(kafka_cluster: LocalCluster) -> None:
    """One coordinator behind both front ends: a confluent-kafka member (KIP-848) and a
    raftlog gRPC member of one group share the topic's partitions between them."""
    from raftlog.client import Consumer

    create_topic(kafka_cluster, "kip848-mixed", partitions=PARTITIONS)
    confluent = _consumer(kafka_cluster.kafka_bootstrap, "kip848-mixed")
    confluent.subscribe(["kip848-mixed"])
    native = Consumer(kafka_cluster.bootstrap, group_id="kip848-mixed", enable_auto_commit=False)
    native.subscribe(["kip848-mixed"])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert confluent.poll(0.1) is None and native.poll(100) == []
            theirs = {p.partition for p in confluent.assignment()}
            ours = {p for _, p in native.assignment()}
            if theirs and ours and sorted(theirs | ours) == list(range(PARTITIONS)):
                assert not theirs & ours
                break
        else:
            raise AssertionError("the two front ends' members never shared the partitions")
    finally:
        native.close()
        confluent.close()


# -- the APIs on the wire, as a client state machine would not send them ----------------------


def _coordinator(cluster: LocalCluster) -> str:
    from kio.schema.find_coordinator.v1.request import FindCoordinatorRequest

    node = next(iter(cluster.nodes.values()))
    found = kafka_call(
        f"127.0.0.1:{node.kafka_port}", FindCoordinatorRequest(key="any", key_type=i8(0))
    )
    assert found.error_code == ErrorCode.none, found
    return f"{found.host}:{found.port}"


def _heartbeat(
    address: str,
    group: str,
    member: str,
    epoch: int,
    topics: tuple[str, ...] | None = None,
    **fields: Any,
) -> Any:
    request = ConsumerGroupHeartbeatRequest(
        group_id=GroupId(group),
        member_id=member,
        member_epoch=i32(epoch),
        rebalance_timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
        subscribed_topic_names=None if topics is None else tuple(TopicName(t) for t in topics),
        topic_partitions=None,
        **fields,
    )
    return kafka_call(address, request)


def test_bad_heartbeats_get_kafka_errors_and_the_node_serves_on(
    kafka_cluster: LocalCluster,
) -> None:
    create_topic(kafka_cluster, "kip848-bad", partitions=2)
    address = _coordinator(kafka_cluster)
    group, topics = "kip848-bad", ("kip848-bad",)

    def code(response: Any) -> ErrorCode:
        return ErrorCode(response.error_code)

    assert code(_heartbeat(address, group, "", 0, topics)) == ErrorCode.invalid_request
    assert code(_heartbeat(address, "", "m", 0, topics)) == ErrorCode.invalid_request
    assert code(_heartbeat(address, group, "m", 0)) == ErrorCode.invalid_request  # no topics
    assert code(_heartbeat(address, group, "m", -7, topics)) == ErrorCode.invalid_request
    unknown = _heartbeat(address, group, "stranger", 3)  # not known, nothing to rebuild from
    assert code(unknown) == ErrorCode.unknown_member_id and unknown.error_message
    ranged = _heartbeat(address, group, "m", 0, topics, server_assignor="range")
    assert code(ranged) == ErrorCode.unsupported_assignor
    regex = _heartbeat(address, group, "m", 0, None, subscribed_topic_regex="kip(")
    assert code(regex) == ErrorCode.invalid_regular_expression
    assert "'kip('" in regex.error_message and "missing )" in regex.error_message
    long = _heartbeat(address, group, "m", 0, None, subscribed_topic_regex="k" * 1025)
    assert code(long) == ErrorCode.invalid_regular_expression and "1025" in long.error_message

    joined = _heartbeat(address, group, "m", 0, topics, server_assignor="uniform")
    assert code(joined) == ErrorCode.none and joined.member_epoch >= 1
    assert joined.heartbeat_interval.total_seconds() > 0
    fenced = _heartbeat(address, group, "m", joined.member_epoch + 5)
    assert code(fenced) == ErrorCode.fenced_member_epoch
    renewed = _heartbeat(address, group, "m", joined.member_epoch)  # nulls: unchanged
    assert code(renewed) == ErrorCode.none and renewed.member_epoch >= joined.member_epoch

    # Commits and fetches with the member's epoch (OffsetCommit v9, OffsetFetch v9).
    ahead = _commit(address, group, "m", renewed.member_epoch + 1, "kip848-bad", 0)
    assert ahead == ErrorCode.stale_member_epoch
    assert _commit(address, group, "ghost", 1, "kip848-bad", 0) == ErrorCode.unknown_member_id
    assert _commit(address, group, "", -1, "kip848-bad", 0) == ErrorCode.unknown_member_id
    assert _fetch(address, group, "ghost", 1) == ErrorCode.unknown_member_id
    assert _fetch(address, group, None, -1) == ErrorCode.none

    # ConsumerGroupDescribe: this group, and GROUP_ID_NOT_FOUND for what is not one.
    described = kafka_call(
        address,
        ConsumerGroupDescribeRequest(
            group_ids=(GroupId(group), GroupId("no-such-group")),
            include_authorized_operations=False,
        ),
    )
    mine, missing = described.groups
    assert mine.error_code == ErrorCode.none and [m.member_id for m in mine.members] == ["m"]
    assert mine.assignor_name == "uniform"
    assert missing.error_code == ErrorCode.group_id_not_found

    # One protocol per group: a classic JoinGroup for this group is refused.
    join = kafka_call(address, _join_request(group))
    assert join.error_code == ErrorCode.inconsistent_group_protocol

    left = _heartbeat(address, group, "m", -1)
    assert code(left) == ErrorCode.none and left.member_epoch == -1
    assert (
        code(_heartbeat(address, group, "m", renewed.member_epoch)) == ErrorCode.unknown_member_id
    )
    assert all(kafka_cluster.is_running(n) for n in kafka_cluster.nodes)


def test_v0_names_a_joining_member_and_describe_v1_types_it(kafka_cluster: LocalCluster) -> None:
    from kio.schema.consumer_group_describe.v1.request import (
        ConsumerGroupDescribeRequest as DescribeV1,
    )
    from kio.schema.consumer_group_heartbeat.v0.request import (
        ConsumerGroupHeartbeatRequest as HeartbeatV0,
    )

    address, group = _coordinator(kafka_cluster), "kip848-v0"
    joined = kafka_call(
        address,
        HeartbeatV0(
            group_id=GroupId(group),
            member_id="",  # v0: the coordinator names the member
            member_epoch=i32(0),
            rebalance_timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
            subscribed_topic_names=(TopicName("kip848"),),
            topic_partitions=(),
        ),
    )
    assert joined.error_code == ErrorCode.none and joined.member_id and joined.member_epoch >= 1
    (described,) = kafka_call(
        address, DescribeV1(group_ids=(GroupId(group),), include_authorized_operations=False)
    ).groups
    (member,) = described.members
    assert member.member_id == joined.member_id and member.member_type == 1
    assert member.subscribed_topic_names == ("kip848",)
    assert _heartbeat(address, group, joined.member_id, -1).member_epoch == -1


def test_a_classic_group_is_not_joined_by_the_consumer_protocol(
    kafka_cluster: LocalCluster,
) -> None:
    address, group = _coordinator(kafka_cluster), "kip848-classic"
    first = kafka_call(address, _join_request(group))
    assert first.error_code == ErrorCode.member_id_required
    joined = kafka_call(address, _join_request(group, first.member_id))
    assert joined.error_code == ErrorCode.none
    refused = _heartbeat(address, group, "m", 0, ("kip848",))
    assert refused.error_code == ErrorCode.group_id_not_found
    assert "classic" in refused.error_message


def test_a_node_that_is_not_the_controller_is_not_the_coordinator(
    kafka_cluster: LocalCluster,
) -> None:
    address = _coordinator(kafka_cluster)
    other = next(
        f"127.0.0.1:{n.kafka_port}"
        for n in kafka_cluster.nodes.values()
        if f"127.0.0.1:{n.kafka_port}" != address
    )
    answer = _heartbeat(other, "kip848-elsewhere", "m", 0, ("kip848",))
    assert answer.error_code == ErrorCode.not_coordinator


def _join_request(group: str, member_id: str = "") -> Any:
    from kio.schema.join_group.v5.request import JoinGroupRequest, JoinGroupRequestProtocol

    return JoinGroupRequest(
        group_id=GroupId(group),
        session_timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)),
        rebalance_timeout=i32Timedelta.parse(datetime.timedelta(seconds=1)),
        member_id=member_id,
        group_instance_id=None,
        protocol_type="consumer",
        protocols=(JoinGroupRequestProtocol(name="range", metadata=b"\x00"),),
    )


def _commit(address: str, group: str, member: str, epoch: int, topic: str, partition: int) -> Any:
    from kio.schema.offset_commit.v9 import request as commit

    request = commit.OffsetCommitRequest(
        group_id=GroupId(group),
        generation_id_or_member_epoch=i32(epoch),
        member_id=member,
        group_instance_id=None,
        topics=(
            commit.OffsetCommitRequestTopic(
                name=TopicName(topic),
                partitions=(
                    commit.OffsetCommitRequestPartition(
                        partition_index=i32(partition),
                        committed_offset=i64(0),
                        committed_leader_epoch=i32(-1),
                        committed_metadata=None,
                    ),
                ),
            ),
        ),
    )
    (topic_answer,) = kafka_call(address, request).topics
    (partition_answer,) = topic_answer.partitions
    return ErrorCode(partition_answer.error_code)


def _fetch(address: str, group: str, member: str | None, epoch: int) -> ErrorCode:
    from kio.schema.offset_fetch.v9 import request as fetch

    request = fetch.OffsetFetchRequest(
        groups=(
            fetch.OffsetFetchRequestGroup(
                group_id=GroupId(group), member_id=member, member_epoch=i32(epoch), topics=None
            ),
        ),
        require_stable=False,
    )
    (answer,) = kafka_call(address, request).groups
    return ErrorCode(answer.error_code)


# -- subscriptions by regex (rpc/kafka/topic_regex.py) -------------------------------------------


def _assigned_topics(response: Any, cluster: LocalCluster) -> set[str]:
    from raftlog.client import Admin
    from raftlog.rpc.kafka.cluster_handlers import topic_uuid

    with Admin(cluster.bootstrap) as admin:
        names = {name: admin.describe_topic(name).topic_id for name in admin.list_topics()}
    by_id = {topic_uuid(topic_id): name for name, topic_id in names.items()}
    return {by_id[t.topic_id] for t in response.assignment.topic_partitions}


def test_a_regex_subscription_is_resolved_at_every_heartbeat(kafka_cluster: LocalCluster) -> None:
    """The pattern must match the whole name (RE2, as Kafka's RE2/J); a topic created later
    that matches is assigned at the next heartbeat; names sent besides are kept; an empty
    pattern goes back to names; ConsumerGroupDescribe shows the pattern."""
    for name in ("rx-a", "rx-b", "xrx-c"):
        create_topic(kafka_cluster, name, partitions=1)
    address = _coordinator(kafka_cluster)
    group, member = "kip848-rx", "m"
    joined = _heartbeat(address, group, member, 0, None, subscribed_topic_regex="rx-.*")
    assert joined.error_code == ErrorCode.none, joined.error_message
    epoch = joined.member_epoch

    def heartbeat(**fields: Any) -> set[str]:
        nonlocal epoch
        answer = _heartbeat(address, group, member, epoch, **fields)
        assert answer.error_code == ErrorCode.none, answer.error_message
        epoch = answer.member_epoch
        return _assigned_topics(answer, kafka_cluster)

    assert _assigned_topics(joined, kafka_cluster) == {"rx-a", "rx-b"}  # not xrx-c
    create_topic(kafka_cluster, "rx-d", partitions=1)
    assert heartbeat() == {"rx-a", "rx-b", "rx-d"}  # the pattern was left out: unchanged
    described = kafka_call(
        address,
        ConsumerGroupDescribeRequest(
            group_ids=(GroupId(group),), include_authorized_operations=False
        ),
    )
    (described_member,) = described.groups[0].members
    assert described_member.subscribed_topic_regex == "rx-.*"
    topics = ("kip848",)
    assert heartbeat(topics=topics) == {"kip848", "rx-a", "rx-b", "rx-d"}  # names besides
    assert heartbeat() == {"kip848", "rx-a", "rx-b", "rx-d"}
    assert heartbeat(topics=topics, subscribed_topic_regex="") == {"kip848"}  # names only
    assert heartbeat() == {"kip848"}
    left = _heartbeat(address, group, member, -1)
    assert left.error_code == ErrorCode.none


def test_a_confluent_consumer_subscribed_by_regex_reads_matching_topics_created_later(
    kafka_cluster: LocalCluster,
) -> None:
    """librdkafka sends the pattern to the coordinator under `group.protocol=consumer`."""
    boot = kafka_cluster.kafka_bootstrap
    for name in ("orders-eu", "orders-us", "refunds"):
        create_topic(kafka_cluster, name, partitions=2)
    producer = kafka.Producer({"bootstrap.servers": boot, "acks": "all"})

    def produce(topic: str) -> None:
        for i in range(10):
            producer.produce(topic, value=f"{topic}-{i}".encode())
        assert producer.flush(30) == 0

    for name in ("orders-eu", "orders-us", "refunds"):
        produce(name)
    consumer = _consumer(boot, "kip848-orders")
    try:
        consumer.subscribe(["^orders-.*"])
        seen: set[str] = set()

        def read_until(expected: set[str]) -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not expected <= seen:
                message = consumer.poll(0.5)
                if message is not None and message.error() is None:
                    seen.add(message.value().decode())
            assert expected <= seen, sorted(expected - seen)

        read_until({f"orders-{region}-{i}" for region in ("eu", "us") for i in range(10)})
        create_topic(kafka_cluster, "orders-apac", partitions=2)
        produce("orders-apac")
        read_until({f"orders-apac-{i}" for i in range(10)})
        assert not any(v.startswith("refunds") for v in seen)
    finally:
        consumer.close()
