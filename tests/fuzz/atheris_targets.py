"""Coverage-guided fuzzing with atheris (libFuzzer) of the batch decoder and segment recovery.

Run one target for as long as you like (the CI test below runs each for a few thousand
inputs):

    .venv/bin/python -m tests.fuzz.atheris_targets batch -runs=1000000
    .venv/bin/python -m tests.fuzz.atheris_targets recovery -max_total_time=600

A target fails (libFuzzer prints the crashing input and exits non-zero) on any exception
other than the documented refusal (CorruptBatchError), or when recovery serves a batch that
was never appended.
"""

from __future__ import annotations

import contextlib
import struct
import sys
from collections.abc import Callable

import atheris
import crc32c

with atheris.instrument_imports():
    from raftlog.config import LogConfig
    from raftlog.errors import CorruptBatchError
    from raftlog.storage.batch import iter_batches, verify_batch
    from raftlog.storage.durable_mark import decode_marks
    from raftlog.storage.log import SegmentedLog
    from raftlog.storage.records import RecordInput, decode_batch, encode_batch, validate_records
    from raftlog.storage.sim_file_system import SimFileSystem
    from raftlog.storage.wall_clock import ManualWallClock

BATCH_BYTES_MAX = 1 << 20
DIRECTORY = "/fuzz/log"
CONFIG = LogConfig(
    segment_bytes_max=1024,
    index_interval_bytes=128,
    batch_bytes_max=512,
    append_buffer_bytes_max=256,
    segment_age_ms_max=10_000,
).validate()
APPENDED = [encode_batch([RecordInput(None, f"v{i}".encode() * 4, i)]) for i in range(6)]


def fuzz_batch(data: bytes) -> None:
    with contextlib.suppress(CorruptBatchError):
        decode_batch(data, batch_bytes_max=BATCH_BYTES_MAX, decompressed_bytes_max=1 << 20)
    try:
        for _ in iter_batches(data, batch_bytes_max=BATCH_BYTES_MAX):
            pass
    except CorruptBatchError:
        pass


def fuzz_recovery(data: bytes) -> None:
    """Good batches, then the fuzzer's bytes as the tail of the active segment."""
    files = SimFileSystem()
    log = SegmentedLog.open(DIRECTORY, config=CONFIG, files=files, clock=ManualWallClock())
    for batch in APPENDED:
        log.append(batch, leader_epoch=1)
    path = f"{DIRECTORY}/{log.segment_base_offsets[-1]:020d}.log"
    log.close()
    handle = files.open(path)
    handle.append([data])
    handle.sync()
    handle.close()
    reopened = SegmentedLog.open(DIRECTORY, config=CONFIG, files=files, clock=ManualWallClock())
    end = reopened.log_end_offset
    if end > len(APPENDED):
        # Bytes after the good batches were taken as data: they must at least verify.
        result = reopened.read(len(APPENDED), bytes_max=1 << 20)
        position = 0
        for header in result.headers:
            decode_batch(result.data, position)
            position += header.size_bytes
    reopened.close()


def fuzz_records(data: bytes) -> None:
    """The fuzzer's bytes as everything after the CRC, with the CRC made right: this reaches
    the records decoder, which a random CRC almost never lets through. The leader's check
    (`validate_records`) must refuse exactly the batches the decoder refuses."""
    body = data.ljust(40, b"\x00")
    batch = struct.pack(">qiibI", 0, len(body) + 9, 0, 2, crc32c.crc32c(body)) + body
    decoded = _accepts(lambda: decode_batch(batch, batch_bytes_max=BATCH_BYTES_MAX,
                                            decompressed_bytes_max=1 << 20))  # fmt: skip
    try:
        header = verify_batch(batch, batch_bytes_max=BATCH_BYTES_MAX)
    except CorruptBatchError:
        assert not decoded
        return
    validated = _accepts(lambda: validate_records(batch, header, decompressed_bytes_max=1 << 20))
    assert decoded == validated, (decoded, validated)


def fuzz_mark(data: bytes) -> None:
    """The fuzzer's bytes as a log's durable mark, beside good batches: open reports damage
    or trusts a valid record, never raises, and never claims the log whole when the mark
    says it reached further than it does."""
    files = SimFileSystem()
    log = SegmentedLog.open(DIRECTORY, config=CONFIG, files=files, clock=ManualWallClock())
    for batch in APPENDED:
        log.append(batch, leader_epoch=1)
    log.close()
    handle = files.open(log.mark.path)
    handle.truncate(0)
    handle.append([data])
    handle.sync()
    handle.close()
    found = decode_marks(data, path=log.mark.path)
    reopened = SegmentedLog.open(DIRECTORY, config=CONFIG, files=files, clock=ManualWallClock())
    if isinstance(found, str) or found[1].repairing or found[1].end_offset > len(APPENDED):
        assert reopened.damage is not None and reopened.is_repairing
    else:
        assert reopened.damage is None
    reopened.close()


def _accepts(check: Callable[[], object]) -> bool:
    try:
        check()
    except CorruptBatchError:
        return False
    return True


TARGETS = {
    "batch": fuzz_batch,
    "recovery": fuzz_recovery,
    "records": fuzz_records,
    "mark": fuzz_mark,
}


def main() -> None:
    target = TARGETS[sys.argv[1]]
    atheris.Setup([sys.argv[0], *sys.argv[2:]], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
