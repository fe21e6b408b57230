"""The Consumer: read committed records from assigned partitions, from positions it controls.

Theory of operation. The caller assigns partitions and may `seek` each one; a partition with
no position gets one from `auto_offset_reset` ("earliest": the log start, "latest": the high
watermark, "error": raise) through a ListOffsets request to its leader, lazily, at the next
`poll` or `position`. Fetching is pipelined (raftlog.client._fetcher): each partition keeps
one Fetch in flight to its leader (long-polling up to `fetch_max_wait_ms`), sent again as
soon as the previous answer is decoded, while `fetch_buffer_bytes_max` allows, so the next
records are on their way while the caller handles these. `poll` decodes the answers that
have arrived, drops control batches (a leader's no-op, membership changes: they occupy
offsets but hold no user records) and records before the position (a batch is returned whole
even when the position lies inside it), buffers the rest and returns up to
`max_poll_records`; it waits (up to its timeout) only when nothing is buffered. A seek,
reset, revocation or unassign drops the partition's buffer and its Fetch in flight, whose
answer is then never delivered.

Positions. Each partition keeps `fetch_offset` (the next offset to ask for) and a buffer of
fetched records; its position, the next offset poll() will return, is the first buffered
record's offset, or `fetch_offset` when the buffer is empty (the Fetch in flight, if any,
asks for `fetch_offset`). Example: the log holds a no-op at
0 and records at 1..3; after `seek(tp, 0)` a poll fetches the batches at 0 and 1..3, skips the
no-op and returns records 1, 2, 3; the position is then 4.

The server only returns batches below the high watermark (the commit offset); the consumer
checks it, and checks that offsets increase, and raises rather than return a record that
breaks either. NOT_LEADER follows the leader hint; other retriable errors (unreachable node,
timeout, election) are retried, each partition after `retry_backoff_ms`, until poll's
timeout and, if no fetch succeeded at all in that time and none is still in flight, the last
one is raised. OFFSET_OUT_OF_RANGE resets the position per `auto_offset_reset`.

Consumer groups. `subscribe(topics, group_id=...)` (or `group_id=` in the constructor) joins
a group instead of `assign`: the cluster's controller shares the topics' partitions among the
group's members and moves them incrementally as members come and go (raftlog.client._consumer_group
has the member's side, raftlog.metadata.consumer_groups the coordinator's). `poll` drives the
membership: it heartbeats when due, and applies each new assignment between fetch rounds. A
revoked partition's position is committed first (with `enable_auto_commit`), then dropped,
and the revocation confirmed at once; partitions kept are never paused. A new partition
starts at the group's committed offset, else per `auto_offset_reset`. With auto-commit the
positions of owned partitions are also committed every `auto_commit_interval_ms` (those that
moved only: each commit is a metadata quorum entry) and on close. `commit()` commits the
positions of all owned partitions now, `commit(offsets)` the given ones; `committed(tp)`
reads the group's committed offset. A consumer that assigns partitions itself may still
commit to a `group_id` as long as that group has no members (Kafka's standalone consumer).
Heartbeats happen only inside poll: a consumer that stops polling for the session timeout
loses its partitions to the other members (and, by its own rule, drops them too).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

from raftlog.client._connection import ConnectionOptions, TopicPartition
from raftlog.client._consumer_group import GroupMember
from raftlog.client._fetcher import ConsumerRecord, Fetcher, PartitionState
from raftlog.client._transactions import ConsumerGroupMetadata
from raftlog.client.config import AutoOffsetReset, ConsumerConfig, IsolationLevel
from raftlog.client.errors import (
    ClientClosedError,
    ClientError,
    NotLeaderForPartitionError,
    OffsetOutOfRangeError,
    ServerError,
    server_error,
)
from raftlog.errors import ConfigError
from raftlog.rpc.v1 import raftlog_pb2 as pb

__all__ = ["Consumer", "ConsumerRecord"]

_RESETS = {"earliest": pb.EARLIEST, "latest": pb.LATEST}
# A leader lookup that keeps answering NOT_LEADER is given up after this many hops.
_LEADER_HOPS_MAX = 5

log = logging.getLogger(__name__)


def _as_tp(tp: tuple[str, int]) -> TopicPartition:
    topic, partition = tp
    if not isinstance(topic, str) or not isinstance(partition, int) or partition < 0:
        raise ClientError(f"a partition is a (topic, partition number) pair, got {tp!r}")
    return TopicPartition(topic, partition)


class Consumer:
    """Reads committed records from explicitly assigned partitions (not thread-safe)."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        *,
        auto_offset_reset: AutoOffsetReset = "latest",
        isolation_level: IsolationLevel = "read_uncommitted",
        partition_fetch_bytes_max: int = 1024 * 1024,
        fetch_max_wait_ms: int = 500,
        fetch_min_bytes: int = 1,
        max_poll_records: int = 500,
        fetch_buffer_bytes_max: int = 32 * 1024 * 1024,
        decompressed_bytes_max: int = 64 * 1024 * 1024,
        consumer_timeout_ms: int | None = None,
        request_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 100,
        metadata_max_age_ms: int = 300_000,
        group_id: str | None = None,
        enable_auto_commit: bool = True,
        auto_commit_interval_ms: int = 5000,
        rebalance_timeout_ms: int = 60_000,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        tls_ca: str | os.PathLike[str] | None = None,  # TLS, trusting this CA
        token: str | None = None,  # bearer token (docs/security.md)
        tls_cert: str | os.PathLike[str] | None = None,  # client certificate (mTLS)
        tls_key: str | os.PathLike[str] | None = None,  # its private key
    ) -> None:
        if auto_commit_interval_ms <= 0 or rebalance_timeout_ms <= 0:
            raise ConfigError(
                f"auto_commit_interval_ms ({auto_commit_interval_ms}) and rebalance_timeout_ms "
                f"({rebalance_timeout_ms}) must be positive"
            )
        options = ConnectionOptions.from_arguments(locals())
        connection = options.config
        self.config = ConsumerConfig(
            auto_offset_reset=auto_offset_reset,
            isolation_level=isolation_level,
            partition_fetch_bytes_max=partition_fetch_bytes_max,
            fetch_max_wait_ms=fetch_max_wait_ms,
            fetch_min_bytes=fetch_min_bytes,
            max_poll_records=max_poll_records,
            fetch_buffer_bytes_max=fetch_buffer_bytes_max,
            decompressed_bytes_max=decompressed_bytes_max,
            consumer_timeout_ms=consumer_timeout_ms,
            connection=connection,
        ).validate()
        self._cluster = options.connect(bootstrap)
        self._clock = clock
        # Clock and sleep are ports: tests pass a manual clock whose sleep moves it.
        self._sleep = sleep
        self._partitions: dict[TopicPartition, PartitionState] = {}
        self._fetcher = Fetcher(self._cluster, self.config)
        self._request_timeout_ms = connection.request_timeout_ms
        self._closed = False
        self._group_id = group_id
        self._enable_auto_commit = enable_auto_commit
        self._auto_commit_interval_s = auto_commit_interval_ms / 1000
        self._rebalance_timeout_ms = rebalance_timeout_ms
        self._group: GroupMember | None = None  # set by subscribe(), or by commit() alone
        self._subscribed = False
        self._next_auto_commit_at = float("inf")
        self._last_committed: dict[TopicPartition, int] = {}

    # -- assignment and positions -----------------------------------------------------------

    def assign(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Read exactly these partitions; positions of partitions kept are kept."""
        self._check_open()
        if self._subscribed:
            raise ClientError("assign() on a subscribed consumer: call unsubscribe() first")
        wanted = [_as_tp(tp) for tp in partitions]
        self._set_partitions({tp: self._partitions.get(tp, PartitionState()) for tp in wanted})

    def _set_partitions(self, partitions: dict[TopicPartition, PartitionState]) -> None:
        """Own exactly `partitions`; the Fetch in flight of each partition dropped is
        cancelled (its answer would be dropped anyway: its state is gone)."""
        for tp, state in self._partitions.items():
            if partitions.get(tp) is not state:
                state.drop_fetch()
        self._partitions = partitions

    def assignment(self) -> set[TopicPartition]:
        return set(self._partitions)

    def seek(self, tp: tuple[str, int], offset: int) -> None:
        """The next poll returns records of `tp` from `offset` on."""
        if not isinstance(offset, int) or offset < 0:
            raise ClientError(f"seek offset must be a non-negative int, got {offset!r}")
        state = self._state(tp)
        state.move_to(offset, None)
        assert state.position() == offset and state.in_flight is None

    def seek_to_beginning(self, *partitions: tuple[str, int]) -> None:
        """Move to the log start of each partition (all assigned ones when none is named)."""
        self._seek_lazily(partitions, "earliest")

    def seek_to_end(self, *partitions: tuple[str, int]) -> None:
        """Move to the high watermark of each partition (all assigned when none is named)."""
        self._seek_lazily(partitions, "latest")

    def _seek_lazily(self, partitions: Sequence[tuple[str, int]], reset: AutoOffsetReset) -> None:
        targets = [_as_tp(tp) for tp in partitions] or list(self._partitions)
        for tp in targets:
            self._state(tp).move_to(None, reset)

    def position(self, tp: tuple[str, int]) -> int:
        """The offset of the next record poll() returns for `tp` (resolving a pending reset)."""
        state = self._state(tp)
        if state.position() is None:
            self._resolve_position(_as_tp(tp), state)
        position = state.position()
        assert position is not None and position >= 0
        return position

    def highwater(self, tp: tuple[str, int]) -> int | None:
        """The high watermark last reported for `tp` (None before the first fetch)."""
        return self._state(tp).high_watermark

    def partitions_for_topic(self, topic: str) -> set[int]:
        """The partition ids of `topic` (from fresh metadata); assign() does not need it."""
        self._check_open()
        self._cluster.mark_stale(topic)
        partitions = {p.partition for p in self._cluster.topic(topic)}
        assert partitions == set(range(len(partitions)))
        return partitions

    def beginning_offsets(self, partitions: Iterable[tuple[str, int]]) -> dict[TopicPartition, int]:
        """The log start offset of each partition, asked of its leader."""
        return self._list_offsets(partitions, pb.EARLIEST)

    def end_offsets(self, partitions: Iterable[tuple[str, int]]) -> dict[TopicPartition, int]:
        """The high watermark of each partition (the offset the next committed record gets);
        with `isolation_level="read_committed"` the last stable offset (as Kafka's consumer)."""
        return self._list_offsets(partitions, pb.LATEST)

    def _list_offsets(
        self, partitions: Iterable[tuple[str, int]], spec: pb.OffsetSpec
    ) -> dict[TopicPartition, int]:
        self._check_open()
        offsets: dict[TopicPartition, int] = {}
        for tp in map(_as_tp, partitions):
            request = pb.ListOffsetsRequest(
                topic=tp.topic,
                partition=tp.partition,
                spec=spec,
                isolation_level=int(self.config.isolation_level == "read_committed"),
            )
            offsets[tp] = self._call_leader(tp, "Log.ListOffsets", request, retry=True).offset
        assert all(offset >= 0 for offset in offsets.values()), offsets
        return offsets

    def _state(self, tp: tuple[str, int]) -> PartitionState:
        self._check_open()
        state = self._partitions.get(_as_tp(tp))
        if state is None:
            raise ClientError(f"partition {tp[0]}/{tp[1]} is not assigned to this consumer")
        return state

    def _resolve_position(
        self, tp: TopicPartition, state: PartitionState, *, retry: bool = True
    ) -> None:
        if state.group_offset_pending and self._group is not None:
            committed = self._group.committed([tp])[tp]
            state.group_offset_pending = False
            if committed is not None:
                state.move_to(committed, None)
                return
        reset = state.reset or self.config.auto_offset_reset
        if reset == "error":
            raise OffsetOutOfRangeError(
                "NO_POSITION",
                "no position and auto_offset_reset='error': seek() first",
                concerning=f"{tp.topic}/{tp.partition}",
            )
        request = pb.ListOffsetsRequest(topic=tp.topic, partition=tp.partition, spec=_RESETS[reset])
        response = self._call_leader(tp, "Log.ListOffsets", request, retry=retry)
        if response.offset < 0:
            raise ServerError(
                "INVALID_RESPONSE",
                f"ListOffsets answered offset {response.offset}",
                concerning=f"{tp.topic}/{tp.partition}",
            )
        state.move_to(response.offset, None)

    def _call_leader(self, tp: TopicPartition, rpc: str, request: Any, *, retry: bool) -> Any:
        """Call `rpc` at `tp`'s leader; with `retry`, retriable errors (an election, a node
        restarting) are retried for up to one request timeout, NOT_LEADER hints at once."""
        deadline = self._clock() + self.config.connection.request_timeout_ms / 1000
        backoff_s = self.config.connection.retry_backoff_ms / 1000
        hops = 0
        while True:
            try:
                return self._call_leader_once(tp, rpc, request)
            except ClientError as error:
                self._on_retriable(tp, error)  # raises what is final
                if not retry or self._clock() + backoff_s >= deadline:
                    raise
                hinted = (
                    isinstance(error, NotLeaderForPartitionError) and error.leader_id is not None
                )
                hops = hops + 1 if hinted else 0
                if not hinted or hops > _LEADER_HOPS_MAX:
                    self._sleep(backoff_s)  # let the election finish before asking again

    def _call_leader_once(self, tp: TopicPartition, rpc: str, request: Any) -> Any:
        address = self._cluster.leader_address(tp)
        response = self._cluster.call(address, rpc, request)
        if response.error.code == pb.NONE:
            return response
        error = server_error(
            response.error, concerning=f"{rpc} for {tp.topic}/{tp.partition} at {address}"
        )
        if isinstance(error, NotLeaderForPartitionError):
            self._cluster.apply_leader_hint(tp, error.leader_id, error.leader_address)
        raise error

    # -- polling ----------------------------------------------------------------------------

    def poll(self, timeout_ms: int = 0, *, max_records: int | None = None) -> list[ConsumerRecord]:
        """Up to `max_records` (default max_poll_records) records, waiting up to `timeout_ms`
        while none is buffered; the next Fetches are on their way when it returns."""
        self._check_open()
        if timeout_ms < 0:
            raise ClientError(f"poll timeout_ms must not be negative, got {timeout_ms}")
        if not self._partitions and not self._subscribed:
            raise ClientError("poll() with no partitions assigned: call assign() first")
        limit = self.config.max_poll_records if max_records is None else max_records
        assert limit > 0, limit
        deadline = self._clock() + timeout_ms / 1000
        last_error: ClientError | None = None
        answered = False
        while True:
            self._group_work()
            answered_now, error = self._collect()
            answered = answered or answered_now
            records = self._fetcher.drain(self._partitions.values(), limit)
            # Before returning: the caller's work on these records overlaps the round trips.
            last_error = self._send_fetches() or error or last_error
            if records:
                return records
            if self._clock() >= deadline:
                in_flight = any(s.in_flight for s in self._partitions.values())
                if last_error is not None and not answered and not in_flight:
                    raise last_error
                return []
            self._wait(deadline)

    def _collect(self) -> tuple[bool, ClientError | None]:
        """Decode the answers that arrived (prefetching after each); returns whether any
        arrived and the last retriable error met."""
        answered = False
        last_error: ClientError | None = None
        if not self._fetcher.any_finished():
            return answered, last_error
        now_s = self._clock()
        for tp, error in self._fetcher.collect(self._partitions):
            if error is None:
                answered = True
            else:
                self._on_fetch_error(tp, error, now_s)
                last_error = error
        return answered, last_error

    def _send_fetches(self) -> ClientError | None:
        """Look up missing positions, then send every Fetch allowed now; returns the last
        retriable error met (each failed partition waits `retry_backoff_ms`)."""
        last_error: ClientError | None = None
        now_s = self._clock()
        for tp, state in self._partitions.items():
            if state.fetch_offset is not None or state.retry_at_s > now_s:
                continue
            assert state.in_flight is None, tp
            try:
                self._resolve_position(tp, state, retry=False)  # poll's loop retries
            except ClientError as error:
                self._on_fetch_error(tp, error, now_s)
                last_error = error
        for tp, send_error in self._fetcher.send(self._partitions, now_s):
            self._on_fetch_error(tp, send_error, now_s)
            last_error = send_error
        return last_error

    def _on_fetch_error(self, tp: TopicPartition, error: ClientError, now_s: float) -> None:
        self._on_retriable(tp, error)  # raises what is final
        state = self._partitions.get(tp)
        if state is not None:
            state.retry_at_s = now_s + self.config.connection.retry_backoff_ms / 1000

    def _wait(self, deadline: float) -> None:
        """Until a Fetch finishes, or the deadline, a heartbeat or a retry backoff's end."""
        now_s = self._clock()
        until_s = min(deadline, now_s + self._heartbeat_ms() / 1000)
        for state in self._partitions.values():
            if state.in_flight is None and state.retry_at_s > now_s:
                until_s = min(until_s, state.retry_at_s)
        if not self._partitions:  # a group member with nothing (yet) to read
            self._sleep(max(0.001, until_s - now_s))
        elif any(state.in_flight for state in self._partitions.values()):
            self._fetcher.wait(until_s - now_s)
        else:
            self._sleep(max(0.0, until_s - now_s))  # only a backoff or the deadline is ahead

    def _on_retriable(self, tp: TopicPartition, error: ClientError) -> None:
        """Re-raise a final error; for a retriable one make the next lookup find the leader."""
        if not error.retriable:
            raise error
        # A NOT_LEADER hint was already recorded; refreshing now could bring back stale news.
        if not isinstance(error, NotLeaderForPartitionError):
            self._cluster.mark_stale(tp.topic)

    # -- consumer groups --------------------------------------------------------------------

    def subscribe(self, topics: Iterable[str], *, group_id: str | None = None) -> None:
        """Consume `topics` as a member of `group_id` (or the constructor's group_id): the
        group's coordinator decides which of their partitions this consumer reads."""
        self._check_open()
        names = tuple(sorted(set(topics)))
        if not names or not all(isinstance(name, str) and name for name in names):
            raise ClientError(f"subscribe() needs non-empty topic names, got {names!r}")
        group = group_id or self._group_id
        if group is None:
            raise ClientError("subscribe() needs a group_id (here or in Consumer(group_id=...))")
        if self._group is None or self._group.group_id != group or not self._subscribed:
            if self._subscribed:
                self.unsubscribe()
            self._set_partitions({})
            self._group = self._new_group_member(group)
            self._next_auto_commit_at = self._clock() + self._auto_commit_interval_s
        self._group_id = group
        self._subscribed = True
        self._group.topics = names
        self._group.hurry()

    def subscription(self) -> set[str]:
        return set(self._group.topics) if self._subscribed and self._group else set()

    def unsubscribe(self) -> None:
        """Leave the group (committing first with auto-commit); drops every partition."""
        self._check_open()
        if self._subscribed and self._group is not None:
            if self._enable_auto_commit:
                self._commit_quietly(self._positions(), why="on unsubscribe")
            self._group.leave()
        self._subscribed = False
        self._set_partitions({})

    def commit(self, offsets: Mapping[tuple[str, int], int] | None = None) -> None:
        """Commit `offsets` (the next offset to consume, per partition), or the positions of
        every owned partition, to the group durably; raises if the cluster refuses."""
        self._check_open()
        chosen = (
            self._positions() if offsets is None else {_as_tp(tp): o for tp, o in offsets.items()}
        )
        if any(not isinstance(o, int) or o < 0 for o in chosen.values()):
            raise ClientError(f"committed offsets must be non-negative ints, got {chosen!r}")
        self._group_for_offsets().commit(chosen, as_member=self._subscribed)
        self._last_committed.update(chosen)

    def committed(self, tp: tuple[str, int]) -> int | None:
        """The group's committed offset for `tp` (None when none was committed)."""
        self._check_open()
        partition = _as_tp(tp)
        return self._group_for_offsets().committed([partition])[partition]

    def group_metadata(self) -> ConsumerGroupMetadata:
        """This consumer's group membership, for `Producer.send_offsets_to_transaction`: the
        member id and epoch while subscribed, else the group id alone (not checked)."""
        self._check_open()
        if self._subscribed and self._group is not None:
            group = self._group
            return ConsumerGroupMetadata(group.group_id, group.member_id, group.member_epoch)
        if self._group_id is None:
            raise ClientError("group_metadata() needs a group_id: pass Consumer(group_id=)")
        return ConsumerGroupMetadata(self._group_id)

    def _new_group_member(self, group_id: str) -> GroupMember:
        return GroupMember(
            self._cluster,
            group_id,
            rebalance_timeout_ms=self._rebalance_timeout_ms,
            clock=self._clock,
            sleep=self._sleep,
        )

    def _group_for_offsets(self) -> GroupMember:
        if self._group is None:
            if self._group_id is None:
                raise ClientError("commit()/committed() need a group_id: pass Consumer(group_id=)")
            self._group = self._new_group_member(self._group_id)
        return self._group

    def _positions(self) -> dict[TopicPartition, int]:
        positions = {tp: state.position() for tp, state in self._partitions.items()}
        return {tp: p for tp, p in positions.items() if p is not None}

    def _heartbeat_ms(self) -> int:
        if not self._subscribed or self._group is None:
            return self.config.fetch_max_wait_ms
        return int(self._group.seconds_to_heartbeat() * 1000)

    def _group_work(self) -> None:
        """Heartbeat when due and apply what it answered; auto-commit when due."""
        group = self._group
        if not self._subscribed or group is None:
            return
        if group.heartbeat_due() or group.session_lost():
            answer = group.heartbeat(self._partitions.keys())
            if answer.lost:
                # Our partitions may already be someone else's: drop them uncommitted.
                log.info(
                    "group %s: membership lost; dropping %d partitions",
                    group.group_id,
                    len(self._partitions),
                )
                self._set_partitions({})
            if answer.assignment is not None:
                self._reconcile(answer.assignment)
        if self._enable_auto_commit and self._clock() >= self._next_auto_commit_at:
            self._next_auto_commit_at = self._clock() + self._auto_commit_interval_s
            self._commit_quietly(self._positions(), why="auto-commit")

    def _reconcile(self, assignment: frozenset[TopicPartition]) -> None:
        """Revoke (commit, drop, confirm soon), then add partitions at committed offsets."""
        assert self._group is not None
        revoked = set(self._partitions) - assignment
        added = sorted(assignment - set(self._partitions))
        if revoked:
            if self._enable_auto_commit:
                positions = self._positions()
                self._commit_quietly(
                    {tp: positions[tp] for tp in revoked if tp in positions}, why="on revoke"
                )
            kept = {tp: s for tp, s in self._partitions.items() if tp not in revoked}
            self._set_partitions(kept)  # an answer for a revoked partition is never delivered
            self._group.hurry()  # confirm, so the new owners get them sooner
        for tp in added:
            self._partitions[tp] = PartitionState(group_offset_pending=True)
        if added:
            try:
                committed = self._group.committed(added)
            except ClientError as error:
                log.info(
                    "group %s: committed offsets not read yet: %s", self._group.group_id, error
                )
                return  # each new partition looks its own up when first fetched
            for tp, offset in committed.items():
                state = self._partitions[tp]
                state.group_offset_pending = False
                if offset is not None:
                    state.fetch_offset = offset
        assert set(self._partitions) == set(assignment)

    def _commit_quietly(self, offsets: Mapping[TopicPartition, int], *, why: str) -> None:
        """Commit what moved since the last commit; a failure is logged (at-least-once: the
        next owner re-reads from the older committed offset)."""
        changed = {tp: o for tp, o in offsets.items() if self._last_committed.get(tp) != o}
        if not changed or self._group is None:
            return
        try:
            self._group.commit(changed, as_member=self._subscribed)
        except ClientError as error:
            log.warning("group %s: commit %s failed: %s", self._group.group_id, why, error)
            return
        self._last_committed.update(changed)

    # -- iteration and lifecycle ------------------------------------------------------------

    def __iter__(self) -> Consumer:
        return self

    def __next__(self) -> ConsumerRecord:
        """The next record, polling as needed; StopIteration after `consumer_timeout_ms`
        without a record (if set) or once the consumer is closed. One record at a time from
        the fetched buffers, so position() always names the next record iteration yields."""
        if self._closed:
            raise StopIteration
        idle_ms_max = self.config.consumer_timeout_ms
        # Without a consumer timeout each poll gets a whole request timeout: retriable errors
        # (an election) are retried that long before poll() raises them.
        window_ms = idle_ms_max if idle_ms_max is not None else self._request_timeout_ms
        while True:
            records = self.poll(timeout_ms=window_ms, max_records=1)
            if records:
                assert len(records) == 1
                return records[0]
            if idle_ms_max is not None or self._closed:
                raise StopIteration  # poll() returns nothing only once its window has passed

    def close(self) -> None:
        """Commit (with auto-commit) and leave the group, then release every connection."""
        if self._closed:
            return
        if self._subscribed and self._group is not None:
            if self._enable_auto_commit:
                self._commit_quietly(self._positions(), why="on close")
            self._group.leave()
        if self._group is not None:
            self._group.close()
        self._set_partitions({})
        self._closed = True
        self._cluster.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("consumer closed")

    def __enter__(self) -> Consumer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
