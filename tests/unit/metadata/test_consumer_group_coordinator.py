"""Consumer group coordination (raftlog.metadata.consumer_groups): the two-step partition move,
expiry, fencing, rebuilding after a controller change, and the sticky assignor.

The property tests drive the coordinator with simulated clients that obey the client's
rules (hold exactly the last assignment received; drop everything when fenced or when no
heartbeat succeeded for the session timeout, measured from the send) over a lossy channel,
and check after every step that no partition is held by two clients at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hypothesis import example, given, settings
from hypothesis import strategies as st

from raftlog.metadata.consumer_groups import (
    ConsumerGroupCoordinator,
    GroupErrorCode,
    GroupLimits,
    HeartbeatRequest,
    HeartbeatResponse,
    TopicPartition,
    sticky_assign,
)

SESSION_MS = 1000
LIMITS = GroupLimits(
    session_timeout_ms=SESSION_MS,
    heartbeat_interval_ms=100,
    rebalance_timeout_ms_max=60_000,
    groups_max=4,
    members_max=8,
)
COUNTS = {"events": 6}
EVENTS = ("events",)


def beat(
    coordinator: ConsumerGroupCoordinator,
    member: str,
    epoch: int,
    owned: frozenset[TopicPartition] = frozenset(),
    *,
    now_ms: int = 0,
    counts: Mapping[str, int] = COUNTS,
    topics: tuple[str, ...] = EVENTS,
) -> HeartbeatResponse:
    request = HeartbeatRequest("g", member, epoch, topics, owned, rebalance_timeout_ms=5000)
    return coordinator.heartbeat(request, partition_counts=counts, now_ms=now_ms)


def tps(*partitions: int) -> frozenset[TopicPartition]:
    return frozenset(("events", p) for p in partitions)


def test_a_joining_member_gets_partitions_only_after_the_owner_confirms_the_revocation() -> None:
    coordinator = ConsumerGroupCoordinator(LIMITS)
    first = beat(coordinator, "m1", 0)
    assert first.error is GroupErrorCode.NONE and first.assignment == tps(*range(6))
    assert first.member_epoch == 1

    joined = beat(coordinator, "m2", 0)
    assert joined.assignment == frozenset()  # m1 still owns everything

    kept = beat(coordinator, "m1", first.member_epoch, first.assignment)
    assert len(kept.assignment) == 3 and kept.assignment < first.assignment
    assert kept.member_epoch == 2
    still_waiting = beat(coordinator, "m2", joined.member_epoch)
    assert still_waiting.assignment == frozenset()  # not confirmed yet

    beat(coordinator, "m1", kept.member_epoch, kept.assignment)  # the confirmation
    moved = beat(coordinator, "m2", still_waiting.member_epoch)
    assert moved.assignment == tps(*range(6)) - kept.assignment


def test_a_silent_member_is_removed_after_the_session_timeout_and_its_partitions_move() -> None:
    coordinator = ConsumerGroupCoordinator(LIMITS)
    m1 = beat(coordinator, "m1", 0)
    m2 = beat(coordinator, "m2", 0)
    m1 = beat(coordinator, "m1", m1.member_epoch, m1.assignment)
    m1 = beat(coordinator, "m1", m1.member_epoch, m1.assignment)
    m2 = beat(coordinator, "m2", m2.member_epoch)
    assert len(m2.assignment) == 3
    assert coordinator.expire(SESSION_MS) == []  # silent for exactly the timeout: still in
    m1 = beat(coordinator, "m1", m1.member_epoch, m1.assignment, now_ms=SESSION_MS)
    assert coordinator.expire(SESSION_MS + 1) == [("g", "m2")]
    m1 = beat(coordinator, "m1", m1.member_epoch, m1.assignment, now_ms=SESSION_MS + 2)
    assert m1.assignment == tps(*range(6))

    late = beat(coordinator, "m2", m2.member_epoch, m2.assignment, now_ms=SESSION_MS + 3)
    assert late.assignment == frozenset(), "a zombie must not get back what moved"


def test_a_member_that_does_not_confirm_a_revocation_is_removed_after_its_rebalance_timeout() -> (
    None
):
    coordinator = ConsumerGroupCoordinator(LIMITS)
    m1 = beat(coordinator, "m1", 0)
    beat(coordinator, "m2", 0)
    everything = m1.assignment
    m1 = beat(coordinator, "m1", m1.member_epoch, everything, now_ms=10)  # asked to revoke
    assert len(m1.assignment) == 3
    for now_ms in range(100, 5011, 100):  # alive, but still listing what it must give up
        beat(coordinator, "m1", m1.member_epoch, everything, now_ms=now_ms)
        beat(coordinator, "m2", 1, now_ms=now_ms)
    assert coordinator.expire(5010) == []
    assert coordinator.expire(5011) == [("g", "m1")]


def test_an_epoch_from_the_future_or_far_past_is_fenced_and_a_rejoin_frees_everything() -> None:
    coordinator = ConsumerGroupCoordinator(LIMITS)
    m1 = beat(coordinator, "m1", 0)
    assert beat(coordinator, "m1", m1.member_epoch + 1).error is GroupErrorCode.FENCED_MEMBER_EPOCH
    beat(coordinator, "m2", 0)
    m1 = beat(coordinator, "m1", m1.member_epoch, m1.assignment)
    beat(coordinator, "m3", 0)
    m1 = beat(coordinator, "m1", m1.member_epoch, m1.assignment)
    assert m1.member_epoch == 3
    assert beat(coordinator, "m1", 1).error is GroupErrorCode.FENCED_MEMBER_EPOCH
    rejoined = beat(coordinator, "m1", 0)
    assert rejoined.error is GroupErrorCode.NONE and rejoined.member_epoch == 1


def test_a_new_coordinator_rebuilds_ownership_from_the_members_heartbeats() -> None:
    old = ConsumerGroupCoordinator(LIMITS)
    m1 = beat(old, "m1", 0)
    m2 = beat(old, "m2", 0)
    m1 = beat(old, "m1", m1.member_epoch, m1.assignment)
    m1 = beat(old, "m1", m1.member_epoch, m1.assignment)
    m2 = beat(old, "m2", m2.member_epoch)
    new = ConsumerGroupCoordinator(LIMITS)
    new.reset(now_ms=0)  # the controller changed: it starts empty
    again2 = beat(new, "m2", m2.member_epoch, m2.assignment)
    assert again2.error is GroupErrorCode.NONE and again2.assignment == m2.assignment
    again1 = beat(new, "m1", m1.member_epoch, m1.assignment)
    assert again1.assignment == m1.assignment, "nothing moves when nothing changed"

    m3 = beat(new, "m3", 0, now_ms=SESSION_MS - 1)
    assert m3.assignment == frozenset(), "no grants until every holder had a session to report"
    for _ in range(2):  # asked to revoke one each, then confirming
        again1 = beat(new, "m1", again1.member_epoch, again1.assignment, now_ms=SESSION_MS)
        again2 = beat(new, "m2", again2.member_epoch, again2.assignment, now_ms=SESSION_MS)
    m3 = beat(new, "m3", m3.member_epoch, now_ms=SESSION_MS)
    assert len(m3.assignment) == 2


def test_offset_commits_need_ownership_and_leaving_frees_partitions() -> None:
    coordinator = ConsumerGroupCoordinator(LIMITS)
    assert coordinator.check_commit("g", "", -1, [("events", 0)])[0] is GroupErrorCode.NONE
    m1 = beat(coordinator, "m1", 0)
    owned = sorted(m1.assignment)
    assert coordinator.check_commit("g", "m1", 1, owned)[0] is GroupErrorCode.NONE
    assert coordinator.check_commit("g", "m1", 2, owned)[0] is GroupErrorCode.FENCED_MEMBER_EPOCH
    assert coordinator.check_commit("g", "m9", 1, owned)[0] is GroupErrorCode.UNKNOWN_MEMBER_ID
    assert coordinator.check_commit("g", "", -1, owned)[0] is GroupErrorCode.UNKNOWN_MEMBER_ID
    # Epoch -1 is outside any membership (Kafka's rule): a member id does not make it one.
    assert coordinator.check_commit("g", "m9", -1, owned)[0] is GroupErrorCode.UNKNOWN_MEMBER_ID
    assert coordinator.check_commit("g", "m1", -1, owned)[0] is GroupErrorCode.FENCED_MEMBER_EPOCH
    assert coordinator.check_commit("empty", "m9", -1, owned)[0] is GroupErrorCode.NONE
    code, message = coordinator.check_commit("g", "m1", 1, [("events", 9)])
    assert code is GroupErrorCode.NOT_OWNER and "events" in message
    assert beat(coordinator, "m1", -1).member_epoch == -1
    assert not coordinator.has_members("g") and coordinator.describe("g") is None


def test_bad_requests_and_bounds_are_refused_with_a_reason() -> None:
    coordinator = ConsumerGroupCoordinator(LIMITS)
    bad = HeartbeatRequest("", "m1", 0, EVENTS, frozenset(), 5000)
    refused = coordinator.heartbeat(bad, partition_counts=COUNTS, now_ms=0)
    assert refused.error is GroupErrorCode.INVALID_REQUEST and "group id" in refused.message
    for member in range(LIMITS.members_max):
        assert beat(coordinator, f"m{member}", 0).error is GroupErrorCode.NONE
    full = beat(coordinator, "one-more", 0)
    assert full.error is GroupErrorCode.GROUP_MAX_SIZE_REACHED and "members_max" in full.message


def test_a_deleted_topic_frees_its_partitions_and_a_new_topic_is_spread() -> None:
    coordinator = ConsumerGroupCoordinator(LIMITS)
    both = ("events", "more")
    m1 = beat(coordinator, "m1", 0, topics=both, counts={"events": 2, "more": 2})
    assert len(m1.assignment) == 4
    m1 = beat(coordinator, "m1", m1.member_epoch, m1.assignment, topics=both, counts={"more": 2})
    assert m1.assignment == frozenset({("more", 0), ("more", 1)})


# ---- the sticky assignor -------------------------------------------------------------------


def test_sticky_assign_moves_only_what_balance_needs() -> None:
    before = sticky_assign({"a": EVENTS, "b": EVENTS}, {"events": 6}, {})
    after = sticky_assign({"a": EVENTS, "b": EVENTS, "c": EVENTS}, {"events": 6}, before)
    assert sorted(len(p) for p in after.values()) == [2, 2, 2]
    assert after["a"] <= before["a"] and after["b"] <= before["b"]


@settings(max_examples=150, deadline=None)
@given(
    member_count=st.integers(1, 6),
    partition_count=st.integers(0, 20),
    previous_seed=st.lists(st.integers(0, 7), max_size=20),
)
def test_sticky_assign_is_complete_balanced_and_sticky(
    member_count: int, partition_count: int, previous_seed: list[int]
) -> None:
    members = [f"m{i}" for i in range(member_count)]
    subscriptions = {m: EVENTS for m in members}
    # A previous target, possibly naming departed members (ids m6, m7) and gone partitions.
    previous: dict[str, set[TopicPartition]] = {}
    for partition, owner in enumerate(previous_seed):
        previous.setdefault(f"m{owner}", set()).add(("events", partition))
    frozen = {m: frozenset(p) for m, p in previous.items()}
    result = sticky_assign(subscriptions, {"events": partition_count}, frozen)

    everything = sorted(tp for assigned in result.values() for tp in assigned)
    assert everything == [("events", p) for p in range(partition_count)]
    loads = [len(result[m]) for m in members]
    assert max(loads) - min(loads) <= 1
    floor = partition_count // member_count
    for member in members:
        valid = {tp for tp in frozen.get(member, ()) if tp[1] < partition_count}
        kept = result[member] & valid
        assert len(kept) >= min(len(valid), floor), "a member keeps its share of what it had"
        assert not (kept != valid and result[member] - valid), "never both gains and loses"


# ---- simulated clients over a lossy channel ------------------------------------------------


@dataclass
class SimClient:
    member_id: str
    epoch: int = 0
    held: frozenset[TopicPartition] = frozenset()
    last_ok_send_ms: int = -(10**9)
    alive: bool = True

    def valid(self, now_ms: int) -> bool:
        return self.alive and now_ms - self.last_ok_send_ms <= SESSION_MS

    def holding(self, now_ms: int) -> frozenset[TopicPartition]:
        return self.held if self.valid(now_ms) else frozenset()


class GroupSim:
    def __init__(self, client_count: int, partition_count: int) -> None:
        self.coordinator = ConsumerGroupCoordinator(LIMITS)
        self.clients = [SimClient(f"c{i}") for i in range(client_count)]
        self.counts = {"events": partition_count}
        self.now_ms = 0

    def heartbeat(self, index: int, *, lose: bool) -> None:
        client = self.clients[index]
        if not client.alive:
            return
        if not client.valid(self.now_ms):
            client.held, client.epoch = frozenset(), 0  # the client's own session rule
        request = HeartbeatRequest(
            "g", client.member_id, client.epoch, EVENTS, client.held, rebalance_timeout_ms=500
        )
        held_before = client.held
        response = self.coordinator.heartbeat(
            request, partition_counts=self.counts, now_ms=self.now_ms
        )
        if lose:
            return
        if response.error is not GroupErrorCode.NONE:
            client.held, client.epoch = frozenset(), 0
            return
        target = self._target(client.member_id)
        # A member that keeps heartbeating never loses a partition it keeps in the target.
        assert held_before & target <= response.assignment, (held_before, target)
        client.held, client.epoch = response.assignment, response.member_epoch
        client.last_ok_send_ms = self.now_ms

    def _target(self, member_id: str) -> frozenset[TopicPartition]:
        description = self.coordinator.describe("g")
        assert description is not None
        member = next(m for m in description.members if m.member_id == member_id)
        return member.target

    def check_no_partition_held_twice(self) -> None:
        seen: dict[TopicPartition, str] = {}
        for client in self.clients:
            for tp in client.holding(self.now_ms):
                assert tp not in seen, f"{tp} held by {seen[tp]} and {client.member_id}"
                seen[tp] = client.member_id

    def heal(self) -> None:
        """No more loss or crashes: live clients heartbeat until the group settles."""
        # Long enough for the crashed to expire, a new coordinator to grant, then settling.
        for _ in range(3 * SESSION_MS // 50):
            self.now_ms += 50
            self.coordinator.expire(self.now_ms)
            for index in range(len(self.clients)):
                self.heartbeat(index, lose=False)
                self.check_no_partition_held_twice()


actions = st.lists(
    st.one_of(
        st.tuples(st.just("beat"), st.integers(0, 3), st.booleans()),
        st.tuples(st.just("tick"), st.integers(1, 700), st.just(False)),
        st.tuples(st.just("crash"), st.integers(0, 3), st.just(False)),
        st.tuples(st.just("restart"), st.integers(0, 3), st.just(False)),
        st.tuples(st.just("expire"), st.just(0), st.just(False)),
        st.tuples(st.just("failover"), st.just(0), st.just(False)),
    ),
    max_size=60,
)


@settings(max_examples=120, deadline=None)
@given(partition_count=st.integers(1, 9), steps=actions)
# A member that confirms each revocation at once is not late with the next one: each gets a
# rebalance timeout of its own (it was removed at the first one's deadline, then still held).
@example(
    partition_count=7,
    steps=[("beat", 1, False), ("beat", 2, False), ("beat", 1, False), ("tick", 351, False)],
)
# A member removed for missing its revocation deadline, silent but within its session, still
# consumes what it owned: those partitions wait for its session to end before anyone gets them.
@example(
    partition_count=2,
    steps=[("beat", 1, False), ("beat", 0, False), ("beat", 1, False), ("tick", 451, False)],
)
def test_no_partition_is_ever_held_twice_and_every_partition_is_held_after_healing(
    partition_count: int, steps: list[tuple[str, int, bool]]
) -> None:
    sim = GroupSim(4, partition_count)
    for action, value, lose in steps:
        if action == "beat":
            sim.heartbeat(value, lose=lose)
        elif action == "tick":
            sim.now_ms += value
        elif action == "crash":
            sim.clients[value].alive = False
        elif action == "restart":
            sim.clients[value] = SimClient(f"c{value}-{sim.now_ms}")
        elif action == "failover":
            sim.coordinator.reset(sim.now_ms)
        else:
            sim.coordinator.expire(sim.now_ms)
        sim.check_no_partition_held_twice()
    sim.heal()
    live = [c for c in sim.clients if c.alive]
    held = sorted(tp for c in live for tp in c.holding(sim.now_ms))
    if live:
        assert held == [("events", p) for p in range(partition_count)]
        loads = [len(c.held) for c in live]
        assert max(loads) - min(loads) <= 1


# -- static members (KIP-848's form of KIP-345) ------------------------------------------------


def static_beat(
    coordinator: ConsumerGroupCoordinator,
    member: str,
    epoch: int,
    instance: str,
    owned: frozenset[TopicPartition] = frozenset(),
    *,
    now_ms: int = 0,
) -> HeartbeatResponse:
    request = HeartbeatRequest("g", member, epoch, EVENTS, owned, 5000, instance_id=instance)
    return coordinator.heartbeat(request, partition_counts=COUNTS, now_ms=now_ms)


def _settled_static_pair(coordinator: ConsumerGroupCoordinator) -> tuple[int, int]:
    """Static members x (member "x1") and y ("y1") sharing the six partitions; their epochs."""
    x = static_beat(coordinator, "x1", 0, "x")
    y = static_beat(coordinator, "y1", 0, "y")
    x = static_beat(coordinator, "x1", x.member_epoch, "x", x.assignment)  # gives y its half
    x = static_beat(coordinator, "x1", x.member_epoch, "x", x.assignment)
    y = static_beat(coordinator, "y1", y.member_epoch, "y", y.assignment)
    assert x.assignment == tps(0, 1, 2) and y.assignment == tps(3, 4, 5)
    return x.member_epoch, y.member_epoch


def test_a_static_member_leaving_for_now_keeps_its_partitions_for_its_successor() -> None:
    coordinator = ConsumerGroupCoordinator(LIMITS)
    x_epoch, y_epoch = _settled_static_pair(coordinator)
    left = static_beat(coordinator, "y1", -2, "y", now_ms=100)
    assert (left.error, left.member_epoch) == (GroupErrorCode.NONE, -2)
    described = coordinator.member("g", "y1")
    assert described is not None and described.member_epoch == -2
    assert described.instance_id == "y" and described.owned == tps(3, 4, 5)
    x = static_beat(coordinator, "x1", x_epoch, "x", tps(0, 1, 2), now_ms=200)
    assert x.assignment == tps(0, 1, 2), "the leaver's partitions wait for it"
    # A new process with the same instance id (and a new member id) takes its place.
    back = static_beat(coordinator, "y2", 0, "y", now_ms=300)
    assert back.error is GroupErrorCode.NONE and back.assignment == tps(3, 4, 5)
    assert coordinator.member("g", "y1") is None
    assert static_beat(coordinator, "y1", y_epoch, "y").error is GroupErrorCode.FENCED_INSTANCE_ID
    # Not back within its session: it is gone and its partitions move.
    static_beat(coordinator, "y2", -2, "y", now_ms=400)
    x = static_beat(coordinator, "x1", x.member_epoch, "x", tps(0, 1, 2), now_ms=1000)
    assert coordinator.expire(now_ms=400 + SESSION_MS + 1) == [("g", "y2")]
    x = static_beat(coordinator, "x1", x.member_epoch, "x", tps(0, 1, 2), now_ms=1500)
    assert x.assignment == tps(0, 1, 2, 3, 4, 5)


def test_an_instance_id_is_held_by_one_member_until_it_leaves() -> None:
    coordinator = ConsumerGroupCoordinator(LIMITS)
    x_epoch, _ = _settled_static_pair(coordinator)
    unreleased = static_beat(coordinator, "x2", 0, "x")
    assert unreleased.error is GroupErrorCode.UNRELEASED_INSTANCE_ID
    assert static_beat(coordinator, "x2", 3, "x").error is GroupErrorCode.FENCED_INSTANCE_ID
    leave = static_beat(coordinator, "x2", -2, "x")
    assert leave.error is GroupErrorCode.FENCED_INSTANCE_ID
    assert static_beat(coordinator, "x1", -2, "nobody").error is GroupErrorCode.UNKNOWN_MEMBER_ID
    # Its own rejoin (epoch 0, same member id) is a rejoin, as for a dynamic member.
    rejoined = static_beat(coordinator, "x1", 0, "x")
    assert rejoined.error is GroupErrorCode.NONE
    # A member of the group joining again with a released instance id takes that place.
    beat(coordinator, "d1", 0)
    assert static_beat(coordinator, "x1", -2, "x").member_epoch == -2
    taken = static_beat(coordinator, "d1", 0, "x")
    assert taken.error is GroupErrorCode.NONE and coordinator.member("g", "x1") is None
    described = coordinator.member("g", "d1")
    assert described is not None and described.instance_id == "x"
    assert static_beat(coordinator, "d1", -1, "x").member_epoch == -1
    assert static_beat(coordinator, "x1", 0, "x").error is GroupErrorCode.NONE
    # Leaving with -1 releases the instance id at once.
    assert static_beat(coordinator, "x1", -1, "x").member_epoch == -1
    assert static_beat(coordinator, "x3", 0, "x").error is GroupErrorCode.NONE
    assert x_epoch > 0
