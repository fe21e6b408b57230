"""A/B of the own Producer's cost over a bare gRPC call, one record in flight, per tree.

    .venv/bin/python benchmarks/producer_overhead_ab.py --baseline main --rounds 4

Theory of operation. What the Producer adds to one acknowledged record is small beside the
cluster's round trip, which swings by milliseconds from minute to minute on a shared machine,
so it is measured against a bare call in the same process, on the same cluster and the same
gRPC channel, in interleaved blocks: `send().result()` of a 1 KiB record (linger 0) against
the same kind of Produce request (one record, acks=all, no producer id) sent from the calling
thread with `Cluster.call_future(...).result()`. Each run (one process per tree, as
`latency_ab.py`: the baseline is a `git archive` view) starts a fresh 3-node cluster, creates
a 1-partition topic, warms up, then runs `--blocks` blocks of `--block-records` of each kind
alternately and prints the p50 and p90 of each and the p50 difference (`overhead_p50_ms`).
In a tree where a written batch without callbacks is completed on gRPC's thread
(`ProducerBatch.claim_inline_completion`), a third kind, `via_sender`, switches that off
for its blocks (its answers go through the sender thread, as before), so the change is also
measured within one process: `inline_saving_p50_ms`. Rounds alternate the order of the
trees; medians and ranges per tree are printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

BENCHMARKS_DIR = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(BENCHMARKS_DIR / "suites"), str(BENCHMARKS_DIR)]
WORKER_TIMEOUT_S = 600
CURRENT = "-"
TOPIC = "overhead"


def worker(tree: str, work: pathlib.Path, blocks: int, block_records: int) -> None:
    """One run in this process (the tree is first on the path): print one line of JSON."""
    assert "raftlog" not in sys.modules, "imported before the tree was put on the path"
    if tree != CURRENT:
        sys.path.insert(0, tree)
        os.environ["PYTHONPATH"] = os.pathsep.join([tree, os.environ.get("PYTHONPATH", "")])
    from _harness import KIB, create_topic, payloads, percentile, running_cluster, warm_up

    import raftlog
    from raftlog.client import Admin, Producer
    from raftlog.client._connection import TopicPartition
    from raftlog.client._sender import serialized_produce_request
    from raftlog.client.accumulator import ProducerBatch
    from raftlog.rpc.v1 import raftlog_pb2 as pb
    from raftlog.storage.records import encode_batch

    assert tree == CURRENT or raftlog.__file__.startswith(tree), (tree, raftlog.__file__)
    values = payloads(KIB)
    samples_ms: dict[str, list[float]] = {"producer": [], "bare": []}
    inline = getattr(ProducerBatch, "claim_inline_completion", None)
    if inline is not None:
        samples_ms["via_sender"] = []
    with running_cluster(work) as running, Admin(running.bootstrap) as admin:
        create_topic(admin, TOPIC, partitions=1)
        with Producer(running.bootstrap, linger_ms=0) as client:
            warm_up(client, TOPIC, values)
            cluster = client._cluster  # the Producer's own channels: the same connection
            address = cluster.leader_address(TopicPartition(TOPIC, 0))

            def bare(value: bytes) -> None:
                # What the sender thread does for such a record, from the calling thread.
                batch = encode_batch([(None, value, int(time.time() * 1000), ())])
                request = serialized_produce_request(
                    TOPIC, 0, batch, acks=pb.ACKS_ALL, timeout_ms=24_000
                )
                future = cluster.call_future(address, "Log.Produce", request, timeout_ms=30_000)
                response = cluster.result(
                    future, address=address, rpc="Log.Produce", timeout_ms=30_000
                )
                assert response.error.code == pb.NONE, response.error

            def produce(value: bytes) -> None:
                client.send(TOPIC, value=value).result(timeout=60)

            for block in range(blocks):
                for kind in samples_ms:
                    # via_sender: this tree with its answers handed to the sender thread, as
                    # before the inline completion (the class attribute switched per block).
                    if inline is not None:
                        ProducerBatch.claim_inline_completion = (  # type: ignore[method-assign]
                            _never if kind == "via_sender" else inline
                        )
                    timed = bare if kind == "bare" else produce
                    for index in range(block_records):
                        value = values[(block * block_records + index) % len(values)]
                        started = time.perf_counter()
                        timed(value)
                        samples_ms[kind].append((time.perf_counter() - started) * 1e3)
    result: dict[str, float] = {}
    for kind, measured in samples_ms.items():
        measured.sort()
        result[f"{kind}_p50_ms"] = percentile(measured, 0.5)
        result[f"{kind}_p90_ms"] = percentile(measured, 0.9)
    result["overhead_p50_ms"] = result["producer_p50_ms"] - result["bare_p50_ms"]
    if inline is not None:
        result["inline_saving_p50_ms"] = result["via_sender_p50_ms"] - result["producer_p50_ms"]
    print(json.dumps(result), flush=True)


def _never(batch: object) -> bool:
    return False


def run_worker(tree: str, out: pathlib.Path, blocks: int, block_records: int) -> dict[str, float]:
    argv = [sys.executable, __file__, "--out", str(out), "--worker", tree]
    argv += ["--blocks", str(blocks), "--block-records", str(block_records)]
    from latency_ab import json_worker  # not at the top: see main

    return json_worker(argv, timeout_s=WORKER_TIMEOUT_S)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=pathlib.Path, help="output directory")
    parser.add_argument("--baseline", help="a git revision to run side by side")
    parser.add_argument("--rounds", type=int, default=4, help="runs of every tree")
    parser.add_argument("--blocks", type=int, default=6, help="blocks of each kind per run")
    parser.add_argument("--block-records", type=int, default=100, help="records per block")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # a tree: run one measurement
    args = parser.parse_args()
    if args.rounds < 1 or args.blocks < 1 or args.block_records < 1:
        parser.error("--rounds, --blocks and --block-records must be at least 1")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.worker is not None:
        worker(args.worker, args.out / "work", args.blocks, args.block_records)
        return
    # Imported here, not at the top: they import raftlog, which a worker takes from its tree.
    from client import baseline_tree
    from latency_ab import alternate, print_medians

    trees = {"current": CURRENT}
    if args.baseline:
        trees = {"baseline": baseline_tree(args.baseline, args.out), **trees}
    samples = alternate(
        trees, args.rounds, lambda tree: run_worker(tree, args.out, args.blocks, args.block_records)
    )
    (args.out / "producer-overhead-ab.json").write_text(json.dumps(samples, indent=2))
    print_medians(samples)


if __name__ == "__main__":
    main()
