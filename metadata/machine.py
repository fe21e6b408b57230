"""The metadata quorum's state machine as the runtime sees it (Raft group 0).

Theory of operation. `raftlog.metadata.MetadataState` is pure: `apply(offset, command)` returns
an `ApplyResult`. This wrapper adds what the node runtime needs around it:

- the result of each applied command is kept (bounded, oldest dropped) so whoever proposed it
  can read it once its proposal future resolves: a command can be *committed* and still
  *rejected* (e.g. TOPIC_ALREADY_EXISTS when two admins race), and only apply knows;
- listeners run after every apply or restore, so the node reconciles the partition groups it
  hosts, the peers it knows and the leaders it reports from one place.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from raftlog.metadata import ApplyResult, MetadataState
from raftlog.raft.types import Entry, EntryKind, Snapshot
from raftlog.types import Offset

__all__ = ["MetadataMachine"]

RESULTS_KEPT_MAX = 4096


class MetadataMachine:
    def __init__(self, cluster_id: str) -> None:
        self.state = MetadataState(cluster_id)
        self._results: OrderedDict[Offset, ApplyResult] = OrderedDict()
        self.listeners: list[Callable[[], None]] = []

    def apply(self, entry: Entry) -> None:
        if entry.kind is EntryKind.DATA:
            result = self.state.apply(entry.offset, entry.data)
            self._results[entry.offset] = result
            while len(self._results) > RESULTS_KEPT_MAX:
                self._results.popitem(last=False)
        self._changed()

    def restore(self, snapshot: Snapshot) -> None:
        self.state = MetadataState.restore(snapshot.data)
        self._results.clear()
        self._changed()

    def take_result(self, offset: Offset) -> ApplyResult | None:
        """The result of the command applied at `offset`, once (None if dropped or unknown)."""
        return self._results.pop(offset, None)

    def _changed(self) -> None:
        for listener in self.listeners:
            listener()
