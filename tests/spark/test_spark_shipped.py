"""The connector works when raftlog is shipped with the job instead of installed on workers.

The test builds a zip of the raftlog package with the wheel's layout (pyproject's `packages`
and `package-dir`), ships it with `spark.sparkContext.addPyFile`, and reads on Python workers
that cannot import the installed copy: their PYTHONPATH (set through the SparkContext's
executor environment) holds a `sitecustomize` that refuses `raftlog` from anywhere but a zip.
Without the zip the same read fails, which shows the installed copy really is hidden.

This module runs after the other Spark modules on purpose: addPyFile cannot be undone, so
later jobs of the shared session also see the zip (an identical copy of the source).
"""

from __future__ import annotations

import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from raftlog.client import Admin, Producer
from raftlog.local_cluster import LocalCluster

PANDAS_WARNING = "ignore:PySpark does not yet fully support pandas:FutureWarning"
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.filterwarnings(PANDAS_WARNING)]
ROOT = Path(__file__).resolve().parents[2]

# Runs at every worker start (after site-packages' .pth files, so after the editable
# install's finder is in place): a finder ahead of all others resolves the top-level
# `raftlog` package only from zip files on sys.path, so a worker without the shipped zip
# cannot import raftlog at all. Submodules are found through the package's own __path__.
HIDE_INSTALLED = """
import importlib.machinery
import sys


class _OnlyShippedRaftlog:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name != "raftlog":
            return None
        zips = [entry for entry in sys.path if entry.endswith(".zip")]
        spec = importlib.machinery.PathFinder.find_spec(name, zips)
        if spec is None:
            raise ModuleNotFoundError("raftlog: only a shipped copy may be imported here")
        return spec


sys.meta_path.insert(0, _OnlyShippedRaftlog)
"""


def package_zip(dest: Path) -> Path:
    """The raftlog package as the wheel lays it out (pyproject's packages and package-dir)."""
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping: dict[str, str] = setup["package-dir"]
    with zipfile.ZipFile(dest, "w") as archive:
        for package in setup["packages"]:
            # The longest mapped prefix names the folder, as setuptools resolves it.
            prefix = max(
                (p for p in mapping if package == p or package.startswith(p + ".")), key=len
            )
            folder = ROOT / mapping[prefix] / package[len(prefix) + 1 :].replace(".", "/")
            for source in sorted(folder.glob("*.py")):
                archive.write(source, "/".join(package.split(".")) + "/" + source.name)
    return dest


@pytest.fixture
def hidden_install(spark: Any, tmp_path: Path) -> Iterator[Any]:
    """Workers whose PYTHONPATH hides the installed raftlog; restored afterwards."""
    from raftlog.connectors.spark.source import RaftlogDataSource

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(HIDE_INSTALLED)
    environment = spark.sparkContext.environment
    assert "PYTHONPATH" not in environment, environment
    environment["PYTHONPATH"] = str(site)
    # A registration captures the environment and the shipped files its workers get.
    spark.dataSource.register(RaftlogDataSource)
    try:
        yield spark
    finally:
        del environment["PYTHONPATH"]
        spark.dataSource.register(RaftlogDataSource)


def test_a_read_on_workers_uses_the_shipped_zip(
    hidden_install: Any, cluster: LocalCluster, tmp_path: Path
) -> None:
    from raftlog.connectors.spark.source import RaftlogDataSource

    spark = hidden_install
    topic = "shipped"
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=2, replication_factor=3)
    values = [b"shipped-%d" % i for i in range(200)]
    with Producer(cluster.bootstrap) as producer:
        for value in values:
            producer.send(topic, value=value)
        producer.flush()

    def read() -> list[bytes]:
        frame = (
            spark.read.format("raftlog")
            .option("bootstrap", cluster.bootstrap)
            .option("subscribe", topic)
            .load()
        )
        return sorted(bytes(row.value) for row in frame.collect())

    with pytest.raises(Exception, match="only a shipped copy may be imported"):
        read()

    def raftlog_origin(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # Nested, so Spark pickles it by value: workers cannot import this test module.
        import raftlog.connectors.spark.source as source

        for batch in batches:
            yield pa.RecordBatch.from_pydict({"origin": [source.__file__] * batch.num_rows})

    shipped = package_zip(tmp_path / "raftlog.zip")
    spark.sparkContext.addPyFile(str(shipped))
    spark.dataSource.register(RaftlogDataSource)
    assert read() == sorted(values)
    origins = {
        row.origin
        for row in spark.range(2, numPartitions=2)
        .mapInArrow(raftlog_origin, "origin string")
        .collect()
    }
    assert len(origins) == 1 and "raftlog.zip/raftlog/connectors/spark/source.py" in origins.pop()
