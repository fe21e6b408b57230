"""A retried batch the leader appended but has not committed (a duplicate) is answered like
its original (raftlog.runtime.group.RaftGroup.waiter_for): at commit for acks=all, once
durable on the leader for acks=1, never before (Raft §5.3/§5.4: only a committed entry is
safe). Three real Raft groups over in-memory storage, driven by hand: a pass processes every
Ready, and messages to or from a cut node are held back, so nothing commits until the test
heals the cut and they arrive."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Coroutine
from typing import Any

import pytest

from raftlog.errors import ProposalDroppedError, RequestTimedOutError
from raftlog.partition.replica import ProduceResult
from raftlog.raft.types import Role
from raftlog.storage.records import RecordInput, encode_batch
from raftlog.types import Commitment, NodeId
from tests.unit.partition.replica_groups import CONFIG, LEADER, ReplicaGroups

TIMEOUT_S = 60.0  # never reached: the tests resolve every wait by driving the groups


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
    partition: ReplicaGroups, sequence: int, commitment: Commitment, timeout_s: float = TIMEOUT_S
) -> Coroutine[Any, Any, ProduceResult]:
    return partition.leader.produce([_batch(sequence)], commitment=commitment, timeout_s=timeout_s)


async def _original_behind_a_cut() -> tuple[ReplicaGroups, asyncio.Task[ProduceResult]]:
    """A leader whose followers are cut off, and an acks=all produce of sequence 0 on it."""
    partition = ReplicaGroups()
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
        partition = ReplicaGroups()
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


def test_batches_behind_a_refused_one_are_refused_alike_not_out_of_order() -> None:
    # A leader at its limit of uncommitted proposals refuses sequence 1; sequence 2, sent
    # behind it, must get the same retriable refusal: OUT_OF_ORDER_SEQUENCE would make
    # librdkafka bump its epoch and resend sequence 0 (already appended) under a new one.
    async def scenario() -> None:
        partition = ReplicaGroups(config=dataclasses.replace(CONFIG, proposals_max=1))
        partition.cut = {NodeId(2), NodeId(3)}
        original = await _started(_produce(partition, 0, Commitment.QUORUM))
        for sequence in (1, 2):
            with pytest.raises(ProposalDroppedError):
                await _produce(partition, sequence, Commitment.QUORUM)
        partition.heal()
        await original
        for sequence in (1, 2):  # the retries, in order, are appended (acks=0: no waiting)
            assert not (await _produce(partition, sequence, Commitment.NONE)).duplicate
            partition.settle()  # committed: room for the next one

    asyncio.run(scenario())
