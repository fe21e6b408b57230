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

Applying does not wait for this Ready's fsync where it need not: committed entries that lie
below the Ready's first new entry were made durable by an earlier Ready (a pass completes
its sync before `advance`), so `apply_durable` applies them before step 1 and
`complete_ready` applies the rest. Under load a leader's Ready nearly always carries new
entries, and its answers to producers would otherwise each wait out one more fsync. Worked
example: entries 0-9 durable, acks commit 0-9, proposals append 10-12. The Ready has
entries [10-12] and committed [0-9]; 0-9 are applied before 10-12 are fsynced. A follower
whose Ready commits part of its own new entries applies those only after the fsync.
"""

from __future__ import annotations

from collections.abc import Callable

from raftlog.raft.node import RaftNode
from raftlog.raft.ports import DurableLog, HardStateStore
from raftlog.raft.types import Entry, Message, ReadState, Ready, Snapshot

__all__ = ["apply_durable", "complete_ready", "persist_ready", "process_ready"]


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
    applied_count = apply_durable(node, ready, apply=apply)
    persist_ready(
        node, ready, log=log, hard_state_store=hard_state_store, send=send, restore=restore
    )
    if ready.must_sync:
        log.sync()
    complete_ready(
        node, ready, send=send, apply=apply, on_read=on_read, applied_count=applied_count
    )
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


def apply_durable(node: RaftNode, ready: Ready, *, apply: Callable[[Entry], None]) -> int:
    """Step 5 early, for the committed entries that were durable here before this Ready
    (below its first new entry; none when it installs a snapshot); returns how many were
    applied, for `complete_ready`. Call before `persist_ready`."""
    assert node.ready_pending, "apply_durable needs a Ready from node.ready()"
    if ready.snapshot is not None:
        return 0
    # Committed entries are never truncated (Raft §5.4), so everything below the first new
    # entry is an earlier Ready's, fsynced before that Ready was advanced.
    durable_below = ready.entries[0].offset if ready.entries else None
    applied_count = 0
    for entry in ready.committed_entries:
        if durable_below is not None and entry.last_offset >= durable_below:
            break
        assert entry.last_offset <= ready.commit_offset, (entry, ready.commit_offset)
        apply(entry)
        applied_count += 1
    return applied_count


def complete_ready(
    node: RaftNode,
    ready: Ready,
    *,
    send: Callable[[Message], None],
    apply: Callable[[Entry], None],
    on_read: Callable[[ReadState], None],
    applied_count: int = 0,
) -> None:
    """Steps 4-6, once the writes of `persist_ready` are durable (synced if `must_sync`);
    the first `applied_count` committed entries were applied already (`apply_durable`)."""
    assert node.ready_pending, "complete_ready without a pending Ready"
    assert 0 <= applied_count <= len(ready.committed_entries), applied_count
    for message in ready.persisted_messages:
        send(message)
    for entry in ready.committed_entries[applied_count:]:
        assert entry.last_offset <= ready.commit_offset, (entry, ready.commit_offset)
        apply(entry)
    for read_state in ready.read_states:
        on_read(read_state)
    node.advance(ready)
    assert not node.ready_pending
