"""The consumer-group service: the coordinator of every consumer group, run by the controller.

Theory of operation. The controller (the metadata quorum's leader) coordinates every consumer
group. `ConsumerGroupService` wraps the pure `raftlog.metadata.consumer_groups`
coordinator with the node's ports: whether this node is the controller (and in which term),
the metadata state (partition counts, committed offsets), `submit` (commit a metadata
command) and a monotonic clock. Both front ends call it: the gRPC Groups service
(`raftlog.rpc.consumer_group_servicer`) and KIP-848's ConsumerGroupHeartbeat on the Kafka
listener (`raftlog.rpc.kafka.consumer_group_handlers`).

- Membership is soft state: when this node becomes controller, or is controller again in a
  new term, the coordinator is reset before it answers, so it never acts on membership it
  may have missed while another node coordinated. Members rebuild it with their next
  heartbeats (they list what they hold). A new controller coordinates only once it has
  applied an entry of its own term (`controller_term`, computed by
  `raftlog.node.controller_duties.controller_term_of`): before that its state may lack
  offsets the previous controller committed, and a fetch would send members back to
  `auto_offset_reset`.
- Expiry is lazy: every heartbeat first removes the members whose session (or revocation)
  timed out, in every group. A partition only moves when some member heartbeats, so nothing
  is lost by not having a timer.
- Offset commits are checked against ownership (`check_commit`), then replicated through the
  metadata quorum (`CommitGroupOffsets`) before the answer: a committed offset survives any
  failure the quorum survives. Offset fetches read the controller's applied state.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from raftlog.config import MetadataConfig
from raftlog.metadata.commands import ApplyResult, Command
from raftlog.metadata.consumer_groups import ConsumerGroupCoordinator, GroupLimits
from raftlog.metadata.state import MetadataState
from raftlog.types import NodeId

__all__ = ["TIMEOUT_MS_DEFAULT", "TIMEOUT_MS_MAX", "ConsumerGroupService", "monotonic_ms"]

TIMEOUT_MS_DEFAULT = 10_000
TIMEOUT_MS_MAX = 300_000


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


def group_limits(config: MetadataConfig) -> GroupLimits:
    return GroupLimits(
        session_timeout_ms=config.group_session_timeout_ms,
        heartbeat_interval_ms=config.group_heartbeat_interval_ms,
        rebalance_timeout_ms_max=config.group_rebalance_timeout_ms_max,
        groups_max=config.groups_max,
        members_max=config.group_members_max,
    )


@dataclass(slots=True)
class ConsumerGroupService:
    """The coordinator with the node's ports (module docstring)."""

    coordinator: ConsumerGroupCoordinator
    # The metadata term while this node is the controller, else None.
    controller_term: Callable[[], int | None]
    controller_id: Callable[[], NodeId | None]
    metadata: Callable[[], MetadataState]
    submit: Callable[..., Awaitable[ApplyResult]]
    clock_ms: Callable[[], int] = monotonic_ms
    _coordinating_term: int | None = None

    @classmethod
    def create(
        cls,
        config: MetadataConfig,
        *,
        controller_term: Callable[[], int | None],
        controller_id: Callable[[], NodeId | None],
        metadata: Callable[[], MetadataState],
        submit: Callable[..., Awaitable[ApplyResult]],
        clock_ms: Callable[[], int] = monotonic_ms,
    ) -> ConsumerGroupService:
        coordinator = ConsumerGroupCoordinator(group_limits(config))
        return cls(coordinator, controller_term, controller_id, metadata, submit, clock_ms)

    def coordinating(self) -> bool:
        """True when this node coordinates groups now; resets the coordinator on a new term."""
        term = self.controller_term()
        if term is None:
            if self._coordinating_term is not None:
                self.coordinator.reset(self.clock_ms())  # drop what a later term will rebuild
                self._coordinating_term = None
            return False
        if term != self._coordinating_term:
            self.coordinator.reset(self.clock_ms())
            self._coordinating_term = term
        assert self._coordinating_term == term
        return True

    def partition_counts(self) -> dict[str, int]:
        return {t.name: t.partition_count for t in self.metadata().topics()}

    async def submit_command(self, command: Command, timeout_ms: int) -> ApplyResult:
        timeout_s = (timeout_ms if 0 < timeout_ms <= TIMEOUT_MS_MAX else TIMEOUT_MS_DEFAULT) / 1000
        return await self.submit(command, timeout_s=timeout_s)
