"""Hard-state saves split for a host saving many groups at once: begin_save appends a
record on the loop, HardStateWrite.finish makes it durable on a disk thread."""

from __future__ import annotations

import pytest

from raftlog.errors import StorageError
from raftlog.raft.types import HardState
from raftlog.storage.hard_state import (
    HARD_STATE_RECORDS_MAX,
    FileHardStateStore,
    encode_hard_state,
)
from raftlog.storage.sim_file_system import SimFileSystem
from raftlog.types import NodeId, Term

RECORD_BYTES = len(encode_hard_state(HardState()))


def _size(sim: SimFileSystem, path: str) -> int:
    handle = sim.open(path)
    try:
        return handle.size_bytes()
    finally:
        handle.close()


def test_first_save_replaces_then_saves_append_and_the_last_record_wins() -> None:
    sim = SimFileSystem()
    store = FileHardStateStore("/n", files=sim)
    assert store.load() == HardState()
    store.begin_save(HardState(Term(1), NodeId(2))).finish()
    assert _size(sim, store.path) == RECORD_BYTES
    for term in range(2, 6):
        store.begin_save(HardState(Term(term), None)).finish()
    assert _size(sim, store.path) == 5 * RECORD_BYTES
    sim.crash()
    assert FileHardStateStore("/n", files=sim).load() == HardState(Term(5), None)


def test_an_unfinished_append_is_lost_whole_never_half() -> None:
    for seed in range(20):
        sim = SimFileSystem(seed)
        store = FileHardStateStore("/n", files=sim)
        store.load()
        store.begin_save(HardState(Term(1), NodeId(1))).finish()
        store.begin_save(HardState(Term(2), NodeId(2)))  # never finished: not durable
        sim.crash()
        reopened = FileHardStateStore("/n", files=sim)
        assert reopened.load() in (HardState(Term(1), NodeId(1)), HardState(Term(2), NodeId(2)))
        reopened.begin_save(HardState(Term(3), NodeId(3))).finish()
        sim.crash()
        assert FileHardStateStore("/n", files=sim).load() == HardState(Term(3), NodeId(3))


def test_a_full_file_is_rewritten_as_one_record() -> None:
    sim = SimFileSystem()
    store = FileHardStateStore("/n", files=sim)
    store.load()
    for term in range(1, HARD_STATE_RECORDS_MAX + 2):
        store.begin_save(HardState(Term(term), None)).finish()
        assert _size(sim, store.path) <= HARD_STATE_RECORDS_MAX * RECORD_BYTES
    assert FileHardStateStore("/n", files=sim).load() == HardState(
        Term(HARD_STATE_RECORDS_MAX + 1), None
    )


def test_a_corrupt_earlier_record_is_corruption() -> None:
    sim = SimFileSystem()
    store = FileHardStateStore("/n", files=sim)
    store.load()
    store.begin_save(HardState(Term(1), NodeId(1))).finish()
    store.begin_save(HardState(Term(2), NodeId(1))).finish()
    sim.corrupt(store.path, 6, b"\\xff")
    sim.corrupt(store.copy_path, 6, b"\\xff")
    with pytest.raises(StorageError, match=r"corrupt hard state /n/hard-state"):
        FileHardStateStore("/n", files=sim).load()


def test_begin_save_checks_the_order_at_once() -> None:
    store = FileHardStateStore("/n", files=SimFileSystem())
    store.load()
    store.begin_save(HardState(Term(3), NodeId(1)))
    with pytest.raises(AssertionError, match="may not become"):
        store.begin_save(HardState(Term(3), NodeId(2)))
