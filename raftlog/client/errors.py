"""The exceptions the raftlog client raises.

Every client error names what it concerns: the address it could not reach, the topic-partition
a server refused, the operation that timed out. Each carries `retriable` (the same request may
succeed later) and, for errors a server returned, the server's `code`, its `message` and its
leader hint (`leader_id`, `leader_address`) so the caller knows where to go next.

    RaftlogError (raftlog.errors)
    └── ClientError
        ├── ConnectionFailedError        an address did not answer (retriable; names it)
        │   └── NoNodeAnsweredError      no address answered (each one's failure listed)
        ├── RequestTimedOutError         no answer within request_timeout_ms (retriable)
        ├── ServerError                  an error code a server returned (code, leader hint)
        │   ├── NotLeaderForPartitionError    retriable; the hint says where the leader went
        │   ├── NotControllerError            retriable; admin requests go to the controller
        │   ├── UnknownTopicOrPartitionError  retriable while metadata spreads
        │   ├── TopicAlreadyExistsError
        │   ├── OffsetOutOfRangeError         the consumer's position is outside the log
        │   └── ProducerFencedError           another instance took the transactional id
        ├── BufferFullError              send() waited max_block_ms for buffer space
        ├── RecordTooLargeError          one record is larger than batch_bytes_max
        ├── DeliveryFailedError          a record's batch failed for good (cause chained)
        ├── TransactionError             a transaction that must be aborted (cause chained)
        └── ClientClosedError            use after close()
"""

from __future__ import annotations

from raftlog.errors import RaftlogError
from raftlog.rpc.v1 import raftlog_pb2 as pb

__all__ = [
    "BufferFullError",
    "ClientClosedError",
    "ClientError",
    "ConnectionFailedError",
    "DeliveryFailedError",
    "NoNodeAnsweredError",
    "NotControllerError",
    "NotLeaderForPartitionError",
    "OffsetOutOfRangeError",
    "ProducerFencedError",
    "RecordTooLargeError",
    "RequestTimedOutError",
    "ServerError",
    "TopicAlreadyExistsError",
    "TransactionError",
    "UnknownTopicOrPartitionError",
    "server_error",
]

# Codes a client may retry unchanged even when the server leaves `retriable` unset: Kafka's
# clients treat these as transient (stale metadata, an election under way).
RETRIABLE_CODES = frozenset(
    {
        pb.NOT_LEADER,
        pb.REQUEST_TIMED_OUT,
        pb.NOT_ENOUGH_REPLICAS,
        pb.NOT_CONTROLLER,
        pb.UNKNOWN_TOPIC_OR_PARTITION,
        pb.FENCED,
    }
)


class ClientError(RaftlogError):
    """Root of the errors the client library raises."""


class ConnectionFailedError(ClientError):
    """`address` did not answer; `reason` is what the transport reported."""

    retriable = True

    def __init__(self, address: str, reason: str, *, operation: str = "request"):
        super().__init__(f"{operation}: could not reach {address}: {reason}")
        self.address = address
        self.reason = reason
        self.operation = operation


class NoNodeAnsweredError(ConnectionFailedError):
    """Every address tried for `operation` failed; `failures` holds each one's error."""

    def __init__(self, operation: str, failures: list[ClientError], *, addresses: list[str]):
        reasons = _distinct(failures) or "no address to try"
        ClientError.__init__(self, f"{operation}: no node answered: {reasons}")
        self.address = ",".join(addresses)
        self.reason = reasons
        self.operation = operation
        self.failures = failures


def _distinct(failures: list[ClientError]) -> str:
    """Each distinct failure once, in the order first seen, with how often it repeated: a
    caller that retried until its deadline may have seen the same refusal hundreds of times."""
    counts: dict[str, int] = {}
    for failure in failures:
        short = _short(failure)
        counts[short] = counts.get(short, 0) + 1
    return "; ".join(
        f"{short} ({count} times)" if count > 1 else short for short, count in counts.items()
    )


def _short(failure: ClientError) -> str:
    if isinstance(failure, ConnectionFailedError):
        return f"{failure.address}: {failure.reason}"
    if isinstance(failure, RequestTimedOutError):
        return f"{failure.address}: timed out after {failure.timeout_ms} ms"
    return str(failure)


class RequestTimedOutError(ClientError):
    """`operation` got no answer from `address` within `timeout_ms`."""

    retriable = True

    def __init__(self, operation: str, *, address: str, timeout_ms: int):
        super().__init__(f"{operation} to {address} timed out after {timeout_ms} ms")
        self.operation = operation
        self.address = address
        self.timeout_ms = timeout_ms


class ServerError(ClientError):
    """A server refused a request with `code` (an ErrorCode name) and its own message."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        concerning: str,
        retriable: bool = False,
        leader_id: int | None = None,
        leader_address: str | None = None,
    ):
        hint = ""
        if leader_id is not None or leader_address:
            hint = f" (leader hint: node {leader_id} at {leader_address or 'unknown address'})"
        super().__init__(f"{concerning}: {code}: {message or 'no message'}{hint}")
        self.code = code
        self.server_message = message
        self.concerning = concerning
        self.retriable = retriable
        self.leader_id = leader_id
        self.leader_address = leader_address


class NotLeaderForPartitionError(ServerError):
    """The node is not the partition's leader; `leader_id` / `leader_address` say who is."""


class NotControllerError(ServerError):
    """The node is not the metadata controller; `leader_id` names the controller."""


class UnknownTopicOrPartitionError(ServerError):
    """The topic or partition does not exist (or its metadata has not reached this node)."""


class TopicAlreadyExistsError(ServerError):
    """create_topic() named a topic that exists."""


class OffsetOutOfRangeError(ServerError):
    """A fetch position below the log start or above the high watermark."""


class ProducerFencedError(ServerError):
    """A newer instance of the transactional id (or the coordinator, aborting a transaction
    past its timeout or on an operator's `raftlog txn abort`) bumped the epoch: this
    producer can do nothing more; close it."""


class TransactionError(ClientError):
    """The transaction cannot commit (a record of it failed): abort it, then begin again."""


class BufferFullError(ClientError):
    """The producer's buffer stayed full for `max_block_ms`."""

    def __init__(self, *, buffer_bytes_max: int, max_block_ms: int, record_bytes: int):
        super().__init__(
            f"producer buffer full: a record of {record_bytes} bytes did not fit in "
            f"buffer_bytes_max={buffer_bytes_max} within max_block_ms={max_block_ms}"
        )
        self.buffer_bytes_max = buffer_bytes_max
        self.max_block_ms = max_block_ms
        self.record_bytes = record_bytes


class RecordTooLargeError(ClientError):
    """One record cannot fit in a batch (or in the whole buffer)."""

    def __init__(self, *, record_bytes: int, limit_name: str, limit_bytes: int):
        super().__init__(f"record of {record_bytes} bytes exceeds {limit_name}={limit_bytes}")
        self.record_bytes = record_bytes
        self.limit_name = limit_name
        self.limit_bytes = limit_bytes


class DeliveryFailedError(ClientError):
    """A batch for `topic`/`partition` failed for good; `__cause__` holds the last error."""

    def __init__(self, topic: str, partition: int, reason: str, *, attempts: int):
        super().__init__(
            f"delivery to {topic}/{partition} failed after {attempts} attempt(s): {reason}"
        )
        self.topic = topic
        self.partition = partition
        self.reason = reason
        self.attempts = attempts


class ClientClosedError(ClientError):
    """The producer, consumer or admin client was used after close()."""


_CLASS_BY_CODE: dict[int, type[ServerError]] = {
    pb.NOT_LEADER: NotLeaderForPartitionError,
    pb.NOT_CONTROLLER: NotControllerError,
    pb.UNKNOWN_TOPIC_OR_PARTITION: UnknownTopicOrPartitionError,
    pb.TOPIC_ALREADY_EXISTS: TopicAlreadyExistsError,
    pb.OFFSET_OUT_OF_RANGE: OffsetOutOfRangeError,
    pb.PRODUCER_FENCED: ProducerFencedError,
}


def server_error(error: pb.Error, *, concerning: str) -> ServerError:
    """The client exception for a non-NONE `Error` a server returned about `concerning`."""
    assert error.code != pb.NONE, "server_error() needs an error"
    code_name = (
        pb.ErrorCode.Name(error.code) if error.code in pb.ErrorCode.values() else str(error.code)
    )
    cls = _CLASS_BY_CODE.get(error.code, ServerError)
    result = cls(
        code_name,
        error.message,
        concerning=concerning,
        retriable=error.retriable or error.code in RETRIABLE_CODES,
        leader_id=error.leader_id if error.leader_id >= 0 else None,
        leader_address=error.leader_address or None,
    )
    assert result.code == code_name
    return result
