"""ARCHITECTURE.md's package map, enforced on the source: every `import` and `from ... import`
of each module (at any depth, TYPE_CHECKING blocks included), read with `ast`, is checked
against the "must not" rule of the row its module belongs to, against the layer order (no
module imports a package of a higher layer), and the graph of packages must have no cycle.
A failure names the import and the rule it breaks."""

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
    "raftlog.metrics",
    "raftlog.node",
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
# Decoding records: the one walk on produce is validation (record_validation); brokers
# never build records on the replication or fetch path.
RECORD_DECODING = ("raftlog.storage.record_decoder",)
# What makes a module impure: effects the Raft core and the simulator reach through ports.
EFFECTS = (
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
)
ABOVE_STORAGE = (
    "raftlog.runtime",
    "raftlog.partition",
    "raftlog.metadata",
    "raftlog.rpc",
    "raftlog.metrics",
    "raftlog.node",
)

RULES = [
    Rule(
        "raftlog.raft",
        (*EFFECTS, "raftlog.storage", "raftlog.runtime", "raftlog.rpc"),
        why="the Raft core is pure: no sockets, clocks, threads, files, asyncio or storage",
    ),
    Rule(
        "raftlog.storage",
        ("asyncio", "grpc", "socket", "ssl", *ABOVE_STORAGE),
        allowed=(),
        why="storage knows no Raft roles and no network: it imports raft.types at most",
    ),
    Rule(
        "raftlog.storage",
        ("raftlog.raft",),
        allowed=("raftlog.raft.types", "raftlog.raft.ports"),
        why="storage implements the core's ports and shares its types, nothing more",
    ),
    Rule(
        "raftlog.runtime",
        ("grpc", "raftlog.partition", "raftlog.metadata", "raftlog.rpc", "raftlog.node"),
        why="the group engine runs Raft groups; what they hold and who hosts them is above it",
    ),
    Rule(
        "raftlog.sim",
        ("asyncio", "grpc", "socket", "threading", "raftlog.rpc", "raftlog.node"),
        why="the simulator runs the real core on simulated disk and network, one thread",
    ),
    *(
        Rule(
            module,
            ("time", "datetime"),
            why="the simulator's clock is its step count; the wall clock never decides",
        )
        for module in sorted(MODULES)
        # Each simulator module but __main__, which times the whole run for its report
        # (the package itself is checked through its modules).
        if module.startswith("raftlog.sim.") and module != "raftlog.sim.__main__"
    ),
    Rule("raftlog.partition", ("grpc", "raftlog.rpc"), why="the partition speaks no gRPC"),
    Rule("raftlog.metadata", ("grpc", "raftlog.rpc"), why="the metadata speaks no gRPC"),
    Rule(
        "raftlog.rpc",
        ("raftlog.node", "raftlog.metrics"),
        why="front ends depend on the node port (raftlog.rpc.port), not on the node",
    ),
    Rule(
        "raftlog.rpc",
        ("raftlog.runtime", "raftlog.storage"),
        # The recorder and the produce trace are event hooks: they reach no group or log.
        allowed=("raftlog.runtime.recorder", "raftlog.runtime.produce_trace", *RECORD_FORMAT),
        why="front ends reach groups and logs only through the node port",
    ),
    Rule(
        "raftlog.rpc.kafka",
        RECORD_DECODING,
        why="the Kafka listener passes record batches through opaque, never decoding records",
    ),
    Rule(
        "raftlog.metrics",
        ("grpc", "raftlog.rpc", "raftlog.node"),
        why="metrics read the node's parts at scrape time; they serve no API and build no node",
    ),
    Rule(
        "raftlog.client",
        (
            "raftlog.node",
            "raftlog.serve",
            "raftlog.raft",
            "raftlog.runtime",
            "raftlog.partition",
            "raftlog.metadata",
            "raftlog.rpc",
            "raftlog.sim",
            "raftlog.chaos",
            "raftlog.storage",
            "raftlog.settings",
        ),
        allowed=("raftlog.rpc.v1", *RECORD_FORMAT),
        why="the client reaches no server internals (the generated API and the batch format "
        "are shared)",
    ),
    Rule(
        "raftlog.connectors.spark",
        ("raftlog.node", "raftlog.raft", "raftlog.runtime", "raftlog.partition", "raftlog.rpc"),
        allowed=("raftlog.rpc.v1",),
        why="the Spark connector is a client: the raftlog client, the API and batch format",
    ),
    *(
        Rule(layer, ("raftlog.chaos",), why="the server never imports the chaos suite")
        for layer in SERVER
    ),
]

# The layer order, lowest first: a module imports only its own layer and those below.
# raft <- storage <- runtime <- partition, metadata <- rpc (gRPC, Kafka) <- node <- CLI;
# the client, the connectors and the chaos suite on top.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "foundation",
        (
            "raftlog",
            "raftlog.types",
            "raftlog.errors",
            "raftlog.config",
            "raftlog.settings",
            "raftlog.tls",
        ),
    ),
    ("raft core", ("raftlog.raft",)),
    ("storage", ("raftlog.storage",)),
    ("group engine", ("raftlog.runtime",)),
    ("state machines", ("raftlog.partition", "raftlog.metadata", "raftlog.sim")),
    ("front ends", ("raftlog.rpc", "raftlog.metrics")),
    ("node", ("raftlog.node",)),
    ("client", ("raftlog.client",)),
    (
        "entry points",
        (
            "raftlog.serve",
            "raftlog.cli",
            "raftlog.__main__",
            "raftlog.cluster_cli",
            "raftlog.client_cli",
            "raftlog.txn_cli",
            "raftlog.local_cluster",
        ),
    ),
    ("tools on top", ("raftlog.connectors", "raftlog.chaos", "raftlog.demo")),
)


def _layer_of(module: str) -> int:
    """The index of the layer whose most specific package holds `module`."""
    best, depth = -1, -1
    for index, (_, packages) in enumerate(LAYERS):
        for package in packages:
            if _within(module, package) and package.count(".") > depth:
                best, depth = index, package.count(".")
    assert best >= 0, f"{module} is in no layer of the map: add it to LAYERS and ARCHITECTURE.md"
    return best


def _package_of(module: str) -> str:
    """The package (a row of the map) `module` belongs to; top-level modules stand alone."""
    for _, packages in LAYERS:
        for package in sorted(packages, key=lambda p: -p.count(".")):
            if package != "raftlog" and _within(module, package):
                return package
    return module


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: f"{rule.layer}-{rule.forbidden[0]}")
def test_layer_imports_nothing_it_must_not(rule: Rule) -> None:
    assert any(_within(m, rule.layer) for m in MODULES), f"no module in {rule.layer}"
    violations = rule.violations()
    assert violations == [], f"{rule.why}: " + "; ".join(violations)


def _internal_imports() -> list[tuple[str, str]]:
    """(module, imported module) for every import of one raftlog module by another."""
    pairs = []
    for module, path in MODULES.items():
        for name in sorted(_imports(path)):
            if name in MODULES and name != module:
                pairs.append((module, name))
    return pairs


def test_every_module_imports_only_its_layer_and_below() -> None:
    found = []
    for module, name in _internal_imports():
        here, there = _layer_of(module), _layer_of(name)
        if there > here:
            found.append(
                f"{module} ({LAYERS[here][0]}) imports {name} ({LAYERS[there][0]}): "
                "a module imports only its own layer and those below"
            )
    assert found == [], "\n".join(found)


def test_the_packages_import_each_other_without_a_cycle() -> None:
    graph: dict[str, set[str]] = {}
    for module, name in _internal_imports():
        source, target = _package_of(module), _package_of(name)
        if source != target and not _within(target, source) and not _within(source, target):
            graph.setdefault(source, set()).add(target)
    cycle = _find_cycle(graph)
    assert cycle is None, "package cycle: " + " -> ".join(cycle or ())


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of `graph` as a path that ends where it starts; None if it has none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_the_cycle_finder_and_the_layer_check_catch_planted_faults() -> None:
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": {"c"}}) is None
    assert _layer_of("raftlog.rpc.kafka.server") > _layer_of("raftlog.partition.replica")
    assert _layer_of("raftlog.node.node") > _layer_of("raftlog.rpc.server")


def test_the_scan_sees_imports() -> None:
    """The rules are checked against real import lists: the node's wiring is visible."""
    assert "raftlog.rpc.server" in _imports(MODULES["raftlog.node.node"])
    assert "raftlog.raft.node" in _imports(MODULES["raftlog.node.group_factory"])
    assert "raftlog.metadata.commands" in _imports(MODULES["raftlog.metadata.state"])
    broken = Rule("raftlog.node.node", ("raftlog.rpc",))
    assert "raftlog.node.node imports raftlog.rpc.server" in broken.violations()
