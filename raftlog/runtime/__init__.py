"""runtime: the shells that drive the pure Raft core (ready processing, asyncio host)."""
