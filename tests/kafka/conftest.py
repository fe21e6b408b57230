"""A real 3-node cluster with Kafka listeners (`raftlog cluster up`'s layout), per module."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftlog.client import Admin
from raftlog.cluster_cli import wait_for_controller
from raftlog.local_cluster import LocalCluster


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster.create(tmp_path_factory.mktemp("kafka"), node_count=3)
    cluster.start()
    try:
        wait_for_controller(cluster.bootstrap, timeout_s=60)
        yield cluster
    finally:
        cluster.stop()


def create_topic(cluster: LocalCluster, name: str, *, partitions: int) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(name, partitions=partitions, replication_factor=3)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            described = admin.describe_topic(name)
            if all(p.leader is not None for p in described.partitions):
                return
            time.sleep(0.05)
    raise AssertionError(f"topic {name}: no leader for every partition within 30 s")


def kcat_path() -> str:
    """kcat (Debian package `kcat`, librdkafka's command-line client), or skip."""
    path = shutil.which("kcat")
    if path is None:
        pytest.skip("kcat is not installed (apt-get install -y kcat); the Makefile installs it")
    return path


def data_dir(cluster: LocalCluster) -> Path:
    return cluster.directory
