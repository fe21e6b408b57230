"""raftlog's exception tree onto Kafka's error codes.

The same ideas as the gRPC servicers' mapping (`raftlog.rpc.log_servicer`): most specific class
first, every raftlog error becomes a per-partition code, so one bad partition never fails a
connection, and retriable raftlog errors map onto codes Kafka clients retry (after refreshing
metadata, which names the new leader).
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from raftlog import errors
from raftlog.metadata import ErrorCode as MetadataErrorCode

__all__ = ["kafka_error", "metadata_result_error"]

_CODES: list[tuple[type[errors.RaftlogError], ErrorCode]] = [
    (errors.NotControllerError, ErrorCode.not_controller),
    (errors.LeaderNotReadyError, ErrorCode.not_leader_or_follower),
    (errors.NotLeaderError, ErrorCode.not_leader_or_follower),
    (errors.UnknownTopicOrPartitionError, ErrorCode.unknown_topic_or_partition),
    (errors.BatchTooLargeError, ErrorCode.message_too_large),
    (errors.BatchOverSegmentError, ErrorCode.record_list_too_large),
    (errors.CorruptBatchError, ErrorCode.corrupt_message),
    (errors.RequestTimedOutError, ErrorCode.request_timed_out),
    (errors.OffsetOutOfRangeError, ErrorCode.offset_out_of_range),
    (errors.OutOfOrderSequenceError, ErrorCode.out_of_order_sequence_number),
    (errors.InvalidRecordError, ErrorCode.invalid_record),
    (errors.ProducerFencedError, ErrorCode.invalid_producer_epoch),
    (errors.PolicyViolationError, ErrorCode.policy_violation),
    (errors.InvalidTxnStateError, ErrorCode.invalid_txn_state),
    (errors.TransactionCoordinatorFencedError, ErrorCode.transaction_coordinator_fenced),
    # A proposal dropped by a leader that lost its term: written nowhere, safe to retry.
    (errors.ProposalDroppedError, ErrorCode.not_enough_replicas),
]

_RESULT_CODES = {
    MetadataErrorCode.TOPIC_ALREADY_EXISTS: ErrorCode.topic_already_exists,
    MetadataErrorCode.UNKNOWN_TOPIC: ErrorCode.unknown_topic_or_partition,
    MetadataErrorCode.UNKNOWN_PARTITION: ErrorCode.unknown_topic_or_partition,
    MetadataErrorCode.INVALID_PARTITIONS: ErrorCode.invalid_partitions,
    MetadataErrorCode.INVALID_REPLICATION_FACTOR: ErrorCode.invalid_replication_factor,
    MetadataErrorCode.INVALID_CONFIG: ErrorCode.invalid_config,
    MetadataErrorCode.INVALID_REPLICA_ASSIGNMENT: ErrorCode.invalid_replica_assignment,
    MetadataErrorCode.INVALID_TOPIC_NAME: ErrorCode.invalid_topic_exception,
}


def kafka_error(error: errors.RaftlogError) -> ErrorCode:
    """The Kafka error code for `error`: the code of its most specific known class, else
    REQUEST_TIMED_OUT if it is retriable (so clients retry it) or UNKNOWN_SERVER_ERROR."""
    return next((code for kind, code in _CODES if isinstance(error, kind)), _fallback(error))


def _fallback(error: errors.RaftlogError) -> ErrorCode:
    # Unknown retriable errors must stay retriable for the client.
    return ErrorCode.request_timed_out if error.retriable else ErrorCode.unknown_server_error


def metadata_result_error(code: MetadataErrorCode) -> ErrorCode:
    """The Kafka error code for a metadata command's result `code`; INVALID_REQUEST for codes with
    no Kafka counterpart."""
    return _RESULT_CODES.get(code, ErrorCode.invalid_request)
