"""The table of KIP-848 regex subscriptions: RE2 semantics, bounds, clear refusals."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftlog.rpc.kafka.topic_regex import RegexSubscription, TopicRegexes

TOPICS = ("orders-eu", "orders-us", "xorders-1", "refunds", "orders")


def _table(members_max: int = 8) -> TopicRegexes:
    return TopicRegexes(members_max=members_max, pattern_chars_max=64, memory_bytes_max=256 * 1024)


def _known(*members: str) -> Callable[[str, str], bool]:
    return lambda group, member: member in members


def test_the_whole_name_must_match_as_in_kafka() -> None:
    table = _table()
    assert table.resolve("orders-.*", TOPICS) == ("orders-eu", "orders-us")
    assert table.resolve("^orders-.*", TOPICS) == ("orders-eu", "orders-us")
    assert table.resolve("orders", TOPICS) == ("orders",)  # not a prefix match
    assert table.resolve("(orders|refunds)", TOPICS) == ("refunds", "orders")


def test_a_bad_or_long_pattern_is_refused_naming_it() -> None:
    table = _table()
    problem = table.check("orders-(")
    assert problem is not None and "'orders-('" in problem and "missing )" in problem
    problem = table.check("o" * 65)
    assert problem == "subscribed topic regex of 65 characters: at most 64"
    assert table.check("orders-.*") is None


def test_a_pattern_needing_more_memory_than_its_bound_is_refused() -> None:
    table = TopicRegexes(members_max=8, pattern_chars_max=1000, memory_bytes_max=1024)
    problem = table.check("(" * 20 + "a{100}" + ")" * 20)
    assert problem is not None and "invalid subscribed topic regex" in problem


@pytest.mark.timeout(120)
def test_a_backtracking_pattern_does_not_hang() -> None:
    # Python's re backtracks exponentially here (the test would hang to its timeout); RE2
    # reads the name once.
    assert _table().resolve("(a+)+$", ["a" * 5000 + "b"]) == ()


def test_a_new_topic_list_is_resolved_again() -> None:
    table = _table()
    assert table.resolve("orders-.*", TOPICS) == ("orders-eu", "orders-us")
    assert table.resolve("orders-.*", (*TOPICS, "orders-apac")) == (
        "orders-eu",
        "orders-us",
        "orders-apac",
    )


def test_the_table_is_bounded_and_drops_members_the_coordinator_forgot() -> None:
    table = _table(members_max=2)
    subscription = RegexSubscription("orders-.*", ())
    assert table.put("g", "a", subscription, is_member=_known("a", "b")) is None
    assert table.put("g", "b", subscription, is_member=_known("a", "b")) is None
    refused = table.put("g", "c", subscription, is_member=_known("a", "b"))
    assert refused is not None and "at most 2 members subscribed by regex" in refused
    assert len(table) == 2
    # "a" left the group: its entry makes room.
    assert table.put("g", "c", subscription, is_member=_known("b", "c")) is None
    assert table.get("g", "a") is None and table.get("g", "c") == subscription
    table.forget("g", "c")
    assert table.get("g", "c") is None and len(table) == 1


@given(st.lists(st.text(alphabet="ab.*+?()|[]^$\\{}0123-", max_size=12), max_size=30))
def test_checked_patterns_never_grow_the_cache_past_its_bound(patterns: list[str]) -> None:
    table = _table(members_max=4)
    for pattern in patterns:
        if table.check(pattern) is None:
            table.resolve(pattern, TOPICS)
        assert len(table._compiled) <= 4 + 1  # the members' patterns, and the one checked
