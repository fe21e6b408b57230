"""Micro-benchmark: the leader's record-framing check against the CRC check it follows.

A leader verifies every produced batch's header and CRC32C (`verify_batch`, in C); with
`produce_record_validation = "full"` it also walks the records (`validate_records`, in
Python, decompressing a compressed batch). This measures both on the same batches, side by
side, for 1 KiB and 100 B records, uncompressed and LZ4, about 64 KiB of records a batch
(a producer's batch under load), and reports per shape:

- `validate_<shape>_mb_s`, `crc_<shape>_mb_s`: batch bytes checked per second;
- `validate_<shape>_us`: microseconds per batch;
- `validate_vs_crc_<shape>`: how many times slower the walk is than the CRC check
  (the median of per-round ratios, the two alternating in short rounds).

Values are random (incompressible for 1 KiB; for LZ4 a repeated 16-byte unit so the batch
compresses as real text would). Nothing touches the disk.
"""

from __future__ import annotations

import pathlib
import random
import statistics
import time
from collections.abc import Callable

from raftlog.config import KIB
from raftlog.storage.batch import Compression, verify_batch
from raftlog.storage.records import RecordInput, encode_batch, validate_records

SEED = 20261122
BATCH_RECORD_BYTES = 64 * KIB
SHAPES = (
    ("1kib_none", 1 * KIB, Compression.NONE),
    ("100b_none", 100, Compression.NONE),
    ("1kib_lz4", 1 * KIB, Compression.LZ4),
    ("100b_lz4", 100, Compression.LZ4),
)


def _batch(record_bytes: int, codec: Compression) -> bytes:
    rng = random.Random(SEED + record_bytes)
    count = BATCH_RECORD_BYTES // record_bytes
    if codec is Compression.NONE:
        values = [rng.randbytes(record_bytes) for _ in range(count)]
    else:
        values = [rng.randbytes(16) * (record_bytes // 16) for _ in range(count)]
    records = [RecordInput(b"key-%d" % i, v, 1_700_000_000_000 + i) for i, v in enumerate(values)]
    return encode_batch(records, compression=codec)


def _seconds_per_call(action: Callable[[], object], budget_s: float) -> float:
    """The fastest of five timings of as many calls as fit in `budget_s / 5`."""
    calls = 1
    while True:
        started = time.perf_counter()
        for _ in range(calls):
            action()
        if time.perf_counter() - started > budget_s / 50:
            break
        calls *= 2
    timings = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(calls):
            action()
        timings.append((time.perf_counter() - started) / calls)
    return min(timings)


def run(out_dir: pathlib.Path, *, quick: bool) -> dict[str, float]:
    rounds, budget_s = (3, 0.5) if quick else (7, 1.0)
    metrics: dict[str, float] = {}
    for shape, record_bytes, codec in SHAPES:
        batch = _batch(record_bytes, codec)
        header = verify_batch(batch)
        crc_s, walk_s = [], []
        for _ in range(rounds):
            crc_s.append(_seconds_per_call(lambda b=batch: verify_batch(b), budget_s))
            walk_s.append(
                _seconds_per_call(lambda b=batch, h=header: validate_records(b, h), budget_s)
            )
        megabytes = len(batch) / 1e6
        metrics[f"crc_{shape}_mb_s"] = megabytes / statistics.median(crc_s)
        metrics[f"validate_{shape}_mb_s"] = megabytes / statistics.median(walk_s)
        metrics[f"validate_{shape}_us"] = statistics.median(walk_s) * 1e6
        metrics[f"validate_vs_crc_{shape}"] = statistics.median(
            w / c for w, c in zip(walk_s, crc_s, strict=True)
        )
    return metrics
