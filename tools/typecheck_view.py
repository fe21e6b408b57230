"""Build a symlinked view of the raftlog namespace for mypy.

setuptools maps `metadata/` to `raftlog.metadata` (and so on) with `package-dir`; mypy only
knows directory layouts. This script mirrors the wheel's layout with symlinks under the
given folder so `mypy -p raftlog` sees exactly the modules the wheel ships.
"""

from __future__ import annotations

import shutil
import sys
import tomllib
from pathlib import Path


def main(target: str) -> None:
    root = Path(__file__).resolve().parent.parent
    package_dir: dict[str, str] = tomllib.loads((root / "pyproject.toml").read_text())["tool"][
        "setuptools"
    ]["package-dir"]
    view = Path(target).resolve()
    shutil.rmtree(view, ignore_errors=True)
    view.mkdir(parents=True)
    # Deepest mappings last so they replace what a shallower mapping linked.
    for package, folder in sorted(package_dir.items(), key=lambda item: item[0].count(".")):
        dest = view.joinpath(*package.split("."))
        if dest.is_symlink():
            dest.unlink()
        dest.parent.mkdir(parents=True, exist_ok=True)
        source = root / folder
        if package == "raftlog":
            # Link the children one by one so nested mapped packages can be placed inside.
            dest.mkdir(exist_ok=True)
            for child in source.iterdir():
                if child.name != "__pycache__":
                    (dest / child.name).symlink_to(child)
        else:
            if dest.exists():
                if dest.is_dir() and not dest.is_symlink():
                    shutil.rmtree(dest)
                else:
                    dest.unlink()
            dest.symlink_to(source)


if __name__ == "__main__":
    main(sys.argv[1])
