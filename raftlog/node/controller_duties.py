"""What the controller (the metadata quorum's leader) does on each liveness pass.

`ControllerDuties.run` fences the nodes whose lease expired (silence measured by
`ControllerWatch` on this node's monotonic clock), makes registered nodes learners of the
metadata group (observers), steps decommissioning along and, with `metadata.auto_rebalance`,
starts the next automatic replica move. The decisions are the pure functions of
`raftlog.metadata.controller`; this module gathers their inputs and commits their commands.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable

from raftlog.config import NodeConfig
from raftlog.errors import RaftlogError
from raftlog.metadata import (
    ApplyResult,
    Command,
    CompleteDecommission,
    MetadataState,
    auto_rebalance_step,
    decommission_step,
    fences_by_silence,
)
from raftlog.node.leases import ControllerWatch
from raftlog.raft.types import Membership, Role
from raftlog.runtime.clock import MonotonicClock
from raftlog.runtime.group import RaftGroup
from raftlog.types import NodeId

__all__ = ["ControllerDuties", "controller_term_of"]

log = logging.getLogger(__name__)

# How long the controller waits for one of its own commands to commit.
_SUBMIT_TIMEOUT_S = 2.0


def controller_term_of(metadata_group: RaftGroup | None) -> int | None:
    """The metadata term while this node leads the metadata quorum and has applied its
    term's first entry (Raft §5.4.2: only then is everything committed before applied)."""
    if metadata_group is None:
        return None
    node = metadata_group.node
    if node.role is not Role.LEADER or node.term_start_offset < 0:
        return None
    if node.applied < node.term_start_offset:
        return None
    return int(node.term)


class ControllerDuties:
    def __init__(
        self,
        *,
        node_id: NodeId,
        config: NodeConfig,
        clock: MonotonicClock,
        watch: ControllerWatch,
        metadata_group: Callable[[], RaftGroup],
        metadata: Callable[[], MetadataState],
        submit: Callable[..., Awaitable[ApplyResult]],
    ) -> None:
        self._node_id = node_id
        self._config = config.metadata
        self._clock = clock
        self._watch = watch
        self._metadata_group = metadata_group
        self._metadata = metadata
        self._submit = submit

    async def run(self) -> None:
        """One pass of the controller's duties (called only while this node leads group 0)."""
        group = self._metadata_group()
        now = self._clock.monotonic()
        state = self._metadata()
        silent_ms = self._watch.silence_ms(
            int(group.node.term), [n.node_id for n in state.nodes()], now
        )
        for command in fences_by_silence(state, silent_ms, self._config.node_lease_ms):
            silence_ms = silent_ms[command.node_id]
            log.warning(
                "node %s: fencing node %s: lease timer: silent %s ms of loop time, %s ms past "
                "its %s ms lease (this controller's own loop lag so far: %.0f ms, not counted)",
                self._node_id, command.node_id, silence_ms,
                silence_ms - self._config.node_lease_ms, self._config.node_lease_ms,
                self._watch.loop_lag_ms(),
            )  # fmt: skip
            await self._submit_quietly(command)
        self._add_metadata_learners()
        await self._decommission_step(silent_ms)
        if self._config.auto_rebalance:
            await self._auto_rebalance(now, silent_ms)

    async def _submit_quietly(self, command: Command) -> None:
        # A command that does not commit now is planned again at the next pass.
        with contextlib.suppress(RaftlogError, TimeoutError):
            await self._submit(command, timeout_s=_SUBMIT_TIMEOUT_S)

    def _add_metadata_learners(self) -> None:
        """Make every registered, alive node that is not a member of the metadata group a
        learner of it (observers): one membership change at a time, once the previous one
        committed, as the core requires."""
        group = self._metadata_group()
        node = group.node
        membership = node.membership
        if node.membership_history.last_offset > node.commit_offset:
            return
        for info in self._metadata().nodes():
            # A node being decommissioned is never (re)added: it is on its way out.
            if info.placeable and info.node_id not in membership.members:
                learners = membership.learners | {info.node_id}
                with contextlib.suppress(RaftlogError):
                    node.propose_membership(Membership(membership.voters, learners))
                    log.info("node %s: node %s joins the metadata quorum as a learner",
                             self._node_id, info.node_id)  # fmt: skip
                    group.wake()
                return

    def _recent_ms(self) -> int:
        """A node heard from within this is live enough to receive a replica."""
        return 2 * self._config.node_heartbeat_interval_ms

    async def _decommission_step(self, silent_ms: dict[NodeId, int]) -> None:
        """The next step of decommissioning nodes (controller.decommission_step): one replica
        move at a time to a node heard from recently; once a node hosts nothing, remove it
        from the metadata group's learners (one membership change, once the previous one
        committed), then mark it decommissioned."""
        recent_ms = self._recent_ms()
        live = {n for n, silence in silent_ms.items() if silence < recent_ms}
        step = decommission_step(self._metadata(), live)
        if step is None:
            return
        if isinstance(step, CompleteDecommission):
            group = self._metadata_group()
            node = group.node
            membership = node.membership
            if step.node_id in membership.members:
                if step.node_id in membership.voters:
                    return  # never: voters are refused at the request (plan_decommission)
                if node.membership_history.last_offset > node.commit_offset:
                    return  # the previous membership change is not committed yet
                with contextlib.suppress(RaftlogError):
                    node.propose_membership(
                        Membership(membership.voters, membership.learners - {step.node_id})
                    )
                    log.info("node %s: node %s leaves the metadata quorum (decommissioned)",
                             self._node_id, step.node_id)  # fmt: skip
                    group.wake()
                return
            if node.membership_history.last_offset > node.commit_offset:
                return
            log.info("node %s: node %s is decommissioned", self._node_id, step.node_id)
        else:
            log.info("node %s: decommissioning: %s-%s -> %s", self._node_id, step.topic,
                     step.partition, list(step.replicas))  # fmt: skip
        await self._submit_quietly(step)

    async def _auto_rebalance(self, now: float, silent_ms: dict[NodeId, int]) -> None:
        """Start the next automatic replica move, if one is due (controller.auto_rebalance_step),
        between nodes alive without interruption for `metadata.rebalance_grace_ms`."""
        state = self._metadata()
        alive_for_ms = self._watch.alive_for_ms(state.nodes(), silent_ms, self._recent_ms(), now)
        command = auto_rebalance_step(state, alive_for_ms, self._config.rebalance_grace_ms)
        if command is None:
            return
        log.info("node %s: rebalancing: %s-%s -> %s", self._node_id, command.topic,
                 command.partition, list(command.replicas))  # fmt: skip
        await self._submit_quietly(command)
