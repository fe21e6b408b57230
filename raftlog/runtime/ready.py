"""The one ready processor: applies a RaftNode's Ready to the ports in the required order.

Theory of operation. Both the asyncio host and the deterministic simulator go through these
functions, so the simulator exercises the production ordering (etcd raft's contract, spelled
out on `raftlog.raft.types.Ready`):

1. send `messages` (they vouch for nothing local: a leader's appends go out while it writes);
2. install the snapshot (log, then the state machine), append entries, save hard state;
3. fsync when `must_sync`;
4. send `persisted_messages` (votes and acknowledgements, now backed by durable state);
5. apply committed entries in order, then deliver read states;
6. `node.advance(ready)`.

`process_ready` does all six at once. A driver that group-commits many Readys with one fsync
(the host) calls `persist_ready` (steps 1-2) for each, syncs them together (step 3), then
`complete_ready` (steps 4-6) for each; the node may be stepped in between, but must not be
asked for another Ready before `complete_ready` advanced the previous one.
"""

from __future__ import annotations

from collections.abc import Callable

from raftlog.raft.node import RaftNode
from raftlog.raft.ports import DurableLog, HardStateStore
from raftlog.raft.types import Entry, Message, ReadState, Ready, Snapshot

__all__ = ["complete_ready", "persist_ready", "process_ready"]


def process_ready(
    node: RaftNode,
    *,
    log: DurableLog,
    hard_state_store: HardStateStore,
    send: Callable[[Message], None],
    apply: Callable[[Entry], None],
    restore: Callable[[Snapshot], None],
    on_read: Callable[[ReadState], None],
) -> Ready:
    """Process one Ready of `node` (call while `node.has_ready()`); returns it for tracing."""
    ready = node.ready()
    persist_ready(
        node, ready, log=log, hard_state_store=hard_state_store, send=send, restore=restore
    )
    if ready.must_sync:
        log.sync()
    complete_ready(node, ready, send=send, apply=apply, on_read=on_read)
    return ready


def persist_ready(
    node: RaftNode,
    ready: Ready,
    *,
    log: DurableLog,
    hard_state_store: HardStateStore,
    send: Callable[[Message], None],
    restore: Callable[[Snapshot], None],
) -> None:
    """Steps 1-2: send what needs no durability, then write (buffered) what must be."""
    assert node.ready_pending, "persist_ready needs a Ready from node.ready()"
    for message in ready.messages:
        send(message)
    if ready.snapshot is not None:
        log.install_snapshot(ready.snapshot)
        restore(ready.snapshot)
    if ready.entries:
        log.append(ready.entries)
        assert log.last_offset() == ready.entries[-1].last_offset, log.last_offset()
    if ready.hard_state is not None:
        hard_state_store.save(ready.hard_state)


def complete_ready(
    node: RaftNode,
    ready: Ready,
    *,
    send: Callable[[Message], None],
    apply: Callable[[Entry], None],
    on_read: Callable[[ReadState], None],
) -> None:
    """Steps 4-6, once the writes of `persist_ready` are durable (synced if `must_sync`)."""
    assert node.ready_pending, "complete_ready without a pending Ready"
    for message in ready.persisted_messages:
        send(message)
    for entry in ready.committed_entries:
        assert entry.last_offset <= ready.commit_offset, (entry, ready.commit_offset)
        apply(entry)
    for read_state in ready.read_states:
        on_read(read_state)
    node.advance(ready)
    assert not node.ready_pending
