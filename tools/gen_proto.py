"""Regenerate the protobuf/gRPC modules of raftlog.rpc.v1 from rpc/v1/*.proto.

The .proto files live in `rpc/v1/` (the `raftlog.rpc.v1` package); protoc derives import
paths from the file's path under its include root, so the files are staged under
`raftlog/rpc/v1/` first. The generated modules are committed (users need no grpcio-tools);
`tests/unit/test_generated_proto.py` fails when they are stale.

    python tools/gen_proto.py            # rewrite rpc/v1/*_pb2*.py(i)
    python tools/gen_proto.py --check    # exit 1 if they differ
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "rpc" / "v1"


def generate(out: Path) -> list[Path]:
    with tempfile.TemporaryDirectory() as staging:
        include = Path(staging)
        package = include / "raftlog" / "rpc" / "v1"
        package.mkdir(parents=True)
        protos = sorted(SOURCE.glob("*.proto"))
        for proto in protos:
            shutil.copy(proto, package / proto.name)
        args = [
            "protoc",
            f"-I{include}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            *(str(package / p.name) for p in protos),
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
    return sorted((out / "raftlog" / "rpc" / "v1").glob("*_pb2*"))


def main() -> int:
    check = "--check" in sys.argv[1:]
    with tempfile.TemporaryDirectory() as out:
        stale = []
        for generated in generate(Path(out)):
            target = SOURCE / generated.name
            text = generated.read_text()
            if not target.exists() or target.read_text() != text:
                stale.append(target.name)
                if not check:
                    target.write_text(text)
    if check and stale:
        print(f"stale generated files: {stale}; run python tools/gen_proto.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
