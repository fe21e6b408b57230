"""raftlog: a distributed commit log with Kafka's model and Raft's guarantees.

See ARCHITECTURE.md for the package map. Subpackages live in the repository's top-level
folders and share this namespace: `metadata/` is `raftlog.metadata`, `partition/` is
`raftlog.partition`, `rpc/` is `raftlog.rpc`, `connectors/spark/` is
`raftlog.connectors.spark` and `chaos/` is `raftlog.chaos`.
"""

__version__ = "0.1.0"

if not __debug__:  # pragma: no cover
    # Assertions state the invariants that keep data safe; -O would silently drop them.
    raise RuntimeError("raftlog refuses to run under python -O: its assertions guard your data")
