"""The retention clock follows the wall clock but holds back its forward steps (fake clocks)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from raftlog.runtime.clock import FakeMonotonicClock, RetentionClock
from raftlog.storage.wall_clock import ManualWallClock

START_MS = 1_800_000_000_000
SLACK_MS = 1000
MINUTE_MS = 60_000


def _clocks() -> tuple[ManualWallClock, FakeMonotonicClock, RetentionClock]:
    wall, monotonic = ManualWallClock(START_MS), FakeMonotonicClock()
    return wall, monotonic, RetentionClock(wall, monotonic, slack_ms=SLACK_MS)


def _advance(wall: ManualWallClock, monotonic: FakeMonotonicClock, ms: int) -> None:
    wall.advance(ms)
    monotonic.advance(ms / 1000)


def test_it_reads_the_wall_clock_while_both_clocks_run_together() -> None:
    wall, monotonic, clock = _clocks()
    assert clock.now_ms() == START_MS
    for _ in range(10):
        _advance(wall, monotonic, 5000)
        assert clock.now_ms() == wall.now_ms()
    assert clock.held_back_ms == 0


def test_a_forward_step_is_held_back_and_time_runs_on_at_the_monotonic_rate() -> None:
    wall, monotonic, clock = _clocks()
    clock.now_ms()
    wall.advance(15 * MINUTE_MS)  # the step: the monotonic clock did not move
    assert clock.now_ms() == START_MS + SLACK_MS
    assert clock.held_back_ms == 15 * MINUTE_MS - SLACK_MS
    for second in range(1, 60):
        _advance(wall, monotonic, 1000)
        # Tracks the monotonic clock from the last trusted reading; the slack is not
        # added again on every reading.
        assert clock.now_ms() == START_MS + second * 1000 + SLACK_MS


def test_the_wall_clock_is_trusted_again_once_it_steps_back() -> None:
    wall, monotonic, clock = _clocks()
    clock.now_ms()
    wall.advance(15 * MINUTE_MS)
    _advance(wall, monotonic, 10_000)
    assert clock.now_ms() == START_MS + 10_000 + SLACK_MS
    assert clock.held_back_ms > 0
    wall.time_ms -= 15 * MINUTE_MS  # corrected
    assert clock.now_ms() == START_MS + 10_000
    assert clock.held_back_ms == 0
    _advance(wall, monotonic, 5000)
    assert clock.now_ms() == START_MS + 15_000


def test_a_backward_step_is_followed_at_once() -> None:
    wall, monotonic, clock = _clocks()
    clock.now_ms()
    wall.time_ms -= 5 * MINUTE_MS
    assert clock.now_ms() == START_MS - 5 * MINUTE_MS
    _advance(wall, monotonic, 1000)
    assert clock.now_ms() == START_MS - 5 * MINUTE_MS + 1000


def test_slewing_within_the_slack_is_followed() -> None:
    wall, monotonic, clock = _clocks()
    clock.now_ms()
    for _ in range(100):  # the wall clock runs 1% fast: 50 ms per 5 s reading
        wall.advance(5050)
        monotonic.advance(5.0)
        assert clock.now_ms() == wall.now_ms()


@given(
    st.lists(
        st.tuples(st.integers(0, 60_000), st.integers(-10 * MINUTE_MS, 10 * MINUTE_MS)),
        max_size=50,
    )
)
def test_no_reading_is_ahead_of_the_wall_clock_or_of_the_last_by_more_than_a_slack(
    steps: list[tuple[int, int]],
) -> None:
    wall, monotonic, clock = _clocks()
    last_ms = clock.now_ms()
    for elapsed_ms, wall_step_ms in steps:
        monotonic.advance(elapsed_ms / 1000)
        wall.time_ms += elapsed_ms + wall_step_ms
        now_ms = clock.now_ms()
        assert now_ms <= wall.now_ms()
        # However far the wall clock stepped forward, one reading moves at most the
        # monotonic time since the last one, plus one slack.
        assert now_ms - last_ms <= elapsed_ms + SLACK_MS
        last_ms = now_ms
