"""PySpark data source and sink for raftlog (raftlog.connectors.spark).

    from raftlog.connectors.spark import RaftlogDataSource
    spark.dataSource.register(RaftlogDataSource)
    df = (spark.readStream.format("raftlog")
          .option("bootstrap", "127.0.0.1:9091")
          .option("subscribe", "events")
          .load())

Importing this package imports pyspark; `import raftlog` never does. The modules:
`options` (validated options), `planning` (pure offset arithmetic), `arrow` (Fetch bytes to
Arrow batches), `access` (the driver's ClusterView and the workers' read_range), `source`
(the data source and its readers) and `sink` (the writers). docs/spark.md has the guide.
"""

from raftlog.connectors.spark.access import DataLossError
from raftlog.connectors.spark.options import SinkOptions, SourceOptions
from raftlog.connectors.spark.source import RaftlogDataSource, source_schema

__all__ = ["DataLossError", "RaftlogDataSource", "SinkOptions", "SourceOptions", "source_schema"]
