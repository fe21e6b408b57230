"""The one ready processor: applies a RaftNode's Ready to the ports in the required order.

Theory of operation. Both the asyncio server and the deterministic simulator call
`process_ready`, so the simulator exercises the production ordering (etcd raft's contract,
spelled out on `raftlog.raft.types.Ready`):

1. send `messages` (they vouch for nothing local: a leader's appends go out while it writes);
2. install the snapshot (log, then the state machine), append entries, save hard state, and
   fsync when `must_sync`;
3. send `persisted_messages` (votes and acknowledgements, now backed by durable state);
4. apply committed entries in order, then deliver read states;
5. `node.advance(ready)`.
"""

from __future__ import annotations

from collections.abc import Callable

from raftlog.raft.node import RaftNode
from raftlog.raft.ports import DurableLog, HardStateStore
from raftlog.raft.types import Entry, Message, ReadState, Ready, Snapshot

__all__ = ["process_ready"]


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
    if ready.must_sync:
        log.sync()
    for message in ready.persisted_messages:
        send(message)
    for entry in ready.committed_entries:
        assert entry.last_offset <= ready.commit_offset, (entry, ready.commit_offset)
        apply(entry)
    for read_state in ready.read_states:
        on_read(read_state)
    node.advance(ready)
    return ready
