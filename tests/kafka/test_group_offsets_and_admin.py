"""Kafka clients against the group coordinator's offset and admin APIs, where librdkafka's own
tests (0081, 0099, 0130, 0140) found raftlog differing from Kafka: a commit's metadata and
leader epoch kept and returned (and bounded, OFFSET_METADATA_TOO_LARGE), ListGroups answered
by every node, commits of consumers outside any membership (epoch -1) to an empty group, and
DeleteGroups and OffsetDelete with Kafka's errors."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest

from raftlog.local_cluster import LocalCluster
from tests.kafka.confluent_groups import consumer as confluent_consumer
from tests.kafka.kafka_wire import create_topic

kafka = pytest.importorskip("confluent_kafka")
admin_module = pytest.importorskip("confluent_kafka.admin")
kafka_python = pytest.importorskip("kafka")

METADATA_MAX = 4096  # Kafka's offset.metadata.max.bytes, the node's default
# confluent-kafka sends a metadata string with its terminating NUL (librdkafka's metadata_size
# is strlen + 1), and Kafka counts it: 4095 characters are the most it commits.
LONGEST = "x" * (METADATA_MAX - 1)


def _admin(cluster: LocalCluster) -> Any:
    return admin_module.AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})


def _consumer(cluster: LocalCluster, group: str, **settings: Any) -> Any:
    return confluent_consumer(cluster.kafka_bootstrap, group, **settings)


@contextlib.contextmanager
def _python_admin(cluster: LocalCluster) -> Iterator[Any]:
    admin = kafka_python.KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap.split(","))
    try:
        yield admin
    finally:
        admin.close()


def _listed_offsets(cluster: LocalCluster, group: str, topic: str, count: int) -> list[Any]:
    request = kafka.ConsumerGroupTopicPartitions(
        group, [kafka.TopicPartition(topic, p) for p in range(count)]
    )
    client = _admin(cluster)  # held until the answer: a client destroyed cancels its requests
    (future,) = client.list_consumer_group_offsets([request]).values()
    return sorted(future.result(timeout=20).topic_partitions, key=lambda tp: tp.partition)


def _until_assigned(consumer: Any, partitions: int) -> None:
    deadline = time.monotonic() + 30
    while len(consumer.assignment()) < partitions:
        assert time.monotonic() < deadline, "never assigned"
        message = consumer.poll(0.1)
        assert message is None or message.error() is None, message.error()


# -- 1: a commit's metadata and leader epoch ---------------------------------------------------


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_commit_metadata_and_leader_epoch_come_back(
    kafka_cluster: LocalCluster, protocol: str
) -> None:
    """librdkafka 0099/0140: what a commit carried besides the offset comes back from
    OffsetFetch, from the consumer and from the AdminClient alike; metadata of Kafka's
    offset.metadata.max.bytes is kept, one character more is OFFSET_METADATA_TOO_LARGE and
    commits nothing."""
    topic, group = f"meta-{protocol}", f"meta-{protocol}-group"
    create_topic(kafka_cluster, topic, partitions=3)
    with _consumer(kafka_cluster, group, **{"group.protocol": protocol}) as consumer:
        consumer.assign([kafka.TopicPartition(topic, p) for p in range(3)])
        committed = consumer.commit(
            offsets=[
                kafka.TopicPartition(topic, 0, 5, metadata="first", leader_epoch=7),
                kafka.TopicPartition(topic, 1, 9, metadata=LONGEST),
                kafka.TopicPartition(topic, 2, 3),
            ],
            asynchronous=False,
        )
        assert all(tp.error is None for tp in committed), committed
        fetched = consumer.committed([kafka.TopicPartition(topic, p) for p in range(3)], timeout=20)
        by_partition = {tp.partition: tp for tp in fetched}
        assert (by_partition[0].offset, by_partition[0].metadata) == (5, "first")
        assert by_partition[0].leader_epoch == 7
        assert by_partition[1].metadata == LONGEST
        assert by_partition[1].leader_epoch is None  # committed without one: -1
        assert (by_partition[2].offset, by_partition[2].metadata) == (3, None)  # "" reads None

        too_large = kafka.TopicPartition(topic, 2, 4, metadata="y" * METADATA_MAX)
        with pytest.raises(kafka.KafkaException) as refused:
            consumer.commit(offsets=[too_large], asynchronous=False)
        assert refused.value.args[0].code() == kafka.KafkaError.OFFSET_METADATA_TOO_LARGE
        still = consumer.committed([kafka.TopicPartition(topic, 2)], timeout=20)
        assert (still[0].offset, still[0].metadata) == (3, None)

    listed = _listed_offsets(kafka_cluster, group, topic, 3)
    assert [(tp.offset, tp.metadata, tp.leader_epoch) for tp in listed] == [
        (5, "first", 7),
        (9, LONGEST, None),
        (3, None, None),
    ]


def test_admin_alters_offsets_with_metadata(kafka_cluster: LocalCluster) -> None:
    """librdkafka 0081/0130: AlterConsumerGroupOffsets (a commit with generation -1) keeps the
    metadata it sets; ListConsumerGroupOffsets returns it."""
    topic, group = "meta-altered", "meta-altered-group"
    create_topic(kafka_cluster, topic, partitions=2)
    request = kafka.ConsumerGroupTopicPartitions(
        group,
        [
            kafka.TopicPartition(topic, 0, 11, metadata="altered-0"),
            kafka.TopicPartition(topic, 1, 12, metadata="altered-1", leader_epoch=2),
        ],
    )
    client = _admin(kafka_cluster)
    (future,) = client.alter_consumer_group_offsets([request]).values()
    assert all(tp.error is None for tp in future.result(timeout=20).topic_partitions)
    listed = _listed_offsets(kafka_cluster, group, topic, 2)
    assert [(tp.offset, tp.metadata, tp.leader_epoch) for tp in listed] == [
        (11, "altered-0", None),
        (12, "altered-1", 2),
    ]


# -- 3: ListGroups on every node ---------------------------------------------------------------


def test_every_node_answers_list_groups(kafka_cluster: LocalCluster) -> None:
    """Kafka: every broker lists the groups it coordinates (the others an empty list, no
    error), so the AdminClient, which asks every broker, reports no errors."""
    topic, group = "listed", "listed-group"
    create_topic(kafka_cluster, topic, partitions=1)
    with _consumer(kafka_cluster, group) as consumer:
        consumer.subscribe([topic])
        _until_assigned(consumer, 1)
        client = _admin(kafka_cluster)
        listed = client.list_consumer_groups(request_timeout=10).result(timeout=20)
    assert listed.errors == []
    assert group in {g.group_id for g in listed.valid}


# -- 4: commits outside any membership (KIP-848) -----------------------------------------------


def test_an_assigned_kip848_consumer_commits_without_subscribing(
    kafka_cluster: LocalCluster,
) -> None:
    """A `group.protocol=consumer` consumer that assign()s sends its member id with epoch -1:
    Kafka accepts the commit while the group has no members, explicit or automatic."""
    topic, group = "assigned-848", "assigned-848-group"
    create_topic(kafka_cluster, topic, partitions=2)
    producer = kafka.Producer({"bootstrap.servers": kafka_cluster.kafka_bootstrap})
    for i in range(20):
        producer.produce(topic, value=b"%d" % i, partition=i % 2)
    assert producer.flush(30) == 0
    partitions = [kafka.TopicPartition(topic, p, 0) for p in range(2)]
    with _consumer(kafka_cluster, group, **{"group.protocol": "consumer"}) as consumer:
        consumer.assign(partitions)
        committed = consumer.commit(offsets=[kafka.TopicPartition(topic, 0, 4)], asynchronous=False)
        assert all(tp.error is None for tp in committed), committed
    settings = {
        "group.protocol": "consumer",
        "enable.auto.commit": True,
        "auto.commit.interval.ms": 100,
    }
    with _consumer(kafka_cluster, group, **settings) as consumer:
        consumer.assign([kafka.TopicPartition(topic, 1, 0)])
        deadline = time.monotonic() + 30
        read = 0
        while read < 10:
            assert time.monotonic() < deadline, f"read {read} of 10"
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                read += 1
        _, end = consumer.get_watermark_offsets(kafka.TopicPartition(topic, 1), timeout=10)
        time.sleep(0.5)  # an auto-commit or two
    listed = _listed_offsets(kafka_cluster, group, topic, 2)
    assert [tp.offset for tp in listed] == [4, end]  # all ten read, auto-committed


# -- 5: DeleteGroups and OffsetDelete ----------------------------------------------------------


def test_delete_groups_as_kafka_does(kafka_cluster: LocalCluster) -> None:
    """DeleteGroups: NON_EMPTY_GROUP while the group has members, GROUP_ID_NOT_FOUND for a group
    the coordinator does not know, else the group's offsets are gone."""
    topic = "deleted-groups"
    create_topic(kafka_cluster, topic, partitions=1)
    client = _admin(kafka_cluster)
    with _consumer(kafka_cluster, "busy-group") as consumer:
        consumer.subscribe([topic])
        _until_assigned(consumer, 1)
        futures = client.delete_consumer_groups(["busy-group", "no-such-group"], request_timeout=10)
        for group, code in (
            ("busy-group", kafka.KafkaError.NON_EMPTY_GROUP),
            ("no-such-group", kafka.KafkaError.GROUP_ID_NOT_FOUND),
        ):
            with pytest.raises(kafka.KafkaException) as refused:
                futures[group].result(timeout=20)
            assert refused.value.args[0].code() == code, group
        consumer.commit(offsets=[kafka.TopicPartition(topic, 0, 1)], asynchronous=False)
    done = client.delete_consumer_groups(["busy-group"], request_timeout=10)
    done["busy-group"].result(timeout=20)
    assert [tp.offset for tp in _listed_offsets(kafka_cluster, "busy-group", topic, 1)] == [-1001]
    listed = client.list_consumer_groups(request_timeout=10).result(timeout=20)
    assert "busy-group" not in {g.group_id for g in listed.valid}

    with _python_admin(kafka_cluster) as admin:
        answered = dict(admin.delete_groups(["busy-group", "no-such-group"]))
    assert answered == {
        "busy-group": "GroupIdNotFoundError",
        "no-such-group": "GroupIdNotFoundError",
    }


def test_offset_delete_as_kafka_does(kafka_cluster: LocalCluster) -> None:
    """OffsetDelete (kafka-python's delete_group_offsets): an unknown group is GROUP_ID_NOT_FOUND;
    a partition of a topic a member subscribes to is GROUP_SUBSCRIBED_TO_TOPIC; others go."""
    from kafka import TopicPartition
    from kafka.structs import OffsetAndMetadata

    subscribed, other, group = "offdel-sub", "offdel-other", "offdel-group"
    create_topic(kafka_cluster, subscribed, partitions=1)
    create_topic(kafka_cluster, other, partitions=2)
    errors = kafka_python.errors
    with _python_admin(kafka_cluster) as admin:
        with pytest.raises(errors.GroupIdNotFoundError):
            admin.delete_group_offsets("offdel-unknown", [TopicPartition(other, 0)])
        offsets = {
            TopicPartition(t, p): OffsetAndMetadata(5, "", -1)
            for t, p in ((subscribed, 0), (other, 0), (other, 1))
        }
        assert set(admin.alter_group_offsets(group, offsets).values()) == {errors.NoError}
        with _consumer(kafka_cluster, group) as consumer:
            consumer.subscribe([subscribed])
            _until_assigned(consumer, 1)
            answer = admin.delete_group_offsets(
                group, [TopicPartition(subscribed, 0), TopicPartition(other, 0)]
            )
            assert answer == {
                TopicPartition(subscribed, 0): errors.GroupSubscribedToTopicError,
                TopicPartition(other, 0): errors.NoError,
            }
        remaining = admin.list_group_offsets({group: None})[group]
    assert sorted((tp.topic, tp.partition) for tp in remaining) == [(other, 1), (subscribed, 0)]
