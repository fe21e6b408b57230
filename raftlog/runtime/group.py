"""One Raft group hosted on a node: the pure core, its ports, and the proposals waiting on it.

Theory of operation. A `RaftGroup` owns a `RaftNode` (pure), the `DurableLog` and
`HardStateStore` that persist it, and a `StateMachine` that applies committed entries. The
`RaftGroupHost` drives every group on a node through the shared ready processor; this class only
keeps the bookkeeping that turns Raft progress into answers for clients:

- a proposal waiting for *commit* (acks=all) is answered when the entry at its offsets is
  applied on this node: with success if the applied entry carries the proposal's term, with
  `ProposalDroppedError` if another leader's entry replaced it (Raft §5.3 truncation). Applying
  is the only signal used, so an answer is never given for an entry that could still vanish;
- a proposal waiting for *durability* (acks=1) is answered once this node's own fsync covers
  its last offset.

Waiters are kept in offset order (proposals get increasing offsets), so resolving is a walk
from the front of a deque; the number of waiters is bounded by `RaftConfig.proposals_max`.
A retried proposal that the leader already appended (a producer's duplicate) waits on the
original entry through a waiter of its own (`waiter_for`), placed beside the original's.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from raftlog.config import RaftConfig
from raftlog.errors import NotLeaderError, ProposalDroppedError
from raftlog.raft.node import RaftNode
from raftlog.raft.ports import DurableLog, HardStateStore
from raftlog.raft.types import Entry, Membership, ReadState, Role, Snapshot
from raftlog.runtime import produce_trace
from raftlog.types import Commitment, Offset, RaftGroupId, Term

log = logging.getLogger(__name__)

__all__ = ["Commitment", "RaftGroup", "StateMachine"]


class StateMachine(Protocol):
    def apply(self, entry: Entry) -> None:
        """Apply one committed entry (entries arrive in offset order, each exactly once per
        incarnation, starting after the snapshot or applied offset the core started from)."""
        ...

    def restore(self, snapshot: Snapshot) -> None:
        """Replace the state with a snapshot received from the leader."""
        ...


@dataclass(slots=True)
class _Waiter:
    term: Term
    base_offset: Offset
    last_offset: Offset
    commitment: Commitment
    future: asyncio.Future[Offset]


class RaftGroup:
    def __init__(
        self,
        *,
        raft_group_id: RaftGroupId,
        node: RaftNode,
        log: DurableLog,
        hard_state_store: HardStateStore,
        state_machine: StateMachine,
        config: RaftConfig,
        bootstrap_membership: Membership,
    ) -> None:
        self.raft_group_id = raft_group_id
        self.node = node
        self.log = log
        self.hard_state_store = hard_state_store
        self.state_machine = state_machine
        self._config = config
        # The voters the group was created with (needed to name the membership of a
        # snapshot taken below every CONFIG entry).
        self.bootstrap_membership = bootstrap_membership
        self._waiters: deque[_Waiter] = deque()
        # Traced proposals (metrics served) on their way to being applied.
        self.traces = produce_trace.StageTraces()
        self._read_waiters: dict[int, asyncio.Future[Offset]] = {}
        self._next_read_id = 1
        self.durable_offset = log.last_offset()
        # The last offset applied here. Ahead of `node.applied` while a pass applies entries
        # early (raftlog.runtime.ready.apply_durable) and has not advanced the core yet.
        self.applied_offset = node.applied
        # The core's repair flag as the log last recorded it (raftlog.raft.repair).
        self.repairing = node.repairing
        self.on_leadership_change: Callable[[RaftGroup], None] | None = None
        # Set by the RaftGroupHost: asks for a processing pass after a proposal or read.
        self.wake: Callable[[], None] = _nothing

    # -- proposals ---------------------------------------------------------------------------

    def propose(
        self, data: bytes, *, offset_count: int, commitment: Commitment
    ) -> tuple[Offset, asyncio.Future[Offset]]:
        """Append `data` as one entry; return its base offset and a future for `commitment`.

        Raises NotLeaderError or ProposalDroppedError (both retriable) without side effects.
        """
        self._require_waiter_room()
        base_offset = self.node.propose(data, offset_count=offset_count)
        self.wake()
        future: asyncio.Future[Offset] = asyncio.get_running_loop().create_future()
        last_offset = Offset(base_offset + offset_count - 1)
        if commitment is Commitment.NONE:
            future.set_result(base_offset)
            return base_offset, future
        self._drop_replaced(base_offset)
        assert not self._waiters or self._waiters[-1].last_offset < base_offset
        self._waiters.append(_Waiter(self.node.term, base_offset, last_offset, commitment, future))
        request = produce_trace.current()
        if request is not None:
            self.traces.add(request, last_offset)
        return base_offset, future

    def waiter_for(
        self, base_offset: Offset, last_offset: Offset, *, term: Term, commitment: Commitment
    ) -> asyncio.Future[Offset]:
        """A future for an entry this leader appended in `term`, answered as a proposal of it
        with `commitment` would be: a retried proposal (a producer's duplicate) waits on the
        original entry instead of proposing it again.

        Resolved at once when what it waits for has happened (the entry is applied, or for
        LEADER durable here), else by the waiter machinery (`apply`, `on_durable`), which
        also fails it if another leader's entry replaces the original. Its own future: a
        caller that times out and cancels it leaves the original proposal's answer alone.
        Raises NotLeaderError when this node no longer leads `term`, ProposalDroppedError
        when `proposals_max` waiters are pending.
        """
        node = self.node
        if node.role is not Role.LEADER or node.term != term:
            raise NotLeaderError(leader_hint=node.leader_id)
        # While this node leads `term` its log is never truncated: the entry is still there.
        assert node.log.term_at(base_offset) == term, (base_offset, term)
        assert base_offset <= last_offset <= node.last_offset, (base_offset, last_offset)
        future: asyncio.Future[Offset] = asyncio.get_running_loop().create_future()
        applied = max(node.applied, self.applied_offset)
        done = commitment is Commitment.NONE or applied >= last_offset
        # The core's durable end, not `durable_offset`: a snapshot installed since that was
        # set may have replaced the log it described.
        durable = commitment is Commitment.LEADER and node.log.durable_last_offset() >= last_offset
        if done or durable:
            future.set_result(base_offset)
            return future
        self._require_waiter_room()
        waiter = _Waiter(term, base_offset, last_offset, commitment, future)
        # After every waiter based at or before it: offset order, and the original first.
        index = bisect.bisect_right(self._waiters, base_offset, key=_waiter_base_offset)
        self._waiters.insert(index, waiter)
        return future

    def _require_waiter_room(self) -> None:
        if len(self._waiters) >= self._config.proposals_max:
            raise ProposalDroppedError(
                f"group {self.raft_group_id}: {len(self._waiters)} proposals already waiting "
                f"(proposals_max={self._config.proposals_max})"
            )

    def _drop_replaced(self, base_offset: Offset) -> None:
        """Fail waiters at or beyond a new proposal's offset: their entries are gone.

        A leader that lost its term, then won a later one, proposes again at offsets its
        old, uncommitted proposals had held; the new leader's log truncated those (Raft
        §5.3), so they can never be applied as proposed.
        """
        self.traces.drop_from(base_offset)
        while self._waiters and self._waiters[-1].last_offset >= base_offset:
            waiter = self._waiters.pop()
            assert waiter.term < self.node.term, (waiter.term, self.node.term)
            if not waiter.future.done():
                waiter.future.set_exception(
                    ProposalDroppedError(
                        f"group {self.raft_group_id}: offsets [{waiter.base_offset}, "
                        f"{waiter.last_offset}] of term {waiter.term} were truncated by a "
                        f"later leader"
                    )
                )

    def read_index(self) -> asyncio.Future[Offset]:
        """A linearizable commit offset (Raft §6.4), answered through a ReadState."""
        if self.node.role is not Role.LEADER:
            raise NotLeaderError(leader_hint=self.node.leader_id)
        if len(self._read_waiters) >= self._config.read_index_requests_max:
            raise ProposalDroppedError(f"group {self.raft_group_id}: too many reads waiting")
        request_id = self._next_read_id
        self._next_read_id += 1
        future: asyncio.Future[Offset] = asyncio.get_running_loop().create_future()
        self._read_waiters[request_id] = future
        self.node.read_index(request_id)
        self.wake()
        return future

    # -- callbacks from the ready processor ------------------------------------------------------

    def apply(self, entry: Entry) -> None:
        self.state_machine.apply(entry)
        self.applied_offset = max(self.applied_offset, entry.last_offset)
        if self.traces.pending:
            self.traces.mark_applied(entry.last_offset)
        while self._waiters and self._waiters[0].base_offset <= entry.last_offset:
            waiter = self._waiters.popleft()
            if waiter.future.done():
                continue
            same = waiter.base_offset == entry.offset and waiter.term == entry.term
            if same:
                waiter.future.set_result(waiter.base_offset)
            else:
                waiter.future.set_exception(
                    ProposalDroppedError(
                        f"group {self.raft_group_id}: offsets [{waiter.base_offset}, "
                        f"{waiter.last_offset}] of term {waiter.term} were replaced by a "
                        f"newer leader's entry (term {entry.term})"
                    )
                )

    def restore(self, snapshot: Snapshot) -> None:
        self.state_machine.restore(snapshot)
        self.fail_waiters(ProposalDroppedError(f"group {self.raft_group_id}: snapshot installed"))

    def on_read(self, read_state: ReadState) -> None:
        future = self._read_waiters.pop(read_state.request_id, None)
        if future is not None and not future.done():
            future.set_result(read_state.commit_offset)

    def on_durable(self, durable_offset: Offset) -> None:
        """This node's fsync now covers offsets up to `durable_offset`."""
        assert durable_offset >= -1
        self.durable_offset = durable_offset
        for waiter in self._waiters:
            if waiter.last_offset > durable_offset:
                break
            if waiter.commitment is Commitment.LEADER and not waiter.future.done():
                waiter.future.set_result(waiter.base_offset)

    def finish_repair(self) -> None:
        """The core ended a repair (its log holds every committed entry again): record it
        in the log's durable mark, so a restart does not abstain again."""
        assert self.repairing and not self.node.repairing
        finish: Callable[[], None] | None = getattr(self.log, "finish_repair", None)
        if finish is not None:
            finish()
        self.repairing = False
        log.warning(
            "group %s: repair finished: the log holds every committed entry again, up to "
            "offset %s; it votes again",
            self.raft_group_id,
            self.node.commit_offset,
        )

    def fail_waiters(self, error: Exception) -> None:
        """Answer every waiter with `error` (the group is closing or lost its state)."""
        for waiter in self._waiters:
            if not waiter.future.done():
                waiter.future.set_exception(error)
        self._waiters.clear()
        self.traces.pending.clear()
        for future in self._read_waiters.values():
            if not future.done():
                future.set_exception(error)
        self._read_waiters.clear()

    def fail_reads_if_not_leader(self) -> None:
        """ReadIndex requests die with leadership; proposals do not (they may still commit)."""
        if self.node.role is Role.LEADER:
            return
        error = NotLeaderError(leader_hint=self.node.leader_id)
        for future in self._read_waiters.values():
            if not future.done():
                future.set_exception(error)
        self._read_waiters.clear()


def _waiter_base_offset(waiter: _Waiter) -> Offset:
    return waiter.base_offset


def _nothing() -> None:
    return None
