"""Real node processes on loopback (raftlog.local_cluster), shared per test module."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from raftlog.client import Admin
from raftlog.cluster_cli import wait_for_controller
from raftlog.local_cluster import LocalCluster


def start_cluster(directory: Path, node_count: int, *extra: str) -> LocalCluster:
    cluster = LocalCluster.create(directory, node_count=node_count)
    cluster.start(*extra)
    try:
        wait_for_controller(cluster.bootstrap, timeout_s=60)
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture(scope="module")
def cluster3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = start_cluster(tmp_path_factory.mktemp("cluster3"), 3)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def cluster5(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = start_cluster(tmp_path_factory.mktemp("cluster5"), 5)
    yield cluster
    cluster.stop()


def wait_until(condition: Callable[[], bool], *, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except Exception:
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def leader_of(admin: Admin, topic: str, partition: int) -> int:
    for p in admin.describe_topic(topic).partitions:
        if p.id == partition and p.leader is not None:
            return p.leader
    raise AssertionError(f"no leader known for {topic}-{partition}")
