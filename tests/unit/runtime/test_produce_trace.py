"""Produce stage timing (raftlog.runtime.produce_trace): the arithmetic of the stages on a fake
clock, and three in-process hosts stamping every boundary of a traced proposal in order,
with the leader's appends handed to the network before its sync on the loop."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest
from test_host_inline_sync import _hosts, _leader, _SlowSyncFiles

from raftlog.runtime import produce_trace as trace
from raftlog.runtime import recorder
from raftlog.runtime.clock import FakeMonotonicClock
from raftlog.types import Commitment

HANG_GUARD_S = 60
CRITICAL_PATH = ("queue", "pass_wait", "send", "write", "quorum", "apply", "respond")


class _Stages(recorder.Recorder):
    traces_produce = True

    def __init__(self) -> None:
        self.samples: list[tuple[str, dict[str, float]]] = []

    def on_produce_stages(self, protocol: str, seconds: Sequence[float]) -> None:
        self.samples.append((protocol, dict(zip(trace.STAGES, seconds, strict=True))))


@pytest.fixture
def stages() -> _Stages:
    recording = _Stages()
    previous = recorder.install(recording)
    yield recording
    recorder.install(previous)


@pytest.fixture
def clock() -> FakeMonotonicClock:
    fake = FakeMonotonicClock(start_s=100.0)
    previous = trace.use_clock(fake)
    yield fake
    trace.use_clock(previous)


def _at(**boundaries: float) -> list[float]:
    at = [trace.UNSET] * trace.BOUNDARIES
    for name, value in boundaries.items():
        at[getattr(trace, name.upper())] = value
    return at


def test_stages_split_the_total_and_the_two_legs_run_beside_the_quorum() -> None:
    at = _at(proposed=1.0, picked=1.5, sent=1.6, written=1.8, durable=2.8, replicated=3.6,
             committed=3.6, applied=4.0)  # fmt: skip
    seconds = trace.stage_seconds(0.5, at, 4.5)
    assert seconds is not None
    stage = dict(zip(trace.STAGES, seconds, strict=True))
    assert stage == pytest.approx(
        {"queue": 0.5, "pass_wait": 0.5, "send": 0.1, "write": 0.2, "quorum": 1.8,
         "apply": 0.4, "respond": 0.5, "total": 4.0, "fsync": 1.0, "replicate": 2.0}
    )  # fmt: skip
    assert sum(stage[name] for name in CRITICAL_PATH) == pytest.approx(stage["total"])


def test_a_boundary_seen_early_is_clamped_and_an_unapplied_proposal_reports_nothing() -> None:
    # Committed seen on a step before the pass stamped written: quorum 0, the sum still holds.
    at = _at(proposed=1.0, picked=1.1, sent=1.2, written=1.5, committed=1.4, applied=1.6)
    seconds = trace.stage_seconds(1.0, at, 1.7)
    assert seconds is not None
    stage = dict(zip(trace.STAGES, seconds, strict=True))
    assert stage["quorum"] == 0.0 and stage["fsync"] == 0.0 and stage["replicate"] == 0.0
    assert sum(stage[name] for name in CRITICAL_PATH) == pytest.approx(stage["total"])
    assert trace.stage_seconds(1.0, _at(proposed=1.0, picked=1.1), 2.0) is None


def test_stamps_reach_the_proposals_they_cover_once_each(
    stages: _Stages, clock: FakeMonotonicClock
) -> None:
    request = trace.begin("kafka")
    assert request is not None
    traces = trace.StageTraces()
    for last_offset in (4, 9):
        clock.advance(0.001)
        traces.add(request, last_offset)
    clock.advance(0.001)
    traces.mark(trace.PICKED, 4)  # the first entry's Ready only
    clock.advance(0.001)
    traces.mark(trace.PICKED, 9)
    first, second = request.proposals
    assert first.at[trace.PICKED] == pytest.approx(100.003)
    assert second.at[trace.PICKED] == pytest.approx(100.004)
    for boundary in (trace.SENT, trace.WRITTEN, trace.DURABLE, trace.COMMITTED):
        traces.mark(boundary, 9)
    clock.advance(0.001)
    traces.mark_applied(4)
    assert list(traces.pending) == [second]
    traces.drop_from(5)  # truncated by a later leader: never applied, never reported
    assert not traces.pending
    clock.advance(0.001)
    request.finish()
    assert [protocol for protocol, _ in stages.samples] == ["kafka"]
    assert stages.samples[0][1]["total"] == pytest.approx(0.006)


def test_nothing_is_traced_unless_the_recorder_asks() -> None:
    assert not recorder.recorder().traces_produce
    assert trace.begin("grpc") is None


def test_hosts_stamp_every_boundary_of_a_traced_proposal(tmp_path: Path, stages: _Stages) -> None:
    files = _SlowSyncFiles()
    flushes: list[int] = []

    async def main() -> None:
        hosts = _hosts(tmp_path, files)
        tasks = [asyncio.create_task(host.run()) for host in hosts.values()]
        try:
            leader = await _leader(hosts)
            leader_host = hosts[leader.node.node_id]
            leader_host._flush_sends = lambda: flushes.append(leader_host.inline_syncs)
            for index in range(5):
                request = trace.begin("grpc")
                assert request is not None
                token = request.attach()
                _, committed = leader.propose(
                    b"traced %d" % index, offset_count=1, commitment=Commitment.QUORUM
                )
                request.detach(token)
                await committed
                request.finish()
        finally:
            for host in hosts.values():
                host.close()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(asyncio.wait_for(main(), HANG_GUARD_S))
    assert len(stages.samples) == 5
    for protocol, stage in stages.samples:
        assert protocol == "grpc"
        assert all(value >= 0 for value in stage.values()), stage
        assert stage["replicate"] > 0 and stage["total"] > 0, stage
        assert sum(stage[name] for name in CRITICAL_PATH) == pytest.approx(stage["total"])
    # Before every sync on the loop the appends were handed to the network (flush_sends),
    # never after it: the inline-sync count a flush saw is the one before its own sync.
    assert flushes and flushes == sorted(set(flushes)), flushes
