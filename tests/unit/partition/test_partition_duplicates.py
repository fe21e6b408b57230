"""A retried batch the leader appended but has not committed (a duplicate) is answered like
its original (raftlog.runtime.group.RaftGroup.waiter_for): at commit for acks=all, once
durable on the leader for acks=1, never before (Raft §5.3/§5.4: only a committed entry is
safe). Three real Raft groups over in-memory storage, driven by hand: a pass processes every
Ready, and messages to or from a cut node are held back, so nothing commits until the test
heals the cut and they arrive."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Coroutine
from typing import Any

import pytest

from raftlog.config import LogConfig, RaftConfig
from raftlog.errors import ProposalDroppedError, RequestTimedOutError
from raftlog.partition.replica import PartitionReplica, ProduceResult
from raftlog.raft.memory import MemoryHardStateStore, MemoryStorage
from raftlog.raft.node import RaftNode
from raftlog.raft.types import Membership, Message, Role
from raftlog.runtime.group import Commitment, RaftGroup
from raftlog.runtime.ready import complete_ready, persist_ready
from raftlog.storage.records import RecordInput, encode_batch
from raftlog.types import GroupId, NodeId

NODES = (NodeId(1), NodeId(2), NodeId(3))
LEADER = NodeId(1)
CONFIG = RaftConfig()
TIMEOUT_S = 60.0  # never reached: the tests resolve every wait by driving the groups


class _NoReads:
    """The consumer side of a partition log; produce never reads it."""

    def log_start_offset(self) -> int:
        raise AssertionError("produce does not read the log")

    def read(self, offset: int, *, bytes_max: int, end_offset: int | None = None) -> bytes:
        raise AssertionError("produce does not read the log")

    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        raise AssertionError("produce does not read the log")


class _Partition:
    def __init__(self) -> None:
        membership = Membership(voters=frozenset(NODES))
        self.cut: set[NodeId] = set()
        self.inbox: list[Message] = []
        self.held: list[Message] = []
        self.groups: dict[NodeId, RaftGroup] = {}
        self.replicas: dict[NodeId, PartitionReplica] = {}
        for node_id in NODES:
            storage = MemoryStorage()
            replica = PartitionReplica(topic="t", partition=0, log=_NoReads(), config=LogConfig())
            node = RaftNode(
                node_id=node_id,
                config=CONFIG,
                storage=storage,
                hard_state=MemoryHardStateStore().load(),
                rng=random.Random(node_id),
                bootstrap_membership=membership,
            )
            group = RaftGroup(
                group_id=GroupId(0),
                node=node,
                log=storage,
                hard_state_store=MemoryHardStateStore(),
                state_machine=replica,
                config=CONFIG,
                bootstrap_membership=membership,
            )
            replica.attach(group)
            self.groups[node_id], self.replicas[node_id] = group, replica
        self.groups[LEADER].node.campaign()
        self.settle()
        assert self.replicas[LEADER].is_leader_ready()

    @property
    def leader(self) -> PartitionReplica:
        return self.replicas[LEADER]

    def heal(self) -> None:
        self.cut = set()
        self.inbox.extend(self.held)
        self.held = []
        self.settle()

    def _send(self, message: Message) -> None:
        cut = message.sender in self.cut or message.receiver in self.cut
        (self.held if cut else self.inbox).append(message)

    def settle(self) -> None:
        """Process Readys (persist, then sync, then acknowledge and apply, as the host does)
        and deliver messages until nothing is left."""
        busy = True
        while busy:
            busy = False
            for group in self.groups.values():
                if group.node.has_ready():
                    self._process(group)
                    busy = True
            inbox, self.inbox = self.inbox, []
            for message in inbox:
                self.groups[message.receiver].node.step(message)
            busy = busy or bool(inbox)

    def _process(self, group: RaftGroup) -> None:
        node = group.node
        ready = node.ready()
        persist_ready(
            node,
            ready,
            log=group.log,
            hard_state_store=group.hard_state_store,
            send=self._send,
            restore=group.restore,
        )
        group.log.sync()
        if ready.entries:
            group.on_durable(ready.entries[-1].last_offset)
        complete_ready(node, ready, send=self._send, apply=group.apply, on_read=group.on_read)


def _batch(sequence: int) -> bytes:
    return encode_batch(
        [RecordInput(None, b"value", 0)], producer_id=7, producer_epoch=0, base_sequence=sequence
    )


async def _started(
    coroutine: Coroutine[Any, Any, ProduceResult],
) -> asyncio.Task[ProduceResult]:
    """A produce running until it waits (for its proposal, or its original)."""
    task = asyncio.ensure_future(coroutine)
    for _ in range(3):
        await asyncio.sleep(0)
    return task


def _produce(
    partition: _Partition, sequence: int, commitment: Commitment, timeout_s: float = TIMEOUT_S
) -> Coroutine[Any, Any, ProduceResult]:
    return partition.leader.produce([_batch(sequence)], commitment=commitment, timeout_s=timeout_s)


async def _original_behind_a_cut() -> tuple[_Partition, asyncio.Task[ProduceResult]]:
    """A leader whose followers are cut off, and an acks=all produce of sequence 0 on it."""
    partition = _Partition()
    partition.cut = {NodeId(2), NodeId(3)}
    return partition, await _started(_produce(partition, 0, Commitment.QUORUM))


def test_a_duplicate_under_acks_all_is_answered_only_once_its_original_commits() -> None:
    async def scenario() -> None:
        partition, original = await _original_behind_a_cut()
        partition.settle()  # durable on the leader, not committed
        retry = await _started(_produce(partition, 0, Commitment.QUORUM))
        assert not original.done() and not retry.done()
        partition.heal()
        first, again = await original, await retry
        assert again.duplicate and not first.duplicate
        assert (again.base_offset, again.last_offset) == (first.base_offset, first.last_offset)
        assert again.high_watermark > again.last_offset

    asyncio.run(scenario())


def test_a_duplicate_under_acks_1_is_answered_once_its_original_is_durable_on_the_leader() -> None:
    async def scenario() -> None:
        partition, original = await _original_behind_a_cut()
        retry = await _started(_produce(partition, 0, Commitment.LEADER))
        assert not retry.done(), "not yet durable: the leader has not persisted its Ready"
        partition.settle()
        for _ in range(3):
            await asyncio.sleep(0)
        assert retry.done() and retry.result().duplicate
        assert retry.result().last_offset >= retry.result().high_watermark, "not committed"
        assert not original.done(), "acks=all still waits for the commit"
        original.cancel()

    asyncio.run(scenario())


def test_a_duplicate_that_times_out_leaves_its_original_waiting() -> None:
    async def scenario() -> None:
        partition, original = await _original_behind_a_cut()
        partition.settle()
        with pytest.raises(RequestTimedOutError, match="retried batch"):
            await _produce(partition, 0, Commitment.QUORUM, timeout_s=0.0)
        assert not original.done(), "the retry's timeout must not cancel the original"
        partition.heal()
        assert not (await original).duplicate
        assert partition.groups[LEADER].node.role is Role.LEADER

    asyncio.run(scenario())


def test_a_duplicate_fails_with_its_original_when_a_new_leader_replaces_it() -> None:
    """Raft §5.3: the entry a deposed leader appended is truncated by the next leader's log;
    the original proposal and its duplicate are both told, neither is acknowledged."""

    async def scenario() -> None:
        partition = _Partition()
        partition.cut = {LEADER}
        original = await _started(_produce(partition, 0, Commitment.QUORUM))
        partition.settle()
        retry = await _started(_produce(partition, 0, Commitment.QUORUM))
        others = [partition.groups[NodeId(2)].node, partition.groups[NodeId(3)].node]
        while not any(node.role is Role.LEADER for node in others):
            for node in others:
                node.tick()
            partition.settle()
        partition.heal()
        for task in (original, retry):
            with pytest.raises(ProposalDroppedError, match="replaced"):
                await task
        assert partition.groups[LEADER].node.role is Role.FOLLOWER

    asyncio.run(scenario())
