"""Verifying a closed segment end to end, for the background scrubber.

Theory of operation. A closed segment is read only on demand (its index locates a batch and
a read checks that batch's CRC), so damage to a part nobody reads stays hidden until the
day a follower or a consumer needs it, possibly after the other copies are gone.
`verify_closed_segment` reads the whole file in chunks and checks what recovery checks of
an active segment: every batch's length, magic and CRC32C, base offsets contiguous from the
segment's base, and the file ending exactly where the last batch ends, at the next segment's
base offset. It touches nothing but one read-only file handle, so it runs on a disk thread
while the log is in use; `pace` (called with the bytes just read) lets the caller bound its
rate. It reports the first offset that is not intact, which is where a repair must refill
the log from (`SegmentedLog.start_repair`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from raftlog.storage.file_system import FileSystem
from raftlog.storage.segment import announced_bytes, verified_batches

__all__ = ["SegmentProblem", "verify_closed_segment"]


@dataclass(frozen=True, slots=True)
class SegmentProblem:
    """The first offset of a closed segment that is not intact, and why."""

    path: str
    offset: int
    cause: str


def verify_closed_segment(
    files: FileSystem,
    path: str,
    *,
    base_offset: int,
    end_offset: int,
    chunk_bytes: int,
    pace: Callable[[int], None] = lambda _: None,
) -> SegmentProblem | None:
    """None when every batch of the segment `[base_offset, end_offset)` checks out."""
    assert base_offset < end_offset and chunk_bytes > 0, (base_offset, end_offset)
    if not files.exists(path):
        return SegmentProblem(path, base_offset, f"{path} is missing")
    handle = files.open(path)
    try:
        size_bytes = handle.size_bytes()
        position, expected = 0, base_offset
        while position < size_bytes:
            chunk = handle.read_at(max(chunk_bytes, announced_bytes(handle, position)), position)
            used = 0
            for batch_position, base, last, batch_bytes, _ in verified_batches(chunk):
                if base != expected:
                    where = position + batch_position
                    cause = f"batch at byte {where} has base offset {base}, expected {expected}"
                    return SegmentProblem(path, expected, f"{path}: {cause}")
                expected = last + 1
                used = batch_position + batch_bytes
            if used == 0:
                cause = f"batch at byte {position} fails its checks (length, magic or CRC32C)"
                return SegmentProblem(path, expected, f"{path}: {cause}")
            position += used
            pace(used)
        if expected != end_offset:
            cause = f"ends at offset {expected} (byte {size_bytes}), expected {end_offset}"
            return SegmentProblem(path, expected, f"{path}: {cause}")
        return None
    finally:
        handle.close()
