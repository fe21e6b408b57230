"""The public API of raftlog.client is a contract (issue 6): pin its names and signatures."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

import raftlog.client
from raftlog.client import Admin, Consumer, Producer
from raftlog.client._connection import ConnectionOptions


def test_public_names() -> None:
    assert sorted(raftlog.client.__all__) == [
        "Admin",
        "ClusterDescription",
        "Consumer",
        "ConsumerGroupMetadata",
        "ConsumerRecord",
        "NodeDescription",
        "PartitionDescription",
        "Producer",
        "RecordMetadata",
        "TopicDescription",
        "TopicPartition",
        "TransactionDescription",
        "errors",
    ]


def parameters(function: object) -> list[str]:
    return list(inspect.signature(function).parameters)  # type: ignore[arg-type]


def test_contract_signatures() -> None:
    assert parameters(Producer.send) == [
        "self",
        "topic",
        "value",
        "key",
        "partition",
        "headers",
        "timestamp_ms",
    ]
    assert parameters(Producer)[0] == "bootstrap"
    assert {"acks", "linger_ms", "batch_bytes_max", "compression"} <= set(parameters(Producer))
    assert parameters(Consumer.poll)[:2] == ["self", "timeout_ms"]
    for name in (
        "assign",
        "seek",
        "seek_to_beginning",
        "seek_to_end",
        "position",
        "poll",
        "__iter__",
    ):
        assert callable(getattr(Consumer, name)), name
    for name in (
        "create_topic",
        "delete_topic",
        "create_partitions",
        "list_topics",
        "describe_topic",
        "describe_cluster",
    ):
        assert callable(getattr(Admin, name)), name
    assert parameters(Admin.create_topic) == [
        "self",
        "name",
        "partitions",
        "replication_factor",
        "config",
    ]


def test_record_fields() -> None:
    record_fields = ["topic", "partition", "offset", "key", "value", "timestamp_ms", "headers"]
    assert list(raftlog.client.ConsumerRecord._fields) == record_fields
    meta_fields = ["topic", "partition", "offset", "timestamp_ms"]
    assert list(raftlog.client.RecordMetadata.__dataclass_fields__) == meta_fields


@pytest.mark.parametrize("client", [Producer, Consumer, Admin])
def test_every_client_takes_the_connection_options_by_name(client: type) -> None:
    # Each constructor hands its locals() to ConnectionOptions.from_arguments: every option
    # must be one of its keyword-only parameters, with the option's own default.
    signature = inspect.signature(client)
    for option in dataclasses.fields(ConnectionOptions):
        parameter = signature.parameters[option.name]
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY, option.name
        assert parameter.default == option.default, option.name
