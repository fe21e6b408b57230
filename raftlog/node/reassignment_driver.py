"""Driving replica moves: the partition leader's side of a reassignment (KIP-455 style).

For each moving partition this node leads, `ReassignmentDriver.drive` takes the next
membership step `raftlog.metadata.reassignment.next_step` names (add a learner, promote it
once caught up, remove a replica, hand leadership away before removing itself), one change
at a time, and reports `CompleteReassignment` to the controller once the committed voters
are the target.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

from raftlog.errors import RaftlogError
from raftlog.metadata import ApplyResult, CompleteReassignment, MetadataState
from raftlog.metadata.reassignment import Complete, ProposeMembership, TransferLeadership, next_step
from raftlog.partition.replica import PartitionReplica
from raftlog.types import NodeId, RaftGroupId

__all__ = ["ReassignmentDriver"]

log = logging.getLogger(__name__)

# How long a completion report may take to commit before a later pass reports again.
_REPORT_TIMEOUT_S = 5.0


class ReassignmentDriver:
    def __init__(
        self,
        *,
        node_id: NodeId,
        metadata: Callable[[], MetadataState],
        replicas_by_raft_group: Mapping[RaftGroupId, PartitionReplica],
        submit: Callable[..., Awaitable[ApplyResult]],
        spawn: Callable[[Awaitable[None], str], None],
    ) -> None:
        self._node_id = node_id
        self._metadata = metadata
        self._replicas_by_group = replicas_by_raft_group
        self._submit = submit
        self._spawn = spawn
        self._completing: set[RaftGroupId] = set()  # CompleteReassignment reports in flight

    def drive(self) -> None:
        """One membership step of each move whose partition this node leads."""
        for info in self._metadata().moving_partitions():
            replica = self._replicas_by_group.get(info.raft_group_id)
            if replica is None or not replica.is_leader_ready():
                continue
            node = replica.group.node
            assert info.target is not None
            commit = node.commit_offset
            step = next_step(
                leader=self._node_id,
                membership=node.membership,
                membership_committed=node.membership_history.last_offset <= commit,
                target=info.target,
                caught_up=frozenset(n for n, p in node.progress.items() if p.match >= commit),
            )
            where = f"{info.topic}-{info.partition}"
            try:
                if isinstance(step, ProposeMembership):
                    node.propose_membership(step.membership)
                    log.info("node %s: %s membership -> %s", self._node_id, where, step.membership)
                elif isinstance(step, TransferLeadership):
                    if node.lead_transferee is None:
                        node.transfer_leadership(step.to)
                        log.info("node %s: %s leaves: leader -> %s", self._node_id, where, step.to)
                elif isinstance(step, Complete) and info.raft_group_id not in self._completing:
                    self._completing.add(info.raft_group_id)
                    complete = CompleteReassignment(
                        info.topic, info.partition, info.raft_group_id, info.target
                    )
                    self._spawn(self._report_completion(complete), f"complete-{info.raft_group_id}")
            except RaftlogError as error:  # retriable: not committed yet, lost leadership
                log.debug("node %s: %s move step %s: %s", self._node_id, where, step, error)
            replica.group.wake()

    async def _report_completion(self, command: CompleteReassignment) -> None:
        try:
            result = await self._submit(command, timeout_s=_REPORT_TIMEOUT_S)
            log.info(
                "node %s: move of group %s reported: %s",
                self._node_id,
                command.raft_group_id,
                result,
            )
        except (RaftlogError, TimeoutError, OSError) as error:
            log.info(
                "node %s: move of group %s not reported yet: %s",
                self._node_id,
                command.raft_group_id,
                error,
            )
        finally:
            self._completing.discard(command.raft_group_id)
