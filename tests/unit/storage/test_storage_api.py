"""Pins the storage API other layers build on: renaming or reshaping any of it must be a
deliberate change that updates this test (and its callers)."""

from __future__ import annotations

import inspect

from raftlog.raft.ports import DurableLog, HardStateStore, LogStorage
from raftlog.storage.hard_state import FileHardStateStore
from raftlog.storage.log import AppendInfo, ReadResult, SegmentedLog
from raftlog.storage.raft_log_storage import RaftLogStorage


def _signature(function: object) -> str:
    return str(inspect.signature(function))  # type: ignore[arg-type]


def test_segmented_log_api() -> None:
    expected = {
        "open": "(directory: 'str | os.PathLike[str]', *, config: 'LogConfig', files: "
        "'FileSystem | None' = None, clock: 'WallClock | None' = None, mark_syncer: "
        "'MarkSyncer | None' = None) -> 'SegmentedLog'",
        "append": "(self, batch: 'bytes | bytearray | memoryview', *, leader_epoch: 'int', "
        "base_offset: 'int | None' = None) -> 'AppendInfo'",
        "read": "(self, offset: 'int', *, bytes_max: 'int') -> 'ReadResult'",
        "batches": "(self, start_offset: 'int', *, bytes_max: 'int') -> "
        "'list[tuple[BatchHeader, memoryview]]'",
        "truncate_from": "(self, offset: 'int') -> 'None'",
        "delete_segments_before": "(self, offset: 'int') -> 'int'",
        "offset_for_timestamp": "(self, timestamp_ms: 'int', *, skip: 'Callable[[int], bool] | "
        "None' = None) -> 'int | None'",
        "flush": "(self) -> 'int'",
        "apply_retention": "(self, now_ms: 'int') -> 'int'",
        "retention_point": "(self, now_ms: 'int') -> 'int | None'",
        "roll": "(self) -> 'None'",
        "close": "(self) -> 'None'",
    }
    for name, signature in expected.items():
        assert _signature(getattr(SegmentedLog, name)) == signature, name
    for name in ("log_start_offset", "log_end_offset", "durable_end_offset", "size_bytes"):
        assert isinstance(getattr(SegmentedLog, name), property), name
    assert list(AppendInfo.__dataclass_fields__) == [
        "base_offset",
        "last_offset",
        "size_bytes",
        "max_timestamp_ms",
    ]
    assert list(ReadResult.__dataclass_fields__) == ["data", "segment_path", "position", "headers"]


def test_raft_ports_are_implemented() -> None:
    pairs = (
        (LogStorage, RaftLogStorage),
        (DurableLog, RaftLogStorage),
        (HardStateStore, FileHardStateStore),
    )
    checked = 0
    for protocol, implementation in pairs:
        for name, member in vars(protocol).items():
            if callable(member) and not name.startswith("_"):
                assert callable(getattr(implementation, name, None)), (implementation, name)
                checked += 1
    assert checked == 6 + 4 + 2
    for name in ("log_start_offset", "read", "offset_for_timestamp", "close"):
        assert callable(getattr(RaftLogStorage, name)), name  # partition.replica.PartitionLog
