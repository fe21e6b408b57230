"""The clean-shutdown marker: what a clean close vouches for, so an open need not scan.

Theory of operation. A log's `close` fsyncs its data and the active segment's index files,
then writes `clean-shutdown` (crc32c u32, then JSON of the active segment's state) atomically;
`open` resumes from that state if it matches the file instead of scanning the active
segment (Kafka's `.kafka_cleanshutdown`). Opening takes the marker: it is removed, and the
removal made durable, before anything else, so a crash after that is recovered by a scan.
A marker that is damaged, too large or of another shape is ignored: a scan is always safe.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping

from raftlog.storage.batch import crc32c
from raftlog.storage.file_system import FileSystem, read_whole_file, write_file_atomically

__all__ = ["CLEAN_SHUTDOWN_FILE_NAME", "take_clean_shutdown", "write_clean_shutdown"]

CLEAN_SHUTDOWN_FILE_NAME = "clean-shutdown"
_CRC = struct.Struct(">I")
# The marker holds one small JSON object; anything larger is not ours.
_CLEAN_SHUTDOWN_BYTES_MAX = 4096
_CLEAN_STATE_KEYS = frozenset(
    (
        "base_offset",
        "size_bytes",
        "end_offset",
        "max_timestamp_ms",
        "max_timestamp_offset",
        "bytes_since_index_entry",
    )
)


def write_clean_shutdown(files: FileSystem, directory: str, state: Mapping[str, int]) -> None:
    """Write the marker for the active segment's `state` (after the fsyncs it vouches for)."""
    assert set(state) == _CLEAN_STATE_KEYS, sorted(state)
    body = json.dumps(dict(state), sort_keys=True).encode()
    path = os.path.join(directory, CLEAN_SHUTDOWN_FILE_NAME)
    write_file_atomically(files, path, _CRC.pack(crc32c(body)) + body)


def take_clean_shutdown(files: FileSystem, directory: str) -> dict[str, int] | None:
    """The active segment's state a clean close left, or None; the marker is removed (and
    the removal made durable) first: from here on a crash must mean a scan."""
    path = os.path.join(directory, CLEAN_SHUTDOWN_FILE_NAME)
    if not files.exists(path):
        return None
    data = read_whole_file(files, path)
    files.remove(path)
    files.sync_directory(directory)
    if not _CRC.size <= len(data) <= _CLEAN_SHUTDOWN_BYTES_MAX:
        return None
    if _CRC.unpack_from(data)[0] != crc32c(data[_CRC.size :]):
        return None
    try:
        state = json.loads(data[_CRC.size :])
    except ValueError:
        return None
    if not isinstance(state, dict) or set(state) != _CLEAN_STATE_KEYS:
        return None
    if not all(type(value) is int for value in state.values()):
        return None
    return state
