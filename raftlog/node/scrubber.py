"""The scrubber: closed segments re-read in the background, at a bounded rate.

Theory of operation. Damage to data nobody reads stays hidden until a follower or a consumer
needs it, possibly after the other copies are gone; the scrubber finds it while the other
replicas still hold the data. One task per node walks the closed segments of every log the
node hosts, round after round, and verifies each end to end on its own disk thread
(`raftlog.storage.scrub.verify_closed_segment`: lengths, CRC32C, contiguous offsets, the
right end). Reading is paced to `bytes_per_s` (sleeping on that thread after each chunk), so
the scrubber's disk and CPU cost is bounded whatever the data size; 0 turns it off. A
segment that fails is reported to `on_damage` on the event loop, unless it was deleted or
rewritten meanwhile (retention, a truncation): the owner then starts a repair, as for damage
found at open. A round that found nothing waits `round_pause_s` before the next.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from raftlog.errors import StorageError
from raftlog.storage.file_system import FileSystem
from raftlog.storage.scrub import SegmentProblem, verify_closed_segment
from raftlog.types import RaftGroupId

__all__ = ["ScrubTarget", "Scrubber"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ScrubTarget:
    """A log to scrub: its group, and how to list its closed segments right now."""

    raft_group_id: RaftGroupId
    files: FileSystem
    closed_segments: Callable[[], list[tuple[str, int, int]]]


class Scrubber:
    def __init__(
        self,
        *,
        bytes_per_s: int,
        chunk_bytes: int,
        targets: Callable[[], Sequence[ScrubTarget]],
        on_damage: Callable[[RaftGroupId, SegmentProblem], None],
        round_pause_s: float = 10.0,
    ) -> None:
        assert bytes_per_s >= 0 and chunk_bytes > 0 and round_pause_s > 0
        self._bytes_per_s = bytes_per_s
        self._chunk_bytes = chunk_bytes
        self._targets = targets
        self._on_damage = on_damage
        self._round_pause_s = round_pause_s
        self._stopping = threading.Event()
        # Its own thread: a paced scrub must never hold a thread the log syncs need.
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="scrub")
        self.bytes_verified = 0
        self.segments_verified = 0
        self.problems_found = 0

    async def run(self) -> None:
        if self._bytes_per_s == 0:
            return
        try:
            while not self._stopping.is_set():
                await self.scrub_round()
                await asyncio.sleep(self._round_pause_s)
        finally:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def stop(self) -> None:
        self._stopping.set()

    async def scrub_round(self) -> int:
        """Verify every closed segment once; returns how many were found damaged."""
        loop = asyncio.get_running_loop()
        found = 0
        for target in list(self._targets()):
            for path, base, end in target.closed_segments():
                if self._stopping.is_set():
                    return found
                problem = await loop.run_in_executor(
                    self._executor, self._verify, target.files, path, base, end
                )
                if problem is not None and (path, base, end) in target.closed_segments():
                    found += 1
                    self.problems_found += 1
                    log.error("scrubber: group %s: %s", target.raft_group_id, problem.cause)
                    self._on_damage(target.raft_group_id, problem)
                    break  # the repair replaces this log's later segments
        return found

    def _verify(self, files: FileSystem, path: str, base: int, end: int) -> SegmentProblem | None:
        try:
            problem = verify_closed_segment(
                files, path, base_offset=base, end_offset=end, chunk_bytes=self._chunk_bytes,
                pace=self._pace,
            )  # fmt: skip
        except StorageError as error:  # gone meanwhile; the caller checks it is still listed
            problem = SegmentProblem(path, base, str(error))
        self.segments_verified += 1
        return problem

    def _pace(self, size_bytes: int) -> None:
        """On the scrub thread: sleep as long as reading `size_bytes` may take."""
        self.bytes_verified += size_bytes
        self._stopping.wait(size_bytes / self._bytes_per_s)
