"""The one-namespace layout: the wheel and the editable install both map the agreed folders.

`metadata/` must import as `raftlog.metadata`, `partition/` as `raftlog.partition`, and so on
(setuptools `package-dir`). A mapping that works editable but not from a wheel (or the
reverse) would only show up on a user's machine, so both are checked here.
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
import zipfile
from pathlib import Path

import raftlog

REPO = Path(__file__).resolve().parents[2]
MAPPED = {
    "raftlog.metadata": "metadata",
    "raftlog.partition": "partition",
    "raftlog.rpc": "rpc",
    "raftlog.connectors.spark": "connectors/spark",
    "raftlog.chaos": "chaos",
}

_LIST_MODULES = """
import importlib, json, pkgutil, sys
import raftlog
names = sorted(
    m.name for m in pkgutil.walk_packages(raftlog.__path__, "raftlog.")
    if not m.name.endswith("__main__")  # importing a __main__ would run the program
)
files = {}
for name in names + sorted({n for n in %r}):
    module = importlib.import_module(name)
    files[name] = getattr(module, "__file__", None)
print(json.dumps(files))
"""


def _import_all_from(path_entry: Path) -> dict[str, str]:
    code = _LIST_MODULES % (list(MAPPED),)
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=path_entry.parent,
        env={"PYTHONPATH": str(path_entry), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    files: dict[str, str] = json.loads(result.stdout.strip().splitlines()[-1])
    return files


def test_editable_install_maps_every_folder() -> None:
    for package, folder in MAPPED.items():
        module = __import__(package, fromlist=["_"])
        assert Path(module.__file__).resolve() == REPO / folder / "__init__.py", package
    assert Path(raftlog.__file__).resolve() == REPO / "raftlog" / "__init__.py"


def test_wheel_contains_and_imports_every_subpackage(tmp_path: Path) -> None:
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("raftlog-*.whl")
    unpacked = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        archive.extractall(unpacked)
    for folder in (
        "raftlog/metadata",
        "raftlog/partition",
        "raftlog/rpc",
        "raftlog/connectors/spark",
        "raftlog/chaos",
    ):
        assert f"{folder}/__init__.py" in names, folder
    assert not any(name.startswith(("metadata/", "partition/", "chaos/")) for name in names)
    files = _import_all_from(unpacked)
    editable = {
        m.name
        for m in pkgutil.walk_packages(raftlog.__path__, "raftlog.")
        if not m.name.endswith("__main__")
    }
    assert editable <= set(files), sorted(editable - set(files))
    for name, file in files.items():
        assert file is not None and file.startswith(str(unpacked)), (name, file)
