"""The metadata quorum: a Raft-replicated controller (raftlog.metadata)."""
