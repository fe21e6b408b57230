"""Strong identifier types shared by every layer.

Converting between them is always an explicit, named step: an `Offset` is a position in a
partition's log (and, since the Raft index space *is* the offset space, a Raft index), a
`Term` is a Raft term (stored in a batch's partition-leader-epoch field), a `NodeId` names a
server. Counts and sizes stay plain `int` with a unit suffix in their names.
"""

from __future__ import annotations

from typing import NewType

__all__ = ["GroupId", "NodeId", "Offset", "PartitionId", "Term"]

NodeId = NewType("NodeId", int)
Term = NewType("Term", int)
Offset = NewType("Offset", int)
PartitionId = NewType("PartitionId", int)
# A Raft group on a node: the metadata quorum is group 0, partitions get ids from the controller.
GroupId = NewType("GroupId", int)
