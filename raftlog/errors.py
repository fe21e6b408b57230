"""The exception tree of raftlog.

Every error raftlog raises on purpose derives from `RaftlogError` and carries machine-readable
attributes: `retriable` says whether the same request may succeed later unchanged, and
`leader_hint` (where present) says where to retry. gRPC status codes appear only in
`raftlog.rpc`, which maps this tree onto them.

    RaftlogError
    ├── ConfigError                 a setting is out of range or contradicts another
    ├── StorageError                the log or hard state on disk
    │   ├── CorruptBatchError       bytes that are not a valid record batch (names file, position)
    │   │   └── CrcMismatchError    the CRC32C does not cover the bytes it claims to
    │   ├── OffsetOutOfRangeError   an offset below the log start or above the log end
    │   ├── BatchTooLargeError      a batch over `batch_bytes_max` (max.message.bytes)
    │   ├── BatchOverSegmentError   a produced batch over `segment_bytes_max` (segment.bytes)
    │   └── LogClosedError          use after close()
    ├── RaftError                   the consensus layer
    │   ├── NotLeaderError          retriable, with leader_hint
    │   │   └── NotControllerError  for the metadata quorum
    │   └── ProposalDroppedError    retriable: the leader changed or a transfer is under way
    ├── PartitionError              produce/fetch on one partition (raftlog.partition)
    │   ├── UnknownTopicOrPartitionError
    │   ├── LeaderNotReadyError     retriable: a new leader has not committed its term yet
    │   ├── RequestTimedOutError    retriable; a produce's outcome is unknown
    │   ├── OutOfOrderSequenceError an idempotent producer skipped sequence numbers
    │   ├── InvalidRecordError      records the topic refuses, each named (record_errors)
    │   ├── ProducerFencedError     a producer epoch older than the one on record
    │   ├── InvalidTxnStateError    a produce the producer's transaction does not allow
    │   └── TransactionCoordinatorFencedError  a marker from an older coordinator
    └── TransportError              node-to-node connections (raftlog.rpc.peer_transport)
        ├── FrameError              bytes off the wire that are not a valid frame (names what)
        └── HandshakeError          a HELLO from another cluster or an unknown node
"""

from __future__ import annotations

__all__ = [
    "BatchOverSegmentError",
    "BatchTooLargeError",
    "ConfigError",
    "CorruptBatchError",
    "CrcMismatchError",
    "FrameError",
    "HandshakeError",
    "InvalidRecordError",
    "InvalidTxnStateError",
    "LeaderNotReadyError",
    "LogClosedError",
    "MembershipChangeError",
    "NotControllerError",
    "NotLeaderError",
    "OffsetOutOfRangeError",
    "OutOfOrderSequenceError",
    "PartitionError",
    "ProducerFencedError",
    "ProposalDroppedError",
    "RaftError",
    "RaftlogError",
    "RequestTimedOutError",
    "StorageError",
    "TransactionCoordinatorFencedError",
    "TransportError",
    "UnknownTopicOrPartitionError",
]


class RaftlogError(Exception):
    """Root of every error raftlog raises on purpose."""

    retriable: bool = False


class ConfigError(RaftlogError, ValueError):
    """A configuration value is invalid; the message names the setting."""


class StorageError(RaftlogError):
    """A failure of the on-disk log or hard state."""


class CorruptBatchError(StorageError):
    """Bytes that are not a valid record batch.

    `path` and `position` say where (path is None for bytes that came off the wire).
    """

    def __init__(self, reason: str, *, path: str | None = None, position: int | None = None):
        where = ""
        if path is not None:
            where = f" in {path}"
        if position is not None:
            where += f" at byte {position}"
        super().__init__(f"corrupt record batch{where}: {reason}")
        self.reason = reason
        self.path = path
        self.position = position


class CrcMismatchError(CorruptBatchError):
    """The stored CRC32C does not match the bytes it covers."""


class OffsetOutOfRangeError(StorageError):
    """An offset outside `[log_start_offset, log_end_offset]`."""

    def __init__(self, offset: int, *, log_start_offset: int, log_end_offset: int):
        super().__init__(
            f"offset {offset} is out of range: the log holds offsets "
            f"[{log_start_offset}, {log_end_offset})"
        )
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class BatchTooLargeError(StorageError):
    """A record batch larger than the configured maximum."""

    def __init__(self, size_bytes: int, *, batch_bytes_max: int):
        super().__init__(
            f"record batch of {size_bytes} bytes exceeds batch_bytes_max={batch_bytes_max}"
        )
        self.size_bytes = size_bytes
        self.batch_bytes_max = batch_bytes_max


class BatchOverSegmentError(StorageError):
    """A produced batch larger than a segment (`segment_bytes_max`, a topic's segment.bytes):
    refused as Kafka's log refuses it (RECORD_LIST_TOO_LARGE)."""

    def __init__(self, size_bytes: int, *, segment_bytes_max: int):
        super().__init__(
            f"record batch of {size_bytes} bytes exceeds segment_bytes_max={segment_bytes_max} "
            "(the topic's segment.bytes)"
        )
        self.size_bytes = size_bytes
        self.segment_bytes_max = segment_bytes_max


class LogClosedError(StorageError):
    """The log was used after close()."""


class RaftError(RaftlogError):
    """A failure of the consensus layer."""


class NotLeaderError(RaftError):
    """This node is not the leader of the group; retry at `leader_hint` if known."""

    retriable = True

    def __init__(self, *, leader_hint: int | None):
        hint = f"node {leader_hint}" if leader_hint is not None else "unknown"
        super().__init__(f"not the leader (leader: {hint})")
        self.leader_hint = leader_hint


class NotControllerError(NotLeaderError):
    """This node is not the controller (the metadata quorum's leader); see `leader_hint`."""

    def __init__(self, *, leader_hint: int | None):
        super().__init__(leader_hint=leader_hint)
        hint = f"node {leader_hint}" if leader_hint is not None else "unknown"
        self.args = (f"not the controller (controller: {hint})",)


class ProposalDroppedError(RaftError):
    """The proposal was not appended (leadership changing); safe to retry."""

    retriable = True


class TransportError(RaftlogError):
    """A failure of a node-to-node connection; the transport reconnects, Raft retries."""

    retriable = True


class FrameError(TransportError):
    """Bytes that are not a valid transport frame; `position` is the byte offset in the frame."""

    retriable = False  # the same bytes will never decode; the connection is dropped

    def __init__(self, reason: str, *, position: int | None = None):
        where = f" at byte {position}" if position is not None else ""
        super().__init__(f"malformed frame{where}: {reason}")
        self.reason = reason
        self.position = position


class HandshakeError(TransportError):
    """A peer's HELLO named another cluster, an unknown node, or came out of order."""


class MembershipChangeError(RaftError):
    """A membership change was refused: more than one voter changed, or (retriable) another
    change is still uncommitted, or the leader has not yet committed an entry of its term."""

    def __init__(self, reason: str, *, retriable: bool = False):
        super().__init__(f"membership change refused: {reason}")
        self.reason = reason
        self.retriable = retriable


class PartitionError(RaftlogError):
    """A produce, fetch or offset lookup on one partition failed."""


class UnknownTopicOrPartitionError(PartitionError):
    def __init__(self, topic: str, partition: int):
        super().__init__(f"unknown topic or partition {topic}-{partition} on this node")
        self.topic = topic
        self.partition = partition


class LeaderNotReadyError(PartitionError, NotLeaderError):
    """This node leads the partition but has not committed an entry of its term, so its
    high watermark may still lag the previous leader's; the client retries shortly."""

    retriable = True

    def __init__(self, *, leader_hint: int | None):
        NotLeaderError.__init__(self, leader_hint=leader_hint)
        self.args = ("leader elected but not ready: its term's first entry is not committed",)


class RequestTimedOutError(PartitionError):
    retriable = True


class OutOfOrderSequenceError(PartitionError):
    pass


class InvalidRecordError(PartitionError):
    """Well-formed records the topic refuses (Kafka's INVALID_RECORD): records without a key
    on a compacted topic, whose cleaner keeps one record per key. `record_errors` names each
    refused record of the batch: (its index in the batch, why), as Kafka's per-record errors
    (KIP-467); the whole batch is refused."""

    def __init__(self, message: str, *, record_errors: tuple[tuple[int, str], ...] = ()):
        super().__init__(message)
        self.record_errors = record_errors


class ProducerFencedError(PartitionError):
    pass


class PolicyViolationError(PartitionError):
    """Kafka's POLICY_VIOLATION: a request the topic's settings forbid (DeleteRecords on a
    topic whose cleanup.policy does not include delete)."""


class InvalidTxnStateError(PartitionError):
    """Kafka's INVALID_TXN_STATE: a transactional batch for a partition the coordinator has
    not added to the producer's transaction (KIP-890), or a non-transactional batch while the
    producer's transaction is open. Nothing of the request is written."""


class TransactionCoordinatorFencedError(PartitionError):
    """Kafka's TRANSACTION_COORDINATOR_FENCED: a marker whose coordinator epoch is older than
    the last marker's for that producer (a deposed coordinator's late write)."""
