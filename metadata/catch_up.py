"""Whether a node's copy of the metadata has caught up since the node started.

Theory of operation. Every node answers metadata reads (Metadata, DescribeTopic, ListTopics,
DescribeCluster) from its own copy of the metadata state. Right after a restart that copy is
only what the node's own log held: a topic created while it was down is missing until the
controller's entries arrive, and a client asking then would be told the topic does not exist.
KRaft brokers therefore serve only once they have caught up to the metadata high watermark
they learned when they registered; raftlog keeps the same rule with what it already has.

Every start registers (`RegisterNode`) with a new, higher incarnation, and the controller
commits that registration after everything committed before the node started. So once this
node has *applied* its own registration, its copy holds every entry committed before it
started. Worked example: node 3 is killed at metadata offset 40, topic `t` is created at
offset 52, node 3 restarts (incarnation 7) and its log still ends at 40; its registration is
committed at offset 60; when node 3's copy shows incarnation 7 it has applied 41..60, `t`
among them. The latch is once per start: later the copy lags the controller by a few entries
at most, as any follower's does. A sole voter registers with itself, so it serves as soon as
it has elected itself and applied its registration.
"""

from __future__ import annotations

from raftlog.metadata.state import MetadataState
from raftlog.types import NodeId

__all__ = ["caught_up_since_start"]


def caught_up_since_start(state: MetadataState, node_id: NodeId, incarnation: int) -> bool:
    """`state` (this node's copy) holds every entry committed before node `node_id` started
    as `incarnation`: it shows that incarnation's registration (or a later one, which was
    committed later still)."""
    assert incarnation >= 0, incarnation
    info = state.node(node_id)
    return info is not None and info.incarnation >= incarnation
