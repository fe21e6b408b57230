"""One JetStream publisher for the peers suite, in its own process; not a suite.

    python _jetstream_worker.py URLS TOPIC PARTITIONS RECORD_BYTES TOTAL_BYTES DURATION_S_MAX

URLS is comma-separated. The run is `_jetstream.publish_throughput`'s closed loop (nats-py's
`publish_async` through the bounded window over the topic's streams); the one line printed
is JSON with the records, their bytes and the seconds. Several of these at once say how much
of the one-process figure is the Python client's.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import sys
import time


async def publish(argv: list[str]) -> dict[str, float]:
    urls, topic, partitions, record_bytes, total_bytes, duration_s_max = argv
    sys.path[:0] = [str(pathlib.Path(__file__).resolve().parent)]
    import _jetstream  # found through the path set just above
    from _harness import payloads

    client, js = await _jetstream.connect_urls(urls.split(","))
    try:
        subjects = [_jetstream.subject_name(topic, p) for p in range(int(partitions))]
        values = payloads(int(record_bytes))
        await _jetstream.publish_all(js, subjects, values, count=_jetstream.WARM_UP_RECORDS)
        started = time.perf_counter()
        count = await _jetstream.publish_all(
            js, subjects, values, count=int(total_bytes) // int(record_bytes),
            duration_s=float(duration_s_max),
        )  # fmt: skip
        elapsed_s = time.perf_counter() - started
    finally:
        await client.close()
    return {"records": count, "value_bytes": count * int(record_bytes), "elapsed_s": elapsed_s}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(publish(sys.argv[1:]))), flush=True)
