"""A node's copy of the metadata has caught up since its start once it shows its own
registration of that start (raftlog.metadata.catch_up): before that, reads would answer from
a copy that may miss whatever was committed while the node was down."""

from __future__ import annotations

from raftlog.metadata import MetadataState, caught_up_since_start
from raftlog.types import NodeId
from tests.unit.metadata.test_metadata_state import Log, create, register

NODE = NodeId(3)
BEFORE_RESTART = 100
AFTER_RESTART = 200


def test_an_empty_copy_has_not_caught_up() -> None:
    assert not caught_up_since_start(MetadataState("c"), NODE, AFTER_RESTART)


def test_the_previous_start_s_registration_is_not_enough() -> None:
    # The node's own log still ends where it was killed: it shows its last registration,
    # not the topic created while it was down.
    log = Log()
    log.ok(register(1), register(NODE, BEFORE_RESTART))
    assert not caught_up_since_start(log.state, NODE, AFTER_RESTART)


def test_applying_this_start_s_registration_catches_up_with_what_came_before_it() -> None:
    log = Log()
    log.ok(register(1), register(NODE, BEFORE_RESTART), create("created-while-down", ((1,),)))
    assert not caught_up_since_start(log.state, NODE, AFTER_RESTART)
    log.ok(register(NODE, AFTER_RESTART))
    assert caught_up_since_start(log.state, NODE, AFTER_RESTART)
    assert log.state.topic("created-while-down") is not None


def test_another_node_s_registration_does_not_count() -> None:
    log = Log()
    log.ok(register(1, AFTER_RESTART + 1))
    assert not caught_up_since_start(log.state, NODE, AFTER_RESTART)


def test_a_later_registration_of_the_same_node_was_committed_later_still() -> None:
    log = Log()
    log.ok(register(NODE, AFTER_RESTART + 1))
    assert caught_up_since_start(log.state, NODE, AFTER_RESTART)


def test_a_restored_snapshot_carries_the_registration() -> None:
    log = Log()
    log.ok(register(NODE, AFTER_RESTART))
    restored = MetadataState.restore(log.state.snapshot())
    assert caught_up_since_start(restored, NODE, AFTER_RESTART)
    assert not caught_up_since_start(restored, NODE, AFTER_RESTART + 1)
