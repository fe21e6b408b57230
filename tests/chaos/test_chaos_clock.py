"""The node's movable wall clock (`ChaosClock`), the SetFaults rule that moves it, and how a
node started with --chaos wires it (and its recording file port) in."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from raftlog.errors import ConfigError
from raftlog.node.node import Node
from raftlog.rpc.admin_servicer import apply_fault_rules
from raftlog.rpc.faults import ChaosClock, FaultInjector
from raftlog.settings import NodeSettings
from raftlog.storage.chaos_file_system import ChaosFileSystem
from raftlog.storage.file_system import OsFileSystem
from raftlog.storage.wall_clock import SystemWallClock
from raftlog.types import NodeId


class _Source:
    """The system clock, as a test moves it (nanoseconds)."""

    def __init__(self) -> None:
        self.now_ns = 1_700_000_000_000 * 1_000_000

    def __call__(self) -> int:
        return self.now_ns

    def advance_ms(self, ms: int) -> None:
        self.now_ns += ms * 1_000_000


def test_the_clock_follows_the_system_clock_until_moved() -> None:
    source = _Source()
    clock = ChaosClock(source)
    assert clock.now_ms() == 1_700_000_000_000
    source.advance_ms(250)
    assert clock.now_ms() == 1_700_000_000_250
    assert clock.is_clean


def test_an_offset_jumps_the_clock_and_reset_puts_it_back() -> None:
    source = _Source()
    clock = ChaosClock(source)
    clock.set(offset_ms=-300_000)
    assert clock.now_ms() == 1_700_000_000_000 - 300_000
    source.advance_ms(10)
    assert clock.now_ms() == 1_700_000_000_010 - 300_000
    clock.reset()
    assert clock.now_ms() == 1_700_000_000_010 and clock.is_clean


def test_a_rate_runs_the_clock_fast_from_now_on_without_a_jump() -> None:
    source = _Source()
    clock = ChaosClock(source)
    source.advance_ms(1000)
    before = clock.now_ms()
    clock.set(rate=2.0)
    assert clock.now_ms() == before, "a rate change never jumps the clock"
    source.advance_ms(1000)
    assert clock.now_ms() == before + 2000
    clock.set(rate=1.0)  # the time gained so far is kept
    source.advance_ms(1000)
    assert clock.now_ms() == before + 3000
    assert not clock.is_clean


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"offset_ms": 10**12}, "at most"),
        ({"rate": 0}, "rate"),
        ({"rate": -1.0}, "rate"),
    ],
)
def test_bad_clock_settings_are_refused_by_name(rule: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ChaosClock(_Source()).set(**rule)  # type: ignore[arg-type]


def test_the_setfaults_rule_moves_the_clock_and_heal_resets_it() -> None:
    source = _Source()
    injector = FaultInjector(rng=random.Random(0), clock=ChaosClock(source))
    apply_fault_rules(injector, {"clock": {"offset_ms": 120_000}})
    assert injector.clock.now_ms() == 1_700_000_120_000
    assert not injector.active, "a clock fault leaves every frame untouched"
    apply_fault_rules(injector, {"heal": True})
    assert injector.clock.now_ms() == 1_700_000_000_000


@pytest.mark.parametrize(
    "clock", [5, {"offset": 5}, {"offset_ms": "5"}, {"rate": "fast"}, {"offset_ms": 1.5}]
)
def test_a_malformed_clock_rule_is_refused(clock: object) -> None:
    injector = FaultInjector(rng=random.Random(0))
    with pytest.raises(ValueError, match="clock"):
        apply_fault_rules(injector, {"clock": clock})
    assert injector.clock.is_clean


def _settings(data_dir: Path, **chaos: bool) -> NodeSettings:
    address = ("127.0.0.1", 1)
    return NodeSettings(
        node_id=NodeId(1),
        data_dir=data_dir,
        listen=address,
        raft_listen=address,
        peers={NodeId(1): address},
        **chaos,
    )


def test_a_chaos_node_reads_the_injectors_clock_and_records_what_it_fsyncs(
    tmp_path: Path,
) -> None:
    node = Node(_settings(tmp_path, chaos=True))
    assert node.faults is not None and node.wall_clock is node.faults.clock
    assert isinstance(node.files, ChaosFileSystem) and not node.files.skip_sync
    unsafe = Node(_settings(tmp_path, chaos=True, chaos_skip_fsync=True))
    assert isinstance(unsafe.files, ChaosFileSystem) and unsafe.files.skip_sync


def test_a_node_without_chaos_uses_the_plain_ports(tmp_path: Path) -> None:
    node = Node(_settings(tmp_path))
    assert node.faults is None
    assert type(node.wall_clock) is SystemWallClock and type(node.files) is OsFileSystem


def test_skipping_fsync_needs_the_chaos_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="chaos_skip_fsync"):
        _settings(tmp_path, chaos_skip_fsync=True).validate()
