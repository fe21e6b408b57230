"""A real 3-node cluster with Kafka listeners (`raftlog cluster up`'s layout), per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from raftlog.local_cluster import LocalCluster
from tests.kafka.kafka_wire import started_cluster


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # No initial rebalance delay (Kafka's 3 s default, test_initial_rebalance_delay.py): each
    # classic group a test starts would wait it out, which the suite's time cannot afford.
    flags = ("--set", "kafka.group_initial_rebalance_delay_ms=0")
    with started_cluster(tmp_path_factory.mktemp("kafka"), flags=flags) as cluster:
        yield cluster
