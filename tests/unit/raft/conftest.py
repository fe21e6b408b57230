"""The Raft unit tests share the interaction harness (`raft_harness.Cluster`)."""

from __future__ import annotations

import sys
from pathlib import Path

# tests/ has no packages; make tests/interaction/raft_harness.py importable by name.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "interaction"))
