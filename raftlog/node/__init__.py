"""The node: the composition root of one `raftlog serve` process and the node's duties.

`raftlog.runtime` below it runs Raft groups; this package decides which groups the node
hosts (`reconcile`, `group_factory`), keeps its lease and liveness (`leases`, `liveness`),
moves leadership (`leadership`, `reassignment_driver`), runs the controller's duties
(`controller_duties`), cleans and scrubs logs (`cleaner`, `scrubber`), and wires it all,
with the transports and the front ends, into one `Node` (`node.py`).
"""
