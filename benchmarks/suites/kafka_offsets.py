"""Benchmark: what translating Raft offsets to Kafka offsets costs a fetch and a produce.

Kafka offsets leave Raft's own entries out (docs/offsets.md): a fetch reads from the Raft
offset holding the asked Kafka offset, drops Raft's batches and rewrites each base offset;
a produce answers the Kafka offsets of its batch. This suite measures that work against the
read it wraps, in one process, alternating, on one log in the page cache:

- `fetch_raw_cpu_ms_per_mb`: `RaftLogStorage.read` from Raft offset 0 to the end in 1 MiB
  budgets (what a fetch did before Kafka offsets: Raft offset = Kafka offset);
- `fetch_kafka_cpu_ms_per_mb`: `read_kafka` over the same data from Kafka offset 0;
- `fetch_kafka_vs_raw`: their ratio (median of per-pair ratios), the translation's share;
- `produce_offsets_us`: one produce's translation (`kafka_offset` of its first and last
  offset), a few thousand Raft offsets spread over the log.

The log: 16 KiB batches (16 records of 1 KiB), a no-op every 500 batches (a leader change
each; far more than a healthy partition has) and one membership change. CPU time
(`time.process_time`), so a busy machine moves the figures less than it moves wall time;
glibc's malloc is tuned as a node tunes it (`raftlog.node.malloc_tuning`), or fresh 1 MiB
buffers' page faults would be most of what is measured.
"""

from __future__ import annotations

import pathlib
import random
import shutil
import statistics
import time
from collections.abc import Callable

from raftlog.config import KIB, MIB, LogConfig, NodeConfig
from raftlog.node.malloc_tuning import tune_malloc
from raftlog.raft.types import Entry, EntryKind, Membership
from raftlog.storage.raft_log_storage import RaftLogStorage
from raftlog.storage.records import RecordInput, encode_batch
from raftlog.types import NodeId, Offset, Term

RECORDS_PER_BATCH = 16
RECORD_BYTES = 1 * KIB
BATCHES_PER_TERM = 500
FETCH_BYTES = 1 * MIB
SEED = 20261127


def _fill(storage: RaftLogStorage, total_bytes: int) -> int:
    """Append data batches with a no-op at each term's start; returns the bytes of data."""
    rng = random.Random(SEED)
    values = [rng.randbytes(RECORD_BYTES) for _ in range(RECORDS_PER_BATCH)]
    batch = encode_batch([RecordInput(None, value, 0) for value in values])
    voters = Membership(frozenset({NodeId(1), NodeId(2), NodeId(3)}))
    offset, term, data_bytes = 0, 1, 0
    entries: list[Entry] = [Entry(Term(term), Offset(0), 1, EntryKind.NOOP, b"")]
    entries.append(Entry(Term(term), Offset(1), 1, EntryKind.CONFIG, voters.encode()))
    offset = 2
    while data_bytes < total_bytes:
        for _ in range(BATCHES_PER_TERM):
            entries.append(
                Entry(Term(term), Offset(offset), RECORDS_PER_BATCH, EntryKind.DATA, batch)
            )
            offset += RECORDS_PER_BATCH
            data_bytes += len(batch)
        storage.append(entries)
        storage.sync()
        term += 1
        entries = [Entry(Term(term), Offset(offset), 1, EntryKind.NOOP, b"")]
        offset += 1
    storage.append(entries)
    storage.sync()
    return data_bytes


def _read_all_raw(storage: RaftLogStorage, end: int) -> int:
    return _read_all(storage.read, end, end)


def _read_all_kafka(storage: RaftLogStorage, end: int) -> int:
    return _read_all(storage.read_kafka, storage.kafka_offset(end), end)


def _read_all(read: Callable[..., bytes], stop: int, end: int) -> int:
    """Bytes `read` returns from offset 0 until `stop`, in fetch-sized budgets."""
    offset, total = 0, 0
    while offset < stop:
        data = read(offset, bytes_max=FETCH_BYTES, end_offset=end)
        if not data:
            break
        total += len(data)
        offset = _next_offset(data)
    return total


def _next_offset(data: bytes) -> int:
    """One past the last batch's last offset (base offset + last offset delta + 1)."""
    position, last = 0, 0
    view = memoryview(data)
    while position + 61 <= len(view):
        base = int.from_bytes(view[position : position + 8], "big")
        length = int.from_bytes(view[position + 8 : position + 12], "big")
        delta = int.from_bytes(view[position + 23 : position + 27], "big")
        last = base + delta + 1
        position += 12 + length
    return last


def _cpu_ms(fn: object, *args: object) -> tuple[float, int]:
    started = time.process_time()
    read = fn(*args)  # type: ignore[operator]
    return (time.process_time() - started) * 1000, read


def run(out_dir: pathlib.Path, *, quick: bool) -> dict[str, float]:
    work = out_dir / "kafka-offsets-work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    total, pairs = (32 * MIB, 4) if quick else (128 * MIB, 8)
    node = NodeConfig()
    tune_malloc(
        trim_threshold_bytes=node.malloc_trim_threshold_bytes,
        mmap_threshold_bytes=node.malloc_mmap_threshold_bytes,
    )
    try:
        storage = RaftLogStorage.open(work / "log", config=LogConfig())
        _fill(storage, total)
        end = int(storage.last_offset()) + 1
        _read_all_raw(storage, end)  # warm the page cache and the index
        raw_ms, kafka_ms, ratios = [], [], []
        for pair in range(pairs):
            order = (0, 1) if pair % 2 == 0 else (1, 0)
            figures: dict[int, tuple[float, int]] = {}
            for which in order:
                reader = _read_all_raw if which == 0 else _read_all_kafka
                figures[which] = _cpu_ms(reader, storage, end)
            raw_per_mb = figures[0][0] / (figures[0][1] / MIB)
            kafka_per_mb = figures[1][0] / (figures[1][1] / MIB)
            raw_ms.append(raw_per_mb)
            kafka_ms.append(kafka_per_mb)
            ratios.append(kafka_per_mb / raw_per_mb)
        rng = random.Random(SEED)
        probes = [rng.randrange(0, end) for _ in range(5000)]
        started = time.process_time()
        for probe in probes:
            storage.kafka_offset(probe)
            storage.kafka_offset(probe + 1 if probe + 1 < end else probe)
        produce_us = (time.process_time() - started) * 1e6 / len(probes)
        storage.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "fetch_raw_cpu_ms_per_mb": statistics.median(raw_ms),
        "fetch_kafka_cpu_ms_per_mb": statistics.median(kafka_ms),
        "fetch_kafka_vs_raw": statistics.median(ratios),
        "produce_offsets_us": produce_us,
        "internal_entries": float(len(storage.internal_offsets())),
    }
