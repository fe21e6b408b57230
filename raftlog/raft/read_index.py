"""ReadIndex: linearizable reads without writing to the log (Raft dissertation §6.4).

Theory of operation. A read request records the leader's commit offset, then the leader
confirms it is still the leader by a round of heartbeats carrying a fresh `read_context`;
once a majority of voters (itself included) answered a context, every read recorded at or
before that context is safe to serve at its commit offset, in order. A new leader first has
to commit an entry of its own term (its NOOP) to know the true commit offset, so reads that
arrive before then wait. All pending reads are dropped when leadership is lost (the driver
times them out and retries). The queue is bounded by `read_index_requests_max`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from raftlog.errors import ProposalDroppedError
from raftlog.raft import quorum, replication
from raftlog.raft.types import ReadState, Role
from raftlog.types import NodeId, Offset

if TYPE_CHECKING:
    from raftlog.raft.node import RaftNode

__all__ = ["ReadIndexQueue", "request"]


@dataclass(slots=True)
class PendingRead:
    request_id: int
    read_context: int
    commit_offset: Offset
    acks: set[NodeId] = field(default_factory=set)


class ReadIndexQueue:
    """A leader's reads: waiting for its first commit, then waiting for a quorum."""

    __slots__ = ("next_context", "pending", "waiting")

    def __init__(self) -> None:
        self.next_context = 1
        self.waiting: deque[int] = deque()  # request ids before the leader's first commit
        self.pending: deque[PendingRead] = deque()

    def __len__(self) -> int:
        return len(self.waiting) + len(self.pending)

    def latest_context(self) -> int:
        """The context heartbeats carry, so a lost confirmation round is retried."""
        return self.pending[-1].read_context if self.pending else 0

    def start(self, node: RaftNode, request_id: int) -> None:
        assert node.current_role is Role.LEADER and node.committed_in_term()
        voters = node.membership_history.current.voters
        if voters == {node.node_id}:
            node.read_states.append(ReadState(request_id, node.commit))  # a quorum of one
            return
        context = self.next_context
        self.next_context += 1
        self.pending.append(PendingRead(request_id, context, node.commit, {node.node_id}))
        replication.bcast_heartbeat(node, context)

    def on_commit(self, node: RaftNode) -> None:
        """The leader's first commit in its term releases the waiting reads."""
        if node.current_role is not Role.LEADER or not node.committed_in_term():
            return
        while self.waiting:
            self.start(node, self.waiting.popleft())
        assert not self.waiting

    def ack(self, node: RaftNode, sender: NodeId, read_context: int) -> None:
        """`sender` acknowledged our leadership after every read up to `read_context`."""
        assert node.current_role is Role.LEADER and read_context < self.next_context
        for read in self.pending:
            if read.read_context > read_context:
                break
            read.acks.add(sender)
        voters = node.membership_history.current.voters
        while self.pending and quorum.has_quorum(voters, self.pending[0].acks):
            read = self.pending.popleft()
            node.read_states.append(ReadState(read.request_id, read.commit_offset))
        assert all(read.read_context >= 1 for read in self.pending)


def request(node: RaftNode, request_id: int) -> None:
    queue = node.reads
    if len(queue) >= node.config.read_index_requests_max:
        raise ProposalDroppedError(
            f"{len(queue)} reads pending reach read_index_requests_max "
            f"({node.config.read_index_requests_max})"
        )
    if node.committed_in_term():
        queue.start(node, request_id)
    else:
        queue.waiting.append(request_id)
    assert len(queue) <= node.config.read_index_requests_max
