"""The event recorder: how the node's code reports what a scrape cannot read afterwards.

Most metrics are read at scrape time from objects that exist anyway (`raftlog.metrics`
walks the hosted groups, the partition replicas and the metadata state), so nothing is
counted on the hot path for them. What only an event shows (an election, a flush's
latency, bytes fetched, a request's status and latency) is reported to the process's one
`Recorder` through a one-line hook. The default recorder ignores everything, so a node
started without `--metrics-listen`, the simulator and the tests pay one attribute lookup
and an empty call per hook; `raftlog.metrics` installs a recorder backed by
`prometheus_client` when the node serves metrics.

Hooks never block and never raise; `on_log_flush` may run on a disk thread, the others
run on the event loop.

Listeners other than gRPC (the Kafka listener) report each request they answer with
`recorder().record_request(protocol="kafka", api="Produce", error_code=0, seconds=...)`:
`api` is the protocol's name of the request (a bounded set), `error_code` its outcome (0
or "OK" for success), `seconds` the time from the request read to the response queued.
"""

from __future__ import annotations

from collections.abc import Sequence

from raftlog.raft.types import Ready

__all__ = ["Recorder", "install", "recorder"]


class Recorder:
    """Receives the node's events; this base class ignores them all."""

    # Whether produce requests are timed stage by stage (raftlog.runtime.produce_trace):
    # off here, so a node without metrics reads no clock for it.
    traces_produce = False

    def on_log_flush(self, size_bytes: int, seconds: float) -> None:
        """One group commit wrote `size_bytes` of appended batches and fsynced, in `seconds`."""

    def on_ready(self, ready: Ready) -> None:
        """A Ready whose soft state changed (role, leader or term) was processed."""

    def on_produce(self, size_bytes: int) -> None:
        """A produce request's batches (`size_bytes`) were answered by a partition leader."""

    def on_fetch(self, size_bytes: int) -> None:
        """A fetch returned `size_bytes` of batches."""

    def on_loop_lag(self, seconds: float) -> None:
        """The event loop ran a timer `seconds` late."""

    def on_produce_stages(self, protocol: str, seconds: Sequence[float]) -> None:
        """One produce batch's stages (`produce_trace.STAGES`, in order) in seconds."""

    def on_transaction_completed(self, *, commit: bool) -> None:
        """The coordinator (controller) committed a transaction's end: every marker was written
        and CompleteEndTransaction applied (`commit` False: an abort, timed out ones too)."""

    def on_transaction_timed_out(self) -> None:
        """The coordinator decided to abort a transaction open past its timeout."""

    def record_request(
        self, *, protocol: str, api: str, error_code: int | str, seconds: float
    ) -> None:
        """One request of `protocol` ("grpc", "kafka") answered with `error_code`."""


_recorder = Recorder()


def recorder() -> Recorder:
    """The process's recorder (a no-op one unless `install` replaced it)."""
    return _recorder


def install(new: Recorder) -> Recorder:
    """Make `new` the process's recorder; returns the previous one (to restore it)."""
    global _recorder
    previous, _recorder = _recorder, new
    return previous
