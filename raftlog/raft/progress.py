"""What a leader knows about each follower's log (etcd's Progress; Raft §5.3 nextIndex and
matchIndex).

Theory of operation. A follower's progress is in one of three states:

- PROBE: the leader does not know where the logs diverge. It sends one AppendRequest and
  waits for the answer (or a heartbeat response) before sending another; a rejection moves
  `next` back using the follower's conflict hints.
- REPLICATE: the logs match up to `match`; the leader streams entries optimistically,
  moving `next` past what it sent. In-flight appends are bounded by count
  (`inflight_messages_max`) and bytes (`inflight_bytes_max`); an acknowledgement frees every
  in-flight append that ends at or below the acknowledged offset.
- SNAPSHOT: the follower needs entries the leader compacted (Raft §7); the leader sent a
  snapshot and waits for it to be acknowledged, or retries after an election timeout.

`match` and `next - 1` are always offsets where an entry ends (or NO_OFFSET / a snapshot
offset), because entries cover ranges of offsets and an append starts at an entry's base.
"""

from __future__ import annotations

import enum
from collections import deque

from raftlog.config import RaftConfig
from raftlog.raft.types import NO_OFFSET
from raftlog.types import Offset

__all__ = ["Progress", "ProgressState"]


class ProgressState(enum.Enum):
    PROBE = "probe"
    REPLICATE = "replicate"
    SNAPSHOT = "snapshot"


class Progress:
    """Mutable per-follower bookkeeping, owned by the leader's RaftNode."""

    __slots__ = (
        "inflight_bytes",
        "inflights",
        "match",
        "next",
        "pending_snapshot",
        "probe_sent",
        "recent_active",
        "sent_commit",
        "snapshot_elapsed_ticks",
        "stalled_heartbeats",
        "state",
    )

    def __init__(self, *, next_offset: Offset) -> None:
        assert next_offset >= 0, next_offset
        self.match: Offset = NO_OFFSET
        self.next: Offset = next_offset
        self.state = ProgressState.PROBE
        self.probe_sent = False
        # (last offset, bytes) of each append in flight, oldest first.
        self.inflights: deque[tuple[Offset, int]] = deque()
        self.inflight_bytes = 0
        self.recent_active = False
        self.pending_snapshot: Offset = NO_OFFSET
        self.snapshot_elapsed_ticks = 0
        self.stalled_heartbeats = 0
        # The highest commit offset sent to this follower, so a leader knows whether the
        # follower has yet to learn that its acknowledged entries are committed.
        self.sent_commit: Offset = NO_OFFSET

    def __repr__(self) -> str:
        return f"Progress({self.state.value} match={self.match} next={self.next})"

    def _reset(self, state: ProgressState) -> None:
        self.state = state
        self.probe_sent = False
        self.inflights.clear()
        self.inflight_bytes = 0
        self.pending_snapshot = NO_OFFSET
        self.snapshot_elapsed_ticks = 0
        self.stalled_heartbeats = 0

    def become_probe(self, *, next_offset: Offset | None = None) -> None:
        self._reset(ProgressState.PROBE)
        self.next = Offset(self.match + 1) if next_offset is None else next_offset
        assert self.next > self.match, self

    def become_replicate(self) -> None:
        self._reset(ProgressState.REPLICATE)
        self.next = Offset(self.match + 1)
        assert self.state is ProgressState.REPLICATE

    def become_snapshot(self, snapshot_offset: Offset) -> None:
        self._reset(ProgressState.SNAPSHOT)
        self.pending_snapshot = snapshot_offset
        assert snapshot_offset >= 0, snapshot_offset

    def maybe_update(self, last_offset: Offset) -> bool:
        """Record an acknowledgement of the log up to `last_offset`; True if match grew."""
        self.recent_active = True
        updated = last_offset > self.match
        if updated:
            self.match = last_offset
            self.stalled_heartbeats = 0
        self.next = max(self.next, Offset(self.match + 1))
        self.free_to(last_offset)
        assert self.next > self.match, self
        return updated

    def free_to(self, last_offset: Offset) -> None:
        """Forget the in-flight appends acknowledged by an answer up to `last_offset`."""
        while self.inflights and self.inflights[0][0] <= last_offset:
            self.inflight_bytes -= self.inflights.popleft()[1]
        assert self.inflight_bytes >= 0, self.inflight_bytes

    def sent(self, last_offset: Offset, size_bytes: int) -> None:
        """Record an append ending at `last_offset` (prev_offset when it carried no entries)."""
        if self.state is ProgressState.REPLICATE:
            self.next = max(self.next, Offset(last_offset + 1))
            self.inflights.append((last_offset, size_bytes))
            self.inflight_bytes += size_bytes
        else:
            assert self.state is ProgressState.PROBE, self
            self.probe_sent = True

    def is_paused(self, config: RaftConfig) -> bool:
        """Whether the leader must wait before sending this follower another append."""
        match self.state:
            case ProgressState.PROBE:
                return self.probe_sent
            case ProgressState.REPLICATE:
                return (
                    len(self.inflights) >= config.inflight_messages_max
                    or self.inflight_bytes >= config.inflight_bytes_max
                )
            case ProgressState.SNAPSHOT:
                return True
