"""One pysyncobj node of the outside baseline; run as a separate process.

Theory of operation. Three of these processes form a pysyncobj cluster on loopback. Each
replicates one `SyncObj` whose only command, `append(data)`, adds the command's bytes to a
counter (the state machine keeps no data, so memory does not grow with the run). When a leader
is elected, the leader process alone becomes the driver: it submits `commands` commands of
the same seeded random payload, each with a callback, keeping at most `window` unacknowledged
(a semaphore released by the callback), and prints one JSON line with the bytes acknowledged
and the seconds from the first submit to the last callback. Followers print nothing and run
until the parent kills them.

pysyncobj keeps its Raft log in memory (no `journalFile`), so it never fsyncs: the baseline
is favoured over raftlog, which fsyncs every acks=all write.

    python _pysyncobj_node.py --port P --partners P2,P3 --commands N --payload-bytes B
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated

SEED = 20261122
LEADER_WAIT_S_MAX = 30.0
CALLBACK_WAIT_S_MAX = 120.0


class Counter(SyncObj):  # type: ignore[misc]
    def __init__(self, self_address: str, partners: list[str], conf: SyncObjConf) -> None:
        super().__init__(self_address, partners, conf=conf)
        self.applied_bytes = 0

    @replicated  # type: ignore[misc]
    def append(self, data: bytes) -> int:
        self.applied_bytes += len(data)
        return self.applied_bytes


def best_conf(batch_bytes: int) -> SyncObjConf:
    """The settings that measured fastest here (see benchmarks/README.md): batched appends
    with a large batch, large socket buffers, a short tick so callbacks fire promptly."""
    return SyncObjConf(
        appendEntriesUseBatch=True,
        appendEntriesBatchSizeBytes=batch_bytes,
        sendBufferSize=2**22,
        recvBufferSize=2**22,
        commandsQueueSize=1_000_000,
        autoTickPeriod=0.001,
        logCompactionMinTime=10_000,
        logCompactionMinEntries=10**9,
    )


def wait_leader(node: Counter) -> str:
    deadline = time.monotonic() + LEADER_WAIT_S_MAX
    while time.monotonic() < deadline:
        leader = node._getLeader()
        if leader is not None:
            return str(leader.address if hasattr(leader, "address") else leader)
        time.sleep(0.05)
    raise RuntimeError(f"pysyncobj: no leader after {LEADER_WAIT_S_MAX} s")


def drive(node: Counter, commands: int, payload_bytes: int, window: int) -> dict[str, float]:
    assert commands > 0 and window > 0, (commands, window)
    payload = random.Random(SEED).randbytes(payload_bytes)
    slots = threading.Semaphore(window)
    done = threading.Event()
    state = {"acked": 0, "failed": 0, "last_s": 0.0}

    def on_result(result: object, error: int) -> None:
        if error == FAIL_REASON.SUCCESS:
            state["acked"] += 1
        else:
            state["failed"] += 1
        slots.release()
        if state["acked"] + state["failed"] == commands:
            state["last_s"] = time.perf_counter()
            done.set()

    started = time.perf_counter()
    for _ in range(commands):
        slots.acquire()
        node.append(payload, callback=on_result)
    if not done.wait(CALLBACK_WAIT_S_MAX):
        raise RuntimeError(f"pysyncobj: {state} of {commands} callbacks after the wait")
    elapsed_s = state["last_s"] - started
    assert elapsed_s > 0, elapsed_s
    return {
        "acked_bytes": state["acked"] * payload_bytes,
        "failed": state["failed"],
        "elapsed_s": elapsed_s,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--partners", required=True)
    parser.add_argument("--commands", type=int, required=True)
    parser.add_argument("--payload-bytes", type=int, default=1024)
    parser.add_argument("--window", type=int, default=10_000)
    parser.add_argument("--batch-bytes", type=int, default=2**20)
    args = parser.parse_args()
    self_address = f"127.0.0.1:{args.port}"
    partners = [f"127.0.0.1:{p}" for p in args.partners.split(",")]
    node = Counter(self_address, partners, best_conf(args.batch_bytes))
    leader = wait_leader(node)
    if leader != self_address:
        while True:  # a follower: serve until the parent kills this process
            time.sleep(1)
    result = drive(node, args.commands, args.payload_bytes, args.window)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
