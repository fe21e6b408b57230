"""A local SparkSession with the raftlog data source registered (tests, benchmarks, demos).

Spark's Python workers are separate processes started with PYSPARK_PYTHON: it is set to the
running interpreter, whose environment has raftlog installed, so workers can unpickle the
connector's readers. PySpark 4.x warns at import that it does not fully support pandas 3; the
connector does not use pandas, so that one warning is silenced while the session starts.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

__all__ = ["local_session"]


def local_session(
    *,
    app_name: str,
    cores: int = 2,
    shuffle_partitions: int = 2,
    task_attempts_max: int = 1,
    **config: str,
) -> Any:
    """`local[cores]`, no UI or progress bars, `raftlog` registered; `config` adds settings.

    `task_attempts_max` > 1 lets a failed task run again (`local[cores,attempts]`: local
    mode ignores `spark.task.maxFailures`), as on a real cluster."""
    assert cores > 0 and shuffle_partitions > 0 and task_attempts_max > 0, (
        cores,
        shuffle_partitions,
        task_attempts_max,
    )
    master = f"local[{cores}]" if task_attempts_max == 1 else f"local[{cores},{task_attempts_max}]"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "PySpark does not yet fully support pandas")
        from pyspark.sql import SparkSession

        from raftlog.connectors.spark.source import RaftlogDataSource

        builder = (
            SparkSession.builder.master(master)
            .appName(app_name)
            .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
        )
        for key, value in config.items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(RaftlogDataSource)
    return session
