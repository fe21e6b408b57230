"""PySpark data source and sink for raftlog (raftlog.connectors.spark)."""
