"""Consumer-group mode (`--consumer-mode group`): members that subscribe instead of assigning.

Theory of operation. Each consumer process joins one consumer group and lets the group's
coordinator decide which partitions it reads. What the group checks need is in the history:

    assign / revoke   the partitions the coordinator gave to or took from this member,
                      recorded when the client learns it (inside a poll, before the records
                      that poll returns), as an invoke and an `ok` at once
    poll              the records it got, marked with the group
    commit            the offsets it committed after processing them (`info` when the
                      outcome is unknown)
    committed         a reader's view of the group's committed offsets (twice a second,
                      and once more after the heal)

A member commits, at most every `commit_interval_s`, one past the last offset it delivered
in each partition it read since; it never commits a partition it was not given. The
`GroupClients` port is implemented by `RaftlogGroupClients` (raftlog's own client, whose
consumer groups are raftlog.client._consumer_group) and by the Kafka clients
(raftlog.chaos.kafka_clients).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from raftlog.chaos.clients import RaftlogClients, ReadRecord
from raftlog.chaos.history import HistoryRecorder
from raftlog.client import Consumer
from raftlog.client._connection import TopicPartition

__all__ = ["GROUP", "ChaosGroupConsumer", "GroupClients", "RaftlogGroupClients"]
__all__ += ["group_member", "read_committed"]

GROUP = "chaos-group"
# Called with "assign" or "revoke" and the partitions concerned.
AssignmentListener = Callable[[str, Sequence[int]], None]


class ChaosGroupConsumer(Protocol):
    def poll(self, timeout_ms: int) -> list[ReadRecord]:
        """Records of partitions this member holds when it returns; calls the listener
        for every assignment change first."""
        ...

    def commit(self, offsets: Mapping[int, int]) -> None:
        """Commit next-offsets per partition durably; raises when not (known to be) done."""
        ...

    def close(self) -> None:
        """Leave the group and release the consumer."""
        ...


@runtime_checkable
class GroupClients(Protocol):
    def group_consumer(
        self, topic: str, group: str, listener: AssignmentListener
    ) -> ChaosGroupConsumer:
        """A new member of `group` subscribed to `topic`, which reports every assignment change to
        `listener`."""
        ...

    def committed(self, topic: str, group: str, partitions: Sequence[int]) -> dict[int, int]:
        """The group's committed offsets (partitions with none are left out)."""
        ...


class _ObservedConsumer(Consumer):
    """raftlog's consumer, telling the chaos member each time it drops partitions.

    Every drop (a revocation, a lost membership, close) goes through `_set_partitions`,
    so hooking it sees a revocation even when the same poll assigns the partition again;
    a diff of `assignment()` around the poll would miss that pair."""

    on_dropped: Callable[[set[TopicPartition]], None] | None = None

    def _set_partitions(self, partitions: dict[TopicPartition, Any]) -> None:
        dropped = set(self._partitions) - set(partitions)
        super()._set_partitions(partitions)
        if dropped and self.on_dropped is not None:
            self.on_dropped(dropped)


class _RaftlogGroupConsumer:
    def __init__(self, consumer: _ObservedConsumer, topic: str, listener: AssignmentListener):
        self._consumer = consumer
        self._topic = topic
        self._listener = listener
        self._held: set[int] = set()
        consumer.on_dropped = self._dropped
        consumer.subscribe([topic])

    def _dropped(self, partitions: set[TopicPartition]) -> None:
        revoked = sorted(tp.partition for tp in partitions if tp.partition in self._held)
        self._held -= set(revoked)
        if revoked:
            self._listener("revoke", revoked)

    def poll(self, timeout_ms: int) -> list[ReadRecord]:
        """Poll raftlog's consumer; partitions it dropped were reported as revoked as they went, and
        those added are reported as assigned before the records are returned."""
        records = self._consumer.poll(timeout_ms)
        # Additions happen in place (no drop), so they are found by a diff at the end; no
        # record is returned after a change within the same poll, see Consumer.poll.
        now = {tp.partition for tp in self._consumer.assignment()}
        added = sorted(now - self._held)
        self._held = now
        if added:
            self._listener("assign", added)
        return [ReadRecord(r.partition, r.offset, (r.value or b"").decode()) for r in records]

    def commit(self, offsets: Mapping[int, int]) -> None:
        """Commit the next offsets per partition of the topic; raises the client's error when the
        commit is not known to be done."""
        self._consumer.commit({(self._topic, p): o for p, o in offsets.items()})

    def close(self) -> None:
        """Close raftlog's consumer without reporting its last partitions as revoked: leaving is not
        a revocation the history needs."""
        self._consumer.on_dropped = None  # leaving is not a revocation the history needs
        self._consumer.close()


class RaftlogGroupClients(RaftlogClients):
    """`RaftlogClients` plus consumer groups through raftlog's own client."""

    def _group_consumer(self, group: str) -> _ObservedConsumer:
        return _ObservedConsumer(
            self.bootstrap,
            group_id=group,
            enable_auto_commit=False,  # the workload commits, so the history has each commit
            auto_offset_reset="earliest",  # no committed offset yet: the group starts at 0
            fetch_max_wait_ms=200,
            request_timeout_ms=self.request_timeout_ms,
        )

    def group_consumer(
        self, topic: str, group: str, listener: AssignmentListener
    ) -> ChaosGroupConsumer:
        """A raftlog consumer-group member of `group` subscribed to `topic`, with manual commits and
        auto_offset_reset="earliest"."""
        return _RaftlogGroupConsumer(self._group_consumer(group), topic, listener)

    def committed(self, topic: str, group: str, partitions: Sequence[int]) -> dict[int, int]:
        """The group's committed offsets of `partitions`, read with a short-lived consumer
        (partitions with none are left out); raises the client's error."""
        consumer = self._group_consumer(group)
        try:
            found = {p: consumer.committed((topic, p)) for p in partitions}
        finally:
            consumer.close()
        return {p: o for p, o in found.items() if o is not None}


def _error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:300]


def _commit(
    consumer: ChaosGroupConsumer,
    recorder: HistoryRecorder,
    process: int,
    topic: str,
    offsets: dict[int, int],
) -> None:
    invoke = {"topic": topic, "group": GROUP, "offsets": {str(p): o for p, o in offsets.items()}}
    recorder.record(process, "invoke", "commit", invoke)
    try:
        consumer.commit(offsets)
    except Exception as error:  # a commit may have been applied before the error: unknown
        recorder.record(process, "info", "commit", {**invoke, "error": _error(error)})
        return
    recorder.record(process, "ok", "commit", invoke)


def group_member(
    clients: GroupClients,
    recorder: HistoryRecorder,
    topic: str,
    take_process: Callable[[], int],
    stop: threading.Event,
    *,
    poll_timeout_ms: int,
    lifetime_s: Callable[[], float],
    commit_interval_s: float = 0.5,
) -> None:
    """One consumer process after another: a new id when its consumer fails for good or
    has lived `lifetime_s()` (members leaving and joining are what make rebalances)."""
    while not stop.is_set():
        process = take_process()
        held: set[int] = set()

        def changed(
            kind: str, partitions: Sequence[int], process: int = process, held: set[int] = held
        ) -> None:
            """Record an assign or revoke of `partitions` (an invoke and an ok at once) and keep
            `held` up to date."""
            value = {"topic": topic, "group": GROUP, "partitions": list(partitions)}
            recorder.record(process, "invoke", kind, value)
            recorder.record(process, "ok", kind, value)
            if kind == "assign":
                held.update(partitions)
            else:
                held.difference_update(partitions)

        consumer = clients.group_consumer(topic, GROUP, changed)
        end_ns = recorder.now_ns() + int(lifetime_s() * 1e9)
        try:
            _member_loop(consumer, recorder, process, topic, held, stop, poll_timeout_ms,
                         commit_interval_s, end_ns)  # fmt: skip
        finally:
            consumer.close()


def _member_loop(
    consumer: ChaosGroupConsumer,
    recorder: HistoryRecorder,
    process: int,
    topic: str,
    held: set[int],
    stop: threading.Event,
    poll_timeout_ms: int,
    commit_interval_s: float,
    end_ns: int,
) -> None:
    pending: dict[int, int] = {}  # partition -> next offset to commit
    next_commit_ns = 0
    while not stop.is_set() and recorder.now_ns() < end_ns:
        recorder.record(process, "invoke", "poll", {"group": GROUP})
        try:
            records = consumer.poll(poll_timeout_ms)
        except Exception as error:
            recorder.record(process, "fail", "poll", {"group": GROUP, "error": _error(error)})
            if not getattr(error, "retriable", False):
                stop.wait(0.2)
                return  # its position is no longer trusted: a new process
            continue
        rows = [{"topic": topic, "partition": r.partition, "offset": r.offset,
                 "value": r.value} for r in records]  # fmt: skip
        recorder.record(process, "ok", "poll", {"group": GROUP, "records": rows})
        for r in records:
            pending[r.partition] = r.offset + 1
        # Only partitions still held: committing a revoked one would race its new owner.
        pending = {p: o for p, o in pending.items() if p in held}
        if pending and recorder.now_ns() >= next_commit_ns:
            _commit(consumer, recorder, process, topic, pending)
            pending = {}
            next_commit_ns = recorder.now_ns() + int(commit_interval_s * 1e9)


def read_committed(
    clients: GroupClients,
    recorder: HistoryRecorder,
    topic: str,
    partitions: Sequence[int],
    process: int | str,
) -> None:
    """One `committed` operation: the group's committed offsets as the cluster answers."""
    invoke = {"topic": topic, "group": GROUP}
    recorder.record(process, "invoke", "committed", invoke)
    try:
        offsets = clients.committed(topic, GROUP, partitions)
    except Exception as error:
        recorder.record(process, "fail", "committed", {**invoke, "error": _error(error)})
        return
    value = {**invoke, "offsets": {str(p): o for p, o in offsets.items()}}
    recorder.record(process, "ok", "committed", value)
