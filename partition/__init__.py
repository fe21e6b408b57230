"""Partition replicas: produce, fetch, high watermark, idempotence (raftlog.partition)."""
