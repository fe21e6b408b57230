"""Hard state (Raft §5.1 currentTerm, votedFor): atomic, checksummed, apart from the log."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raftlog.errors import StorageError
from raftlog.raft.types import HardState
from raftlog.storage.file_system import FileSystem
from raftlog.storage.hard_state import FileHardStateStore, encode_hard_state
from raftlog.storage.sim_file_system import SimFileSystem
from raftlog.types import NodeId, Term


def test_fresh_store_is_term_zero_without_vote(files_and_dir: tuple[FileSystem, str]) -> None:
    files, directory = files_and_dir
    assert FileHardStateStore(directory, files=files).load() == HardState()


def test_save_then_load_round_trips(files_and_dir: tuple[FileSystem, str]) -> None:
    files, directory = files_and_dir
    store = FileHardStateStore(directory, files=files)
    for state in (HardState(Term(3), NodeId(2)), HardState(Term(4), None)):
        store.save(state)
        assert store.load() == state
        assert FileHardStateStore(directory, files=files).load() == state


def test_every_flipped_byte_is_detected_and_the_other_copy_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    good = encode_hard_state(HardState(Term(9), NodeId(1)))
    for position in range(len(good) - 4):  # the last 4 bytes are reserved
        for damaged in ("path", "copy_path"):
            sim = SimFileSystem()
            store = FileHardStateStore("/n", files=sim)
            store.save(HardState(Term(9), NodeId(1)))
            path = getattr(store, damaged)
            sim.corrupt(path, position, bytes([good[position] ^ 0x40]))
            caplog.clear()
            assert store.load() == HardState(Term(9), NodeId(1))
            assert f"corrupt hard state {path}" in caplog.text
            # The next save rewrites the damaged copy: the other may now fail too.
            store.begin_save(HardState(Term(10), None)).finish()
            other = store.copy_path if damaged == "path" else store.path
            sim.corrupt(other, 0, b"X")
            assert FileHardStateStore("/n", files=sim).load() == HardState(Term(10), None)


def test_both_copies_damaged_is_an_error_naming_both() -> None:
    good = encode_hard_state(HardState(Term(9), NodeId(1)))
    sim = SimFileSystem()
    store = FileHardStateStore("/n", files=sim)
    store.save(HardState(Term(9), NodeId(1)))
    for path in (store.path, store.copy_path):
        sim.corrupt(path, 9, bytes([good[9] ^ 0x01]))
    with pytest.raises(StorageError, match=r"/n/hard-state: .*/n/hard-state.copy: "):
        store.load()


def test_one_deleted_copy_loses_nothing() -> None:
    sim = SimFileSystem()
    store = FileHardStateStore("/n", files=sim)
    store.save(HardState(Term(4), NodeId(3)))
    sim.remove(store.path)
    assert FileHardStateStore("/n", files=sim).load() == HardState(Term(4), NodeId(3))


def test_truncated_file_is_corrupt(tmp_path: Path) -> None:
    directory = os.fspath(tmp_path)
    store = FileHardStateStore(directory)
    store.save(HardState(Term(1), NodeId(1)))
    for path in (store.path, store.copy_path):
        with open(path, "r+b") as file:
            file.truncate(10)
    with pytest.raises(StorageError, match="10 bytes, expected 29"):
        store.load()


def test_a_crash_during_save_leaves_old_or_new_never_neither() -> None:
    for seed in range(20):
        sim = SimFileSystem(seed)
        store = FileHardStateStore("/n", files=sim)
        store.save(HardState(Term(1), NodeId(1)))
        # A save interrupted after writing its temporary file, before the rename.
        handle = sim.open(store.path + ".tmp", create=True)
        handle.append([encode_hard_state(HardState(Term(2), NodeId(2)))[:7]])
        sim.crash()
        reopened = FileHardStateStore("/n", files=sim)
        assert reopened.load() == HardState(Term(1), NodeId(1))
        reopened.save(HardState(Term(2), NodeId(3)))
        sim.crash()
        assert FileHardStateStore("/n", files=sim).load() == HardState(Term(2), NodeId(3))


def test_a_term_going_back_or_a_changed_vote_is_refused() -> None:
    store = FileHardStateStore("/n", files=SimFileSystem())
    store.save(HardState(Term(3), NodeId(1)))
    with pytest.raises(AssertionError, match="may not become"):
        store.save(HardState(Term(2), None))  # Raft §5.1: terms only increase
    with pytest.raises(AssertionError, match="may not become"):
        store.save(HardState(Term(3), NodeId(2)))  # one vote per term
    store.save(HardState(Term(3), NodeId(1)))  # saving the same state again is fine
