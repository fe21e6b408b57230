"""The strace replay that says what a JetStream server had fsynced, and the file damage."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from raftlog.chaos.jetstream_durability import (
    DAMAGES,
    DurabilityTracker,
    corrupt_one,
    cut_to_durable,
    snapshot_sizes,
)

BLK = "/s/streams/t-0/msgs/1.blk"


def _trace(*bodies: str) -> list[str]:
    return [f"4242  {body}\n" for body in bodies]


def test_pwrites_are_durable_only_up_to_the_last_fsync() -> None:
    tracker = DurabilityTracker({})
    tracker.feed(_trace(
        f'openat(AT_FDCWD</w>, "{BLK}", O_RDWR|O_CREAT|O_CLOEXEC, 0640) = 9<{BLK}>',
        f'pwrite64(9<{BLK}>, ""..., 100, 0) = 100',
        f"fsync(9<{BLK}>) = 0",
        f'pwrite64(9<{BLK}>, ""..., 50, 100) = 50',
    ))  # fmt: skip
    state = tracker.files[BLK]
    assert (state.size, state.durable) == (150, 100)


def test_a_file_at_rest_when_the_server_started_is_durable_until_truncated() -> None:
    tracker = DurabilityTracker({BLK: 400})
    assert tracker.files[BLK].durable == 400
    tracker.feed(_trace(f"ftruncate(9<{BLK}>, 300) = 0"))
    assert (tracker.files[BLK].size, tracker.files[BLK].durable) == (300, 300)


def test_writes_through_an_o_sync_fd_are_durable_at_once_and_renames_carry_them() -> None:
    tmp, final = "/s/peers.idx.tmp", "/s/peers.idx"
    tracker = DurabilityTracker({})
    tracker.feed(_trace(
        f'openat(AT_FDCWD</w>, "{tmp}", O_WRONLY|O_CREAT|O_TRUNC|O_SYNC, 0640) = 21<{tmp}>',
        f'write(21<{tmp}>, ""..., 34) = 34',
        f'renameat(AT_FDCWD</w>, "{tmp}", AT_FDCWD</w>, "{final}") = 0',
    ))  # fmt: skip
    assert tmp not in tracker.files
    assert (tracker.files[final].size, tracker.files[final].durable) == (34, 34)


def test_a_call_split_by_another_thread_is_joined_and_a_failed_call_ignored() -> None:
    tracker = DurabilityTracker({})
    tracker.feed([
        f'7  pwrite64(9<{BLK}>, ""..., 64, 0 <unfinished ...>\n',
        f"8  fsync(9<{BLK}>) = -1 EIO (Input/output error)\n",
        "7  <... pwrite64 resumed>) = 64\n",
        f"8  fsync(9<{BLK}>) = 0\n",
        f'7  pwrite64(9<{BLK}>, ""..., 64, 64) = 64\n',
    ])  # fmt: skip
    assert (tracker.files[BLK].size, tracker.files[BLK].durable) == (128, 64)


def test_unlinked_files_are_forgotten() -> None:
    tracker = DurabilityTracker({BLK: 10})
    tracker.feed(_trace(f'unlinkat(AT_FDCWD</w>, "{BLK}", 0) = 0'))
    assert BLK not in tracker.files


def test_cut_to_durable_shortens_only_files_past_their_durable_length(tmp_path: Path) -> None:
    synced, unsynced = tmp_path / "a.blk", tmp_path / "b.blk"
    synced.write_bytes(b"x" * 100)
    unsynced.write_bytes(b"y" * 10)
    tracker = DurabilityTracker(snapshot_sizes(tmp_path))
    unsynced.write_bytes(b"y" * 90)  # written after the start, never fsynced
    tracker.feed(_trace(f'pwrite64(5<{unsynced}>, ""..., 80, 10) = 80'))
    report = cut_to_durable(tracker, tmp_path)
    assert report == {"files_cut": 1, "bytes_cut": 80, "cut": {"b.blk": 80}}
    assert (synced.stat().st_size, unsynced.read_bytes()) == (100, b"y" * 10)


@pytest.mark.parametrize("seed", range(12))
def test_corrupt_damages_one_block_and_says_how(tmp_path: Path, seed: int) -> None:
    block = tmp_path / "streams" / "t-0" / "msgs" / "1.blk"
    block.parent.mkdir(parents=True)
    original = bytes(range(256)) * 16
    block.write_bytes(original)
    (tmp_path / "meta.inf").write_text("{}")
    described = corrupt_one(tmp_path, random.Random(seed))
    assert described is not None
    assert described["file"] == "streams/t-0/msgs/1.blk" and described["damage"] in DAMAGES
    if described["damage"] == "delete":
        assert not block.exists()
    elif described["damage"] == "truncate":
        assert block.stat().st_size == described["detail"]["length"] < len(original)
    else:
        damaged = block.read_bytes()
        changed = [i for i in range(len(original)) if damaged[i] != original[i]]
        assert changed == described["detail"]["offsets"]
        assert all(len(original) // 4 <= i < 3 * len(original) // 4 for i in changed)


def test_corrupt_finds_nothing_in_an_empty_store(tmp_path: Path) -> None:
    assert corrupt_one(tmp_path, random.Random(1)) is None
