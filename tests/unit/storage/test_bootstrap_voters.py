"""A group's bootstrap voters: written once, checksummed, damage reported (never a default
read silently), the plain JSON of older directories still read."""

from __future__ import annotations

from raftlog.raft.types import Membership
from raftlog.storage.bootstrap_voters import (
    BOOTSTRAP_VOTERS_FILE_NAME,
    load_or_write_bootstrap_voters,
)
from raftlog.storage.file_system import write_file_atomically
from raftlog.storage.sim_file_system import SimFileSystem
from raftlog.types import NodeId

VOTERS = frozenset({NodeId(1), NodeId(2), NodeId(3)})
OTHERS = frozenset({NodeId(4), NodeId(5), NodeId(6)})
PATH = f"/g/{BOOTSTRAP_VOTERS_FILE_NAME}"


def _sim() -> SimFileSystem:
    sim = SimFileSystem()
    sim.make_directory("/g")
    return sim


def test_written_once_then_read_back_whatever_is_offered() -> None:
    sim = _sim()
    assert load_or_write_bootstrap_voters(sim, "/g", VOTERS).voters == VOTERS
    sim.crash()
    again = load_or_write_bootstrap_voters(sim, "/g", OTHERS)
    assert again.voters == VOTERS and again.damage is None


def test_every_flipped_byte_is_damage_and_the_offered_voters_are_written() -> None:
    sim = _sim()
    load_or_write_bootstrap_voters(sim, "/g", VOTERS)
    size = len(sim.file_bytes(PATH))
    for position in range(size):
        sim.corrupt(PATH, position, bytes([sim.file_bytes(PATH)[position] ^ 0x08]))
        found = load_or_write_bootstrap_voters(sim, "/g", OTHERS)
        assert found.damage is not None and PATH in found.damage, position
        assert found.voters == OTHERS
        write_file_atomically(sim, PATH, sim.file_bytes(PATH))  # rewritten: valid again
        assert load_or_write_bootstrap_voters(sim, "/g", VOTERS).voters == OTHERS
        load_or_write_bootstrap_voters(sim, "/g", VOTERS)
        sim.remove(PATH)
        load_or_write_bootstrap_voters(sim, "/g", VOTERS)


def test_the_plain_json_of_older_directories_is_still_read() -> None:
    sim = _sim()
    write_file_atomically(sim, PATH, Membership(voters=VOTERS).encode())
    found = load_or_write_bootstrap_voters(sim, "/g", OTHERS)
    assert found.voters == VOTERS and found.damage is None


def test_a_replica_joining_through_a_move_starts_with_no_voters() -> None:
    sim = _sim()
    assert load_or_write_bootstrap_voters(sim, "/g", frozenset()).voters == frozenset()
    found = load_or_write_bootstrap_voters(sim, "/g", VOTERS)
    assert found.voters == frozenset() and found.damage is None
