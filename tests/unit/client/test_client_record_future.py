"""RecordFuture: a record's result read from its batch's one future, still a Future to callers."""

from __future__ import annotations

import threading
from concurrent.futures import Future, as_completed, wait
from concurrent.futures import TimeoutError as FutureTimeoutError

import pytest

from raftlog.client._connection import TopicPartition
from raftlog.client.accumulator import ProducerBatch, RecordFuture, RecordMetadata

TIMEOUT_S = 10.0


def _batch_of(count: int) -> tuple[ProducerBatch, list[RecordFuture]]:
    batch = ProducerBatch(TopicPartition("t", 2), created_at=0.0)
    return batch, [RecordFuture(batch, index, 1000 + index) for index in range(count)]


def test_records_resolve_from_the_batch_completion_with_their_own_offsets() -> None:
    batch, futures = _batch_of(3)
    assert [f.done() or f.cancelled() for f in futures] == [False] * 3
    assert all(f.running() and not f.cancel() for f in futures)
    with pytest.raises(FutureTimeoutError):
        futures[0].result(timeout=0)
    batch.future.set_result(40)
    assert [f.result(timeout=0) for f in futures] == [
        RecordMetadata("t", 2, 40 + i, 1000 + i) for i in range(3)
    ]
    assert all(f.done() and f.exception(timeout=0) is None for f in futures)


def test_acks_0_records_have_no_offset() -> None:
    batch, futures = _batch_of(2)
    batch.future.set_result(-1)
    assert [f.result().offset for f in futures] == [-1, -1]


def test_a_failed_batch_fails_every_record_with_its_error() -> None:
    batch, futures = _batch_of(2)
    error = RuntimeError("delivery failed")
    batch.future.set_exception(error)
    for future in futures:
        assert future.exception() is error
        with pytest.raises(RuntimeError, match="delivery failed"):
            future.result()


def test_callbacks_get_the_record_future_before_and_after_completion() -> None:
    batch, futures = _batch_of(2)
    seen: list[Future[RecordMetadata]] = []
    futures[1].add_done_callback(seen.append)
    assert seen == []
    batch.future.set_result(7)
    assert seen == [futures[1]]
    futures[0].add_done_callback(seen.append)  # already done: runs at once
    assert seen == [futures[1], futures[0]]


def test_wait_and_as_completed_work_on_record_futures() -> None:
    batch, futures = _batch_of(3)
    other_batch, others = _batch_of(1)
    done, not_done = wait([futures[0], others[0]], timeout=0)
    assert not done and not_done == {futures[0], others[0]}
    threading.Timer(0.01, batch.future.set_result, args=(10,)).start()
    done, not_done = wait(futures, timeout=TIMEOUT_S)
    assert done == set(futures) and not not_done
    assert [f.result().offset for f in futures] == [10, 11, 12]
    other_batch.future.set_result(3)
    assert [f.result().offset for f in as_completed(others, timeout=TIMEOUT_S)] == [3]


def test_callers_cannot_complete_a_record_future() -> None:
    _, futures = _batch_of(1)
    with pytest.raises(RuntimeError, match="completed by its producer"):
        futures[0].set_result(RecordMetadata("t", 2, 0, 0))
    with pytest.raises(RuntimeError, match="completed by its producer"):
        futures[0].set_exception(RuntimeError())


def logged_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [str(r.exc_info[1]) for r in caplog.records if r.exc_info]


def test_a_failing_callback_is_logged_and_the_others_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    batch, futures = _batch_of(3)
    seen: list[int] = []

    def failing(_: Future[RecordMetadata]) -> None:
        raise ValueError("planted callback failure")

    futures[0].add_done_callback(lambda f: seen.append(f.result().offset))
    futures[1].add_done_callback(failing)
    futures[2].add_done_callback(lambda f: seen.append(f.result().offset))
    batch.future.set_result(5)
    assert seen == [5, 7]  # in the order they were added
    assert logged_errors(caplog) == ["planted callback failure"]
    futures[1].add_done_callback(failing)  # run at once: logged, not raised
    assert logged_errors(caplog) == ["planted callback failure"] * 2


def test_callbacks_added_while_the_batch_resolves_run_exactly_once() -> None:
    batch, futures = _batch_of(1)
    calls: list[int] = []
    adding = threading.Event()

    def add_callbacks() -> None:
        adding.set()
        for index in range(2000):
            futures[0].add_done_callback(lambda _, index=index: calls.append(index))

    adder = threading.Thread(target=add_callbacks)
    adder.start()
    adding.wait(TIMEOUT_S)
    batch.future.set_result(0)
    adder.join(TIMEOUT_S)
    assert sorted(calls) == list(range(2000))


def test_a_resolved_batch_answers_without_its_future() -> None:
    # After resolution result() and exception() read the batch's copy of the outcome; the
    # copy is taken from the future once, so both agree with it.
    batch, futures = _batch_of(2)
    error = RuntimeError("delivery failed")
    batch.future.set_exception(error)
    assert batch.resolved and batch.error is error
    assert futures[1].exception() is error and futures[1].done()
    other, others = _batch_of(2)
    other.future.set_result(9)
    assert other.resolved and other.error is None and other.base_offset == 9
    assert others[1].result() == RecordMetadata("t", 2, 10, 1001)
    assert repr(others[1]) == "<RecordFuture t/2#1 finished>"
