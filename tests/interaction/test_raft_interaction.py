"""Golden-transcript interaction tests of the Raft core (etcd raft's datadriven style).

Each file in testdata/ is a sequence of blocks separated by blank lines. A block is either
comment lines (`# ...`, kept as they are) or one command, a `----` line and the transcript
the command produced. The test replays the commands on a fresh `Cluster` and compares every
transcript; `--rewrite` (or RAFTLOG_REWRITE=1) writes the new transcripts instead, so a
deliberate behaviour change shows up as a reviewable diff of these files.

The first line of a file, `# cluster: 1 2 3 [options]`, says which nodes the cluster starts
with; options are RaftConfig fields (`pre_vote=false`, `append_bytes_max=300`, ...).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from raft_harness import Cluster

from raftlog.config import RaftConfig

TESTDATA = Path(__file__).parent / "testdata"
SCRIPTS = sorted(TESTDATA.glob("*.txt"))


def _parse_value(field: dataclasses.Field[object], text: str) -> object:
    if text in ("true", "false"):
        return text == "true"
    if field.name == "planted_bugs":
        return frozenset(text.split(","))
    return int(text) if text.lstrip("-").isdigit() else text


def cluster_for(header: str) -> Cluster:
    assert header.startswith("# cluster:"), f"first line must be '# cluster: ...', got {header!r}"
    words = header.removeprefix("# cluster:").split()
    node_ids = [int(w) for w in words if "=" not in w]
    fields = {f.name: f for f in dataclasses.fields(RaftConfig)}
    options = {}
    for word in words:
        if "=" in word:
            name, value = word.split("=", 1)
            options[name] = _parse_value(fields[name], value)
    return Cluster(node_ids, config=RaftConfig(**options))  # type: ignore[arg-type]


def replay(text: str) -> str:
    """Run every command of a script; return the script with fresh transcripts."""
    blocks = text.strip("\n").split("\n\n")
    cluster = cluster_for(blocks[0].splitlines()[0])
    out = []
    for block in blocks:
        lines = block.splitlines()
        if all(line.startswith("#") for line in lines):
            out.append(block)
            continue
        command = lines[0]
        assert len(lines) == 1 or lines[1] == "----", f"malformed block: {block!r}"
        out.append("\n".join([command, "----", *cluster.run(command)]))
    return "\n\n".join(out) + "\n"


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_transcript(path: Path, rewrite: bool) -> None:
    expected = path.read_text()
    actual = replay(expected)
    if rewrite:
        path.write_text(actual)
        return
    assert actual == expected, f"{path.name} changed; rerun with --rewrite and review the diff"


def test_there_are_scripts() -> None:
    assert len(SCRIPTS) >= 8, [p.name for p in SCRIPTS]
