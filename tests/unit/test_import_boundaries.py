"""The "must not" column of ARCHITECTURE.md's package map, enforced on the source: every
`import` and `from ... import` of each module (at any depth, TYPE_CHECKING blocks included),
read with `ast`, is checked against the rules of the layer the module belongs to."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# pyproject.toml's package-dir: one import namespace over several top-level folders.
PACKAGE_DIRS = {
    "raftlog": ROOT / "raftlog",
    "raftlog.metadata": ROOT / "metadata",
    "raftlog.partition": ROOT / "partition",
    "raftlog.rpc": ROOT / "rpc",
    "raftlog.connectors.spark": ROOT / "connectors" / "spark",
    "raftlog.chaos": ROOT / "chaos",
}


def _module_files() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package, directory in PACKAGE_DIRS.items():
        for path in sorted(directory.rglob("*.py")):
            parts = path.relative_to(directory).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


MODULES = _module_files()


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, absolute (the package has no relative imports)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module, f"{path}: relative import"
            found.add(node.module)
            # `from raftlog.storage import records` imports the submodule.
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


@dataclass(frozen=True)
class Rule:
    layer: str  # the modules the rule applies to (a package or a module)
    forbidden: tuple[str, ...]  # what they must not import (packages or modules)
    allowed: tuple[str, ...] = ()  # exceptions inside `forbidden`
    why: str = ""

    def violations(self) -> list[str]:
        found = []
        for module, path in MODULES.items():
            if not _within(module, self.layer):
                continue
            for name in sorted(_imports(path)):
                if any(_within(name, f) for f in self.forbidden) and not any(
                    _within(name, a) for a in self.allowed
                ):
                    found.append(f"{module} imports {name}")
        return found


# What the server is made of: none of it may depend on the chaos suite.
SERVER = (
    "raftlog.raft",
    "raftlog.storage",
    "raftlog.runtime",
    "raftlog.partition",
    "raftlog.metadata",
    "raftlog.rpc",
    "raftlog.node.node",
    "raftlog.serve",
)
# The RecordBatch v2 wire format, which clients encode and decode too.
RECORD_FORMAT = (
    "raftlog.storage.batch",
    "raftlog.storage.compression",
    "raftlog.storage.control_batches",
    "raftlog.storage.record_decoder",
    "raftlog.storage.record_encoder",
    "raftlog.storage.record_format",
    "raftlog.storage.record_validation",
    "raftlog.storage.records",
    "raftlog.storage.varints",
)

RULES = [
    Rule(
        "raftlog.raft",
        (
            "asyncio",
            "concurrent",
            "grpc",
            "io",
            "multiprocessing",
            "os",
            "pathlib",
            "select",
            "selectors",
            "shutil",
            "signal",
            "socket",
            "ssl",
            "subprocess",
            "tempfile",
            "threading",
            "time",
            "raftlog.storage",
            "raftlog.runtime",
            "raftlog.rpc",
        ),
        why="the Raft core is pure: no sockets, clocks, threads, files, asyncio or storage",
    ),
    Rule("raftlog.partition", ("grpc", "raftlog.rpc"), why="the partition speaks no gRPC"),
    Rule("raftlog.metadata", ("grpc", "raftlog.rpc"), why="the metadata speaks no gRPC"),
    Rule(
        "raftlog.client",
        (
            "raftlog.node.node",
            "raftlog.serve",
            "raftlog.raft",
            "raftlog.runtime",
            "raftlog.partition",
            "raftlog.metadata",
            "raftlog.rpc",
            "raftlog.sim",
            "raftlog.chaos",
            "raftlog.storage",
        ),
        allowed=("raftlog.rpc.v1", *RECORD_FORMAT),
        why="the client reaches no server internals (the generated API and the batch format "
        "are shared)",
    ),
    *(
        Rule(layer, ("raftlog.chaos",), why="the server never imports the chaos suite")
        for layer in SERVER
    ),
    Rule(
        "raftlog.rpc",
        ("raftlog.node.node",),
        why="servicers depend on the node port (raftlog.rpc.port), not on the Node",
    ),
]


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: f"{rule.layer}-{rule.forbidden[0]}")
def test_layer_imports_nothing_it_must_not(rule: Rule) -> None:
    assert any(_within(m, rule.layer) for m in MODULES), f"no module in {rule.layer}"
    assert rule.violations() == [], rule.why


def test_the_scan_sees_imports() -> None:
    """The rules are checked against real import lists: the broker's wiring is visible."""
    assert "raftlog.rpc.server" in _imports(MODULES["raftlog.node.node"])
    assert "raftlog.raft.node" in _imports(MODULES["raftlog.node.group_factory"])
    assert "raftlog.metadata.commands" in _imports(MODULES["raftlog.metadata.state"])
    broken = Rule("raftlog.node.node", ("raftlog.rpc",))
    assert "raftlog.node.node imports raftlog.rpc.server" in broken.violations()
