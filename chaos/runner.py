"""One chaos run, start to verdict: cluster up, load under faults, heal, final read, check.

Theory of operation. Everything random derives from `RunOptions.seed`, printed first with
every option. The run has four phases:

1. setup: the backend starts the nodes; the topic is created; the run waits until every
   partition answers a high-watermark read (a run that cannot start is an error, not a
   verdict).
2. load: the workers send, poll and read watermarks while the main thread plays the fault
   schedule (`fault_schedule`), each fault planned against the current leaders when it starts
   (`plan_fault`) and recorded as nemesis `start`/`stop` events; a progress line is printed
   every `progress_interval_s` (elapsed time, operations completed, faults active).
3. heal: workers stop, every node is resumed, restarted and reconnected, and the run waits
   (up to `recovery_timeout_s`) until every partition answers again.
4. verdict: the final read of every partition; the checker and the stats (with the
   elections and fences the node logs show in the load phase, `raftlog.chaos.elections`);
   results.json, history.jsonl and the report are written to `out_dir`.

The backend is a port (`Backend`): `LocalBackend` (processes), `DockerBackend` (containers)
and `SyncObjBackend` (the pysyncobj baseline) all run through this same function.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from raftlog.chaos.checker import check
from raftlog.chaos.clients import LogClients
from raftlog.chaos.corrupt import repairs_in_logs
from raftlog.chaos.elections import election_stats, leader_removals
from raftlog.chaos.generator import PlannedFault, fault_schedule
from raftlog.chaos.history import NEMESIS, HistoryRecorder, pair_operations
from raftlog.chaos.kafka_proxy import KafkaDelayProxy
from raftlog.chaos.nemesis import NEMESES, ClusterControl, Nemesis, plan_fault
from raftlog.chaos.stats import availability, error_summary, fault_windows, latency_percentiles
from raftlog.chaos.txn_checker import FINAL, OUTCOMES
from raftlog.chaos.workload import Workers, WorkloadOptions, compacted_topic_config, final_read
from raftlog.config import NodeConfig

if TYPE_CHECKING:
    from raftlog.chaos.txn_workload import TxnOptions  # needs confluent-kafka

__all__ = ["Backend", "RunOptions", "run"]


class Backend(ClusterControl, Protocol):
    @property
    def log_paths(self) -> list[str]:
        """Each node's log file, read after the load for elections, fences and repairs."""
        ...

    def start(self, *, timeout_s: float = 60.0) -> LogClients:
        """Start the cluster and return clients for it; raises (TimeoutError and the like) when it
        is not up within `timeout_s`."""
        ...

    def stop(self) -> None:
        """Stop every node; called once at the end, also after a failed run."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    out_dir: Path
    seed: int
    duration_s: float = 60.0
    nemeses: tuple[str, ...] = ("kill", "partition", "pause")
    workload: WorkloadOptions = field(default_factory=WorkloadOptions)
    client: str = "grpc"  # which clients the backend gave the workload (for the record)
    gap_s: tuple[float, float] = (2.0, 5.0)
    hold_s: tuple[float, float] = (2.0, 6.0)
    recovery_timeout_s: float = 60.0
    creation_timeout_s: float = 60.0
    progress_interval_s: float = 5.0
    examples_max: int = 10
    # The transactional workload (raftlog.chaos.txn_workload) instead of `workload`'s sends;
    # `workload.partitions` is still what the faults aim at.
    txn: TxnOptions | None = None

    def __post_init__(self) -> None:
        unknown = set(self.nemeses) - set(NEMESES)
        if unknown:
            raise ValueError(f"--nemesis: unknown {sorted(unknown)}; choose from {NEMESES}")
        if self.duration_s <= 0:
            raise ValueError(f"--duration must be positive, got {self.duration_s}")
        if self.recovery_timeout_s <= 0:
            raise ValueError(f"--recovery-timeout must be positive, got {self.recovery_timeout_s}")


def _wait_ready(clients: LogClients, options: WorkloadOptions, *, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    partitions = list(range(options.partitions))
    while time.monotonic() < deadline:
        try:
            clients.high_watermarks(options.topic, partitions)
            return True
        except Exception:
            time.sleep(0.5)  # an election or a restart under way: ask again shortly
    return False


class _Progress:
    def __init__(self, recorder: HistoryRecorder, say: Callable[[str], None], interval_s: float):
        self._recorder = recorder
        self._say = say
        self._interval_s = interval_s
        self._next_s = time.monotonic() + interval_s
        self.active: list[str] = []

    def maybe_report(self, *, force: bool = False) -> None:
        """Print the progress line if `interval_s` has passed since the last one, or at once with
        `force`."""
        if not force and time.monotonic() < self._next_s:
            return
        self._next_s = time.monotonic() + self._interval_s
        events = self._recorder.events
        done = sum(1 for e in events if e.type != "invoke" and e.process != NEMESIS)
        ok = sum(1 for e in events if e.type == "ok")
        faults = ", ".join(self.active) or "none"
        elapsed = self._recorder.now_ns() / 1e9
        self._say(f"[{elapsed:6.1f}s] operations {done} done ({ok} ok); faults active: {faults}")


def _sleep_until(target_s: float, start_s: float, progress: _Progress) -> None:
    while (remaining := start_s + target_s - time.monotonic()) > 0:
        time.sleep(min(remaining, 0.5))
        progress.maybe_report()


def _play_faults(
    backend: Backend,
    nemesis: Nemesis,
    schedule: Sequence[PlannedFault],
    rng: random.Random,
    recorder: HistoryRecorder,
    progress: _Progress,
    options: RunOptions,
) -> None:
    start_s = time.monotonic()
    for number, planned in enumerate(schedule):
        _sleep_until(planned.start_s, start_s, progress)
        partition = rng.randrange(options.workload.partitions)
        leader = backend.partition_leader(partition)
        replicas = (
            backend.partition_replicas(partition) if planned.nemesis == "move-replica" else None
        )
        fault = plan_fault(
            planned.nemesis,
            backend.node_ids,
            rng,
            leader=leader,
            controller=backend.controller(),
            partition=partition,
            replicas=replicas,
            observers=backend.observers() if planned.nemesis == "remove-node" else (),
        )
        described = {"id": number, **fault.describe()}
        recorder.record(NEMESIS, "info", "start", described)
        effects = nemesis.start(fault)
        if effects:
            recorder.record(NEMESIS, "info", "effects", {"id": number, **effects})
        progress.active = [f"{fault.nemesis}/{fault.kind} {list(fault.nodes) or ''}".strip()]
        _sleep_until(planned.stop_s, start_s, progress)
        healed = nemesis.stop(fault)
        if healed:
            recorder.record(NEMESIS, "info", "effects", {"id": number, **healed})
        recorder.record(NEMESIS, "info", "stop", described)
        progress.active = []
    _sleep_until(options.duration_s, start_s, progress)


def run(
    options: RunOptions, backend: Backend, *, say: Callable[[str], None] = print
) -> dict[str, Any]:
    """Run once and write history.jsonl, results.json and the report; returns the results."""
    say(f"chaos run seed={options.seed} options={json.dumps(_options_json(options))}")
    options.out_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(options.seed)
    schedule = fault_schedule(
        rng,
        options.nemeses,
        duration_s=options.duration_s,
        gap_s=options.gap_s,
        hold_s=options.hold_s,
    )
    clients = backend.start()
    try:
        for work in _topics(options):
            clients.create_topic(
                work.topic, work.partitions, work.replication_factor, compacted_topic_config(work)
            )
            if not _wait_ready(clients, work, timeout_s=options.creation_timeout_s):
                timeout_s = options.creation_timeout_s
                raise TimeoutError(f"topic {work.topic!r} not readable {timeout_s}s after creation")
        with (options.out_dir / "history.jsonl").open("w", buffering=1) as sink:
            recorder = HistoryRecorder(time.monotonic_ns, sink)
            progress = _Progress(recorder, say, options.progress_interval_s)
            load = _load_heal_read if options.txn is None else _txn_load_heal_read
            results = load(options, backend, clients, recorder, progress, schedule, rng)
            recorder.close()
    finally:
        backend.stop()
    (options.out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    from raftlog.chaos.report import write_report

    write_report(options.out_dir, recorder.events, results)
    say(
        f"valid: {results['valid']}; wrote {options.out_dir}/results.json, history.jsonl, report.md"
    )
    return results


def _topics(options: RunOptions) -> list[WorkloadOptions]:
    """The workload's topic, or the transactional workload's topics, as workload options."""
    if options.txn is None:
        return [options.workload]
    return [
        replace(options.workload, topic=topic, partitions=options.txn.partitions, keys=0)
        for topic in options.txn.topics
    ]


def _txn_load_heal_read(
    options: RunOptions,
    backend: Backend,
    clients: LogClients,
    recorder: HistoryRecorder,
    progress: _Progress,
    schedule: Sequence[PlannedFault],
    rng: random.Random,
) -> dict[str, Any]:
    """`_load_heal_read` for the transactional workload: transactions under the faults (and the
    txn-delay nemesis), the heal, the final read_committed read, the checker."""
    from raftlog.chaos.kafka_clients import KafkaClients  # needs confluent-kafka
    from raftlog.chaos.txn_workload import TxnWorkers, final_txn_read

    txn = options.txn
    assert txn is not None
    assert isinstance(clients, KafkaClients), "--workload txn runs on the Kafka listeners"
    bootstrap = clients.bootstrap  # the Kafka listeners (or their proxies)
    proxy: KafkaDelayProxy | None = getattr(backend, "kafka_proxy", None)
    workers = TxnWorkers(bootstrap, recorder, txn, options.seed, proxy)
    nemesis = Nemesis(backend)
    workers.start()
    try:
        _play_faults(backend, nemesis, schedule, rng, recorder, progress, options)
    finally:
        load_end_ns = recorder.now_ns()
        stuck = workers.stop(timeout_s=txn.api_timeout_s * 2 + 10)
        nemesis.heal_all()
    if workers.crashes:
        raise RuntimeError(f"worker crashed: {'; '.join(workers.crashes)}")
    recorder.record(NEMESIS, "info", "heal", {"stuck_workers": stuck})
    progress.maybe_report(force=True)
    recovered = all(
        _wait_ready(clients, work, timeout_s=options.recovery_timeout_s)
        for work in _topics(options)
    )
    final_txn_read(bootstrap, recorder, txn)
    ops = list(pair_operations(recorder.events))
    verdict = check(ops, examples_max=options.examples_max)
    load_ops = [op for op in ops if op.process != FINAL]
    txns = [op for op in ops if op.f == "txn"]
    return {
        "valid": verdict.valid and not verdict.unchecked,
        "seed": options.seed,
        "options": _options_json(options),
        "anomaly_counts": verdict.counts,
        "anomalies": verdict.anomalies,
        "unchecked": verdict.unchecked,
        "recovered_after_heal": recovered,
        "transactions": {
            outcome: sum(1 for op in txns if op.type == type_)
            for type_, outcome in OUTCOMES.items()
        },
        "delays": sum(1 for e in recorder.events if e.process == NEMESIS and e.f == "held"),
        "availability": availability(load_ops, end_ns=load_end_ns),
        "latency_ms": latency_percentiles(ops),
        "errors": error_summary(ops),
        "faults": [asdict(w) for w in fault_windows(recorder.events, end_ns=load_end_ns)],
        "node_logs": backend.log_paths,
    }


def _load_heal_read(
    options: RunOptions,
    backend: Backend,
    clients: LogClients,
    recorder: HistoryRecorder,
    progress: _Progress,
    schedule: Sequence[PlannedFault],
    rng: random.Random,
) -> dict[str, Any]:
    workers = Workers(clients, recorder, options.workload, options.seed)
    nemesis = Nemesis(backend)
    # Node logs carry wall-clock times; the history, times since its start.
    wall_origin_s = time.time() - recorder.now_ns() / 1e9
    workers.start()
    try:
        _play_faults(backend, nemesis, schedule, rng, recorder, progress, options)
    finally:
        load_end_ns = recorder.now_ns()
        stuck = workers.stop(timeout_s=options.workload.close_timeout_s + 10)
        nemesis.heal_all()
    if workers.crashes:
        raise RuntimeError(f"worker crashed: {'; '.join(workers.crashes)}")
    recorder.record(NEMESIS, "info", "heal", {"stuck_workers": stuck})
    progress.maybe_report(force=True)
    recovered = _wait_ready(clients, options.workload, timeout_s=options.recovery_timeout_s)
    final_read(clients, recorder, options.workload)
    ops = list(pair_operations(recorder.events))
    verdict = check(ops, examples_max=options.examples_max, compacted=options.workload.keys > 0)
    windows = fault_windows(recorder.events, end_ns=load_end_ns)
    load_ops = [op for op in ops if op.f != "final_read"]
    # A partition the final read could not judge makes the run unproven, so not valid.
    return {
        "valid": verdict.valid and not verdict.unchecked,
        "seed": options.seed,
        "options": _options_json(options),
        "anomaly_counts": verdict.counts,
        "anomalies": verdict.anomalies,
        "unchecked": verdict.unchecked,
        "recovered_after_heal": recovered,
        "availability": availability(load_ops, end_ns=load_end_ns),
        "latency_ms": latency_percentiles(ops),
        "errors": error_summary(ops),
        "faults": [asdict(w) for w in windows],
        "storage": _storage_damage(recorder, backend),
        "elections": _elections(recorder, backend, wall_origin_s, load_end_ns),
        "node_logs": backend.log_paths,
    }


def _elections(
    recorder: HistoryRecorder, backend: Backend, wall_origin_s: float, load_end_ns: int
) -> dict[str, Any]:
    """Elections and fences of the load phase, from the node logs, and the faults that
    explain elections (`raftlog.chaos.elections`); timeouts are the nodes' defaults."""
    config = NodeConfig()
    removals = leader_removals(
        recorder.events,
        wall_origin_s=wall_origin_s,
        election_timeout_ms=config.raft.election_timeout_ticks * config.tick_interval_ms,
        heartbeat_interval_ms=config.raft.heartbeat_interval_ticks * config.tick_interval_ms,
    )
    window_s = (wall_origin_s, wall_origin_s + load_end_ns / 1e9)
    return election_stats(list(backend.log_paths), window_s=window_s, removals=removals)


def _storage_damage(recorder: HistoryRecorder, backend: Backend) -> dict[str, Any]:
    """What `corrupt` damaged, and what the node logs say was found and repaired."""
    damage = [
        {"node": node, **report}
        for event in recorder.events
        if event.process == NEMESIS and event.f == "effects" and isinstance(event.value, dict)
        for node, report in event.value.get("damage", {}).items()
        if report is not None
    ]
    return {"damage": damage, **repairs_in_logs(list(backend.log_paths))}


def _options_json(options: RunOptions) -> dict[str, Any]:
    raw = asdict(options)
    raw["out_dir"] = str(options.out_dir)
    return raw
