"""Generated protobuf and gRPC modules of the raftlog.v1 API (see tools/gen_proto.py)."""
