"""RaftGroupHost syncs small writes on the event loop and falls back to the disk thread while the
disk is slow (raftlog.runtime.host: `_may_sync_inline`). Three in-process hosts, one group,
real segment logs on a file system whose fsyncs take as long as the test says."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from raftlog.config import LogConfig, RaftConfig
from raftlog.raft.types import Message, Role
from raftlog.runtime.clock import FakeMonotonicClock
from raftlog.runtime.group import RaftGroup
from raftlog.runtime.host import RaftGroupHost
from raftlog.storage.file_system import FileHandle, OsFileSystem
from raftlog.storage.raft_log_storage import RaftLogStorage
from raftlog.types import Commitment, NodeId, RaftGroupId
from tests.unit.runtime.hosted_groups import add_group

NODES = (NodeId(1), NodeId(2), NodeId(3))
GROUP = RaftGroupId(1)
CONFIG = RaftConfig(election_timeout_ticks=10, heartbeat_interval_ticks=2)
# The host's slow-sync threshold here: far above a sync that only writes to the page cache,
# while the stall injected below (twice this, on the hosts' fake clock) takes no real time.
SLOW_MS = 20
HANG_GUARD_S = 60


class _SlowSyncHandle:
    """A real file whose fsync takes `files.sync_delay_s` on the hosts' clock (a fast or a
    stalling disk).

    The real fdatasync is left out: its time is the machine's, not the test's (one took
    5.2 ms in a CI run, over the slow threshold, during the phase meant to be fast), and
    what this file tests is the host's choice of where to sync, not durability."""

    def __init__(self, files: _SlowSyncFiles, inner: FileHandle) -> None:
        self._files = files
        self._inner = inner

    @property
    def path(self) -> str:
        return self._inner.path

    def append(self, buffers: Sequence[bytes | bytearray | memoryview]) -> None:
        self._inner.append(buffers)

    def read_at(self, size_bytes: int, position: int) -> bytes:
        return self._inner.read_at(size_bytes, position)

    def write_at(self, data: bytes | bytearray | memoryview, position: int) -> None:
        self._inner.write_at(data, position)

    def size_bytes(self) -> int:
        return self._inner.size_bytes()

    def sync(self) -> None:
        self._files.sync_threads.add(threading.current_thread().name)
        with self._files.clock_lock:
            self._files.clock.advance(self._files.sync_delay_s)

    def truncate(self, size_bytes: int) -> None:
        self._inner.truncate(size_bytes)

    def close(self) -> None:
        self._inner.close()


class _SlowSyncFiles(OsFileSystem):
    """Syncs take `sync_delay_s` on `clock`, the hosts' clock: how long a sync took is the
    test's choice, not the loaded machine's."""

    def __init__(self) -> None:
        self.sync_delay_s = 0.0
        self.sync_threads: set[str] = set()
        self.clock = FakeMonotonicClock()
        self.clock_lock = threading.Lock()  # syncs run on the loop and on disk threads

    def open(self, path: str, *, create: bool = False) -> FileHandle:
        return _SlowSyncHandle(self, super().open(path, create=create))


def _hosts(root: Path, files: _SlowSyncFiles) -> dict[NodeId, RaftGroupHost]:
    hosts: dict[NodeId, RaftGroupHost] = {}

    def sender(source: NodeId) -> Callable[[NodeId, RaftGroupId, Message], None]:
        def send(receiver: NodeId, group: RaftGroupId, message: Message) -> None:
            loop = asyncio.get_running_loop()
            loop.call_soon(hosts[receiver].deliver, source, [(group, message)])

        return send

    for node_id in NODES:
        host = RaftGroupHost(
            node_id=node_id,
            tick_interval_ms=10,
            send=sender(node_id),
            sync_on_loop_bytes_max=64 * 1024,
            sync_on_loop_slow_ms=SLOW_MS,
            clock=files.clock,
        )
        storage = RaftLogStorage.open(root / f"node-{node_id}", config=LogConfig(), files=files)
        add_group(host, GROUP, storage, config=CONFIG, voters=NODES, seed=node_id)
        for peer in NODES:
            host.set_peer_reachable(peer, reachable=peer != node_id)
        hosts[node_id] = host
    return hosts


async def _leader(hosts: dict[NodeId, RaftGroupHost]) -> RaftGroup:
    while True:
        for host in hosts.values():
            group = host.get(GROUP)
            if group is not None and group.node.role is Role.LEADER:
                return group
        await asyncio.sleep(0.005)


async def _commit(group: RaftGroup, data: bytes) -> None:
    _, committed = group.propose(data, offset_count=1, commitment=Commitment.QUORUM)
    await committed


Scenario = Callable[[dict[NodeId, RaftGroupHost], _SlowSyncFiles, RaftGroup], Awaitable[None]]


def _run(tmp_path: Path, scenario: Scenario) -> None:
    """Run the three hosts, wait for a leader, play `scenario`, then stop the hosts."""
    files = _SlowSyncFiles()

    async def main() -> None:
        hosts = _hosts(tmp_path, files)
        tasks = [asyncio.create_task(host.run()) for host in hosts.values()]
        try:
            await scenario(hosts, files, await _leader(hosts))
        finally:
            for host in hosts.values():
                host.close()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(asyncio.wait_for(main(), HANG_GUARD_S))


def test_small_syncs_run_on_the_loop_until_one_is_slow(tmp_path: Path) -> None:
    async def scenario(
        hosts: dict[NodeId, RaftGroupHost], files: _SlowSyncFiles, leader: RaftGroup
    ) -> None:
        for index in range(20):
            await _commit(leader, b"small %d" % index)
        assert all(host.inline_syncs > 0 for host in hosts.values())
        assert threading.current_thread().name in files.sync_threads
        assert not any(host.inline_sync_pauses for host in hosts.values())

        files.sync_delay_s = 2 * SLOW_MS / 1000  # the disk stalls
        files.sync_threads.clear()
        await _commit(leader, b"slow")
        # (the follower outside the commit's majority may still be syncing: wait for it)
        while not all(host.inline_sync_pauses >= 1 for host in hosts.values()):
            await asyncio.sleep(0.001)
        inline = {node_id: host.inline_syncs for node_id, host in hosts.items()}
        files.sync_threads.clear()
        for index in range(3):  # within the pause (1 s on the hosts' clock): the disk thread syncs
            await _commit(leader, b"during the pause %d" % index)
        assert {node_id: host.inline_syncs for node_id, host in hosts.items()} == inline
        assert files.sync_threads and threading.current_thread().name not in files.sync_threads

    _run(tmp_path, scenario)


def test_large_writes_keep_the_disk_thread(tmp_path: Path) -> None:
    async def scenario(
        hosts: dict[NodeId, RaftGroupHost], files: _SlowSyncFiles, leader: RaftGroup
    ) -> None:
        await _commit(leader, b"warm")
        files.sync_threads.clear()
        inline = {node_id: host.inline_syncs for node_id, host in hosts.items()}
        await _commit(leader, bytes(128 * 1024))  # above sync_on_loop_bytes_max
        assert threading.current_thread().name not in files.sync_threads
        leader_host = hosts[leader.node.node_id]
        assert leader_host.inline_syncs == inline[leader.node.node_id]

    _run(tmp_path, scenario)


class _ScriptedClock:
    """Reads its readings from a list (each on-loop sync reads it before and after), once
    given one; until then (building the host) it stands still."""

    readings: list[float] | None = None

    def monotonic(self) -> float:
        return 100.0 if self.readings is None else self.readings.pop(0)


def test_slow_syncs_in_a_row_double_the_pause_and_a_fast_one_resets_it() -> None:
    slow_s, fast_s = 2 * SLOW_MS / 1000, SLOW_MS / 2000
    clock, readings = _ScriptedClock(), []
    for took_s in (slow_s, slow_s, slow_s, fast_s, slow_s):
        readings += [100.0, 100.0 + took_s]
    host = RaftGroupHost(
        node_id=NodeId(1),
        tick_interval_ms=50,
        send=lambda *_: None,
        sync_on_loop_bytes_max=1024,
        sync_on_loop_slow_ms=SLOW_MS,
        clock=clock,
    )
    clock.readings = readings
    pauses = []
    for _ in range(5):
        host._sync_inline([])
        pauses.append(host.inline_sync_pause_s())
    assert pauses == [2.0, 4.0, 8.0, 1.0, 2.0]
    assert host.inline_sync_pauses == 4
