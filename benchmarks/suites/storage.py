"""Benchmark: the segmented log against the disk's own limit, measured side by side.

Metrics (all in one run, on the file system holding `out_dir`):
- `raw_append_mb_s`: a plain Python loop writing 1 MiB chunks to a file, fdatasync after each;
  the machine's limit for "1 MiB per fsync".
- `log_append_mb_s`: SegmentedLog appending 1 MiB worth of batches (16 records of 1 KiB each,
  about 16.6 KiB a batch; built once up front, as a producer would send them) per `flush()`.
- `log_append_vs_raw`: their ratio; goal >= 0.8. The two alternate in short pairs and
  the figures are medians (the ratio: the median of per-pair ratios), as the disk is shared.
- `log_read_mb_s`: sequential `read()` of the same data in 1 MiB budgets (page cache warm).
- `recovery_s`: `SegmentedLog.open` of a >= 2 GiB log (1 GiB segments, as Kafka's default,
  the active one half full) whose last batch was torn by a crash, with the page cache of
  the segment files dropped first (posix_fadvise DONTNEED, cold as after a reboot);
  `recovery_warm_s` the same open again with the cache warm. Goal: under 1 s.
- `recovery_log_gib`, `recovery_active_segment_mib`: the size of what was recovered.

Files live under `out_dir/storage-work` and are removed afterwards.
"""

from __future__ import annotations

import os
import pathlib
import random
import shutil
import statistics
import time

from raftlog.config import GIB, KIB, MIB, LogConfig
from raftlog.storage.log import SegmentedLog
from raftlog.storage.records import RecordInput, encode_batch

RECORD_BYTES = 1 * KIB
RECORDS_PER_BATCH = 16
FLUSH_BYTES = 1 * MIB
SEED = 20261122


def _batches_per_flush() -> list[bytes]:
    """Distinct batches adding up to about 1 MiB, of random (incompressible) values, so a
    disk or hypervisor that compresses or deduplicates favours neither side."""
    rng = random.Random(SEED)
    batches: list[bytes] = []
    total = 0
    while total + 17 * KIB <= FLUSH_BYTES:
        records = [
            RecordInput(None, rng.randbytes(RECORD_BYTES), 1_700_000_000_000)
            for _ in range(RECORDS_PER_BATCH)
        ]
        batches.append(encode_batch(records))
        total += len(batches[-1])
    return batches


def raw_append_mb_s(work: pathlib.Path, total_bytes: int) -> float:
    chunk = random.Random(SEED + 1).randbytes(FLUSH_BYTES)
    path = work / "raw.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    try:
        started = time.perf_counter()
        for _ in range(total_bytes // FLUSH_BYTES):
            os.write(fd, chunk)
            os.fdatasync(fd)
        elapsed = time.perf_counter() - started
    finally:
        os.close(fd)
        os.remove(path)
    return total_bytes / elapsed / 1e6


def log_append_mb_s(log: SegmentedLog, batches: list[bytes], total_bytes: int) -> float:
    per_flush = sum(len(b) for b in batches)
    rounds = max(1, total_bytes // per_flush)
    started = time.perf_counter()
    for _ in range(rounds):
        for batch in batches:
            log.append(batch, leader_epoch=1)
        log.flush()
    elapsed = time.perf_counter() - started
    assert log.durable_end_offset == log.log_end_offset
    return rounds * per_flush / elapsed / 1e6


def log_read_mb_s(log: SegmentedLog) -> float:
    offset, read_bytes = log.log_start_offset, 0
    started = time.perf_counter()
    while offset < log.log_end_offset:
        result = log.read(offset, bytes_max=FLUSH_BYTES)
        read_bytes += len(result.data)
        offset = result.next_offset
    elapsed = time.perf_counter() - started
    return read_bytes / elapsed / 1e6


def _drop_page_cache(directory: pathlib.Path) -> None:
    for path in directory.iterdir():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def build_crashed_log(directory: pathlib.Path, config: LogConfig, total_bytes: int) -> int:
    """Write `total_bytes` of batches, then tear the last one; returns the offset it had."""
    log = SegmentedLog.open(directory, config=config)
    batches = _batches_per_flush()
    while log.size_bytes < total_bytes:
        for batch in batches:
            log.append(batch, leader_epoch=1)
        log.flush()
    torn_offset = log.append(batches[0], leader_epoch=1).base_offset
    log.close()
    last = directory / f"{log.segment_base_offsets[-1]:020d}.log"
    os.truncate(last, os.path.getsize(last) - len(batches[0]) // 2)
    return torn_offset


def recovery_metrics(work: pathlib.Path, total_bytes: int) -> dict[str, float]:
    directory = work / "recovery-log"
    config = LogConfig(segment_bytes_max=1 * GIB).validate()
    torn_offset = build_crashed_log(directory, config, total_bytes)
    _drop_page_cache(directory)
    started = time.perf_counter()
    log = SegmentedLog.open(directory, config=config)
    cold_s = time.perf_counter() - started
    assert log.log_end_offset == torn_offset, (log.log_end_offset, torn_offset)
    size_bytes = log.size_bytes
    active_bytes = os.path.getsize(directory / f"{log.segment_base_offsets[-1]:020d}.log")
    log.close()
    started = time.perf_counter()
    SegmentedLog.open(directory, config=config).close()
    warm_s = time.perf_counter() - started
    shutil.rmtree(directory)
    return {
        "recovery_s": cold_s,
        "recovery_warm_s": warm_s,
        "recovery_log_gib": size_bytes / GIB,
        "recovery_active_segment_mib": active_bytes / MIB,
    }


def run(out_dir: pathlib.Path, *, quick: bool) -> dict[str, float]:
    work = out_dir / "storage-work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    pairs, pair_bytes = (4, 32 * MIB) if quick else (8, 64 * MIB)
    try:
        metrics: dict[str, float] = {}
        log = SegmentedLog.open(work / "append-log", config=LogConfig().validate())
        batches = _batches_per_flush()
        # The disk is shared and noisy (the same raw loop varies 2-3x run to run), so the two
        # run in alternating short pairs and each figure is a median: the ratio is the median
        # of the per-pair ratios, which compares measurements taken seconds apart.
        raw, logged = [], []
        for _ in range(pairs):
            raw.append(raw_append_mb_s(work, pair_bytes))
            logged.append(log_append_mb_s(log, batches, pair_bytes))
        metrics["raw_append_mb_s"] = statistics.median(raw)
        metrics["log_append_mb_s"] = statistics.median(logged)
        metrics["log_append_vs_raw"] = statistics.median(
            log_mb_s / raw_mb_s for log_mb_s, raw_mb_s in zip(logged, raw, strict=True)
        )
        metrics["log_read_mb_s"] = log_read_mb_s(log)
        log.close()
        # A 1 GiB segment half full on top of two full ones: 2.5 GiB.
        metrics.update(recovery_metrics(work, 2 * GIB + 512 * MIB))
        return metrics
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    import json
    import sys

    print(
        json.dumps(run(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "bench-out"), quick=True))
    )
