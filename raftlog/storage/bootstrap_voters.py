"""The voters a Raft group was created with, fixed in its directory when the directory is made.

Theory of operation. A partition group starts with the replicas the metadata assigned it; a
later move changes its membership through CONFIG entries, so the metadata's replica list
stops being the group's starting point. The starting voters are therefore written once, when
the group's directory is created, and read back at every later open (the membership of the
log before any CONFIG entry). The file is checksummed:

    b"RLBV", crc32c u32 of the rest, then Membership.encode() (JSON)

A file written before the checksum (plain JSON) is still read. A file that fails its checks
is damage: the caller is told (`BootstrapVoters.damage`) and gets the voters it offered, and
the file is rewritten with them; the group then abstains until a leader has refilled it
(`raftlog.raft.repair`), because its own view of the membership cannot be trusted.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from raftlog.raft.types import Membership
from raftlog.storage.batch import crc32c
from raftlog.storage.file_system import FileSystem, read_whole_file, write_file_atomically
from raftlog.types import NodeId

__all__ = ["BOOTSTRAP_VOTERS_FILE_NAME", "BootstrapVoters", "load_or_write_bootstrap_voters"]

BOOTSTRAP_VOTERS_FILE_NAME = "bootstrap-voters"
_MAGIC = b"RLBV"
_CRC = struct.Struct(">I")
_BYTES_MAX = 64 * 1024


@dataclass(frozen=True, slots=True)
class BootstrapVoters:
    voters: frozenset[NodeId]
    damage: str | None = None  # what was wrong with the file, if anything


def encode_bootstrap_voters(voters: frozenset[NodeId]) -> bytes:
    body = Membership(voters=voters).encode()
    return _MAGIC + _CRC.pack(crc32c(body)) + body


def decode_bootstrap_voters(data: bytes, *, path: str) -> frozenset[NodeId] | str:
    """The voters, or a sentence saying what is wrong."""
    if len(data) > _BYTES_MAX:
        return f"{path}: {len(data)} bytes, more than a voters file holds"
    if data.startswith(_MAGIC):
        head = len(_MAGIC) + _CRC.size
        if len(data) < head or _CRC.unpack_from(data, len(_MAGIC))[0] != crc32c(data[head:]):
            return f"{path}: fails its CRC32C"
        body = data[head:]
    else:
        body = data  # written before the checksum
    try:
        voters = Membership.decode(body).voters
    except (ValueError, KeyError, TypeError) as error:
        return f"{path}: not a voters file ({error})"
    return voters  # empty for a replica that joined through a move


def load_or_write_bootstrap_voters(
    files: FileSystem, directory: str, voters: frozenset[NodeId]
) -> BootstrapVoters:
    """The group's starting voters: read back, or `voters` written (durably) now (none for a
    replica joining through a move: it learns the membership from the leader)."""
    path = os.path.join(directory, BOOTSTRAP_VOTERS_FILE_NAME)
    if files.exists(path):
        found = decode_bootstrap_voters(read_whole_file(files, path), path=path)
        if not isinstance(found, str):
            return BootstrapVoters(found)
        write_file_atomically(files, path, encode_bootstrap_voters(voters))
        return BootstrapVoters(voters, damage=found)
    write_file_atomically(files, path, encode_bootstrap_voters(voters))
    return BootstrapVoters(voters)
