"""Strong identifier types shared by every layer.

Converting between them is always an explicit, named step: an `Offset` is a position in a
partition's log (and, since the Raft index space *is* the offset space, a Raft index), a
`Term` is a Raft term (stored in a batch's partition-leader-epoch field), a `NodeId` names a
server. Counts and sizes stay plain `int` with a unit suffix in their names.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NewType

__all__ = [
    "DERIVED_PRODUCER_ID_MIN",
    "Commitment",
    "NodeId",
    "Offset",
    "PartitionId",
    "RaftGroupId",
    "Term",
    "TxnMarker",
    "TxnMarkerResult",
]

NodeId = NewType("NodeId", int)
Term = NewType("Term", int)
Offset = NewType("Offset", int)
PartitionId = NewType("PartitionId", int)
# A Raft group on a node: the metadata quorum is group 0, partitions get ids from the controller.
RaftGroupId = NewType("RaftGroupId", int)

# Producer ids split at 2**62: the controller allocates ids below it (InitProducerId), clients
# that must resume as the same producer (the Spark sink's tasks) derive theirs at or above it
# (`raftlog.client.producer.derived_producer_id`), so the two kinds never meet.
DERIVED_PRODUCER_ID_MIN = 1 << 62


class Commitment(enum.Enum):
    """What a proposer waits for (Kafka's acks)."""

    NONE = "0"  # answered as soon as the leader appended it to its (unsynced) log
    LEADER = "1"  # durable on the leader
    QUORUM = "all"  # committed: durable on a majority, applied here


@dataclass(frozen=True, slots=True)
class TxnMarker:
    """A COMMIT or ABORT marker the transaction coordinator asks a partition to write
    (Kafka's WriteTxnMarkers entry, one partition): it ends `producer_id`'s transaction there.
    `producer_epoch` is the epoch the marker is written with (with KIP-890 part 2, the bumped
    one); `coordinator_epoch` fences markers from an older coordinator."""

    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    commit: bool
    topic: str
    partition: int

    def __post_init__(self) -> None:
        assert self.producer_id >= 0 and 0 <= self.producer_epoch < 2**15, self
        assert self.coordinator_epoch >= 0 and self.partition >= 0 and self.topic, self


@dataclass(frozen=True, slots=True)
class TxnMarkerResult:
    """What writing one marker came to: a Kafka error code, 0 once the marker is committed."""

    topic: str
    partition: int
    error_code: int
