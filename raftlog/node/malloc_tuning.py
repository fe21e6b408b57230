"""glibc malloc settings for a node process: keep freed memory for the next batch.

Theory of operation. A node allocates and frees a buffer of about a batch (up to 1 MiB, and
frames up to `transport.frame_bytes_max`) for every produce request, append frame and read.
glibc serves blocks above its mmap threshold (128 KiB at start, adjusted as it goes) with a
fresh `mmap` and returns them with `munmap`, and it gives the top of its heap back to the
kernel above a trim threshold; each fresh 1 MiB then costs 256 page faults, zero-filled
pages, on the loop. Raising both thresholds once at start lets freed batches be reused
(benchmarks/README.md has the cluster runs that measured the gain). The cost is bounded: at
most `malloc_trim_threshold_bytes` of freed heap stays with the process.

Only glibc has `mallopt`; elsewhere nothing changes and `tune_malloc` says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util

from raftlog.config import MALLOC_MMAP_THRESHOLD_BYTES_MAX

__all__ = ["tune_malloc"]

# glibc's M_* parameter numbers (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def tune_malloc(*, trim_threshold_bytes: int, mmap_threshold_bytes: int) -> bool:
    """Set glibc's trim and mmap thresholds; False where there is no glibc `mallopt`.

    Raises ValueError naming the setting glibc refused (the config validates both first)."""
    assert trim_threshold_bytes > 0, trim_threshold_bytes
    assert 0 < mmap_threshold_bytes <= MALLOC_MMAP_THRESHOLD_BYTES_MAX, mmap_threshold_bytes
    mallopt = _mallopt()
    if mallopt is None:
        return False
    for name, parameter, value in (
        ("malloc_trim_threshold_bytes", _M_TRIM_THRESHOLD, trim_threshold_bytes),
        ("malloc_mmap_threshold_bytes", _M_MMAP_THRESHOLD, mmap_threshold_bytes),
    ):
        if mallopt(parameter, value) != 1:  # mallopt answers 1 on success, 0 on error
            raise ValueError(f"{name}: glibc's mallopt refused {value}")
    return True


def _mallopt() -> ctypes._NamedFuncPointer | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return None  # not glibc (musl has no mallopt), or no C library to load
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt
