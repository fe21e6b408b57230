"""The FileSystem port: one conformance suite for both implementations, then the crash model
of the simulated one (what survives a crash is exactly what was synced, plus torn appends)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raftlog.errors import StorageError
from raftlog.storage.file_system import (
    FileSystem,
    OsFileSystem,
    read_whole_file,
    write_file_atomically,
)
from raftlog.storage.sim_file_system import SimFileSystem
from raftlog.storage.wall_clock import ManualWallClock, SystemWallClock


def test_append_read_size_truncate(files_and_dir: tuple[FileSystem, str]) -> None:
    files, directory = files_and_dir
    files.make_directory(directory)
    handle = files.open(os.path.join(directory, "a"), create=True)
    handle.append([b"hello ", bytearray(b"wor"), memoryview(b"ld")])
    assert handle.size_bytes() == 11
    assert handle.read_at(5, 6) == b"world"
    assert handle.read_at(100, 6) == b"world"  # short only at the end of the file
    assert handle.read_at(4, 11) == b""
    handle.truncate(5)
    handle.sync()
    assert handle.read_at(100, 0) == b"hello"
    handle.close()


def test_many_buffers_are_all_written(files_and_dir: tuple[FileSystem, str]) -> None:
    files, directory = files_and_dir
    files.make_directory(directory)
    handle = files.open(os.path.join(directory, "many"), create=True)
    buffers = [bytes([i % 256]) * 3 for i in range(3000)]  # more than IOV_MAX
    handle.append(buffers)
    assert handle.read_at(9000, 0) == b"".join(buffers)
    handle.close()


def test_directory_operations(files_and_dir: tuple[FileSystem, str]) -> None:
    files, directory = files_and_dir
    files.make_directory(directory)
    for name in ("b", "a"):
        files.open(os.path.join(directory, name), create=True).close()
    assert files.list_directory(directory) == ["a", "b"]
    files.rename(os.path.join(directory, "a"), os.path.join(directory, "c"))
    files.remove(os.path.join(directory, "b"))
    files.sync_directory(directory)
    assert files.list_directory(directory) == ["c"]
    assert files.exists(os.path.join(directory, "c"))
    assert not files.exists(os.path.join(directory, "a"))


def test_open_missing_file_names_it(files_and_dir: tuple[FileSystem, str]) -> None:
    files, directory = files_and_dir
    files.make_directory(directory)
    missing = os.path.join(directory, "missing")
    with pytest.raises(StorageError, match="missing"):
        files.open(missing)


def test_write_file_atomically_replaces(files_and_dir: tuple[FileSystem, str]) -> None:
    files, directory = files_and_dir
    files.make_directory(directory)
    path = os.path.join(directory, "state")
    write_file_atomically(files, path, b"one")
    write_file_atomically(files, path, b"two!")
    assert read_whole_file(files, path) == b"two!"
    assert files.list_directory(directory) == ["state"]


# --- the crash model of SimFileSystem ----------------------------------------------------


def _file_with(sim: SimFileSystem, synced: bytes, unsynced: bytes) -> str:
    sim.make_directory("/d")
    handle = sim.open("/d/f", create=True)
    handle.append([synced])
    handle.sync()
    sim.sync_directory("/d")
    handle.append([unsynced])
    return "/d/f"


def test_crash_loses_unsynced_appends(sim: SimFileSystem) -> None:
    path = _file_with(sim, b"durable", b"lost")
    sim.crash(torn=False)
    assert sim.file_bytes(path) == b"durable"


def test_crash_can_keep_a_torn_prefix(sim: SimFileSystem) -> None:
    kept = set()
    for seed in range(40):
        sim = SimFileSystem(seed)
        path = _file_with(sim, b"durable", b"0123456789")
        sim.crash(torn=True)
        data = sim.file_bytes(path)
        assert data.startswith(b"durable") and b"durable0123456789".startswith(data)
        kept.add(len(data))
    assert len(kept) > 3, "torn crashes keep prefixes of many lengths"


def test_crash_reverts_unsynced_truncation(sim: SimFileSystem) -> None:
    path = _file_with(sim, b"durable", b"")
    sim.open(path).truncate(2)
    sim.crash()
    assert sim.file_bytes(path) == b"durable"


def test_crash_reverts_unsynced_directory_changes(sim: SimFileSystem) -> None:
    path = _file_with(sim, b"x", b"")
    handle = sim.open("/d/new", create=True)
    handle.append([b"synced data, unsynced name"])
    handle.sync()
    sim.remove(path)
    sim.crash()
    assert sim.list_directory("/d") == ["f"]


def test_handles_die_with_the_crash(sim: SimFileSystem) -> None:
    path = _file_with(sim, b"x", b"")
    handle = sim.open(path)
    sim.crash()
    with pytest.raises(StorageError, match="after a simulated crash"):
        handle.read_at(1, 0)


def test_clocks() -> None:
    clock = ManualWallClock(5)
    clock.advance(7)
    assert clock.now_ms() == 12
    assert SystemWallClock().now_ms() > 1_600_000_000_000


def test_os_errors_name_the_file(tmp_path: Path) -> None:
    files = OsFileSystem()
    handle = files.open(str(tmp_path / "f"), create=True)
    handle.close()
    with pytest.raises(StorageError, match=r"/f is closed"):
        handle.read_at(1, 0)
    with pytest.raises(StorageError, match=r"/f is closed"):
        handle.sync()
    with pytest.raises(StorageError, match=r"cannot open .*/missing/f: No such file"):
        files.open(str(tmp_path / "missing" / "f"), create=True)
