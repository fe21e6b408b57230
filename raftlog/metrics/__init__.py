"""Prometheus metrics of a node (docs/metrics.md): the endpoint, the scrape-time collector,
the event recorder and the gRPC request interceptor. Event hooks in the rest of the code go
through `raftlog.runtime.recorder`, which this package's recorder backs."""

from raftlog.metrics.node import NodeMetrics
from raftlog.metrics.snapshot import NodeSnapshot, NodeView, PartitionSample, capture

__all__ = ["NodeMetrics", "NodeSnapshot", "NodeView", "PartitionSample", "capture"]
