"""The classic group coordinator's state machine on a fake clock, without sockets, and the
consumer protocol's subscription as it reads it."""

from __future__ import annotations

import asyncio
import dataclasses
import struct

from kio.schema.errors import ErrorCode

from raftlog.rpc.kafka.classic_group_coordinator import (
    ClassicGroups,
    GroupState,
    JoinAnswer,
    JoinRequest,
)
from raftlog.rpc.kafka.consumer_protocol import subscribed_topics


class FakeClock:
    def __init__(self) -> None:
        self.now_ms = 0

    def __call__(self) -> int:
        return self.now_ms


def _request(
    member_id: str, *, protocols: tuple[tuple[str, bytes], ...] = (("range", b"m"),)
) -> JoinRequest:
    return JoinRequest(
        group_id="g",
        member_id=member_id,
        client_id="c",
        session_timeout_ms=1000,
        rebalance_timeout_ms=200,
        protocol_type="consumer",
        protocols=protocols,
    )


async def _pair(groups: ClassicGroups) -> tuple[str, str]:
    """Two members in generation 2: the first alone (1), then the second with it."""
    first, second = await _member_id(groups), await _member_id(groups)
    await groups.join(_request(first))
    await asyncio.gather(groups.join(_request(second)), groups.join(_request(first)))
    return first, second


async def _member_id(groups: ClassicGroups) -> str:
    answer = await groups.join(_request(""))
    assert answer.error == ErrorCode.member_id_required and answer.member_id
    return answer.member_id


def test_two_members_get_one_generation_and_the_leader_assigns() -> None:
    async def scenario() -> None:
        groups = ClassicGroups(clock_ms=FakeClock(), groups_max=10, members_max=10)
        first = await _member_id(groups)
        joined = await groups.join(_request(first))
        assert (joined.error, joined.generation_id, joined.leader_id) == (ErrorCode.none, 1, first)
        second = await _member_id(groups)
        # The second join starts a rebalance; it completes once the first rejoins.
        waiting = asyncio.ensure_future(groups.join(_request(second)))
        await asyncio.sleep(0)
        assert groups.heartbeat("g", first, 1) == ErrorCode.rebalance_in_progress
        answers: list[JoinAnswer] = [await groups.join(_request(first)), await waiting]
        assert {a.generation_id for a in answers} == {2}
        leader = next(a for a in answers if a.members)
        assert leader.member_id == first and {m.member_id for m in leader.members} == {
            first,
            second,
        }
        follower_sync = asyncio.ensure_future(groups.sync("g", second, 2, {}))
        await asyncio.sleep(0)
        assert not follower_sync.done()  # waits for the leader's assignment
        mine = await groups.sync("g", first, 2, {first: b"A", second: b"B"})
        assert (mine.error, mine.assignment) == (ErrorCode.none, b"A")
        assert (await follower_sync).assignment == b"B"
        assert groups.describe("g")[0] is GroupState.STABLE
        assert groups.check_member("g", second, 1) == ErrorCode.illegal_generation
        assert groups.check_member("g", second, 2) == ErrorCode.none

    asyncio.run(scenario())


def test_a_silent_member_is_removed_and_the_group_rebalances() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        groups = ClassicGroups(clock_ms=clock, groups_max=10, members_max=10)
        first, second = await _pair(groups)
        clock.now_ms = 800
        assert groups.heartbeat("g", first, 2) == ErrorCode.none
        clock.now_ms = 1500  # the second was last heard at 0: past its 1000 ms session
        assert groups.heartbeat("g", first, 2) == ErrorCode.rebalance_in_progress
        rejoined = await groups.join(_request(first))
        assert rejoined.generation_id == 3 and [m.member_id for m in rejoined.members] == [first]
        assert groups.heartbeat("g", second, 3) == ErrorCode.unknown_member_id

    asyncio.run(scenario())


def test_a_silent_member_is_removed_by_the_timer_while_a_rebalance_waits_for_it() -> None:
    """Nobody sends anything while the others wait in JoinGroup: the coordinator's timer ends
    the silent member's session and the rebalance completes without it, long before its
    rebalance timeout (60 s)."""

    async def scenario() -> None:
        clock = FakeClock()
        groups = ClassicGroups(clock_ms=clock, groups_max=10, members_max=10)

        def patient(member_id: str) -> JoinRequest:
            return dataclasses.replace(_request(member_id), rebalance_timeout_ms=60_000)

        first, second = await _member_id(groups), await _member_id(groups)
        await groups.join(patient(first))
        await asyncio.gather(groups.join(patient(second)), groups.join(patient(first)))
        third = await _member_id(groups)
        clock.now_ms = 800
        assert groups.heartbeat("g", first, 2) == ErrorCode.none  # the second stays silent
        joins = asyncio.gather(groups.join(patient(third)), groups.join(patient(first)))
        await asyncio.sleep(0)
        assert groups.describe("g")[0] is GroupState.PREPARING_REBALANCE
        clock.now_ms = 1500  # no request comes: the second's session (0 + 1000) ends
        answers = await asyncio.wait_for(joins, 5)
        assert {a.generation_id for a in answers} == {3}
        leader = next(a for a in answers if a.members)
        assert {m.member_id for m in leader.members} == {first, third}

    asyncio.run(scenario())


def test_a_member_that_does_not_rejoin_in_time_is_dropped() -> None:
    async def scenario() -> None:
        groups = ClassicGroups(clock_ms=FakeClock(), groups_max=10, members_max=10)
        first, _ = await _pair(groups)
        third = await _member_id(groups)
        # Only the third and the first rejoin; the rebalance timeout (200 ms) drops the second.
        answers = await asyncio.gather(groups.join(_request(third)), groups.join(_request(first)))
        assert {a.generation_id for a in answers} == {3}
        leader = next(a for a in answers if a.members)
        assert {m.member_id for m in leader.members} == {first, third}

    asyncio.run(scenario())


def test_refusals_name_kafkas_errors() -> None:
    async def scenario() -> None:
        groups = ClassicGroups(clock_ms=FakeClock(), groups_max=1, members_max=2)
        assert (await groups.join(_request("stranger"))).error == ErrorCode.unknown_member_id
        first = await _member_id(groups)
        await groups.join(_request(first))
        other = _request("", protocols=(("other", b""),))
        assert (await groups.join(other)).error == ErrorCode.inconsistent_group_protocol
        await _member_id(groups)  # a second id handed out counts toward the bound
        assert (await groups.join(_request(""))).error == ErrorCode.group_max_size_reached
        assert groups.leave("g", "stranger") == ErrorCode.unknown_member_id
        assert groups.leave("g", first) == ErrorCode.none
        assert groups.describe("g")[0] is GroupState.EMPTY
        # Outside the protocol, commits are allowed only while the group has no members.
        assert groups.check_member("g", "", -1) == ErrorCode.none

    asyncio.run(scenario())


def test_commits_follow_kafkas_rules() -> None:
    """ClassicGroup.validateOffsetCommit: generation -1 commits to a group without members,
    member id or not; members commit at their generation, during PreparingRebalance too (the
    eager protocol commits before it rejoins), not between JoinGroup and SyncGroup."""

    async def scenario() -> None:
        groups = ClassicGroups(clock_ms=FakeClock(), groups_max=10, members_max=10)
        assert groups.check_member("g", "a-kip848-member-id", -1) == ErrorCode.none
        assert groups.check_member("g", "m", 3) == ErrorCode.unknown_member_id
        first, second = await _pair(groups)
        assert groups.describe("g")[0] is GroupState.COMPLETING_REBALANCE
        assert groups.check_member("g", first, 2) == ErrorCode.rebalance_in_progress
        await asyncio.gather(groups.sync("g", first, 2, {}), groups.sync("g", second, 2, {}))
        assert groups.check_member("g", "", -1) == ErrorCode.unknown_member_id
        assert groups.check_member("g", "stranger", -1) == ErrorCode.unknown_member_id
        assert groups.check_member("g", first, -1) == ErrorCode.illegal_generation
        third = await _member_id(groups)
        waiting = asyncio.ensure_future(groups.join(_request(third)))
        await asyncio.sleep(0)
        assert groups.describe("g")[0] is GroupState.PREPARING_REBALANCE
        assert groups.check_member("g", first, 2) == ErrorCode.none
        waiting.cancel()

    asyncio.run(scenario())


def _subscription(*topics: str, version: int = 3) -> bytes:
    body = struct.pack(">hi", version, len(topics))
    for topic in topics:
        body += struct.pack(">h", len(topic)) + topic.encode()
    return body + b"\xff\xff\xff\xff" + b"later versions' fields"


def test_subscriptions_are_read_by_their_version_0_prefix() -> None:
    assert subscribed_topics(_subscription("a", "b")) == {"a", "b"}
    assert subscribed_topics(_subscription(version=0)) == frozenset()
    for bad in (b"", b"\x00\x00\x00\x00\x00\x02\x00\x01a", b"\xff\xff", _subscription()[:3]):
        assert subscribed_topics(bad) is None, bad


def test_offset_delete_sees_what_members_subscribe_to() -> None:
    async def scenario() -> None:
        groups = ClassicGroups(clock_ms=FakeClock(), groups_max=10, members_max=10)
        assert groups.offset_delete_refusal("g") is None and not groups.is_subscribed("g", "a")
        member = await _member_id(groups)
        protocols = (("range", _subscription("a")),)
        await groups.join(_request(member, protocols=protocols))
        assert groups.is_subscribed("g", "a") and not groups.is_subscribed("g", "b")
        assert groups.offset_delete_refusal("g") is None
        other = ClassicGroups(clock_ms=FakeClock(), groups_max=10, members_max=10)
        connect = JoinRequest("g", "", "c", 1000, 200, "connect", (("v1", b""),))
        joined = await other.join(connect)
        await other.join(dataclasses.replace(connect, member_id=joined.member_id))
        assert other.offset_delete_refusal("g") == ErrorCode.non_empty_group
        assert not other.forget("g") and groups.leave("g", member) == ErrorCode.none
        assert not groups.holds("g") and not groups.forget("g")

    asyncio.run(scenario())


# -- static membership (KIP-345) ---------------------------------------------------------------


def _static(instance: str, member_id: str = "", *, skip: bool = False) -> JoinRequest:
    return dataclasses.replace(
        _request(member_id), group_instance_id=instance, skip_assignment_supported=skip
    )


async def _stable_static_pair(groups: ClassicGroups) -> tuple[str, str]:
    """Static members "a" (the leader) and "b" in a Stable generation 2, assigned b"A", b"B"."""
    first = await groups.join(_static("a"))
    assert first.error == ErrorCode.none and first.generation_id == 1  # no MEMBER_ID_REQUIRED
    a = first.member_id
    b_join = asyncio.ensure_future(groups.join(_static("b")))
    await asyncio.sleep(0)
    await groups.join(_static("a", a))
    b = (await b_join).member_id
    await asyncio.gather(groups.sync("g", a, 2, {a: b"A", b: b"B"}), groups.sync("g", b, 2, {}))
    assert groups.describe("g")[0] is GroupState.STABLE
    return a, b


def test_a_restarted_static_member_takes_its_place_without_a_rebalance() -> None:
    async def scenario() -> None:
        groups = ClassicGroups(clock_ms=FakeClock(), groups_max=10, members_max=10)
        a, b = await _stable_static_pair(groups)
        again = await groups.join(_static("b"))  # a new process, no member id
        assert (again.error, again.generation_id, again.leader_id) == (ErrorCode.none, 2, a)
        assert again.member_id != b and not again.members
        assert groups.describe("g")[0] is GroupState.STABLE  # no rebalance
        synced = await groups.sync("g", again.member_id, 2, {}, "b")
        assert synced.assignment == b"B"
        assert groups.heartbeat("g", b, 2, "b") == ErrorCode.fenced_instance_id
        assert groups.heartbeat("g", again.member_id, 2, "b") == ErrorCode.none
        assert groups.heartbeat("g", a, 2, "a") == ErrorCode.none
        assert groups.check_member("g", b, 2, "b") == ErrorCode.fenced_instance_id
        assert groups.heartbeat("g", a, 2, "zz") == ErrorCode.unknown_member_id
        views = {v.instance_id: v.member_id for v in groups.describe("g")[3]}
        assert views == {"a": a, "b": again.member_id}

    asyncio.run(scenario())


def test_a_replaced_static_leader_assigns_only_on_join_group_v9() -> None:
    async def scenario() -> None:
        groups = ClassicGroups(clock_ms=FakeClock(), groups_max=10, members_max=10)
        a, _ = await _stable_static_pair(groups)
        old = await groups.join(_static("a"))  # before v9: told the old id leads, not it
        assert old.leader_id == a != old.member_id and not old.members
        assert not old.skip_assignment
        new = await groups.join(_static("a", skip=True))  # v9: the members, and skip
        assert new.leader_id == new.member_id and new.skip_assignment
        assert {m.instance_id for m in new.members} == {"a", "b"}
        assert (
            await groups.join(_static("a", old.member_id))
        ).error == ErrorCode.fenced_instance_id

    asyncio.run(scenario())


def test_static_members_leave_by_instance_id_and_stay_through_a_rebalance() -> None:
    async def scenario() -> None:
        groups = ClassicGroups(clock_ms=FakeClock(), groups_max=10, members_max=10)
        a, b = await _stable_static_pair(groups)
        # A rebalance that "b" does not rejoin: it stays a member (it may be restarting).
        third = await _member_id(groups)
        joins = asyncio.gather(groups.join(_request(third)), groups.join(_static("a", a)))
        answers = await asyncio.wait_for(joins, 5)  # the rebalance timeout (200 ms)
        assert {a.generation_id for a in answers} == {3}
        assert {v.instance_id for v in groups.describe("g")[3]} == {"a", "b", None}
        assert groups.leave("g", "", "nobody") == ErrorCode.unknown_member_id
        assert groups.leave("g", a, "b") == ErrorCode.fenced_instance_id
        assert groups.leave("g", "", "b") == ErrorCode.none
        assert {v.member_id for v in groups.describe("g")[3]} == {a, third}
        assert b not in {v.member_id for v in groups.describe("g")[3]}

    asyncio.run(scenario())


def test_a_joiner_needs_a_protocol_every_member_supports() -> None:
    """Kafka's supportsProtocols: a protocol in common with each member is not enough."""

    async def scenario() -> None:
        groups = ClassicGroups(clock_ms=FakeClock(), groups_max=10, members_max=10)
        first, second = await _member_id(groups), await _member_id(groups)
        xy, yz = (("x", b""), ("y", b"")), (("y", b""), ("z", b""))
        await groups.join(_request(first, protocols=xy))
        await asyncio.gather(
            groups.join(_request(second, protocols=yz)), groups.join(_request(first, protocols=xy))
        )
        xz = (("x", b""), ("z", b""))  # x with the first, z with the second, none with both
        refused = await groups.join(_request("", protocols=xz))
        assert refused.error == ErrorCode.inconsistent_group_protocol

    asyncio.run(scenario())
