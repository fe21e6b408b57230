"""Connectors to other systems (raftlog.connectors.spark)."""
