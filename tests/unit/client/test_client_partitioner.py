"""murmur2 and the partitioners agree with Kafka's Java client (via kafka-python's port)."""

from __future__ import annotations

import random
import warnings

from hypothesis import given, settings
from hypothesis import strategies as st

with warnings.catch_warnings():
    # kafka/__init__ calls the deprecated importlib.resources.read_text at import time.
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.partitioner.default import murmur2 as kafka_murmur2

from raftlog.client.partitioner import StickyPartitioner, murmur2, partition_for_key

# Kafka's UtilsTest.testMurmur2: Java's signed results for these inputs.
JAVA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def test_murmur2_matches_the_java_client_vectors() -> None:
    for data, java_signed in JAVA_VECTORS.items():
        assert murmur2(data) == java_signed & 0xFFFFFFFF, data


@settings(max_examples=300)
@given(st.binary(max_size=64))
def test_murmur2_matches_kafka_python(data: bytes) -> None:
    assert murmur2(data) == kafka_murmur2(data)


@settings(max_examples=200)
@given(st.binary(min_size=0, max_size=32), st.integers(min_value=1, max_value=1000))
def test_partition_for_key_matches_kafka_default_partitioner(key: bytes, partitions: int) -> None:
    expected = (kafka_murmur2(key) & 0x7FFFFFFF) % partitions
    assert partition_for_key(key, partitions) == expected


def test_sticky_partition_holds_until_its_batch_closes_then_moves() -> None:
    sticky = StickyPartitioner(random.Random(7))
    first = sticky.partition("t", 6)
    assert all(sticky.partition("t", 6) == first for _ in range(20))
    sticky.on_batch_closed("t", first, 6)
    second = sticky.partition("t", 6)
    assert second != first
    # A batch closing on a partition that is no longer sticky changes nothing.
    sticky.on_batch_closed("t", first, 6)
    assert sticky.partition("t", 6) == second


def test_sticky_partitioner_with_one_partition_stays_put() -> None:
    sticky = StickyPartitioner(random.Random(1))
    assert sticky.partition("t", 1) == 0
    sticky.on_batch_closed("t", 0, 1)
    assert sticky.partition("t", 1) == 0
