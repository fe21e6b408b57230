"""Pins the public API of the Raft core (h11's habit): a change here is a deliberate one."""

from __future__ import annotations

import inspect

import raftlog.raft
from raftlog.raft.node import RaftNode
from raftlog.runtime.ready import process_ready


def test_package_exports() -> None:
    assert sorted(raftlog.raft.__all__) == [
        "DurableLog",
        "HardStateStore",
        "LogStorage",
        "MemoryHardStateStore",
        "MemoryStorage",
        "RaftNode",
    ]


def test_raft_node_signatures() -> None:
    assert str(inspect.signature(RaftNode.__init__)) == (
        "(self, *, node_id: 'NodeId', config: 'RaftConfig', storage: 'LogStorage', "
        "hard_state: 'HardState', rng: 'random.Random', "
        "bootstrap_membership: 'Membership | None' = None, "
        "applied_offset: 'Offset' = -1, repair_offset: 'Offset | None' = None) -> 'None'"
    )
    methods = {
        "tick": "(self) -> 'None'",
        "step": "(self, message: 'Message') -> 'None'",
        "propose": "(self, data: 'bytes', *, offset_count: 'int') -> 'Offset'",
        "propose_membership": "(self, membership: 'Membership') -> 'Offset'",
        "campaign": "(self) -> 'None'",
        "transfer_leadership": "(self, to: 'NodeId') -> 'None'",
        "read_index": "(self, request_id: 'int') -> 'None'",
        "has_ready": "(self) -> 'bool'",
        "ready": "(self) -> 'Ready'",
        "advance": "(self, ready: 'Ready') -> 'None'",
    }
    for name, signature in methods.items():
        assert str(inspect.signature(getattr(RaftNode, name))) == signature, name
    for name in ("node_id", "role", "term", "leader_id", "commit_offset", "last_offset"):
        assert isinstance(getattr(RaftNode, name), property), name
    assert isinstance(RaftNode.membership, property)


def test_process_ready_signature() -> None:
    assert list(inspect.signature(process_ready).parameters) == [
        "node",
        "log",
        "hard_state_store",
        "send",
        "apply",
        "restore",
        "on_read",
    ]
