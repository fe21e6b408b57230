"""The production DurableLog (`raftlog.storage.raft_log_storage.RaftLogStorage`) passes the same
conformance checks as MemoryStorage, so the fake the core is tested with never drifts."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest
import storage_conformance

from raftlog.config import LogConfig
from raftlog.raft.ports import DurableLog
from raftlog.storage.raft_log_storage import RaftLogStorage


@pytest.mark.parametrize("check", storage_conformance.CHECKS, ids=lambda c: c.__name__)
def test_disk_storage_conforms(
    check: Callable[[Callable[[], DurableLog]], None], tmp_path: Path
) -> None:
    counter = itertools.count()

    def factory() -> DurableLog:
        return RaftLogStorage.open(tmp_path / f"log{next(counter)}", config=LogConfig())

    check(factory)
