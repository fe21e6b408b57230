"""Partition leadership moves a node makes on its own, and leader reports to the controller.

- A partition leader reports itself (`ReportLeader`) so the metadata routes clients to it,
  and re-reports what the metadata does not show yet (a report made right after an election
  can be lost with the controller it was forwarded to).
- A fenced node transfers its leaderships away (Raft §3.10), preferring an in-sync voter, at
  a bounded rate, and stops as soon as it is unfenced.
- A leader hands leadership back to the preferred replica once it is in sync (Kafka's ISR
  rule, `RaftNode.is_in_sync`), so leadership that piled up on survivors spreads again.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Mapping

from raftlog.errors import RaftlogError
from raftlog.metadata import ApplyResult, Command, MetadataState, ReportLeader
from raftlog.partition.replica import PartitionReplica
from raftlog.raft.types import Role
from raftlog.runtime.clock import MonotonicClock
from raftlog.runtime.group import RaftGroup
from raftlog.runtime.rate import TokenBucket
from raftlog.types import NodeId, PartitionId, RaftGroupId

__all__ = ["LeadershipMoves"]

log = logging.getLogger(__name__)

# How long a leader report may take to commit before the next pass reports again.
_REPORT_TIMEOUT_S = 5.0


class LeadershipMoves:
    def __init__(
        self,
        *,
        node_id: NodeId,
        metadata: Callable[[], MetadataState],
        replicas: Mapping[tuple[str, int], PartitionReplica],
        replicas_by_raft_group: Mapping[RaftGroupId, PartitionReplica],
        rng: random.Random,
        submit: Callable[..., Awaitable[ApplyResult]],
        spawn: Callable[[Awaitable[None], str], None],
        clock: MonotonicClock,
        fenced_transfers_per_s_max: int,
        reports_in_flight_max: int,
    ) -> None:
        assert fenced_transfers_per_s_max > 0 and reports_in_flight_max > 0
        self._node_id = node_id
        self._transfers = TokenBucket(fenced_transfers_per_s_max, clock)
        self._metadata = metadata
        self._replicas = replicas
        self._replicas_by_group = replicas_by_raft_group
        self._rng = rng
        self._submit = submit
        self._spawn = spawn
        # Partition groups whose leadership report is in flight (one each, a bounded number).
        self._reporting: set[RaftGroupId] = set()
        self._reports_in_flight_max = reports_in_flight_max

    def on_leadership_change(self, group: RaftGroup, *, quiet: bool = False) -> None:
        """Log a partition group's new role; as its leader, report it to the controller."""
        replica = self._replicas_by_group.get(group.raft_group_id)
        if replica is None:
            return
        node = group.node
        log.log(
            logging.DEBUG if quiet else logging.INFO,
            "node %s: %s-%s is now %s in term %s (leader %s); cause: %s",
            self._node_id,
            replica.topic,
            replica.partition,
            node.role.value,
            node.term,
            node.leader_id,
            node.role_cause,
        )
        if node.role is not Role.LEADER:
            return
        if group.raft_group_id in self._reporting:
            return  # the report in flight names the group; a newer term is reported later
        if len(self._reporting) >= self._reports_in_flight_max:
            return  # report_stale_leaders reports it on a later liveness turn
        command = ReportLeader(
            topic=replica.topic,
            partition=PartitionId(replica.partition),
            raft_group_id=group.raft_group_id,
            leader_id=self._node_id,
            epoch=int(group.node.term),
        )
        self._reporting.add(group.raft_group_id)
        assert len(self._reporting) <= self._reports_in_flight_max
        self._spawn(
            self._report(group.raft_group_id, command), f"report-leader-{group.raft_group_id}"
        )

    async def _report(self, raft_group_id: RaftGroupId, command: Command) -> None:
        try:
            with contextlib.suppress(RaftlogError, TimeoutError, OSError):
                await self._submit(command, timeout_s=_REPORT_TIMEOUT_S)
        finally:
            self._reporting.discard(raft_group_id)

    def report_stale_leaders(self) -> None:
        """Re-report leadership the metadata does not show yet.

        A report made right after an election can be lost (the controller it was forwarded
        to had just died); clients route by the metadata, so a lost report would send them
        to a former leader until the next election. Each pass repairs that.
        """
        state = self._metadata()
        for replica in self._replicas.values():
            node = replica.group.node
            info = state.partition(replica.topic, replica.partition)
            if info is None or node.role is not Role.LEADER:
                continue
            if info.leader_id == self._node_id and info.leader_epoch >= node.term:
                continue
            self.on_leadership_change(replica.group, quiet=True)

    def step_down_fenced(self, cause: str) -> None:
        """Transfer partitions this fenced node leads to a voter the metadata shows alive,
        one in sync if there is one (Raft §3.10; the core aborts a transfer that does not
        finish in time), at most `metadata.fenced_transfers_per_s_max` a second.

        No mass handoff: a node fenced because it was slow must not add an election per
        partition to its own and its peers' load (that load fences more nodes). The caller
        stops calling as soon as the node is unfenced, so what is left stays put."""
        state = self._metadata()
        for replica in self._replicas.values():
            if not self._transfers.available():
                return
            node = replica.group.node
            if node.role is not Role.LEADER or node.lead_transferee is not None:
                continue
            candidates = [
                n
                for n in sorted(node.membership.voters - {self._node_id})
                if (info := state.node(n)) is not None and info.alive
            ]
            if not candidates:
                continue
            # An in-sync voter takes over in a round trip; another only after catching up.
            in_sync = [n for n in candidates if node.is_in_sync(n)]
            to = self._rng.choice(in_sync or candidates)
            self._transfers.take()
            log.info(
                "node %s: fenced (%s); handing %s-%s to node %s (%s, %d/s at most)",
                self._node_id,
                cause,
                replica.topic,
                replica.partition,
                to,
                "in sync" if to in in_sync else "catching up first",
                self._transfers.per_s_max,
            )
            with contextlib.suppress(RaftlogError):
                node.transfer_leadership(to)
                replica.group.wake()

    def move_leaders_to_preferred(self) -> None:
        """Hand partition leadership back to the preferred replica when it is in sync.

        After a failure, leadership piles up on the survivors; each leader gives it back on
        its own (no controller round trip), as Kafka moves it back to a preferred replica
        that is in the ISR: only to a follower the leader reaches, replicates to and that
        holds every committed entry (`RaftNode.is_in_sync`). The core's transfer (Raft
        §3.10) refuses proposals until the target has caught up, or aborts after an election
        timeout, so a transfer toward a node that is down but still shown alive (until its
        lease runs out) would stall produce on every pass; a lagging target is tried again
        at a later pass, once it has caught up.
        """
        state = self._metadata()
        for replica in self._replicas.values():
            node = replica.group.node
            info = state.partition(replica.topic, replica.partition)
            if info is None or node.role is not Role.LEADER:
                continue
            # During a move the target's first replica is the one leadership goes back to.
            preferred = info.preferred_leader if info.target is None else info.target[0]
            target = state.node(preferred)
            if preferred == self._node_id or target is None or not target.alive:
                continue
            if preferred not in node.membership.voters or not replica.is_leader_ready():
                continue
            if not node.is_in_sync(preferred):
                continue
            with contextlib.suppress(RaftlogError):
                node.transfer_leadership(preferred)
                replica.group.wake()
