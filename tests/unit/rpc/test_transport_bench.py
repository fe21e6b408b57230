"""The file candidates of the transport benchmark (benchmarks/suites/transport.py) move the
leader's batches intact: run each on a tiny log, in one process, and compare the follower's
file with the leader's segment byte for byte. No timing is checked."""

from __future__ import annotations

import asyncio
import importlib.util
import pathlib
import sys
from types import ModuleType
from typing import Any

import pytest

from raftlog.storage.batch import verify_batch

SUITE = pathlib.Path(__file__).resolve().parents[3] / "benchmarks" / "suites" / "transport.py"
KIB = 1024


def load_suite() -> ModuleType:
    name = "benchmark_suites.transport"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SUITE)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.mark.parametrize("event_loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("candidate", ["push_read", "pull_read", "pull_sendfile"])
def test_candidate_moves_the_leaders_batches_intact(
    tmp_path: pathlib.Path, candidate: str, event_loop: str
) -> None:
    if event_loop == "uvloop":
        pytest.importorskip("uvloop")
    bench = load_suite()
    batch_bytes = bench.BATCH_BYTES
    leader = bench.LeaderLog(tmp_path / "leader", log_bytes=32 * batch_bytes)
    # Spans of 3 batches over 40 batches: the last span of the segment is short (2 batches)
    # and the run wraps around to offset 0, as the benchmark's long runs do.
    span_bytes, volume_bytes = 3 * batch_bytes, 40 * batch_bytes
    protocols: list[Any] = []  # the suite's FollowerReceiver, loaded by path

    def follower() -> Any:
        protocol = bench.FollowerReceiver(tmp_path, candidate, pull=candidate.startswith("pull"))
        protocols.append(protocol)
        return protocol

    async def main() -> int:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(follower, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        written = await bench.FILE_SENDERS[candidate](port, leader, span_bytes, volume_bytes)
        # The follower closes its file when the leader's side of the connection is gone.
        while any(protocol.fd != -1 for protocol in protocols):
            await asyncio.sleep(0.01)
        server.close()
        await server.wait_closed()
        return int(written)

    try:
        written = bench.run_on(event_loop, main)
    finally:
        leader.close()
    received = (tmp_path / f"{candidate}.log").read_bytes()
    assert len(received) == written >= volume_bytes
    assert written % batch_bytes == 0, written
    segment = pathlib.Path(leader.path).read_bytes()
    batch_count = len(segment) // batch_bytes
    assert batch_count == 32
    for index in range(written // batch_bytes):
        got = received[index * batch_bytes : (index + 1) * batch_bytes]
        source = index % batch_count
        assert got == segment[source * batch_bytes : (source + 1) * batch_bytes], index
        assert verify_batch(got).size_bytes == batch_bytes
