"""Storage damage for the `corrupt` nemesis: one of a stopped node's data files hurt on disk.

Theory of operation. A real disk returns damaged or missing data now and then: a latent
sector error, a firmware bug, a misdirected or lost write, an operator's `truncate` or `rm`.
`damage_node_files` does one of those to one file of a node that is not running: it flips a
few bytes in the middle, truncates the file to a fraction of its length, or deletes it. The
files are the node's own (segments, their indexes, hard state, durable marks, checkpoints,
snapshots, bootstrap voters), never the chaos harness's manifest. Every choice comes from
the caller's seeded generator, so a run replays; the description returned goes into the
history and the report. Which nodes may be damaged is the nemesis's decision (a fixed
minority, `raftlog.chaos.nemesis`): raftlog promises to survive damage on a minority.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from raftlog.storage.chaos_file_system import DURABILITY_MANIFEST_NAME

__all__ = ["DAMAGE_KINDS", "damage_node_files", "damageable_files", "repairs_in_logs"]

DAMAGE_KINDS = ("flip", "truncate", "delete")
# Node log lines that say a replica found damage, and that its repair finished
# (raftlog.node.node, raftlog.runtime.group).
DAMAGE_LINE = "storage damage"
REPAIRED_LINE = "repair finished"
_SKIPPED_SUFFIXES = (".tmp", ".pem", ".key", ".crt", ".json", ".lock")


def damageable_files(data_dir: str) -> list[Path]:
    """The node's data files, in a stable order (so a seed picks the same one)."""
    root = Path(data_dir)
    found = [
        path
        for path in root.rglob("*")
        if path.is_file()
        and path.name != DURABILITY_MANIFEST_NAME
        and not path.name.endswith(_SKIPPED_SUFFIXES)
        and path.stat().st_size > 0
    ]
    return sorted(found)


def damage_node_files(
    data_dir: str, rng: random.Random, *, kinds: Sequence[str] = DAMAGE_KINDS
) -> dict[str, Any] | None:
    """Damage one file under `data_dir` (its node must be stopped) in one of `kinds`; what
    was done, or None when there is no file to damage."""
    files = damageable_files(data_dir)
    if not files:
        return None
    # Segments hold the acknowledged data: hit them half the time, any file otherwise.
    segments = [path for path in files if path.suffix == ".log"]
    path = rng.choice(segments if segments and rng.random() < 0.5 else files)
    kind = rng.choice(tuple(kinds))
    assert kind in DAMAGE_KINDS, kind
    size = path.stat().st_size
    relative = os.path.relpath(path, data_dir)
    if kind == "delete":
        path.unlink()
        return {"file": relative, "damage": kind, "size_bytes": size}
    if kind == "truncate":
        keep = int(size * rng.uniform(0.2, 0.9))
        os.truncate(path, keep)
        return {"file": relative, "damage": kind, "size_bytes": size, "kept_bytes": keep}
    data = bytearray(path.read_bytes())
    low, high = size // 4, max(size // 4 + 1, 3 * size // 4)
    positions = sorted({rng.randrange(low, high) for _ in range(rng.randint(1, 3))})
    for position in positions:
        data[position] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))
    return {"file": relative, "damage": kind, "size_bytes": size, "positions": positions}


def repairs_in_logs(log_paths: list[str]) -> dict[str, int]:
    """How many damaged groups the node logs report, and how many repairs finished."""
    found, repaired = 0, 0
    for log_path in log_paths:
        try:
            text = Path(log_path).read_text(errors="replace")
        except OSError:
            continue
        found += text.count(DAMAGE_LINE)
        repaired += text.count(REPAIRED_LINE)
    return {"damage_found": found, "repairs_finished": repaired}
