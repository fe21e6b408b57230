"""`raftlog cluster status`'s replication and consumer-lag lines, read from the nodes' own
metrics endpoints: the figures a Prometheus server would scrape, so the CLI and the
dashboards never disagree about what "under-replicated" means.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["NodeFigures", "read_node", "status_lines"]

SCRAPE_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class NodeFigures:
    node_id: int
    under_replicated: int = 0
    offline: int = 0
    is_controller: bool = False
    # (group, topic, partition) -> committed offset (the controller's only)
    consumer_groups: dict[tuple[str, str, int], int] = field(default_factory=dict)
    # (topic, partition) -> high watermark, as each hosted replica knows it
    high_watermarks: dict[tuple[str, int], int] = field(default_factory=dict)
    error: str | None = None  # why the node's metrics could not be read


def parse(node_id: int, text: str) -> NodeFigures:
    single: dict[str, float] = {}
    committed: dict[tuple[str, str, int], int] = {}
    high_watermarks: dict[tuple[str, int], int] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if not labels:
                single[sample.name] = sample.value
            elif sample.name == "raftlog_consumer_group_committed_offset":
                key = (labels["group"], labels["topic"], int(labels["partition"]))
                committed[key] = int(sample.value)
            elif sample.name == "raftlog_partition_high_watermark":
                high_watermarks[labels["topic"], int(labels["partition"])] = int(sample.value)
    return NodeFigures(
        node_id=node_id,
        under_replicated=int(single.get("raftlog_partitions_under_replicated", 0)),
        offline=int(single.get("raftlog_partitions_offline", 0)),
        is_controller=single.get("raftlog_controller", 0) == 1,
        consumer_groups=committed,
        high_watermarks=high_watermarks,
    )


def read_node(node_id: int, address: str) -> NodeFigures:
    """The figures of the node serving metrics at HOST:PORT `address`."""
    try:
        url = f"http://{address}/metrics"
        with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as reply:
            return parse(node_id, reply.read().decode())
    except (OSError, urllib.error.URLError) as error:
        return NodeFigures(node_id=node_id, error=f"metrics at {address} unreachable: {error}")


def status_lines(nodes: Iterable[NodeFigures]) -> list[str]:
    """Under-replicated and offline partitions per node and in all, and each consumer group's
    lag: the highest high watermark any node reports (the leader's) minus the committed
    offset the controller reports."""
    nodes = list(nodes)
    read = [n for n in nodes if n.error is None]
    lines = [
        f"replication: {sum(n.under_replicated for n in read)} under-replicated partitions "
        f"(counted by their leaders), {max((n.offline for n in read), default=0)} offline "
        "(most replicas without a leader on one node)"
    ]
    for node in nodes:
        if node.error is not None:
            lines.append(f"  node {node.node_id}: {node.error}")
        else:
            lines.append(
                f"  node {node.node_id}: {node.under_replicated} under-replicated, "
                f"{node.offline} without a leader"
            )
    controller = next((n for n in read if n.is_controller), None)
    if controller is None:
        lines.append("consumer groups: no controller's metrics could be read")
        return lines
    lines.append(f"consumer groups (from controller node {controller.node_id}):")
    if not controller.consumer_groups:
        lines.append("  none with committed offsets")
    high_watermarks: dict[tuple[str, int], int] = {}
    for node in read:
        for key, offset in node.high_watermarks.items():
            high_watermarks[key] = max(offset, high_watermarks.get(key, offset))
    for (group, topic, partition), offset in sorted(controller.consumer_groups.items()):
        high_watermark = high_watermarks.get((topic, partition))
        lag = "?" if high_watermark is None else str(max(0, high_watermark - offset))
        lines.append(f"  {group} {topic}-{partition}: committed {offset} lag {lag}")
    return lines
