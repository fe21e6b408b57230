"""The deterministic simulator: the real Raft core on simulated disks, network and clocks.

Theory of operation. A run is a pure function of its seed. `options` derives every knob from
`random.Random(seed)` (and prints them first); `cluster` drives one `RaftNode` per server
through `raftlog.runtime.ready.process_ready`, the server's own ready processor, over `disk`
(loses what was not synced, tears the last write, may crash the node inside a disk call) and
`network` (loss, duplication, delay, symmetric, one-way and bridge partitions); `workload`
plays clients and operators (proposals, reads, membership changes, compaction, leadership
transfer); `checker` checks Raft's invariants after every input and every step; after the
chaos, a heal phase demands liveness. `runner` turns a seed into a `SeedResult` and maps seed
ranges over processes; `python -m raftlog.sim` is the command line.

Modules: options, disk, network, trace, checker, workload, cluster, runner, __main__.
"""

from raftlog.sim.checker import Checker, InvariantViolation
from raftlog.sim.options import SimOptions, derive_options, scripted_options
from raftlog.sim.runner import SeedResult, run_seed, run_seeds

__all__ = [
    "Checker",
    "InvariantViolation",
    "SeedResult",
    "SimOptions",
    "derive_options",
    "run_seed",
    "run_seeds",
    "scripted_options",
]
