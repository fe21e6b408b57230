"""Controller decisions: pure functions from the metadata state (and the time) to commands.

Theory of operation. The metadata quorum's leader is the controller. It never changes the
state directly: it reads its `MetadataState`, decides here, proposes the resulting commands to
group 0, and answers the admin request once the command is committed and applied. Everything
here is a pure function of its arguments (time included), so a decision can be replayed, and
a decision made on a state that moved on before its command was applied is caught by the
command's own check at apply time (a stale plan is rejected, the controller plans again).

Duties:
- `plan_create_topic` / `plan_create_partitions`: validate the request against the state and
  `MetadataConfig`, place replicas on the nodes alive *now* (registered, unfenced, heartbeat
  within the lease) with `assign_replicas`, and hand out fresh group ids. Errors come back as
  an `ApplyResult` carrying the same codes `apply` uses.
- `expired_nodes`: a FenceNode for each unfenced node silent for a lease or more. A node's
  silence is measured from its last heartbeat or from when this controller took office,
  whichever is later: heartbeat times are the previous controller's clock, and a new
  controller first gives everyone one full lease (as KRaft does).
- `fences_by_silence`: the same, from silences the controller measured on its monotonic
  clock (what the runtime uses: wall clocks of different nodes are never compared).
- `preferred_leader_moves`: partitions led by another node although the preferred replica
  (replicas[0]) is alive; the runtime transfers leadership of those groups back to it.
- `rebalance_plan`: ReassignPartition commands that even out load among the alive nodes.
  Step 1 moves replicas from the fullest alive node to the emptiest one until replica counts
  differ by at most 1, one replica per partition per plan (so each ReassignPartition is one
  membership change of its group; the next plan continues); step 2 reorders replica lists
  (no data moves) until preferred-leader counts differ by at most 1 where replica sets
  allow. Only partitions whose replicas are all alive and that are not already moving are
  touched: a membership change of a group missing a member risks its majority, and a
  partition moves to one target at a time (load counts a moving partition at its target).
  Replicas are never moved *off* a dead node (it is expected back; a failed node is
  replaced by hand), so when a node returns its replicas are where it left them and only
  leadership moves back, by
  `preferred_leader_moves`. What `rebalance_plan` moves after a return are the partitions
  created while the node was away, and the same for a newly added node.
- `plan_decommission` / `decommission_step` (taking a node out): the admin request is
  refused for a voter of the metadata quorum (voters are fixed at bootstrap by `--peers`;
  only observers leave) and, by the command's own check, when some topic would be left with
  fewer active nodes than its replication factor. Once the node is decommissioning, no
  placement or rebalance puts a replica on it, and each step moves one replica off it (to
  the live, active node holding fewest replicas, in the same list position, so a preferred
  leadership moves with it) through the ordinary reassignment, one move at a time. When it
  hosts nothing the step says so (`CompleteDecommission`); the runtime first removes the
  node from the metadata quorum's learners, then proposes it.
- `auto_rebalance_step`: what the controller's duties run on their own (setting
  `metadata.auto_rebalance`): the first move of `rebalance_plan`, only when no move is under
  way and every node it involves has been alive (and heard from) for
  `metadata.rebalance_grace_ms`, so a node that just returned, or flaps, receives nothing
  until it has stayed up, and a cluster never runs two automatic moves at once.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from raftlog.config import MetadataConfig
from raftlog.metadata.assignment import NodeLoad, assign_replicas
from raftlog.metadata.commands import (
    ApplyResult,
    CompleteDecommission,
    CreatePartitions,
    CreateTopic,
    DecommissionNode,
    ErrorCode,
    FenceNode,
    ReassignPartition,
    check_topic_config,
    check_topic_name,
    reject,
)
from raftlog.metadata.state import MetadataState
from raftlog.types import NodeId, PartitionId, RaftGroupId

__all__ = [
    "CreateTopicRequest",
    "LeaderMove",
    "auto_rebalance_step",
    "decommission_step",
    "expired_nodes",
    "fences_by_silence",
    "live_node_ids",
    "node_loads",
    "plan_create_partitions",
    "plan_create_topic",
    "plan_decommission",
    "preferred_leader_moves",
    "rebalance_plan",
]

# Namespace of the deterministic topic ids (uuid5 over cluster id, name and first group id).
_TOPIC_ID_NAMESPACE = uuid.UUID("6f1c3a52-9a53-4f39-9a8e-2f54a2b7d0c1")


@dataclass(frozen=True, slots=True)
class CreateTopicRequest:
    name: str
    partition_count: int
    replication_factor: int
    config: Mapping[str, str] = field(default_factory=dict, hash=False)
    # Each partition's replicas, the first its preferred leader, as an operator chose them
    # (Kafka's manual replica assignment); None: the controller places them.
    assignments: tuple[tuple[NodeId, ...], ...] | None = None


@dataclass(frozen=True, slots=True)
class LeaderMove:
    """Transfer leadership of `raft_group_id` from `from_leader` to the preferred `to_leader`."""

    topic: str
    partition: PartitionId
    raft_group_id: RaftGroupId
    from_leader: NodeId
    to_leader: NodeId


def live_node_ids(state: MetadataState, now_ms: int, lease_ms: int) -> tuple[NodeId, ...]:
    """Nodes that take new replicas (unfenced, not leaving) and were heard from within the
    lease, in id order."""
    assert lease_ms > 0, lease_ms
    return tuple(
        n.node_id for n in state.nodes() if n.placeable and now_ms - n.last_heartbeat_ms < lease_ms
    )


def node_loads(state: MetadataState) -> dict[NodeId, NodeLoad]:
    """Preferred leaderships and replicas per registered node (zero for idle nodes)."""
    leaders = {n.node_id: 0 for n in state.nodes()}
    replicas = dict(leaders)
    for p in state.all_partitions():
        # A partition being moved already counts where it is going.
        assignment = p.replicas if p.target is None else p.target
        leaders[assignment[0]] += 1
        for node_id in assignment:
            replicas[node_id] += 1
    return {n: NodeLoad(leaders=leaders[n], replicas=replicas[n]) for n in leaders}


def plan_create_topic(
    state: MetadataState,
    request: CreateTopicRequest,
    now_ms: int,
    *,
    config: MetadataConfig | None = None,
) -> CreateTopic | ApplyResult:
    """The CreateTopic to propose for `request`, or the error to answer with."""
    limits = config or MetadataConfig()
    problem = check_topic_name(request.name) or _check_absent(state, request.name)
    problem = problem or check_topic_config(request.config)
    problem = problem or _check_limits(state, request, limits)
    if problem is not None:
        return problem
    live = live_node_ids(state, now_ms, limits.node_lease_ms)
    if request.assignments is None:
        problem = _check_enough_nodes(request.replication_factor, live)
    else:
        problem = _check_manual_assignment(
            request.assignments, request.partition_count, request.replication_factor, live
        )
    if problem is not None:
        return problem
    first_raft_group_id = int(state.next_raft_group_id)
    command = CreateTopic(
        name=request.name,
        topic_id=_topic_id(state.cluster_id, request.name, first_raft_group_id),
        partition_count=request.partition_count,
        replication_factor=request.replication_factor,
        config=dict(sorted(request.config.items())),
        assignments=request.assignments
        or assign_replicas(
            live,
            node_loads(state),
            request.partition_count,
            request.replication_factor,
            first_raft_group_id,
        ),
        raft_group_ids=tuple(
            RaftGroupId(first_raft_group_id + i) for i in range(request.partition_count)
        ),
    )
    verdict = state.check(command)
    return command if verdict.ok else verdict


def _check_absent(state: MetadataState, name: str) -> ApplyResult | None:
    if state.topic(name) is not None:
        return reject(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
    return None


def _check_limits(
    state: MetadataState, request: CreateTopicRequest, limits: MetadataConfig
) -> ApplyResult | None:
    if len(state.topics()) >= limits.topics_max:
        return reject(
            ErrorCode.INVALID_REQUEST, f"the cluster holds topics_max={limits.topics_max} topics"
        )
    if not 1 <= request.partition_count <= limits.partitions_per_topic_max:
        return reject(
            ErrorCode.INVALID_PARTITIONS,
            f"partition count {request.partition_count} must be in "
            f"[1, partitions_per_topic_max={limits.partitions_per_topic_max}]",
        )
    if not 1 <= request.replication_factor <= limits.replication_factor_max:
        return reject(
            ErrorCode.INVALID_REPLICATION_FACTOR,
            f"replication factor {request.replication_factor} must be in "
            f"[1, replication_factor_max={limits.replication_factor_max}]",
        )
    return None


def _check_enough_nodes(replication_factor: int, live: tuple[NodeId, ...]) -> ApplyResult | None:
    if replication_factor > len(live):
        return reject(
            ErrorCode.INVALID_REPLICATION_FACTOR,
            f"replication factor {replication_factor} exceeds the {len(live)} live nodes "
            f"{list(live)}",
        )
    return None


def _check_manual_assignment(
    assignments: tuple[tuple[NodeId, ...], ...],
    partition_count: int,
    replication_factor: int,
    live: tuple[NodeId, ...],
) -> ApplyResult | None:
    """Kafka's rules for replicas an operator chose: one list per partition, all of one
    length; each partition has a live replica (Kafka: an unfenced one). The state's own
    check then refuses unknown, repeated or decommissioning nodes."""
    if len(assignments) != partition_count:
        return reject(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"{len(assignments)} replica lists for {partition_count} partitions",
        )
    for index, replicas in enumerate(assignments):
        if len(replicas) != replication_factor:
            return reject(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"partition {index} has {len(replicas)} replicas, the others {replication_factor}",
            )
        if not any(node in live for node in replicas):
            return reject(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"no replica of partition {index} ({list(replicas)}) is on a live node",
            )
    return None


def _topic_id(cluster_id: str, name: str, first_raft_group_id: int) -> str:
    """Kafka-style (22 characters of base64url), derived, not drawn: group ids are never
    reused, so a topic re-created under the same name gets a new id."""
    derived = uuid.uuid5(_TOPIC_ID_NAMESPACE, f"{cluster_id}/{name}/{first_raft_group_id}")
    topic_id = base64.urlsafe_b64encode(derived.bytes).rstrip(b"=").decode()
    assert len(topic_id) == 22, topic_id
    return topic_id


def plan_create_partitions(
    state: MetadataState,
    name: str,
    total_count: int,
    now_ms: int,
    *,
    config: MetadataConfig | None = None,
    assignments: tuple[tuple[NodeId, ...], ...] | None = None,
) -> CreatePartitions | ApplyResult:
    """Grows topic `name` to `total_count` partitions (the admin API's CreatePartitions),
    placing the new ones on `assignments` if an operator chose them."""
    limits = config or MetadataConfig()
    topic = state.topic(name)
    if topic is None:
        return reject(ErrorCode.UNKNOWN_TOPIC, f"topic {name!r} does not exist")
    if not topic.partition_count < total_count <= limits.partitions_per_topic_max:
        return reject(
            ErrorCode.INVALID_PARTITIONS,
            f"topic {name!r} has {topic.partition_count} partitions; the new total "
            f"{total_count} must exceed it and be at most {limits.partitions_per_topic_max}",
        )
    live = live_node_ids(state, now_ms, limits.node_lease_ms)
    added = total_count - topic.partition_count
    if assignments is None:
        problem = _check_enough_nodes(topic.replication_factor, live)
    else:
        problem = _check_manual_assignment(assignments, added, topic.replication_factor, live)
    if problem is not None:
        return problem
    first_raft_group_id = int(state.next_raft_group_id)
    command = CreatePartitions(
        name=name,
        assignments=assignments
        or assign_replicas(
            live, node_loads(state), added, topic.replication_factor, first_raft_group_id
        ),
        raft_group_ids=tuple(RaftGroupId(first_raft_group_id + i) for i in range(added)),
    )
    verdict = state.check(command)
    return command if verdict.ok else verdict


def expired_nodes(
    state: MetadataState, now_ms: int, lease_ms: int, *, controller_since_ms: int | None = None
) -> tuple[FenceNode, ...]:
    """FenceNode commands for unfenced nodes silent for `lease_ms` or more."""
    assert lease_ms > 0, lease_ms
    fences = []
    for node in state.nodes():
        heard_ms = node.last_heartbeat_ms
        if controller_since_ms is not None:
            heard_ms = max(heard_ms, controller_since_ms)
        if node.alive and now_ms - heard_ms >= lease_ms:
            fences.append(FenceNode(node_id=node.node_id, now_ms=now_ms, lease_ms=lease_ms))
    # Silence since controller_since_ms is at most silence since the last heartbeat, so each
    # fence also passes apply's own check of the lease.
    assert all(state.check(f).ok for f in fences)
    return tuple(fences)


def fences_by_silence(
    state: MetadataState, silent_ms: Mapping[NodeId, int], lease_ms: int
) -> tuple[FenceNode, ...]:
    """FenceNode commands for unfenced nodes silent for `lease_ms` or more.

    Silence is measured by the controller on its own monotonic clock, from the later of the
    last heartbeat of the node it committed and its taking office (a new controller grants
    every node a full lease, as KRaft does). So no two nodes' wall clocks are ever compared
    and a wall clock that jumps fences nobody. The command's `now_ms` is expressed in the
    metadata's time base, the node's last heartbeat stamp plus the silence: apply's check
    then passes, unless a heartbeat stamped later was applied in between (it wins).
    """
    assert lease_ms > 0, lease_ms
    fences = []
    for node in state.nodes():
        silence_ms = silent_ms.get(node.node_id)
        if node.alive and silence_ms is not None and silence_ms >= lease_ms:
            now_ms = node.last_heartbeat_ms + silence_ms
            fences.append(FenceNode(node_id=node.node_id, now_ms=now_ms, lease_ms=lease_ms))
    assert all(state.check(f).ok for f in fences)
    return tuple(fences)


def preferred_leader_moves(state: MetadataState) -> tuple[LeaderMove, ...]:
    """Partitions whose reported leader is not the preferred replica, which is alive."""
    moves = []
    for p in state.all_partitions():
        preferred = state.node(p.preferred_leader)
        assert preferred is not None, p  # replicas are registered nodes
        if p.leader_id is not None and p.leader_id != p.preferred_leader and preferred.alive:
            moves.append(
                LeaderMove(p.topic, p.partition, p.raft_group_id, p.leader_id, preferred.node_id)
            )
    return tuple(moves)


def rebalance_plan(
    state: MetadataState, *, moves_max: int | None = None
) -> tuple[ReassignPartition, ...]:
    """Reassignments that balance replicas, then preferred leaders, among alive nodes."""
    budget = MetadataConfig().rebalance_moves_max if moves_max is None else moves_max
    assert budget >= 0, budget
    # A node being decommissioned is neither a source nor a target here: partitions on it
    # are left to decommission_step, which only ever moves replicas off it.
    alive = set(state.placeable_node_ids())
    if len(alive) < 2:
        return ()
    replicas = {
        (p.topic, p.partition): list(p.replicas)
        for p in state.all_partitions()
        if alive.issuperset(p.replicas) and p.target is None  # one move at a time
    }
    budget -= _balance_replicas(state, alive, replicas, budget)
    _balance_preferred_leaders(state, alive, replicas, budget)
    changed = []
    for p in state.all_partitions():
        target = replicas.get((p.topic, p.partition))
        if target is not None and tuple(target) != p.replicas:
            changed.append(ReassignPartition(p.topic, p.partition, tuple(target)))
    assert all(state.check(c).ok for c in changed)
    return tuple(changed)


def _current_lists(
    state: MetadataState, replicas: dict[tuple[str, PartitionId], list[NodeId]]
) -> list[list[NodeId]]:
    """Every partition's replicas as planned so far (the state's, where not a candidate; the
    target of a move under way)."""
    return [
        replicas.get((p.topic, p.partition), list(p.replicas if p.target is None else p.target))
        for p in state.all_partitions()
    ]


def _counts(alive: set[NodeId], lists: list[list[NodeId]]) -> dict[NodeId, int]:
    """How often each alive node appears in `lists` (dead nodes are not counted)."""
    counts = dict.fromkeys(sorted(alive), 0)
    for replicas in lists:
        for node_id in replicas:
            if node_id in counts:
                counts[node_id] += 1
    return counts


def _extremes(counts: dict[NodeId, int]) -> tuple[NodeId, NodeId]:
    """The fullest and the emptiest node (lowest id on ties)."""
    fullest = min(counts, key=lambda n: (-counts[n], n))
    emptiest = min(counts, key=lambda n: (counts[n], n))
    return fullest, emptiest


def _balance_replicas(
    state: MetadataState,
    alive: set[NodeId],
    replicas: dict[tuple[str, PartitionId], list[NodeId]],
    budget: int,
) -> int:
    """Moves one replica at a time from the fullest node to the emptiest, at most one per
    partition (one membership change of its group); returns the moves made."""
    # Replicas of every partition count toward a node's load, movable or not.
    counts = _counts(alive, _current_lists(state, replicas))
    moved: set[tuple[str, PartitionId]] = set()
    while len(moved) < budget:
        fullest, emptiest = _extremes(counts)
        if counts[fullest] - counts[emptiest] <= 1:
            break
        key = next(
            (
                key
                for key, r in sorted(replicas.items())
                if key not in moved and fullest in r and emptiest not in r
            ),
            None,
        )
        if key is None:
            break
        movable = replicas[key]
        movable[movable.index(fullest)] = emptiest
        moved.add(key)
        counts[fullest] -= 1
        counts[emptiest] += 1
    return len(moved)


def _balance_preferred_leaders(
    state: MetadataState,
    alive: set[NodeId],
    replicas: dict[tuple[str, PartitionId], list[NodeId]],
    budget: int,
) -> int:
    """Swaps a replica to the front of its list, from the node preferred most often to the
    node preferred least often; no data moves. Returns the swaps made."""
    counts = _counts(alive, [r[:1] for r in _current_lists(state, replicas)])
    swaps = 0
    while swaps < budget:
        fullest, emptiest = _extremes(counts)
        if counts[fullest] - counts[emptiest] <= 1:
            break
        swappable = next(
            (r for _, r in sorted(replicas.items()) if r[0] == fullest and emptiest in r), None
        )
        if swappable is None:
            break
        position = swappable.index(emptiest)
        swappable[0], swappable[position] = emptiest, fullest
        counts[fullest] -= 1
        counts[emptiest] += 1
        swaps += 1
    return swaps


def auto_rebalance_step(
    state: MetadataState, alive_for_ms: Mapping[NodeId, int], grace_ms: int
) -> ReassignPartition | None:
    """The one move the controller starts by itself now, or None.

    `alive_for_ms` is how long each node has been alive without interruption as the
    controller measured it (missing: not alive, or not heard from recently). Nothing starts
    while any move (automatic or an operator's) is under way: moves go one at a time, each
    one membership change after another of a single group.
    """
    assert grace_ms > 0, grace_ms
    if state.moving_partitions():
        return None
    for command in rebalance_plan(state, moves_max=1):
        info = state.partition(command.topic, command.partition)
        assert info is not None, command
        involved = set(info.replicas) | set(command.replicas)
        if all(alive_for_ms.get(n, -1) >= grace_ms for n in involved):
            return command
    return None


def plan_decommission(
    state: MetadataState, node_id: NodeId, metadata_voters: Collection[NodeId]
) -> DecommissionNode | ApplyResult:
    """The DecommissionNode to propose for the admin request, or the error to answer with."""
    if node_id in metadata_voters:
        return reject(
            ErrorCode.DECOMMISSION_REFUSED,
            f"node {node_id} is a voter of the metadata quorum {sorted(metadata_voters)}: voters "
            "are fixed at bootstrap (--peers) and cannot be decommissioned; only observers "
            "(nodes started with --bootstrap) can",
        )
    command = DecommissionNode(node_id=node_id)
    verdict = state.check(command)
    return command if verdict.ok else verdict


def decommission_step(
    state: MetadataState, live: Collection[NodeId]
) -> ReassignPartition | CompleteDecommission | None:
    """The next step of taking decommissioning nodes out, or None (nothing to do now).

    `live` are the nodes the controller heard from recently: a replica moves only to one of
    them. Nothing starts while any move is under way (one move at a time, as rebalancing)."""
    leaving = state.decommissioning_node_ids()
    if not leaving or state.moving_partitions():
        return None
    targets = [n for n in state.placeable_node_ids() if n in live]
    loads = node_loads(state)
    for node_id in leaving:
        hosted = state.partitions_hosted_by(node_id)
        if not hosted:
            return CompleteDecommission(node_id=node_id)
        for p in hosted:
            candidates = [n for n in targets if n not in p.replicas]
            if not candidates:
                continue  # wait for a node to come back (or be added)
            to = min(candidates, key=lambda n: (loads[n].replicas, n))
            replicas = tuple(to if n == node_id else n for n in p.replicas)
            command = ReassignPartition(p.topic, p.partition, replicas)
            assert state.check(command).ok, (command, state.check(command))
            return command
    return None
