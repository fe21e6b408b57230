"""raftlog.raft: the pure Raft core (no I/O), its storage ports and in-memory fakes.

`RaftNode` is the engine; `raftlog.runtime.ready.process_ready` drives it. Values and
messages live in `raftlog.raft.types`, the storage protocols in `raftlog.raft.ports`.
"""

from raftlog.raft.memory import MemoryHardStateStore, MemoryStorage
from raftlog.raft.node import RaftNode
from raftlog.raft.ports import DurableLog, HardStateStore, LogStorage

__all__ = [
    "DurableLog",
    "HardStateStore",
    "LogStorage",
    "MemoryHardStateStore",
    "MemoryStorage",
    "RaftNode",
]
