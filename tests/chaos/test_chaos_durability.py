"""The lose-unsynced-writes hook: the durability manifest of `ChaosFileSystem` and the cut.

Everything runs on the simulated file system, which already models a power loss
(`SimFileSystem.crash`): the cut of a node's files from its manifest must leave exactly what
that model keeps, for every sequence of operations both model the same way.
"""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.chaos.cli import main
from raftlog.errors import StorageError
from raftlog.storage.chaos_file_system import (
    DURABILITY_MANIFEST_NAME,
    UNSAFE_UNSYNCED_DIRECTORY,
    ChaosFileSystem,
    cut_to_durable,
    load_durability_manifest,
)
from raftlog.storage.file_system import FileHandle, FileSystem, OsFileSystem, write_file_atomically
from raftlog.storage.sim_file_system import SimFileSystem

ROOT = "/node"


def _files(fs: SimFileSystem) -> dict[str, bytes]:
    names = [n for n in fs.list_directory(ROOT) if not n.startswith(DURABILITY_MANIFEST_NAME)]
    return {n: fs.file_bytes(f"{ROOT}/{n}") for n in names}


def _chaos() -> tuple[SimFileSystem, ChaosFileSystem]:
    sim = SimFileSystem(seed=1)
    sim.make_directory(ROOT)
    return sim, ChaosFileSystem(sim, ROOT)


def test_appends_after_the_last_sync_are_cut_off() -> None:
    sim, fs = _chaos()
    handle = fs.open(f"{ROOT}/seg", create=True)
    fs.sync_directory(ROOT)
    handle.append([b"acked"])
    handle.sync()
    handle.append([b"-not-synced"])
    report = cut_to_durable(sim, ROOT)
    assert _files(sim) == {"seg": b"acked"}
    assert report.truncated == {"seg": len(b"-not-synced")}
    assert not sim.exists(f"{ROOT}/{DURABILITY_MANIFEST_NAME}"), "all that is left is durable"


def test_a_file_whose_creation_was_never_made_durable_is_removed() -> None:
    sim, fs = _chaos()
    handle = fs.open(f"{ROOT}/new", create=True)
    handle.append([b"synced but its name is not"])
    handle.sync()
    report = cut_to_durable(sim, ROOT)
    assert _files(sim) == {}
    assert report.removed == ["new"]


def test_an_unsynced_rename_is_undone_and_a_synced_one_kept() -> None:
    sim, fs = _chaos()
    for name in ("a", "b"):
        handle = fs.open(f"{ROOT}/{name}", create=True)
        handle.append([name.encode()])
        handle.sync()
    fs.sync_directory(ROOT)
    fs.rename(f"{ROOT}/a", f"{ROOT}/a2")
    report = cut_to_durable(sim, ROOT)
    assert _files(sim) == {"a": b"a", "b": b"b"}
    assert report.restored == [("a2", "a")]


def test_a_truncation_counts_even_unsynced_and_later_appends_do_not() -> None:
    sim, fs = _chaos()
    handle = fs.open(f"{ROOT}/seg", create=True)
    handle.append([b"0123456789"])
    handle.sync()
    fs.sync_directory(ROOT)
    handle.truncate(4)
    handle.append([b"xyz"])
    cut_to_durable(sim, ROOT)
    assert _files(sim) == {"seg": b"0123"}


def test_an_atomic_replace_survives_whole_and_files_found_on_disk_count_as_durable() -> None:
    sim = SimFileSystem(seed=2)
    sim.make_directory(ROOT)
    old = sim.open(f"{ROOT}/state", create=True)
    old.append([b"old"])  # written before the node had a manifest: taken as durable
    fs = ChaosFileSystem(sim, ROOT)
    write_file_atomically(fs, f"{ROOT}/state", b"new state")
    cut_to_durable(sim, ROOT)
    assert _files(sim) == {"state": b"new state"}


def test_the_manifest_survives_a_restart_of_the_node() -> None:
    sim, fs = _chaos()
    handle = fs.open(f"{ROOT}/seg", create=True)
    fs.sync_directory(ROOT)
    handle.append([b"synced"])
    handle.sync()
    handle.append([b"+lost"])
    # The node restarts without a cut (a plain kill), then is killed again with one.
    again = ChaosFileSystem(sim, ROOT)
    assert again.manifest == fs.manifest
    assert again.list_directory(ROOT) == ["seg"], "the manifest is hidden from the log"
    again.open(f"{ROOT}/seg").append([b"+more"])
    cut_to_durable(sim, ROOT)
    assert _files(sim) == {"seg": b"synced"}


def test_the_unsafe_node_never_syncs_its_partition_logs_so_the_cut_loses_their_writes() -> None:
    sim = SimFileSystem(seed=3)
    partition = f"{ROOT}/{UNSAFE_UNSYNCED_DIRECTORY}/t-0"
    sim.make_directory(partition)
    fs = ChaosFileSystem(sim, ROOT, skip_sync=True)
    for directory in (ROOT, partition):
        handle = fs.open(f"{directory}/seg", create=True)
        handle.append([b"acknowledged"])
        handle.sync()
        fs.sync_directory(directory)
        write_file_atomically(fs, f"{directory}/hard-state", b"vote")
    cut_to_durable(sim, ROOT)
    assert _files(sim) == {"seg": b"acknowledged", "hard-state": b"vote"}, "honest outside"
    assert sim.file_bytes(f"{partition}/seg") == b"", "the partition log's appends are gone"
    assert sim.file_bytes(f"{partition}/hard-state") == b"vote", "its hard state is honest"


def test_the_cut_command_cuts_a_stopped_node_by_hand(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fs = ChaosFileSystem(OsFileSystem(), str(tmp_path))
    handle = fs.open(str(tmp_path / "seg"), create=True)
    fs.sync_directory(str(tmp_path))
    handle.append([b"synced"])
    handle.sync()
    handle.append([b"+lost"])
    handle.close()
    assert main(["cut", str(tmp_path)]) == 0
    assert (tmp_path / "seg").read_bytes() == b"synced"
    assert '"bytes_cut": 5' in capsys.readouterr().out
    assert main(["cut", str(tmp_path)]) == 2, "cut already: the manifest is gone"
    assert "nothing to cut" in capsys.readouterr().err


def test_a_damaged_manifest_is_a_clear_error() -> None:
    sim, _ = _chaos()
    write_file_atomically(sim, f"{ROOT}/{DURABILITY_MANIFEST_NAME}", b"{not json")
    with pytest.raises(StorageError, match="not a durability manifest"):
        load_durability_manifest(sim, f"{ROOT}/{DURABILITY_MANIFEST_NAME}")


# One operation on both file systems: (kind, file number, size).
_OPS = st.lists(
    st.tuples(
        st.sampled_from(["create", "append", "sync", "sync_dir", "rename", "truncate_sync"]),
        st.integers(0, 3),
        st.integers(0, 20),
    ),
    max_size=40,
)


def _apply(fs: FileSystem, ops: list[tuple[str, int, int]]) -> None:
    """Operations both models agree on: no removal, and a rename never replaces a file (the
    cut cannot bring back a replaced file's bytes, the simulation can)."""
    handles = {}
    for kind, number, size in ops:
        path = f"{ROOT}/f{number}"
        if kind == "create":
            if not fs.exists(path):
                handles[path] = fs.open(path, create=True)
        elif kind == "sync_dir":
            fs.sync_directory(ROOT)
        elif kind == "rename":
            target = f"{ROOT}/f{(number + 1) % 4}"
            if fs.exists(path) and not fs.exists(target):
                fs.rename(path, target)
                handles[target] = handles.pop(path)
        elif path in handles:
            handle = handles[path]
            if kind == "append":
                handle.append([bytes([number]) * size])
            elif kind == "sync":
                handle.sync()
            else:
                handle.truncate(min(size, handle.size_bytes()))
                handle.sync()


def _check_cut_matches_power_loss(ops: list[tuple[str, int, int]]) -> None:
    reference = SimFileSystem(seed=0)
    reference.make_directory(ROOT)
    _apply(reference, ops)
    reference.crash(torn=False)
    sim, fs = _chaos()
    _apply(fs, ops)
    cut_to_durable(sim, ROOT)
    expected = {n: reference.file_bytes(f"{ROOT}/{n}") for n in reference.list_directory(ROOT)}
    assert _files(sim) == expected, ops


@given(_OPS)
@settings(max_examples=200, deadline=None)
def test_the_cut_leaves_what_the_simulated_power_loss_leaves(
    ops: list[tuple[str, int, int]],
) -> None:
    _check_cut_matches_power_loss(ops)


@pytest.mark.parametrize("seed", range(5))
def test_long_operation_sequences_too(seed: int) -> None:
    rng = random.Random(seed)
    kinds = ["create", "append", "sync", "sync_dir", "rename", "truncate_sync"]
    ops = [(rng.choice(kinds), rng.randrange(4), rng.randrange(30)) for _ in range(500)]
    _check_cut_matches_power_loss(ops)


def test_syncs_from_several_disk_threads_keep_one_consistent_manifest(tmp_path: Path) -> None:
    # The node syncs logs and saves hard states on several threads at once (runtime.host).
    fs = ChaosFileSystem(OsFileSystem(), str(tmp_path))
    handles = [fs.open(str(tmp_path / f"f{i}"), create=True) for i in range(4)]
    fs.sync_directory(str(tmp_path))

    def work(handle: FileHandle) -> None:
        for round_number in range(50):
            handle.append([bytes([round_number])])
            handle.sync()

    threads = [threading.Thread(target=work, args=(h,)) for h in handles]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    manifest = load_durability_manifest(OsFileSystem(), fs.manifest_path)
    assert {p: durable for p, (_, durable) in manifest.files.items()} == {
        f"f{i}": 50 for i in range(4)
    }
