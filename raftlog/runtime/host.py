"""The group host: every Raft group of one node, driven by one asyncio loop.

Theory of operation. Each pass of `run()` (woken by a tick, an inbound message or a proposal)
collects a Ready from every group that has one and processes them *together* in the order the
core requires:

    1. send each Ready's `messages` (a leader's appends go out before its own fsync);
    2. persist: install snapshots, append entries, save hard state (buffered writes);
    3. fsync every log touched in this pass (group commit: the appends a pass gathered from
       many proposals and groups share one round of fsyncs);
    4. send `persisted_messages` (votes, append acknowledgements), apply committed entries,
       answer reads, `advance`.

Step 3 runs on a disk thread (fdatasync releases the GIL); while it runs the loop may step
groups and take proposals (the core allows that between `ready()` and `advance()`), but no
group gives a new Ready before the pass completes its previous one. Messages for a group this
node does not host (yet) are dropped: Raft retries, and the metadata quorum creates the group.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

from raftlog.raft.types import Message
from raftlog.runtime.group import RaftGroup
from raftlog.runtime.ready import complete_ready, persist_ready
from raftlog.storage.log import FlushTicket
from raftlog.types import GroupId, NodeId

__all__ = ["GroupHost"]

log = logging.getLogger(__name__)

SendFn = Callable[[NodeId, GroupId, Message], None]


class GroupHost:
    def __init__(self, *, node_id: NodeId, tick_interval_ms: int, send: SendFn) -> None:
        assert tick_interval_ms > 0
        self.node_id = node_id
        self._tick_interval_s = tick_interval_ms / 1000
        self._send = send
        self._groups: dict[GroupId, RaftGroup] = {}
        self._wake = asyncio.Event()
        self._closed = False
        self.passes = 0
        self.dropped_for_unknown_group = 0

    # -- membership of groups on this node -------------------------------------------------

    def add(self, group: RaftGroup) -> None:
        assert group.group_id not in self._groups, group.group_id
        self._groups[group.group_id] = group
        group.wake = self._wake.set
        self._wake.set()

    def remove(self, group_id: GroupId) -> RaftGroup | None:
        return self._groups.pop(group_id, None)

    def get(self, group_id: GroupId) -> RaftGroup | None:
        return self._groups.get(group_id)

    def groups(self) -> Iterable[RaftGroup]:
        return self._groups.values()

    # -- inputs ------------------------------------------------------------------------------

    def deliver(self, sender: NodeId, items: list[tuple[GroupId, Message]]) -> None:
        """Transport callback: step each message into its group."""
        for group_id, message in items:
            group = self._groups.get(group_id)
            if group is None:
                self.dropped_for_unknown_group += 1
                continue
            assert message.sender == sender, (message, sender)
            group.node.step(message)
        self._wake.set()

    def notify(self) -> None:
        """Something was proposed or changed outside `deliver`: run a pass soon."""
        self._wake.set()

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
            for group in self._groups.values():
                group.node.tick()
            self._wake.set()

    async def process_pass(self) -> None:
        """One group-commit pass over every group that has work."""
        batch = [
            (group, group.node.ready())
            for group in list(self._groups.values())
            if group.node.has_ready()
        ]
        if not batch:
            return
        self.passes += 1
        for group, ready in batch:
            persist_ready(
                group.node,
                ready,
                log=group.log,
                hard_state_store=group.hard_state_store,
                send=self._sender(group),
                restore=group.restore,
            )
        # One pass, one round of fsyncs for every group that wrote, on a disk thread so the
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
        if tickets:
            await asyncio.to_thread(_run_tickets, [ticket for _, ticket in tickets])
            for split_log, ticket in tickets:
                split_log.complete_sync(ticket)
        for group, ready in batch:
            if ready.entries:
                group.on_durable(ready.entries[-1].last_offset)
            complete_ready(
                group.node,
                ready,
                send=self._sender(group),
                apply=group.apply,
                on_read=group.on_read,
            )
            if ready.soft_state is not None:
                group.fail_reads_if_not_leader()
                if group.on_leadership_change is not None:
                    group.on_leadership_change(group)
        # A pass may leave more work (e.g. entries committed by the acks it just sent).
        if any(group.node.has_ready() for group, _ in batch):
            self._wake.set()

    def _sender(self, group: RaftGroup) -> Callable[[Message], None]:
        group_id = group.group_id

        def send(message: Message) -> None:
            self._send(message.receiver, group_id, message)

        return send


@runtime_checkable
class SplitSyncLog(Protocol):
    """A log whose fsync can run off the event loop (raftlog.storage.raft_log)."""

    def prepare_sync(self) -> FlushTicket: ...

    def complete_sync(self, ticket: FlushTicket) -> None: ...


def _run_tickets(tickets: list[FlushTicket]) -> None:
    """On the disk thread: only fsyncs of file descriptors, nothing Python-shared."""
    for ticket in tickets:
        ticket.run()
