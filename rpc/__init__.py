"""Wire protocols: protobuf/gRPC client API and node-to-node transport (raftlog.rpc)."""
