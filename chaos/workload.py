"""The workload: producer, consumer and watermark processes that record what they see.

Theory of operation. Each worker is one thread that plays one or more Jepsen processes. A
producer process sends unique values (`"<process>-<n>"`) to random partitions at a bounded
rate with at most `in_flight_max` sends outstanding; completions are recorded from the
producer's callbacks, so sends really pipeline (which is what makes per-partition order worth
checking). A consumer process polls every partition from offset 0 and records the records it
got; when its consumer fails for good it is replaced, under a new process id, as a crashed
Jepsen process is. A watermark process reads every partition's high watermark twice a
second. After the load phase and the heal, `final_read` reads every partition from 0.

Every worker records an invoke before acting and exactly one completion after (see
`raftlog.chaos.history`); a send still outstanding when the run ends is left without a
completion, which the checker counts as unknown.
"""

from __future__ import annotations

import functools
import itertools
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from raftlog.chaos.clients import ChaosConsumer, LogClients, send_outcome
from raftlog.chaos.consumer_groups import GroupClients, group_member, read_committed
from raftlog.chaos.generator import RateLimiter
from raftlog.chaos.history import HistoryRecorder

__all__ = ["ProcessIds", "Workers", "WorkloadOptions", "compacted_topic_config", "final_read"]


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadOptions:
    topic: str = "chaos"
    partitions: int = 3
    replication_factor: int = 3
    producers: int = 2
    consumers: int = 1
    acks: str = "all"
    idempotence: bool = True
    send_rate_per_s: float = 40.0  # per producer process
    in_flight_max: int = 16  # sends outstanding per producer process
    poll_timeout_ms: int = 500
    watermark_interval_s: float = 0.5
    close_timeout_s: float = 5.0
    final_read_timeout_s: float = 30.0
    # "assign": each consumer reads every partition from 0; "group": consumers subscribe
    # through one consumer group (raftlog.chaos.consumer_groups).
    consumer_mode: str = "assign"
    member_lifetime_s: tuple[float, float] = (3.0, 8.0)  # group mode: then a new member
    # > 0: the keyed workload, on a compacted topic (each send a key out of this many).
    keys: int = 0

    def __post_init__(self) -> None:
        if self.consumer_mode not in ("assign", "group"):
            raise ValueError(f"consumer mode: 'assign' or 'group', got {self.consumer_mode!r}")
        assert self.partitions > 0 and self.producers >= 0 and self.consumers >= 0
        assert self.send_rate_per_s > 0 and self.in_flight_max > 0 and self.keys >= 0
        if self.acks not in ("all", "1", "0"):
            raise ValueError(f"acks: 'all', '1' or '0', got {self.acks!r}")
        if self.idempotence and self.acks != "all":
            raise ValueError(f"idempotence needs acks=all (got acks={self.acks}): disable it")


def compacted_topic_config(options: WorkloadOptions) -> dict[str, str] | None:
    """The keyed workload's topic: compacted, in small segments cleaned eagerly, so a run
    of a minute rolls and cleans segments many times under its faults."""
    if not options.keys:
        return None
    return {
        "cleanup.policy": "compact",
        "segment.bytes": "16384",
        "segment.ms": "2000",
        "min.cleanable.dirty.ratio": "0.01",
        "delete.retention.ms": "0",
    }


class ProcessIds:
    """Thread-safe source of fresh process ids."""

    def __init__(self) -> None:
        self._next = itertools.count()
        self._lock = threading.Lock()

    def take(self) -> int:
        """The next process id, never handed out before (0, 1, 2...)."""
        with self._lock:
            return next(self._next)


def _error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:300]


def _producer(
    clients: LogClients,
    recorder: HistoryRecorder,
    options: WorkloadOptions,
    process: int,
    rng: random.Random,
    stop: threading.Event,
) -> None:
    producer = clients.producer(acks=options.acks, idempotence=options.idempotence)
    window = threading.BoundedSemaphore(options.in_flight_max)
    limiter = RateLimiter(options.send_rate_per_s, clock=time.monotonic, sleep=stop.wait)

    def completed(invoke: dict[str, Any], future: Future[int]) -> None:
        """Record the send's completion (ok with its offset, else `send_outcome`'s fail or info with
        the error) and free its in-flight slot."""
        error = future.exception()
        if error is None:
            recorder.record(process, "ok", "send", {**invoke, "offset": future.result()})
        else:
            recorder.record(
                process, send_outcome(error), "send", {**invoke, "error": _error(error)}
            )
        window.release()

    try:
        for n in itertools.count(1):
            limiter.wait()
            if stop.is_set():
                break
            if not window.acquire(timeout=0.5):
                continue
            partition, value = rng.randrange(options.partitions), f"{process}-{n}"
            key = f"k{rng.randrange(options.keys)}" if options.keys else None
            invoke: dict[str, Any] = {
                "topic": options.topic,
                "partition": partition,
                "value": value,
            }
            if key is not None:
                invoke["key"] = key
            recorder.record(process, "invoke", "send", invoke)
            try:
                future = producer.send(options.topic, partition, value, key)
            except Exception as error:  # refused before it was queued: certainly not written
                recorder.record(process, "fail", "send", {**invoke, "error": _error(error)})
                window.release()
                continue
            future.add_done_callback(functools.partial(completed, invoke))
    finally:
        producer.close(options.close_timeout_s)


def _consumer(
    clients: LogClients,
    recorder: HistoryRecorder,
    options: WorkloadOptions,
    ids: ProcessIds,
    stop: threading.Event,
) -> None:
    consumer: ChaosConsumer | None = None
    process = -1
    partitions = list(range(options.partitions))
    while not stop.is_set():
        if consumer is None:
            process = ids.take()
            consumer = clients.consumer(options.topic, partitions)
        recorder.record(process, "invoke", "poll", None)
        try:
            records = consumer.poll(options.poll_timeout_ms)
        except Exception as error:  # a read changes nothing, so a failed poll is a `fail`
            recorder.record(process, "fail", "poll", {"error": _error(error)})
            if not getattr(error, "retriable", False):
                consumer.close()
                consumer = None  # its position is no longer trusted: a new process
                stop.wait(0.2)
            continue
        rows = [{"topic": options.topic, "partition": r.partition, "offset": r.offset,
                 "value": r.value} for r in records]  # fmt: skip
        recorder.record(process, "ok", "poll", {"records": rows})
    if consumer is not None:
        consumer.close()


def _watermarks(
    clients: LogClients,
    recorder: HistoryRecorder,
    options: WorkloadOptions,
    process: int,
    stop: threading.Event,
) -> None:
    partitions = list(range(options.partitions))
    while not stop.wait(options.watermark_interval_s):
        recorder.record(process, "invoke", "watermarks", {"topic": options.topic})
        try:
            hws = clients.high_watermarks(options.topic, partitions)
        except Exception as error:
            recorder.record(process, "fail", "watermarks", {"error": _error(error)})
            continue
        value = {"topic": options.topic, "high_watermarks": {str(p): hw for p, hw in hws.items()}}
        recorder.record(process, "ok", "watermarks", value)


def _group_clients(clients: LogClients) -> GroupClients:
    if not isinstance(clients, GroupClients):
        raise ValueError(f"--consumer-mode group: {type(clients).__name__} has no consumer groups")
    return clients


def _committed(
    clients: LogClients,
    recorder: HistoryRecorder,
    options: WorkloadOptions,
    process: int,
    stop: threading.Event,
) -> None:
    partitions = list(range(options.partitions))
    group_clients = _group_clients(clients)
    while not stop.wait(options.watermark_interval_s):
        read_committed(group_clients, recorder, options.topic, partitions, process)


class Workers:
    """Starts every worker thread; `stop` asks them to finish and waits (bounded)."""

    def __init__(
        self, clients: LogClients, recorder: HistoryRecorder, options: WorkloadOptions, seed: int
    ) -> None:
        self.stop_event = threading.Event()
        self.ids = ProcessIds()
        self._threads: list[threading.Thread] = []
        targets: list[tuple[str, Callable[[], None]]] = []
        stop = self.stop_event
        for _ in range(options.producers):
            process = self.ids.take()
            rng = random.Random(seed * 1000 + process)
            target = functools.partial(_producer, clients, recorder, options, process, rng, stop)
            targets.append((f"producer-{process}", target))
        for n in range(options.consumers):
            target = functools.partial(_consumer, clients, recorder, options, self.ids, stop)
            if options.consumer_mode == "group":
                target = functools.partial(
                    group_member, _group_clients(clients), recorder, options.topic,
                    self.ids.take, stop, poll_timeout_ms=options.poll_timeout_ms,
                    lifetime_s=functools.partial(
                        random.Random(seed * 1000 + 500 + n).uniform, *options.member_lifetime_s
                    ),
                )  # fmt: skip
            targets.append((f"consumer-{n}", target))
        process = self.ids.take()
        target = functools.partial(_watermarks, clients, recorder, options, process, stop)
        targets.append(("watermarks", target))
        if options.consumer_mode == "group":
            process = self.ids.take()
            target = functools.partial(_committed, clients, recorder, options, process, stop)
            targets.append(("committed", target))
        self.crashes: list[str] = []
        for name, work in targets:
            thread = threading.Thread(
                target=self._guard, args=(name, work), name=f"chaos-{name}", daemon=True
            )
            self._threads.append(thread)
        self.options = options

    def _guard(self, name: str, work: Callable[[], None]) -> None:
        # A worker that dies would silently thin the history: the run must say so instead.
        try:
            work()
        except Exception as error:
            self.crashes.append(f"{name}: {_error(error)}")
            self.stop_event.set()

    def start(self) -> None:
        """Start every worker thread; call once. A worker that raises is listed in `crashes` and
        stops the others."""
        for thread in self._threads:
            thread.start()

    def stop(self, *, timeout_s: float) -> list[str]:
        """Stop and join; returns the names of threads that did not finish in time."""
        self.stop_event.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [t.name for t in self._threads if t.is_alive()]


def final_read(
    clients: LogClients,
    recorder: HistoryRecorder,
    options: WorkloadOptions,
    *,
    attempts_max: int = 3,
) -> None:
    """Read every partition from offset 0; a failed read is retried, each try recorded."""
    assert attempts_max > 0
    for partition in range(options.partitions):
        invoke = {"topic": options.topic, "partition": partition}
        for _ in range(attempts_max):
            recorder.record("final", "invoke", "final_read", invoke)
            try:
                read = clients.final_read(
                    options.topic, partition, timeout_s=options.final_read_timeout_s
                )
            except Exception as error:
                recorder.record("final", "fail", "final_read", {**invoke, "error": _error(error)})
                continue
            rows = [{"topic": options.topic, "partition": r.partition, "offset": r.offset,
                     "value": r.value, "key": r.key} for r in read.records]  # fmt: skip
            value = {**invoke, "records": rows, "end_offset": read.end_offset}
            recorder.record("final", "ok", "final_read", value)
            break
    if options.consumer_mode == "group":
        partitions = list(range(options.partitions))
        read_committed(_group_clients(clients), recorder, options.topic, partitions, "final")
