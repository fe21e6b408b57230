"""Helpers for the Raft unit tests: one node driven by hand, with its disk and outbox."""

from __future__ import annotations

import random
from collections.abc import Iterable

from raftlog.config import RaftConfig
from raftlog.raft.memory import MemoryHardStateStore, MemoryStorage
from raftlog.raft.node import RaftNode
from raftlog.raft.types import Entry, EntryKind, HardState, Membership, Message, ReadState, Ready
from raftlog.runtime.ready import process_ready
from raftlog.types import NodeId, Offset, Term


def ids(*numbers: int) -> frozenset[NodeId]:
    return frozenset(NodeId(n) for n in numbers)


def data_entry(term: int, offset: int, count: int = 1, data: bytes = b"x") -> Entry:
    return Entry(Term(term), Offset(offset), count, EntryKind.DATA, data)


class Harness:
    """A single RaftNode with a MemoryStorage; `process()` runs one Ready through it."""

    def __init__(
        self,
        node_id: int = 1,
        *,
        voters: Iterable[int] = (1, 2, 3),
        learners: Iterable[int] = (),
        config: RaftConfig | None = None,
        entries: Iterable[Entry] = (),
        hard_state: HardState | None = None,
    ) -> None:
        self.storage = MemoryStorage()
        self.storage.append(list(entries))
        self.storage.sync()
        self.store = MemoryHardStateStore(hard_state)
        self.membership = Membership(ids(*voters), ids(*learners))
        self.node = RaftNode(
            node_id=NodeId(node_id),
            config=config or RaftConfig(),
            storage=self.storage,
            hard_state=self.store.load(),
            rng=random.Random(node_id),
            bootstrap_membership=self.membership,
        )
        self.sent: list[Message] = []
        self.applied: list[Entry] = []
        self.reads: list[ReadState] = []

    def process(self) -> Ready:
        return process_ready(
            self.node,
            log=self.storage,
            hard_state_store=self.store,
            send=self.sent.append,
            apply=self.applied.append,
            restore=lambda snapshot: None,
            on_read=self.reads.append,
        )

    def drain(self) -> list[Message]:
        """Process every Ready; return (and forget) the messages sent."""
        while self.node.has_ready():
            self.process()
        sent, self.sent = self.sent, []
        return sent

    def step(self, message: Message) -> list[Message]:
        self.node.step(message)
        return self.drain()

    def tick(self, times: int = 1) -> list[Message]:
        for _ in range(times):
            self.node.tick()
        return self.drain()
