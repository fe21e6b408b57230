"""The consumer-group checks are trusted only after each catches its anomaly planted in a history.

The valid history: two members of one group; member 5 holds both partitions, reads and
commits, then a rebalance gives partition 0 to member 6, which goes on from the committed
offset; a reader sees the committed offsets move forward.
"""

from __future__ import annotations

import pytest

from raftlog.chaos.checker import check
from raftlog.chaos.consumer_group_checker import GROUP_ANOMALIES
from tests.chaos.test_chaos_checker import Builder, T

G = "chaos-group"


class GroupBuilder(Builder):
    def member(self, process: int, kind: str, partitions: list[int]) -> None:
        value = {"topic": T, "group": G, "partitions": partitions}
        self.event(process, "invoke", kind, value)
        self.event(process, "ok", kind, value)

    def group_poll(self, process: int, records: list[tuple[int, int, str]]) -> None:
        self.event(process, "invoke", "poll", {"group": G})
        rows = [{"topic": T, "partition": p, "offset": o, "value": v} for p, o, v in records]
        self.event(process, "ok", "poll", {"group": G, "records": rows})

    def commit(self, process: int, offsets: dict[int, int], result: str = "ok") -> None:
        value = {"topic": T, "group": G, "offsets": {str(p): o for p, o in offsets.items()}}
        self.event(process, "invoke", "commit", value)
        self.event(process, result, "commit", value)

    def committed(self, offsets: dict[int, int]) -> None:
        self.event(7, "invoke", "committed", {"topic": T, "group": G})
        value = {"topic": T, "group": G, "offsets": {str(p): o for p, o in offsets.items()}}
        self.event(7, "ok", "committed", value)


def group_history(plant: str | None = None) -> GroupBuilder:
    b = GroupBuilder()
    b.send(0, "0-1", 0, "ok", 1)
    b.send(0, "0-2", 0, "ok", 2)
    b.send(0, "0-3", 1, "ok", 1)
    b.send(0, "0-4", 0, "ok", 3)
    b.member(5, "assign", [0, 1])
    b.group_poll(5, [(0, 1, "0-1"), (1, 1, "0-3")])
    b.commit(5, {0: 2, 1: 2})
    b.committed({0: 2, 1: 2})
    b.member(5, "revoke", [0, 1])
    b.member(5, "assign", [1])
    b.member(6, "assign", [0])
    if plant == "revoked_read":
        b.group_poll(5, [(0, 2, "0-2")])
    if plant == "rebalance_skip":
        b.group_poll(6, [(0, 3, "0-4")])
    elif plant == "commit_undelivered":
        b.group_poll(6, [(0, 2, "0-2")])
    else:
        b.group_poll(6, [(0, 2, "0-2"), (0, 3, "0-4")])
    b.commit(6, {0: 4})
    b.committed({0: 1, 1: 2} if plant == "commit_backward" else {0: 4, 1: 2})
    b.final(0, [(1, "0-1"), (2, "0-2"), (3, "0-4")], 4)
    b.final(1, [(1, "0-3")], 2)
    return b


def test_the_valid_group_history_passes() -> None:
    result = check(group_history().ops())
    assert result.valid, result.anomalies


# A new owner that starts too far on also lets its own commit pass an undelivered record.
ALSO = {"rebalance_skip": {"commit_undelivered"}}


@pytest.mark.parametrize("anomaly", GROUP_ANOMALIES)
def test_each_planted_group_anomaly_is_reported(anomaly: str) -> None:
    result = check(group_history(plant=anomaly).ops())
    reported = {name for name, count in result.counts.items() if count}
    assert anomaly in reported, result.counts
    assert reported <= {anomaly} | ALSO.get(anomaly, set()), result.counts
    assert result.anomalies[anomaly], "each anomaly comes with an example"


def test_a_member_given_a_partition_again_rereads_from_the_committed_offset() -> None:
    # Member 6's commit is unknown and its partition goes away and comes back: it reads
    # offset 2 again from the committed offset, which is no rewind and no skip.
    b = GroupBuilder()
    b.send(0, "0-1", 0, "ok", 1)
    b.send(0, "0-2", 0, "ok", 2)
    b.member(6, "assign", [0])
    b.group_poll(6, [(0, 1, "0-1")])
    b.commit(6, {0: 2})
    b.group_poll(6, [(0, 2, "0-2")])
    b.commit(6, {0: 3}, result="info")
    b.member(6, "revoke", [0])
    b.member(6, "assign", [0])
    b.group_poll(6, [(0, 2, "0-2")])
    b.final(0, [(1, "0-1"), (2, "0-2")], 3)
    result = check(b.ops())
    assert result.valid, result.anomalies


def test_an_unknown_commit_widens_the_start_a_new_owner_may_take() -> None:
    # Member 5's last commit timed out but was applied: member 6 rightly starts at offset 3.
    b = GroupBuilder()
    for n, offset in ((1, 1), (2, 2), (3, 3)):
        b.send(0, f"0-{n}", 0, "ok", offset)
    b.member(5, "assign", [0])
    b.group_poll(5, [(0, 1, "0-1"), (0, 2, "0-2")])
    b.commit(5, {0: 3}, result="info")
    b.member(5, "revoke", [0])
    b.member(6, "assign", [0])
    b.group_poll(6, [(0, 3, "0-3")])
    b.final(0, [(1, "0-1"), (2, "0-2"), (3, "0-3")], 4)
    result = check(b.ops())
    assert result.valid, result.anomalies
