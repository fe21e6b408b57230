"""Build a symlinked view of the raftlog namespace for mypy.

setuptools maps `metadata/` to `raftlog.metadata` (and so on) with `package-dir`; mypy only
knows directory layouts. This script mirrors the wheel's layout under the given folder, so
`mypy -p raftlog` sees exactly the modules the wheel ships. Directories in the view are real
directories and only files are symlinks: a directory symlink would let a nested mapping
(`raftlog.connectors.spark` inside `raftlog/connectors/`) write into the source tree.
"""

from __future__ import annotations

import shutil
import sys
import tomllib
from pathlib import Path


def _mirror(source: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for child in source.iterdir():
        if child.name == "__pycache__" or child.is_symlink():
            continue
        if child.is_dir():
            _mirror(child, dest / child.name)
        else:
            (dest / child.name).symlink_to(child.resolve())


def main(target: str) -> None:
    root = Path(__file__).resolve().parent.parent
    package_dir: dict[str, str] = tomllib.loads((root / "pyproject.toml").read_text())["tool"][
        "setuptools"
    ]["package-dir"]
    view = Path(target).resolve()
    assert root not in view.parents or view.is_relative_to(root / "build"), view
    shutil.rmtree(view, ignore_errors=True)
    # Shallow mappings first; a deeper one replaces what the shallower mirrored there.
    for package, folder in sorted(package_dir.items(), key=lambda item: item[0].count(".")):
        dest = view.joinpath(*package.split("."))
        if dest.exists():
            shutil.rmtree(dest)
        _mirror(root / folder, dest)


if __name__ == "__main__":
    main(sys.argv[1])
