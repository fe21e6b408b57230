"""Fixtures of the Spark connector tests: one SparkSession for the run, one cluster per module.

Starting Spark takes 10 to 20 seconds on a 2-core machine, so the session is shared by every
test module (`local[2,4]`: two cores, four attempts per task; two shuffle partitions, no UI).
Workers are separate Python processes: PYSPARK_PYTHON points them at this interpreter, whose
environment has raftlog installed.
Tests skip, saying why, only when java or pyspark is missing.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftlog.cluster_cli import wait_for_controller
from raftlog.local_cluster import LocalCluster


def missing_requirement() -> str | None:
    if importlib.util.find_spec("pyspark") is None:
        return "pyspark is not installed (pip install 'raftlog[spark]')"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "java is not installed (PySpark needs a JVM)"
    return None


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    reason = missing_requirement()
    if reason is not None:
        pytest.skip(reason)
    from raftlog.connectors.spark.session import local_session

    # Four attempts per task (`local[2,4]`), as a real cluster's spark.task.maxFailures: the
    # sink's exactly-once tests make tasks fail and must see them retried.
    session = local_session(
        app_name="raftlog-spark-tests",
        task_attempts_max=4,
        **{"spark.sql.streaming.stopTimeout": "30s"},
    )
    yield session
    session.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A real 3-node cluster on loopback; --chaos lets a test cut links (Internal.SetFaults)."""
    directory: Path = tmp_path_factory.mktemp("raftlog-spark-cluster")
    local = LocalCluster.create(directory, node_count=3)
    local.start("--chaos")
    try:
        wait_for_controller(local.bootstrap, timeout_s=30)
        yield local
    finally:
        local.stop()
