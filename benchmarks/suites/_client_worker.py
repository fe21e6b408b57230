"""One producer run for the client suite, in its own process; not a suite.

    python _client_worker.py TREE BOOTSTRAP TOPIC RECORD_BYTES TOTAL_BYTES

TREE is a folder holding a `raftlog` namespace (a view of another commit, so two versions of
the client can be measured against the same cluster), or "-" for the installed one. It goes
first on sys.path before anything imports raftlog. The run is the cluster suite's acks=all
closed loop (`cluster.produce`: same producer settings, same payloads); the one line printed
is JSON with the records, their bytes, the seconds and the process CPU seconds (every thread
of this process: the caller's and the sender's share one GIL, so moving work between them
is no saving) spent from the producer's construction to its close.
"""

from __future__ import annotations

import json
import pathlib
import sys
import time


def main(argv: list[str]) -> None:
    tree, bootstrap, topic, record_bytes, total_bytes = argv
    if tree != "-":
        sys.path.insert(0, tree)
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import cluster  # found through the path set just above

    cpu_started_s = time.process_time()
    throughput = cluster.produce(
        bootstrap, topic, "all", record_bytes=int(record_bytes), total_bytes=int(total_bytes)
    )
    cpu_s = time.process_time() - cpu_started_s
    import raftlog

    assert tree == "-" or raftlog.__file__.startswith(tree), (tree, raftlog.__file__)
    result = {
        "records": throughput.records,
        "value_bytes": throughput.value_bytes,
        "elapsed_s": throughput.elapsed_s,
        "cpu_s": cpu_s,
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
