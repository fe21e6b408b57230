"""The group host: every Raft group of one node, driven by one asyncio loop.

Theory of operation. Each pass of `run()` (woken by a tick, an inbound message or a proposal)
collects a Ready from every *dirty* group that has one and processes them *together* in the
order the core requires:

    1. send each Ready's `messages` (a leader's appends go out before its own fsync: the
       transport is flushed before a sync that holds the loop, `flush_sends`);
    2. persist: install snapshots, append entries (buffered writes); hard states to save are
       collected;
    3. on a disk thread: save the collected hard states (each an atomic file replace), and
       write (one writev per log) and fsync every log touched in this pass (group commit:
       the votes and appends a pass gathered from many groups share one trip off the loop);
       a pass with no hard state to save and at most `sync_on_loop_bytes_max` to write does
       this on the loop instead (see `_sync_inline`);
    4. send `persisted_messages` (votes, append acknowledgements), apply committed entries,
       answer reads, `advance`.

Committed entries that were durable before the pass (below its new entries) are applied
before step 1 (`ready.apply_durable`), so their producers' answers do not wait for the
pass's fsync. A commit learned where nothing waits to be written (a follower's
acknowledgement stepped in `deliver`, the leader's own fsync counted by `advance`) is
applied and answered in that same turn (`_apply_now`): a Ready with nothing to make durable
completes at once, so a producer's answer does not wait for the loop to come round to the
next pass. The metadata group keeps to its passes (its applies may add and remove groups).

Liveness before bulk work: a pass first completes, steps 1-4 with a sync of their own, the
Readys that keep the cluster's view of who is alive and who leads: first every Ready of an
*urgent* group (the metadata quorum, whose heartbeats and leases every node depends on),
alone, then every Ready that writes and applies no entries (heartbeats, votes, role
changes, read states: cheap by construction, though a thousand votes are a thousand
hard-state saves). Only then does it write, sync and apply the bulk (partition appends,
snapshots, applies). A vote or the metadata group's acknowledgement thus never
waits for the fsync of megabytes of partition appends, nor a lease heartbeat's commit for
thousands of applies; when a pass holds only one kind, it is one sync as before.

While step 3 runs the loop may step groups and take proposals (the core allows that between
`ready()` and `advance()`), but no group gives a new Ready before the pass completes its
previous one. Messages for a group this node does not host (yet) are dropped: Raft retries,
and the metadata quorum creates the group. Vote requests are the exception: a new topic's
preferred replica campaigns the moment it creates its group, usually before the other
replicas have applied the topic's creation, and a dropped pre-vote would leave the first
election to whichever timer fires first (then a second election hands leadership to the
preferred replica, and clients meet NOT_LEADER_OR_FOLLOWER in between). So up to
`vote_requests_held_max` vote requests for groups not hosted are held for one election
timeout and stepped into the group when it is added; past that time the candidate has
campaigned again anyway.

Scaling to thousands of mostly idle groups: a group is *dirty* once something may have given
it work (a message stepped into it, a tick, a proposal or read through `RaftGroup.wake`, a
liveness change, `notify()`), and a pass looks at dirty groups only, never at every group.
Only *awake* groups are ticked: a group whose core quiesced (raftlog.raft.quiesce) leaves
the tick set when a pass sees it quiet and returns when an input wakes it. The transport's
node-pair liveness (`set_peer_reachable`) replaces the heartbeats quiesced groups stop sending.

Elections per node are bounded: at most `campaigns_per_s_max` groups a second start a
campaign by their election timer (a token bucket holding a second's worth). A group whose
timer would fire with the bucket empty misses that tick, as a group waiting on its disk
does, and campaigns on a later tick that finds a token: when a slow node makes thousands of
timers fire at once, the votes, hard-state saves and role changes they cause arrive at a
bounded rate instead of in one burst that slows the node further. Leadership transfers
(TimeoutNow) and campaigns the runtime asks for are not timer campaigns and not counted.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import time
from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

from raftlog.errors import CorruptBatchError
from raftlog.raft.ports import HardStateStore
from raftlog.raft.types import HardState, Message, Ready, VoteRequest
from raftlog.runtime import produce_trace
from raftlog.runtime import recorder as metrics
from raftlog.runtime.clock import MonotonicClock, SystemMonotonicClock
from raftlog.runtime.group import RaftGroup
from raftlog.runtime.rate import TokenBucket
from raftlog.runtime.ready import apply_durable, complete_ready, persist_ready, process_ready
from raftlog.storage.hard_state import HardStateWrite
from raftlog.storage.log import FlushTicket
from raftlog.types import NodeId, RaftGroupId

__all__ = ["RaftGroupHost"]

log = logging.getLogger(__name__)

SendFn = Callable[[NodeId, RaftGroupId, Message], None]


# An on-loop sync slower than `sync_on_loop_slow_ms` (a disk that stalls) sends the syncs of
# the passes of the next this-many seconds to the disk thread, so that the loop keeps serving
# heartbeats, reads and the other groups while the disk is slow. Each on-loop sync after a
# pause probes the disk; a slow probe doubles the pause (up to the maximum), a fast one
# resets it: a disk that stays slow for minutes (a thousand groups being created on every
# node) would otherwise stall the loop for a slow sync every second.
INLINE_SYNC_PAUSE_S = 1.0
INLINE_SYNC_PAUSE_S_MAX = 32.0


class RaftGroupHost:
    def __init__(
        self,
        *,
        node_id: NodeId,
        tick_interval_ms: int,
        send: SendFn,
        sync_on_loop_bytes_max: int = 0,
        sync_on_loop_slow_ms: int = 5,
        urgent_groups: frozenset[RaftGroupId] = frozenset(),
        campaigns_per_s_max: int = 500,
        clock: MonotonicClock | None = None,
        flush_sends: Callable[[], None] | None = None,
        vote_requests_held_max: int = 0,
        vote_request_hold_ms: int = 0,
    ) -> None:
        assert tick_interval_ms > 0 and sync_on_loop_bytes_max >= 0 and sync_on_loop_slow_ms > 0
        assert vote_requests_held_max >= 0 and vote_request_hold_ms >= 0
        self.node_id = node_id
        self._tick_interval_s = tick_interval_ms / 1000
        self._send = send
        # Hands what `send` queued to the network now (the transport's `flush_now`); called
        # before a sync on the loop, which would otherwise hold the appends until it ends.
        self._flush_sends = flush_sends
        self._sync_on_loop_bytes_max = sync_on_loop_bytes_max
        self._sync_on_loop_slow_ms = sync_on_loop_slow_ms
        self._urgent_groups = urgent_groups
        # Timing decisions (campaign budget, slow syncs) read this clock, so tests drive them.
        self._clock = clock or SystemMonotonicClock()
        self._campaigns = TokenBucket(campaigns_per_s_max, self._clock)
        self.campaigns_started = 0
        self.campaigns_postponed = 0  # ticks missed for want of a token
        self._inline_sync_paused_until = float("-inf")
        self._inline_sync_pause_s = INLINE_SYNC_PAUSE_S
        self.inline_syncs = 0
        self.inline_sync_pauses = 0
        self._groups: dict[RaftGroupId, RaftGroup] = {}
        # Groups a pass must look at, and groups that tick (not quiesced); insertion-ordered.
        self._dirty: dict[RaftGroupId, RaftGroup] = {}
        self._awake: dict[RaftGroupId, RaftGroup] = {}
        self._reachable: set[NodeId] = set()  # peers the transport reports alive
        self._wake = asyncio.Event()
        self._closed = False
        self.passes = 0
        self.ticks = 0  # group ticks, summed over groups: what quiescence saves
        self.tick_rounds = 0
        self.dropped_for_unknown_group = 0
        # Vote requests for groups not hosted yet, oldest first per group: (when held, sender,
        # request); `_held_count` sums them, at most `_vote_requests_held_max`.
        self._held: dict[RaftGroupId, list[tuple[float, NodeId, VoteRequest]]] = {}
        self._held_count = 0
        self._vote_requests_held_max = vote_requests_held_max
        self._vote_request_hold_s = vote_request_hold_ms / 1000
        self.vote_requests_held = 0
        # A group whose log turned out damaged on a read (a CRC, an epoch) is taken off the
        # host and handed here to be reopened for a repair; None: the error propagates.
        self.on_storage_damage: Callable[[RaftGroup, CorruptBatchError], None] | None = None

    # -- membership of groups on this node -------------------------------------------------

    def add(self, group: RaftGroup) -> None:
        assert group.raft_group_id not in self._groups, group.raft_group_id
        self._groups[group.raft_group_id] = group
        for peer in sorted(self._reachable):
            group.node.set_peer_reachable(peer, reachable=True)
        group.wake = lambda: self._mark_dirty(group)
        self._awake[group.raft_group_id] = group
        self._mark_dirty(group)
        held = self._held.pop(group.raft_group_id, None)
        if held is not None:
            self._held_count -= len(held)
            self._step_held(group.raft_group_id, held)

    def remove(self, raft_group_id: RaftGroupId) -> RaftGroup | None:
        self._dirty.pop(raft_group_id, None)
        self._awake.pop(raft_group_id, None)
        return self._groups.pop(raft_group_id, None)

    def get(self, raft_group_id: RaftGroupId) -> RaftGroup | None:
        return self._groups.get(raft_group_id)

    def groups(self) -> Iterable[RaftGroup]:
        return self._groups.values()

    # -- inputs ------------------------------------------------------------------------------

    def deliver(self, sender: NodeId, items: list[tuple[RaftGroupId, Message]]) -> None:
        """Transport callback: step each message into its group; a commit it teaches a group
        with nothing to write is applied at once (`_apply_now`)."""
        stepped: dict[RaftGroupId, RaftGroup] = {}
        for raft_group_id, message in items:
            group = self._groups.get(raft_group_id)
            if group is None:
                self._hold_or_drop(raft_group_id, sender, message)
                continue
            assert message.sender == sender, (message, sender)
            try:
                group.node.step(message)
            except CorruptBatchError as error:
                self._storage_damaged(group, error)
                continue
            self._dirty[raft_group_id] = group
            stepped[raft_group_id] = group
            if group.traces.pending:
                # A traced proposal's followers' acknowledgements and commit are seen here,
                # the moment they are stepped (produce_trace).
                group.traces.on_stepped(group.node)
        for group in stepped.values():
            if self._groups.get(group.raft_group_id) is group:
                self._apply_now(group)
        self._wake.set()

    def _hold_or_drop(self, raft_group_id: RaftGroupId, sender: NodeId, message: Message) -> None:
        """A message for a group not hosted here: a vote request is held while there is room
        (the group may be created in a moment, see the module's docstring), anything else
        dropped."""
        if isinstance(message, VoteRequest) and self._held_count < self._vote_requests_held_max:
            assert message.sender == sender, (message, sender)
            held = (self._clock.monotonic(), sender, message)
            self._held.setdefault(raft_group_id, []).append(held)
            self._held_count += 1
            self.vote_requests_held += 1
            return
        self.dropped_for_unknown_group += 1

    def _step_held(
        self, raft_group_id: RaftGroupId, held: list[tuple[float, NodeId, VoteRequest]]
    ) -> None:
        """Step the vote requests held for a group just added, those still fresh, in the
        order they came."""
        oldest = self._clock.monotonic() - self._vote_request_hold_s
        for held_at, sender, request in held:
            if held_at < oldest:
                self.dropped_for_unknown_group += 1
            else:
                self.deliver(sender, [(raft_group_id, request)])

    def _expire_held(self) -> None:
        """Drop the vote requests held longer than the hold time (a tick's work)."""
        oldest = self._clock.monotonic() - self._vote_request_hold_s
        for raft_group_id in list(self._held):
            held = self._held[raft_group_id]
            fresh = [item for item in held if item[0] >= oldest]
            self.dropped_for_unknown_group += len(held) - len(fresh)
            self._held_count -= len(held) - len(fresh)
            if fresh:
                self._held[raft_group_id] = fresh
            else:
                del self._held[raft_group_id]
        assert self._held_count == sum(len(held) for held in self._held.values())

    def _apply_now(self, group: RaftGroup) -> None:
        """Complete `group`'s Ready now if it applies committed entries and has nothing to
        make durable: its writes are all behind it (no Ready pending, nothing unstable), so
        the ready processor's order holds with no sync, and the producers waiting on those
        entries are answered in this turn instead of the next pass's."""
        node = group.node
        if (
            node.ready_pending
            or node.commit <= node.applied
            or group.raft_group_id in self._urgent_groups
            or node.ready_needs_sync()
        ):
            return
        try:
            ready = process_ready(
                node,
                log=group.log,
                hard_state_store=group.hard_state_store,
                send=self._sender(group),
                apply=group.apply,
                restore=group.restore,
                on_read=group.on_read,
            )
        except CorruptBatchError as error:
            self._storage_damaged(group, error)
            return
        assert not ready.must_sync, ready
        self._after_complete(group, ready)

    def notify(self) -> None:
        """Something changed outside `deliver` in groups not named: look at all of them
        (rare: peer restarts; per-group changes go through `RaftGroup.wake`)."""
        self._dirty.update(self._groups)
        self._wake.set()

    def set_peer_reachable(self, peer: NodeId, *, reachable: bool) -> None:
        """Transport callback: node-level liveness of `peer` changed; tell every group."""
        if reachable:
            self._reachable.add(peer)
        else:
            self._reachable.discard(peer)
        for group in self._groups.values():
            group.node.set_peer_reachable(peer, reachable=reachable)
        self.notify()

    def _storage_damaged(self, group: RaftGroup, error: CorruptBatchError) -> None:
        """A read of `group`'s log met damage mid-step: the core's state is unusable, the
        group leaves the host at once and its owner reopens it for a repair."""
        if self.on_storage_damage is None:
            raise error
        self.remove(group.raft_group_id)
        self.on_storage_damage(group, error)

    def _mark_dirty(self, group: RaftGroup) -> None:
        if self._groups.get(group.raft_group_id) is group:
            self._dirty[group.raft_group_id] = group
        self._wake.set()

    def awake_count(self) -> int:
        """Groups that still tick (not quiesced)."""
        return len(self._awake)

    # -- the loop ----------------------------------------------------------------------------

    async def run(self) -> None:
        ticker = asyncio.create_task(self._tick_forever(), name=f"ticker-{self.node_id}")
        try:
            while not self._closed:
                await self._wake.wait()
                self._wake.clear()
                await self.process_pass()
        finally:
            ticker.cancel()

    def close(self) -> None:
        self._closed = True
        self._wake.set()

    async def _tick_forever(self) -> None:
        while not self._closed:
            await asyncio.sleep(self._tick_interval_s)
            self.tick_round()

    def tick_round(self) -> None:
        """Tick every awake group once (the tick task's turn; tests call it directly)."""
        awake = self._awake
        for group in list(awake.values()):
            # A group whose Ready is still on its way to disk does not tick: a vote or
            # acknowledgement that takes longer to save than an election timeout would
            # otherwise always arrive too late, and a mass election (1,000 groups) on a
            # slow disk would churn for ever. Only its own timers wait (the other groups
            # keep heartbeating); the ticks it misses are dropped, not replayed.
            if not group.node.ready_pending:
                self._tick_group(group)
        self.ticks += len(awake)
        self.tick_rounds += 1
        if self._held:
            self._expire_held()
        self._dirty.update(awake)
        self._wake.set()

    def _tick_group(self, group: RaftGroup) -> None:
        node = group.node
        campaigns = node.campaigns_on_next_tick()
        if campaigns and not self._campaigns.available():
            self.campaigns_postponed += 1
            return  # the tick is dropped: the timer fires on a later one
        try:
            node.tick()
        except CorruptBatchError as error:
            self._storage_damaged(group, error)
            return
        if campaigns:
            self._campaigns.take()
            self.campaigns_started += 1

    async def process_pass(self) -> None:
        """One group-commit pass over the dirty groups that have work: the urgent Readys
        first, then the bulk (see the module's docstring)."""
        batch = self._collect_readys()
        if not batch:
            return
        self.passes += 1
        # The urgent groups' Readys (the metadata quorum's) complete first and alone: their
        # sync is never one with the hard-state saves of hundreds of votes.
        urgent = [
            (group, ready) for group, ready in batch if group.raft_group_id in self._urgent_groups
        ]
        liveness = [
            (group, ready)
            for group, ready in batch
            if group.raft_group_id not in self._urgent_groups and self._is_liveness(ready)
        ]
        bulk = [
            (group, ready)
            for group, ready in batch
            if group.raft_group_id not in self._urgent_groups and not self._is_liveness(ready)
        ]
        assert len(urgent) + len(liveness) + len(bulk) == len(batch)
        for part in (urgent, liveness, bulk):
            if part:
                await self._complete_batch(part)
        # A pass may leave more work (e.g. entries committed by the acks it just sent); a
        # group the pass removed (the metadata's apply deleted it) has none.
        more = [group for group, _ in batch if self._groups.get(group.raft_group_id) is group]
        more = [group for group in more if group.node.has_ready()]
        for group in more:
            self._dirty[group.raft_group_id] = group
        if more:
            self._wake.set()

    @staticmethod
    def _is_liveness(ready: Ready) -> bool:
        """Liveness work: a Ready with no entry to write or apply (heartbeats, votes, role
        changes, read states)."""
        return not (ready.entries or ready.committed_entries or ready.snapshot is not None)

    def _collect_readys(self) -> list[tuple[RaftGroup, Ready]]:
        """Take the Readys of the dirty groups; groups stepped mid-pass stay dirty."""
        dirty, self._dirty = self._dirty, {}
        batch = []
        for group in dirty.values():
            node = group.node
            if node.quiesced:
                self._awake.pop(group.raft_group_id, None)
            else:
                self._awake[group.raft_group_id] = group
            if not node.ready_pending and node.has_ready():
                try:
                    batch.append((group, node.ready()))
                except CorruptBatchError as error:
                    self._storage_damaged(group, error)
            elif node.ready_pending:
                self._dirty[group.raft_group_id] = group  # stepped mid-pass: look again next pass
        return batch

    async def _complete_batch(self, batch: list[tuple[RaftGroup, Ready]]) -> None:
        """Steps 1-4 of the module's docstring for `batch`, with one sync."""
        # Entries durable before this pass are applied first, so their waiting producers are
        # answered while the pass's own writes go to disk, not after that fsync.
        applied_counts = {
            group.raft_group_id: apply_durable(group.node, ready, apply=group.apply)
            for group, ready in batch
        }
        # Applying may have removed groups (the metadata group's apply reconciles the hosted
        # partitions and closes a removed one's log): a removed group is finished, nothing of
        # its Ready is persisted or completed.
        batch = [
            (group, ready)
            for group, ready in batch
            if self._groups.get(group.raft_group_id) is group
        ]
        saves = _HardStateSaves()
        for group, ready in batch:
            send = self._sender(group)
            traced = bool(ready.entries and group.traces.pending)
            if traced:
                sent_at = [produce_trace.now()]
                group.traces.mark(produce_trace.PICKED, ready.entries[-1].last_offset, sent_at[0])
                send = group.traces.sender(send, sent_at)
            persist_ready(
                group.node,
                ready,
                log=group.log,
                hard_state_store=saves.store_for(group.hard_state_store),
                send=send,
                restore=group.restore,
            )
            if traced:
                self._trace_written(group, ready, sent_s=sent_at[0])
        # One pass, one trip to a disk thread for every hard state and log fsync, so the
        # loop keeps serving (reads, proposals that the next pass will carry) meanwhile.
        # Logs that cannot split their sync (the simulator's) sync here, on the loop.
        tickets: list[tuple[SplitSyncLog, FlushTicket]] = []
        for group, ready in batch:
            if not ready.must_sync:
                continue
            durable_log = group.log
            if isinstance(durable_log, SplitSyncLog):
                tickets.append((durable_log, durable_log.prepare_sync()))
            else:
                durable_log.sync()
        if tickets and not saves.pending and self._may_sync_inline(tickets):
            # The transport writes queued messages at the loop's next turn, and a sync here
            # holds the loop: the leader's appends would reach the followers only after its
            # own fsync, the two fsyncs in series. Whatever is queued may leave at once:
            # `persisted_messages` are queued only after the sync that backs them.
            if self._flush_sends is not None:
                self._flush_sends()
            self._sync_inline([ticket for _, ticket in tickets])
        elif tickets or saves.pending:
            await _sync_off_loop(saves, [ticket for _, ticket in tickets])
        for split_log, ticket in tickets:
            split_log.complete_sync(ticket)
        for group, ready in batch:
            if ready.entries:
                group.on_durable(ready.entries[-1].last_offset)
                if group.traces.pending:
                    group.traces.mark(produce_trace.DURABLE, ready.entries[-1].last_offset)
            complete_ready(
                group.node,
                ready,
                send=self._sender(group),
                apply=group.apply,
                on_read=group.on_read,
                applied_count=applied_counts[group.raft_group_id],
            )
            if group.traces.pending:
                # The leader's own durable copy may have completed a quorum (advance).
                group.traces.mark(produce_trace.COMMITTED, group.node.commit_offset)
            self._after_complete(group, ready)
            if self._groups.get(group.raft_group_id) is group:
                self._apply_now(group)

    def _after_complete(self, group: RaftGroup, ready: Ready) -> None:
        """What a completed Ready tells the node beyond the ready processor: a finished
        repair, a change of role or leader, quiescence."""
        if group.repairing and not group.node.repairing:
            group.finish_repair()
        if ready.soft_state is not None:
            metrics.recorder().on_ready(ready)
            group.fail_reads_if_not_leader()
            if group.on_leadership_change is not None:
                group.on_leadership_change(group)
        if group.node.quiesced:
            self._awake.pop(group.raft_group_id, None)

    @staticmethod
    def _trace_written(group: RaftGroup, ready: Ready, *, sent_s: float) -> None:
        """Stamp the traced proposals `ready` carries: sent when its last message was handed
        to the transport, written now that `persist_ready` buffered the append."""
        last_offset = ready.entries[-1].last_offset
        group.traces.mark(produce_trace.SENT, last_offset, sent_s)
        group.traces.mark(produce_trace.WRITTEN, last_offset)

    def _may_sync_inline(self, tickets: list[tuple[SplitSyncLog, FlushTicket]]) -> bool:
        """Whether this pass's writes are small enough to sync on the loop.

        Measured on a 2-core VM (benchmarks/README.md, afternoon of 2026-11-22): the round trip
        through the executor took 1.2 ms at p50 for 0.65 ms of writev + fdatasync, and each
        trip costs two thread switches and the GIL handed back and forth. Syncing small
        writes on the loop cut node CPU per request by 10-13% and p99 by 10-15%. Large
        writes (throughput) and hard-state saves (elections of many groups) keep the thread."""
        if self._sync_on_loop_bytes_max == 0:
            return False
        size_bytes = sum(sync.size_bytes for _, ticket in tickets for sync in ticket.syncs)
        if size_bytes > self._sync_on_loop_bytes_max:
            return False
        return self._clock.monotonic() >= self._inline_sync_paused_until

    def _sync_inline(self, tickets: list[FlushTicket]) -> None:
        """Write and fsync on the loop; a slow sync pauses this (`INLINE_SYNC_PAUSE_S`,
        doubled by every slow sync in a row)."""
        started = self._clock.monotonic()
        _run_tickets(tickets)
        self.inline_syncs += 1
        finished = self._clock.monotonic()
        took_ms = (finished - started) * 1000
        if took_ms <= self._sync_on_loop_slow_ms:
            self._inline_sync_pause_s = INLINE_SYNC_PAUSE_S
            return
        pause_s = self._inline_sync_pause_s
        self._inline_sync_paused_until = finished + pause_s
        self._inline_sync_pause_s = min(2 * pause_s, INLINE_SYNC_PAUSE_S_MAX)
        self.inline_sync_pauses += 1
        log.warning(
            "node %s: a sync on the event loop took %.1f ms (> sync_on_loop_slow_ms=%d); "
            "syncs go to the disk thread for %.0f s",
            self.node_id,
            took_ms,
            self._sync_on_loop_slow_ms,
            pause_s,
        )

    def inline_sync_pause_s(self) -> float:
        """How long the next slow on-loop sync sends syncs to the disk thread."""
        return self._inline_sync_pause_s

    def _sender(self, group: RaftGroup) -> Callable[[Message], None]:
        raft_group_id = group.raft_group_id

        def send(message: Message) -> None:
            self._send(message.receiver, raft_group_id, message)

        return send


@runtime_checkable
class SplitSyncLog(Protocol):
    """A log whose fsync can run off the event loop (raftlog.storage.raft_log_storage)."""

    def prepare_sync(self) -> FlushTicket: ...

    def complete_sync(self, ticket: FlushTicket) -> None: ...


# Hard-state saves of one pass run on this many disk threads at once: each is an atomic
# replace with two fsyncs of its own file and directory, and concurrent fsyncs share the
# file system's journal commits (an election of 1,000 groups saves 1,000 files at once).
HARD_STATE_SAVE_THREADS = 16
_save_executor = concurrent.futures.ThreadPoolExecutor(
    max_workers=HARD_STATE_SAVE_THREADS, thread_name_prefix="hard-state"
)


@runtime_checkable
class SplitSaveStore(Protocol):
    """A hard-state store whose save can finish off the loop (raftlog.storage.hard_state)."""

    def begin_save(self, hard_state: HardState) -> HardStateWrite: ...


class _HardStateSaves:
    """Collects a pass's hard-state saves so their fsyncs run off the loop with the logs'.

    Stores that can split a save write it now, on the loop, and leave only the fsyncs and
    the rename for the disk threads (little Python there, so the threads hardly contend
    with the loop for the GIL); other stores save whole on a disk thread."""

    def __init__(self) -> None:
        self.pending: list[Callable[[], None]] = []

    def store_for(self, store: HardStateStore) -> HardStateStore:
        return _DeferredStore(self, store)


class _DeferredStore:
    __slots__ = ("_saves", "_store")

    def __init__(self, saves: _HardStateSaves, store: HardStateStore) -> None:
        self._saves = saves
        self._store = store

    def load(self) -> HardState:
        return self._store.load()

    def save(self, hard_state: HardState) -> None:
        store = self._store
        if isinstance(store, SplitSaveStore):
            self._saves.pending.append(store.begin_save(hard_state).finish)
        else:
            self._saves.pending.append(functools.partial(store.save, hard_state))


async def _sync_off_loop(saves: _HardStateSaves, tickets: list[FlushTicket]) -> None:
    """Save the hard states (spread over a few threads) and fsync the logs, off the loop;
    returns once all of it is durable."""
    chunks = [saves.pending[i::HARD_STATE_SAVE_THREADS] for i in range(HARD_STATE_SAVE_THREADS)]
    loop = asyncio.get_running_loop()
    work = [loop.run_in_executor(_save_executor, _save_all, chunk) for chunk in chunks if chunk]
    if tickets:
        work.append(loop.run_in_executor(None, _run_tickets, tickets))
    await asyncio.gather(*work)


def _save_all(pending: list[Callable[[], None]]) -> None:
    """On a disk thread: each store is touched by one thread only (one save per group)."""
    for finish in pending:
        finish()


def _run_tickets(tickets: list[FlushTicket]) -> None:
    """On the disk thread: writes of buffers handed over and fsyncs of file descriptors,
    nothing the loop touches meanwhile (raftlog.storage.segment.SegmentSync)."""
    started = time.perf_counter()
    for ticket in tickets:
        ticket.run()
    flushed_bytes = sum(sync.size_bytes for ticket in tickets for sync in ticket.syncs)
    metrics.recorder().on_log_flush(flushed_bytes, time.perf_counter() - started)
