"""NodeConfig.event_loop: `raftlog serve` runs the node on the loop it names (uvloop when
importable, asyncio's own otherwise or when asked), and refuses a name it does not know."""

from __future__ import annotations

import asyncio

import pytest

from raftlog.config import NodeConfig
from raftlog.errors import ConfigError
from raftlog.serve import run_on_loop
from raftlog.settings import apply_overrides


async def _loop_module() -> int:
    return 1 if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else 0


def test_asyncio_runs_on_asyncios_loop() -> None:
    assert run_on_loop(_loop_module(), "asyncio") == 0


def test_uvloop_runs_on_uvloop() -> None:
    pytest.importorskip("uvloop")
    assert run_on_loop(_loop_module(), "uvloop") == 1


def test_the_setting_is_checked() -> None:
    assert apply_overrides(NodeConfig(), ["event_loop=asyncio"]).event_loop == "asyncio"
    with pytest.raises(ConfigError, match="event_loop"):
        apply_overrides(NodeConfig(), ["event_loop=tokio"])
