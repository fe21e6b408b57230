"""The leader's per-follower Progress (etcd's probe/replicate/snapshot states, Raft §5.3)."""

from __future__ import annotations

from raftlog.config import RaftConfig
from raftlog.raft.progress import Progress, ProgressState
from raftlog.types import Offset

CONFIG = RaftConfig(inflight_messages_max=3, inflight_bytes_max=1000, append_bytes_max=500)


def test_probe_sends_one_append_at_a_time() -> None:
    progress = Progress(next_offset=Offset(5))
    assert not progress.is_paused(CONFIG)
    progress.sent(Offset(7), 100)
    assert progress.is_paused(CONFIG) and progress.next == 5  # probing does not move next


def test_replicate_pipelines_up_to_the_window_and_acks_free_it() -> None:
    progress = Progress(next_offset=Offset(5))
    progress.maybe_update(Offset(4))
    progress.become_replicate()
    for last in (5, 6, 7):
        assert not progress.is_paused(CONFIG)
        progress.sent(Offset(last), 10)
    assert progress.is_paused(CONFIG) and progress.next == 8  # inflight_messages_max
    assert progress.maybe_update(Offset(6))
    assert len(progress.inflights) == 1 and progress.inflight_bytes == 10
    assert not progress.is_paused(CONFIG)


def test_byte_window_closes_the_pipeline() -> None:
    progress = Progress(next_offset=Offset(0))
    progress.become_replicate()
    progress.sent(Offset(3), 600)
    progress.sent(Offset(6), 500)
    assert progress.is_paused(CONFIG)  # 1100 bytes >= inflight_bytes_max


def test_snapshot_state_pauses_until_answered() -> None:
    progress = Progress(next_offset=Offset(0))
    progress.become_snapshot(Offset(40))
    assert progress.state is ProgressState.SNAPSHOT and progress.is_paused(CONFIG)
    progress.maybe_update(Offset(40))
    progress.become_replicate()
    assert progress.next == 41 and not progress.is_paused(CONFIG)


def test_stale_acknowledgements_do_not_move_match_back() -> None:
    progress = Progress(next_offset=Offset(0))
    assert progress.maybe_update(Offset(9))
    assert not progress.maybe_update(Offset(3))
    assert progress.match == 9 and progress.next == 10
