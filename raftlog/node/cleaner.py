"""The log cleaner: compacted topics' logs cleaned in the background, at a bounded rate.

Theory of operation. One task per node visits the partition replicas it hosts every
`interval_s`; for each whose topic is compacted it plans a pass on the event loop
(`raftlog.partition.cleaning.plan_cleaning`: which closed segments, below the high watermark
and the applied offset), runs it on the cleaner's own thread (read, filter, write and fsync
the cleaned copies; never on the event loop, never on a thread the log syncs need), and
swaps the copies in back on the loop (`SegmentedLog.install_cleaned`: a few renames and
directory fsyncs). Reading is paced to `bytes_per_s` (sleeping on that thread after each
chunk), so the cleaner's disk and CPU cost is bounded whatever the data size; 0 turns it off.
A log closed or reopened meanwhile (a repair, a deleted topic) simply loses the pass: the
copies are discarded when the log next opens or the next pass installs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from raftlog.errors import StorageError
from raftlog.partition.cleaning import (
    CleanerState,
    CleaningPass,
    CompactionSettings,
    finish_cleaning,
    plan_cleaning,
    run_cleaning,
)
from raftlog.partition.producer_state import AbortedTxn
from raftlog.storage.compaction import CleanedSegment
from raftlog.storage.log import SegmentedLog
from raftlog.types import RaftGroupId

__all__ = ["CleanTarget", "LogCleaner"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CleanTarget:
    """A hosted partition log: its settings now, and the first offset not to touch."""

    raft_group_id: RaftGroupId
    log: SegmentedLog
    settings: CompactionSettings
    clean_below: int
    # The replica's aborted transactions (Raft offsets) whose records a pass drops.
    aborted: tuple[AbortedTxn, ...] = ()


class LogCleaner:
    def __init__(
        self,
        *,
        bytes_per_s: int,
        targets: Callable[[], Sequence[CleanTarget]],
        now_ms: Callable[[], int],
        interval_s: float = 15.0,
    ) -> None:
        assert bytes_per_s >= 0 and interval_s > 0
        self._bytes_per_s = bytes_per_s
        self._targets = targets
        self._now_ms = now_ms
        self._interval_s = interval_s
        self._stopping = threading.Event()
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="cleaner")
        self._states: dict[RaftGroupId, CleanerState] = {}
        self.bytes_read = 0
        self.bytes_saved = 0
        self.passes = 0
        self.cpu_s = 0.0  # thread CPU time spent cleaning

    async def run(self) -> None:
        if self._bytes_per_s == 0:
            return
        try:
            while not self._stopping.is_set():
                await self.clean_round()
                await asyncio.sleep(self._interval_s)
        finally:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def stop(self) -> None:
        self._stopping.set()

    async def clean_round(self) -> int:
        """One pass over every hosted log that needs one; returns the bytes saved."""
        saved = 0
        targets = list(self._targets())
        live = {target.raft_group_id for target in targets}
        for raft_group_id in [g for g in self._states if g not in live]:
            del self._states[raft_group_id]
        for target in targets:
            if self._stopping.is_set():
                break
            saved += await self.clean(target)
        return saved

    async def clean(self, target: CleanTarget) -> int:
        state = self._states.setdefault(target.raft_group_id, CleanerState())
        plan = plan_cleaning(
            target.log, target.settings, state, clean_below=target.clean_below,
            now_ms=self._now_ms(), aborted=target.aborted,
        )  # fmt: skip
        if plan is None:
            return 0
        loop = asyncio.get_running_loop()
        try:
            cleaned = await loop.run_in_executor(self._executor, self._run, plan)
            if target.log.is_closed:
                return 0
            saved = finish_cleaning(target.log, plan, cleaned, state)
        except StorageError as error:  # the log changed under the pass; the next one retries
            log.warning("cleaner: group %s: pass abandoned: %s", target.raft_group_id, error)
            return 0
        self.passes += 1
        self.bytes_saved += saved
        log.info(
            "cleaner: group %s: %d segments below offset %d cleaned, %d bytes saved",
            target.raft_group_id, len(cleaned), plan.dirty_end_offset, saved,
        )  # fmt: skip
        return saved

    def _run(self, plan: CleaningPass) -> list[CleanedSegment]:
        started = time.thread_time()
        try:
            return run_cleaning(plan, self._pace)
        finally:
            self.cpu_s += time.thread_time() - started

    def _pace(self, size_bytes: int) -> None:
        """On the cleaner thread, after each batch: sleep as long as reading `size_bytes` may
        take. The sleep is never skipped, however short: it releases the interpreter lock,
        so the event loop waits at most one batch's work for it."""
        self.bytes_read += size_bytes
        if self._stopping.is_set():
            raise StorageError("cleaner stopping")
        time.sleep(size_bytes / self._bytes_per_s)
