"""Benchmark: what detecting storage damage costs (docs/storage-faults.md).

Metrics (one run, on the file system holding `out_dir`):
- `flush_with_mark_us`, `flush_without_mark_us`: median time of one group-commit flush of a
  produce-sized append (one batch of 16 records of 1 KiB, as a busy partition's pass holds)
  through `prepare_flush` / `FlushTicket.run` / `complete_flush`, with the durable mark
  recorded after the log's fsync (what every flush does) and with it switched off on the
  same log; the two alternate in short pairs. `flush_mark_cost_ratio`: their ratio (the
  median of per-pair ratios); goal: within noise of 1.0 on a disk where a small in-place
  fsync is cheap, and what it costs where it is not.
- `scrub_mb_s_unpaced`, `scrub_cpu_s_per_mb`: `verify_closed_segment` over closed segments
  of 1 KiB-record batches with no pacing: how fast the check itself is, and its CPU per MB.
- `scrub_cpu_fraction_at_default`: the CPU share of one core the scrubber costs at the
  default `scrub_bytes_per_s` (raftlog.config.NodeConfig), from the figure above.

Files live under `out_dir/storage-faults-work` and are removed afterwards.
"""

from __future__ import annotations

import pathlib
import random
import shutil
import statistics
import time

from raftlog.config import KIB, MIB, LogConfig, NodeConfig
from raftlog.storage.file_system import OsFileSystem
from raftlog.storage.log import SegmentedLog
from raftlog.storage.records import RecordInput, encode_batch
from raftlog.storage.scrub import verify_closed_segment

SEED = 20261126
RECORD_BYTES = 1 * KIB
RECORDS_PER_BATCH = 16


def _batch(rng: random.Random) -> bytes:
    records = [
        RecordInput(None, rng.randbytes(RECORD_BYTES), 1_700_000_000_000)
        for _ in range(RECORDS_PER_BATCH)
    ]
    return encode_batch(records)


def _flush_us(log: SegmentedLog, batch: bytes, *, with_mark: bool, flushes: int) -> float:
    samples = []
    for _ in range(flushes):
        log.append(batch, leader_epoch=1)
        started = time.perf_counter()
        ticket = log.prepare_flush()
        if not with_mark:
            ticket.mark = None
        ticket.run()
        log.complete_flush(ticket)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1e6


def _flush_costs(work: pathlib.Path, *, pairs: int, flushes: int) -> dict[str, float]:
    log = SegmentedLog.open(work / "flush-log", config=LogConfig().validate())
    batch = _batch(random.Random(SEED))
    with_mark, without_mark, ratios = [], [], []
    try:
        _flush_us(log, batch, with_mark=True, flushes=flushes)  # warm up
        for pair in range(pairs):
            order = (True, False) if pair % 2 == 0 else (False, True)
            figures = {
                mode: _flush_us(log, batch, with_mark=mode, flushes=flushes) for mode in order
            }
            with_mark.append(figures[True])
            without_mark.append(figures[False])
            ratios.append(figures[True] / figures[False])
    finally:
        log.close()
    return {
        "flush_with_mark_us": statistics.median(with_mark),
        "flush_without_mark_us": statistics.median(without_mark),
        "flush_mark_cost_ratio": statistics.median(ratios),
    }


def _scrub_costs(work: pathlib.Path, *, log_bytes: int) -> dict[str, float]:
    config = LogConfig(segment_bytes_max=16 * MIB).validate()
    log = SegmentedLog.open(work / "scrub-log", config=config)
    rng = random.Random(SEED)
    batches = [_batch(rng) for _ in range(64)]
    written = 0
    while written < log_bytes:
        batch = batches[written % len(batches)]
        log.append(batch, leader_epoch=1)
        written += len(batch)
    log.flush()
    segments = log.closed_segments()
    files = OsFileSystem()
    wall, cpu = time.perf_counter(), time.process_time()
    scrubbed = 0
    for path, base, end in segments:
        problem = verify_closed_segment(
            files,
            path,
            base_offset=base,
            end_offset=end,
            chunk_bytes=NodeConfig().scrub_chunk_bytes,
        )
        assert problem is None, problem
        scrubbed += pathlib.Path(path).stat().st_size
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    log.close()
    mb = scrubbed / MIB
    cpu_per_mb = cpu / mb
    return {
        "scrub_mb_s_unpaced": mb / wall,
        "scrub_cpu_s_per_mb": cpu_per_mb,
        "scrub_cpu_fraction_at_default": cpu_per_mb * NodeConfig().scrub_bytes_per_s / MIB,
    }


def run(out_dir: pathlib.Path, *, quick: bool) -> dict[str, float]:
    work = out_dir / "storage-faults-work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        metrics = _flush_costs(work, pairs=6 if quick else 12, flushes=100 if quick else 200)
        metrics |= _scrub_costs(work, log_bytes=(64 if quick else 256) * MIB)
        return metrics
    finally:
        shutil.rmtree(work, ignore_errors=True)
