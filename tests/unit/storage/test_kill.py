"""A real process killed with SIGKILL in the middle of appends: every offset its flush()
reported durable is there after recovery, and the log is a clean prefix of what it wrote.

(SIGKILL keeps the page cache, so this checks the process side: user-space buffers and a
writev cut short. Power loss is modelled by SimFileSystem in the other tests.)
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from raftlog.config import LogConfig
from raftlog.storage.log import SegmentedLog

CONFIG = LogConfig(
    segment_bytes_max=64 * 1024, batch_bytes_max=8 * 1024, append_buffer_bytes_max=8 * 1024
)
WRITER = """
import sys
from raftlog.config import LogConfig
from raftlog.storage.log import SegmentedLog
from raftlog.storage.records import RecordInput, encode_batch

config = LogConfig(
    segment_bytes_max=64 * 1024, batch_bytes_max=8 * 1024, append_buffer_bytes_max=8 * 1024
)
log = SegmentedLog.open(sys.argv[1], config=config)
batch = encode_batch([RecordInput(None, b"v" * 300, 7)] * 3)
while True:
    for _ in range(5):
        log.append(batch, leader_epoch=1)
    print(log.flush(), flush=True)
"""


def test_sigkill_loses_nothing_flushed(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(directory)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    durable = [int(child.stdout.readline()) for _ in range(200)]
    child.send_signal(signal.SIGKILL)
    child.wait()
    child.stdout.close()
    assert durable == sorted(durable) and durable[-1] == 200 * 15
    log = SegmentedLog.open(directory, config=CONFIG)
    assert log.log_end_offset >= durable[-1] and log.log_end_offset % 3 == 0
    offset = 0
    while offset < log.log_end_offset:
        result = log.read(offset, bytes_max=64 * 1024)
        assert [h.base_offset for h in result.headers] == list(range(offset, result.next_offset, 3))
        offset = result.next_offset
    assert len(log.segment_base_offsets) > 10
    log.close()
