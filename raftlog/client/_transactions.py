"""A transactional producer's side of Kafka's transaction protocol, over gRPC.

Theory of operation. The coordinator of every transactional id is the controller
(`rpc/txn_producer_calls.py`); calls to it follow NOT_CONTROLLER hints as Admin calls do, and
CONCURRENT_TRANSACTIONS (the previous end still writing its markers) or a timeout is retried
after `retry_backoff_ms` until `request_timeout_ms` passes (each call is safe to repeat).

    init_transactions()   InitProducerId(transactional_id): the id's producer id and next
                          epoch, fencing older instances (their open transaction is aborted)
    begin_transaction()   local: records may be sent
    send()                a partition's first record in the transaction adds the partition
                          (AddPartitionsToTxn) before the record is queued, so the leader's
                          KIP-890 check finds it in the transaction
    send_offsets_to_transaction()   AddOffsetsToTxn, then TxnOffsetCommit; given the
                          consumer's group_metadata(), the coordinator checks that the
                          consumer is still the member it was (KIP-447)
    commit_transaction()  flush; any record that failed makes it TransactionError (abort
                          it); else EndTxn(commit)
    abort_transaction()   flush (records already sent settle), EndTxn(abort)

A PRODUCER_FENCED answer (a newer instance, or the coordinator aborting on timeout or for an
operator) is final: every later call raises ProducerFencedError. EndTxn bumps the epoch
(KIP-890 part 2) and answers the new one; the producer numbers the next transaction's
batches with it from sequence 0, so a late copy of an ended transaction's batch carries an
epoch the partitions refuse.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from raftlog.client.errors import (
    ClientError,
    ProducerFencedError,
    ServerError,
    TransactionError,
)
from raftlog.rpc.v1 import raftlog_pb2 as pb

__all__ = ["ConsumerGroupMetadata", "TransactionManager"]

CallController = Callable[[str, Any, str], Any]

_RETRIED_CODES = frozenset({"CONCURRENT_TRANSACTIONS", "REQUEST_TIMED_OUT"})


@dataclass(frozen=True, slots=True)
class ConsumerGroupMetadata:
    """A consumer's group membership as `Consumer.group_metadata()` gives it (Kafka's
    ConsumerGroupMetadata; `member_epoch` is the KIP-848 group's generation): passed to
    `Producer.send_offsets_to_transaction`, it makes the coordinator refuse the offsets once
    the consumer is no longer that member at that epoch. `member_id` "" (with epoch -1): a
    consumer outside the group's membership, which is not checked."""

    group_id: str
    member_id: str = ""
    member_epoch: int = -1


class _Phase(enum.Enum):
    UNINITIALIZED = "uninitialized"
    READY = "ready"
    IN_TRANSACTION = "in transaction"
    FENCED = "fenced"


class TransactionManager:
    """The transaction state of one Producer (module docstring); thread-safe."""

    def __init__(
        self,
        *,
        transactional_id: str,
        transaction_timeout_ms: int,
        call_controller: CallController,
        request_timeout_ms: int,
        retry_backoff_ms: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not transactional_id:
            raise ClientError("transactional_id must be a non-empty string")
        self.transactional_id = transactional_id
        self._timeout_ms = transaction_timeout_ms
        self._call_controller = call_controller
        self._request_timeout_s = request_timeout_ms / 1000
        self._backoff_s = retry_backoff_ms / 1000
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.RLock()
        self._phase = _Phase.UNINITIALIZED
        self.producer_id = -1
        self.producer_epoch = -1
        self._partitions: set[tuple[str, int]] = set()
        self._futures: list[Future[Any]] = []

    # -- the producer's calls ---------------------------------------------------------------

    def init(self) -> tuple[int, int]:
        """InitProducerId: (producer id, epoch) to number this instance's batches with."""
        with self._lock:
            self._check_not_fenced()
            if self._phase is _Phase.IN_TRANSACTION:
                raise ClientError("init_transactions() inside a transaction")
            request = pb.InitProducerIdRequest(
                transactional_id=self.transactional_id,
                transaction_timeout_ms=self._timeout_ms,
            )
            response = self._call("Log.InitProducerId", request, "init transactions")
            self.producer_id, self.producer_epoch = response.producer_id, response.producer_epoch
            self._phase = _Phase.READY
            return self.producer_id, self.producer_epoch

    def begin(self) -> None:
        with self._lock:
            self._check_not_fenced()
            if self._phase is not _Phase.READY:
                raise ClientError(
                    f"begin_transaction() while {self._phase.value} "
                    "(call init_transactions() first, and end a transaction before the next)"
                )
            self._phase = _Phase.IN_TRANSACTION
            self._partitions.clear()
            self._futures.clear()

    def before_append(self, topic: str, partition: int) -> None:
        """Adds the partition to the transaction before its first record is queued."""
        with self._lock:
            self._check_in_transaction("send()")
            if (topic, partition) in self._partitions:
                return
            request = pb.AddPartitionsToTxnRequest(
                **self._producer(),
                partitions=[pb.TopicPartitions(topic=topic, partitions=[partition])],
            )
            self._call("Log.AddPartitionsToTxn", request, f"add {topic}/{partition}")
            self._partitions.add((topic, partition))

    def track(self, future: Future[Any]) -> None:
        with self._lock:
            self._futures.append(future)

    def send_offsets(
        self, offsets: Mapping[tuple[str, int], int], group: str | ConsumerGroupMetadata
    ) -> None:
        member = group if isinstance(group, ConsumerGroupMetadata) else ConsumerGroupMetadata(group)
        group_id = member.group_id
        with self._lock:
            self._check_in_transaction("send_offsets_to_transaction()")
            if not group_id:
                raise ClientError("group_id must be a non-empty string")
            add = pb.AddOffsetsToTxnRequest(**self._producer(), group_id=group_id)
            self._call("Log.AddOffsetsToTxn", add, f"add group {group_id!r}")
            commit = pb.TxnOffsetCommitRequest(
                **self._producer(),
                group_id=group_id,
                member_id=member.member_id,
                member_epoch=member.member_epoch,
                offsets=[
                    pb.TxnOffset(topic=topic, partition=partition, offset=offset)
                    for (topic, partition), offset in sorted(offsets.items())
                ],
            )
            self._call("Log.TxnOffsetCommit", commit, f"offsets of group {group_id!r}")

    def end(
        self,
        *,
        commit: bool,
        flush: Callable[[], None],
        renumber: Callable[[int, int], None] = lambda producer_id, epoch: None,
    ) -> None:
        """Flush, then EndTxn; a commit with a failed record raises TransactionError and
        leaves the transaction open for abort. `renumber(producer id, epoch)` gets the
        producer the coordinator answered (the epoch bumped) before any later call of this
        producer can start: the next transaction's batches must carry it."""
        with self._lock:
            self._check_in_transaction("commit_transaction()" if commit else "abort_transaction()")
            flush()
            failed = _first_failure(self._futures)
            if commit and failed is not None:
                if _fenced(failed):
                    self._phase = _Phase.FENCED
                raise TransactionError(
                    f"transaction of {self.transactional_id!r} cannot commit: a record "
                    f"failed ({failed}); abort it"
                ) from failed
            request = pb.EndTxnRequest(**self._producer(), commit=commit)
            response = self._call("Log.EndTxn", request, "commit" if commit else "abort")
            assert response.producer_id >= 0 and response.producer_epoch >= 0, response
            self.producer_id, self.producer_epoch = response.producer_id, response.producer_epoch
            renumber(self.producer_id, self.producer_epoch)
            self._phase = _Phase.READY

    # -- helpers ----------------------------------------------------------------------------

    def _producer(self) -> dict[str, Any]:
        return {
            "transactional_id": self.transactional_id,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
        }

    def _check_not_fenced(self) -> None:
        if self._phase is _Phase.FENCED:
            raise ProducerFencedError(
                "PRODUCER_FENCED",
                "a newer instance or the coordinator ended this producer; close it",
                concerning=f"transactional id {self.transactional_id!r}",
            )

    def _check_in_transaction(self, operation: str) -> None:
        self._check_not_fenced()
        if self._phase is not _Phase.IN_TRANSACTION:
            raise ClientError(f"{operation} outside a transaction (call begin_transaction())")

    def _call(self, rpc: str, request: Any, what: str) -> Any:
        concerning = f"{what} (transactional id {self.transactional_id!r})"
        deadline = self._clock() + self._request_timeout_s
        while True:
            try:
                return self._call_controller(rpc, request, concerning)
            except ProducerFencedError:
                self._phase = _Phase.FENCED
                raise
            except ServerError as error:
                if error.code not in _RETRIED_CODES or self._clock() >= deadline:
                    raise
            self._sleep(self._backoff_s)


def _first_failure(futures: Iterable[Future[Any]]) -> BaseException | None:
    for future in futures:
        if future.done() and future.exception() is not None:
            return future.exception()
    return None


def _fenced(error: BaseException) -> bool:
    """Whether a record failed because its epoch was fenced (the cause chain's codes)."""
    cause: BaseException | None = error
    while cause is not None:
        if getattr(cause, "code", None) in ("PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH"):
            return True
        cause = cause.__cause__
    return False
