"""raft."""
