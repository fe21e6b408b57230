"""The committed protobuf/gRPC modules match rpc/v1/*.proto (regenerate: tools/gen_proto.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_generated_modules_are_current() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "tools" / "gen_proto.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_api_services_are_importable() -> None:
    from raftlog.rpc.v1 import raftlog_pb2, raftlog_pb2_grpc

    assert raftlog_pb2.DESCRIPTOR.package == "raftlog.v1"
    assert hasattr(raftlog_pb2_grpc, "LogServicer")
    assert hasattr(raftlog_pb2_grpc, "AdminServicer")
