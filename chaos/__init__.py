"""Jepsen-style fault injection: clients, generators, nemeses, checkers (raftlog.chaos)."""
