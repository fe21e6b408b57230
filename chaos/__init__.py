"""Jepsen-style fault injection for raftlog: clients, generators, nemeses, checkers (raftlog.chaos).

Theory of operation. A run (`run(RunOptions(...), backend)`) starts a cluster through a
backend (node processes, containers, or the pysyncobj baseline), drives producer, consumer
and watermark processes that record every operation as JSON-lines history events
(`invoke`, then `ok` / `fail` / `info` for an unknown outcome), lets a nemesis inject and
heal faults on a seeded schedule, heals everything, reads every partition from offset 0 and
hands the history to `check`, which reports lost acknowledged writes, duplicates, offsets
holding two values, phantom and failed reads, polls that skip or go backward, reordered
sends, reads later gone and high watermarks moving backward. `raftlog chaos run` is the
command line; docs/chaos.md is the manual.

Modules: `history`, `clients`, `workload`, `generator`, `nemesis`, `checker`, `stats`,
`runner`, `report`, `cli`, and the backends `local_backend`, `docker_backend`,
`syncobj_log` (imported on demand: they pull in Docker, pysyncobj or matplotlib).
"""

from raftlog.chaos.checker import ANOMALIES, CheckResult, check
from raftlog.chaos.clients import LogClients, RaftlogClients, send_outcome
from raftlog.chaos.history import Event, HistoryRecorder, Op, load_history, pair_operations
from raftlog.chaos.nemesis import NEMESES, ClusterControl, Fault, Nemesis, plan_fault
from raftlog.chaos.runner import Backend, RunOptions, run
from raftlog.chaos.workload import WorkloadOptions

__all__ = [
    "ANOMALIES",
    "NEMESES",
    "Backend",
    "CheckResult",
    "ClusterControl",
    "Event",
    "Fault",
    "HistoryRecorder",
    "LogClients",
    "Nemesis",
    "Op",
    "RaftlogClients",
    "RunOptions",
    "WorkloadOptions",
    "check",
    "load_history",
    "pair_operations",
    "plan_fault",
    "run",
    "send_outcome",
]
