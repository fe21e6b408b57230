"""The transactional workload (`--workload txn`): producers running transactions, read_committed
readers, and the `txn-delay` nemesis that holds one producer's requests.

Theory of operation. Each producer process is one confluent-kafka producer with its own
transactional.id (`chaos-txn-<process>`, also its client.id, which is how the `txn-delay`
proxy picks it) on the Kafka listeners. It runs transactions one after another, each a
`txn` operation: the generator (seeded per process) picks 2-5 writes over the partitions of
the two topics and whether the transaction is to commit or abort; the invoke lists the writes
(values `"<process>-<txn>-<i>"`, unique in the run, in produce order) and the intent, the
completion is what the client learned (raftlog.chaos.txn_checker): ok committed, fail
aborted, info indefinite. An abort is sent after every record is delivered, so aborted records
are really in the log. After an indefinite outcome or a fatal error the producer is replaced
by a new instance with the same transactional.id, whose InitProducerId fences the old one
and ends what it left open.

A reader process, during the load, polls every partition from offset 0 with
isolation.level=read_committed (`txn_read` operations of the records each poll got); after
the heal, `final_txn_read` (process "final") reads every partition from 0 until its position
passes the high watermark taken when it started, or its time is up (those partitions are
listed as `unfinished`: a hanging transaction holds a read_committed reader back).

`txn-delay`: every `delay_every_s`, the nemesis arms the proxy (raftlog.chaos.kafka_proxy)
to hold the victim producer's (process 0) next EndTxn or Produce for `delay_s`, longer than
the client's request timeout: the client times out, reconnects and retries, goes on to its
next transaction, and the held request reaches the node during it.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import confluent_kafka as kafka

from raftlog.chaos.history import NEMESIS, HistoryRecorder
from raftlog.chaos.kafka_proxy import (
    API_ADD_PARTITIONS_TO_TXN,
    API_END_TXN,
    API_PRODUCE,
    Held,
    KafkaDelayProxy,
)
from raftlog.chaos.txn_checker import FINAL

__all__ = ["TxnOptions", "TxnWorkers", "final_txn_read", "transactional_id"]

_LIBRDKAFKA_LOG = logging.getLogger("raftlog.chaos.librdkafka")  # as kafka_clients.py
_LIBRDKAFKA_LOG.addHandler(logging.NullHandler())  # not Python's last-resort stderr either


@dataclass(frozen=True, slots=True, kw_only=True)
class TxnOptions:
    topics: tuple[str, ...] = ("chaos-txn-a", "chaos-txn-b")
    partitions: int = 3  # per topic
    replication_factor: int = 3
    producers: int = 3
    readers: int = 1
    writes: tuple[int, int] = (2, 5)  # records per transaction, inclusive
    abort_fraction: float = 0.3  # transactions the generator ends with an abort
    txn_gap_s: float = 0.05  # between one producer's transactions
    request_timeout_ms: int = 2_000
    # How long the client keeps trying a record before failing it (and, for a record of an
    # aborting transaction, only then ending the abort, with an epoch bump).
    message_timeout_ms: int = 3_000
    transaction_timeout_ms: int = 10_000
    api_timeout_s: float = 6.0  # init/commit/abort_transaction calls
    delay: bool = False  # the txn-delay nemesis
    delay_apis: tuple[int, ...] = (API_END_TXN, API_PRODUCE)  # which requests it holds
    # How long a held request is held at most: past the client's message timeout, so a held
    # Produce of an aborting transaction reaches the partition after the abort (_Delayer).
    delay_s: float = 6.0
    delay_every_s: float = 2.0  # how often the victim's next request is picked
    final_read_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        assert self.topics and self.partitions > 0 and self.producers > 0
        assert 1 <= self.writes[0] <= self.writes[1]
        assert 0 <= self.abort_fraction <= 1
        assert self.delay_s * 1000 > self.message_timeout_ms, "a held Produce must outlive it"
        assert self.message_timeout_ms <= self.transaction_timeout_ms, "librdkafka requires it"

    @property
    def topic_partitions(self) -> list[tuple[str, int]]:
        return [(t, p) for t in self.topics for p in range(self.partitions)]


def transactional_id(process: int) -> str:
    """The transactional.id (and client.id) of producer process `process`."""
    return f"chaos-txn-{process}"


def _error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:300]


def _kafka_error(error: BaseException) -> Any:
    return error.args[0] if error.args and isinstance(error.args[0], kafka.KafkaError) else None


class _TxnProducer:
    """One producer process: transactions until stopped, each recorded as a `txn` operation."""

    def __init__(
        self,
        bootstrap: str,
        process: int,
        options: TxnOptions,
        recorder: HistoryRecorder,
        seed: int,
    ) -> None:
        self._bootstrap = bootstrap
        self._process = process
        self._options = options
        self._recorder = recorder
        self._rng = random.Random(seed * 1_000 + process)
        self._producer: Any = None
        self._stop = threading.Event()
        # The txn-delay nemesis's hook, called with each transaction's plan before it starts.
        self.before: Callable[[dict[str, Any]], None] = lambda plan: None

    def _client(self) -> Any:
        options = self._options
        return kafka.Producer(
            {
                "bootstrap.servers": self._bootstrap,
                "transactional.id": transactional_id(self._process),
                "client.id": transactional_id(self._process),
                "transaction.timeout.ms": options.transaction_timeout_ms,
                "request.timeout.ms": options.request_timeout_ms,
                "socket.timeout.ms": options.request_timeout_ms,
                "message.timeout.ms": options.message_timeout_ms,
                "reconnect.backoff.max.ms": 1_000,
                "linger.ms": 2,
                "logger": _LIBRDKAFKA_LOG,
            }
        )

    def _new_producer(self) -> Any:
        """A new instance, initialised (its InitProducerId fences the previous one and ends
        what that left open), or not yet when the run stops first."""
        producer = self._client()
        while not self._stop.is_set():
            try:
                producer.init_transactions(self._options.api_timeout_s)
                return producer
            except kafka.KafkaException as error:
                found = _kafka_error(error)
                if found is not None and found.fatal():
                    _drop(producer)
                    producer = self._client()
                self._stop.wait(0.2)  # a coordinator election or a fencing abort under way
        return producer

    def _replace(self) -> None:
        _drop(self._producer)
        self._producer = self._new_producer()

    def run(self, stop: threading.Event) -> None:
        """Transactions one after another until `stop`."""
        self._stop = stop
        self._producer = self._new_producer()
        number = 0
        while not stop.is_set():
            self._transaction(number)
            number += 1
            stop.wait(self._options.txn_gap_s)

    def _plan(self, number: int) -> dict[str, Any]:
        options = self._options
        count = self._rng.randint(*options.writes)
        chosen = [self._rng.choice(options.topic_partitions) for _ in range(count)]
        writes = [
            {"topic": t, "partition": p, "value": f"{self._process}-{number}-{i}"}
            for i, (t, p) in enumerate(chosen)
        ]
        intent = "abort" if self._rng.random() < options.abort_fraction else "commit"
        # Half the aborts wait for every record to be in the log first; the others abort
        # with records still in flight, which the client then purges.
        flush = intent == "commit" or self._rng.random() < 0.5
        return {"txn": number, "intent": intent, "flush": flush, "writes": writes}

    def _transaction(self, number: int) -> None:
        invoke = self._plan(number)
        self.before(invoke)
        self._recorder.record(self._process, "invoke", "txn", invoke)
        producer = self._producer
        try:
            producer.begin_transaction()
            for w in invoke["writes"]:
                producer.produce(w["topic"], w["value"].encode(), partition=w["partition"])
            if invoke["intent"] == "abort":
                # Without flush: half a second, time for the client to send what it queued
                # (an EndTxn right behind an unanswered AddPartitionsToTxn meets the bug
                # of test_an_end_txn_pipelined_behind_add_partitions_to_txn...).
                remaining = producer.flush(self._options.api_timeout_s if invoke["flush"] else 0.5)
                if remaining and invoke["flush"]:
                    raise RuntimeError(f"{remaining} records not delivered before the abort")
                producer.abort_transaction(self._options.api_timeout_s)
                self._end("fail", invoke, "aborted")
                return
            self._commit(invoke)
        except Exception as error:
            self._after_error(invoke, error)

    def _commit(self, invoke: dict[str, Any]) -> None:
        """commit_transaction, retried while the client says the error is retriable (the
        outcome is still open then); an abortable error goes to `_after_error`."""
        for _ in range(5):
            try:
                self._producer.commit_transaction(self._options.api_timeout_s)
                self._end("ok", invoke, "committed")
                return
            except kafka.KafkaException as error:
                found = _kafka_error(error)
                if found is None or not found.retriable() or found.txn_requires_abort():
                    raise
        raise RuntimeError("commit_transaction still retriable after 5 tries")

    def _after_error(self, invoke: dict[str, Any], error: BaseException) -> None:
        found = _kafka_error(error)
        if found is not None and found.txn_requires_abort():
            try:
                self._producer.abort_transaction(self._options.api_timeout_s)
            except Exception as abort_error:
                self._end(
                    "info", invoke, "indefinite", f"{_error(error)}; abort: {_error(abort_error)}"
                )
                self._replace()
                return
            self._end("fail", invoke, "aborted", _error(error))
            return
        # Fatal, or still retriable after the tries: the client cannot tell; a new
        # instance's InitProducerId fences this one and ends what it left open.
        self._end("info", invoke, "indefinite", _error(error))
        self._replace()

    def _end(self, type_: Any, invoke: dict[str, Any], outcome: str, error: str = "") -> None:
        value = {**invoke, "outcome": outcome, **({"error": error} if error else {})}
        self._recorder.record(self._process, type_, "txn", value)

    def close(self) -> None:
        """Drop what is queued and release the client."""
        if self._producer is not None:
            _drop(self._producer)


def _drop(producer: Any) -> None:
    """Purge what `producer` still holds; a producer in a fatal state may refuse even that."""
    with contextlib.suppress(kafka.KafkaException, RuntimeError):
        producer.purge()
        producer.flush(0)


def _read_consumer(bootstrap: str, group: str, *, isolation: str = "read_committed") -> Any:
    return kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "auto.offset.reset": "error",  # a skip or a rewind shows
            "fetch.wait.max.ms": 200,
            "socket.timeout.ms": 10_000,
            "reconnect.backoff.max.ms": 1_000,
            "logger": _LIBRDKAFKA_LOG,
        }
    )


def _rows(messages: Sequence[Any]) -> list[dict[str, Any]]:
    rows = []
    for m in messages:
        if m.error() is not None:
            if m.error().retriable():
                continue  # a leader moving: the consumer fetches again on its own
            raise kafka.KafkaException(m.error())
        rows.append(
            {
                "topic": m.topic(),
                "partition": m.partition(),
                "offset": m.offset(),
                "value": (m.value() or b"").decode(errors="replace"),
            }
        )
    return rows


def _reader(
    bootstrap: str,
    process: int,
    options: TxnOptions,
    recorder: HistoryRecorder,
    stop: threading.Event,
) -> None:
    """Poll every partition from 0, read_committed, until `stop`; a failing consumer is replaced
    under a new process id (the next one is `process + 1000`)."""
    while not stop.is_set():
        consumer = _read_consumer(bootstrap, f"chaos-txn-reader-{process}")
        consumer.assign([kafka.TopicPartition(t, p, 0) for t, p in options.topic_partitions])
        try:
            while not stop.is_set():
                recorder.record(process, "invoke", "txn_read", {})
                try:
                    rows = _rows(consumer.consume(500, 0.5))
                except kafka.KafkaException as error:
                    recorder.record(process, "fail", "txn_read", {"error": _error(error)})
                    break
                recorder.record(process, "ok", "txn_read", {"records": rows})
        finally:
            consumer.close()
        process += 1000


def _high_watermark(consumer: Any, tp: tuple[str, int], deadline: float) -> int:
    """The partition's high watermark, asked again while its leader moves (until `deadline`).

    `consumer` must read uncommitted: librdkafka asks ListOffsets at its consumer's isolation
    level, and read_committed's latest offset is the last stable offset, which a hanging
    transaction holds back (the final read would stop there and call finished a partition
    whose committed records past it it never read)."""
    while True:
        try:
            found = consumer.get_watermark_offsets(kafka.TopicPartition(*tp), timeout=5,
                                                   cached=False)  # fmt: skip
            return int(found[1])
        except kafka.KafkaException:
            # NOT_LEADER_FOR_PARTITION and the like after a restart are not flagged retriable.
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def final_txn_read(bootstrap: str, recorder: HistoryRecorder, options: TxnOptions) -> None:
    """Read every partition from 0, read_committed, until each position reaches the high
    watermark taken first, or `final_read_timeout_s` passes; one `txn_read` of process
    "final" with every record and the partitions not finished."""
    recorder.record(FINAL, "invoke", "txn_read", {})
    consumer = _read_consumer(bootstrap, "chaos-txn-final")
    watermarks = _read_consumer(bootstrap, "chaos-txn-final", isolation="read_uncommitted")
    deadline = time.monotonic() + options.final_read_timeout_s
    try:
        try:
            ends = {
                tp: _high_watermark(watermarks, tp, deadline) for tp in options.topic_partitions
            }
        finally:
            watermarks.close()
        consumer.assign([kafka.TopicPartition(t, p, 0) for t, p in options.topic_partitions])
        rows: list[dict[str, Any]] = []
        unfinished = [tp for tp, end in ends.items() if end > 0]
        while unfinished and time.monotonic() < deadline:
            rows += _rows(consumer.consume(500, 0.5))
            positions = consumer.position([kafka.TopicPartition(t, p) for t, p in unfinished])
            done = {
                (tp.topic, tp.partition)
                for tp in positions
                if tp.offset >= ends[(tp.topic, tp.partition)]
            }
            unfinished = [tp for tp in unfinished if tp not in done]
    except kafka.KafkaException as error:
        recorder.record(FINAL, "fail", "txn_read", {"error": _error(error)})
        return
    finally:
        consumer.close()
    value = {
        "records": rows,
        "unfinished": [list(tp) for tp in unfinished],
        "ends": {f"{t}/{p}": end for (t, p), end in ends.items()},
    }
    recorder.record(FINAL, "ok", "txn_read", value)


class TxnWorkers:
    """The producer, reader and txn-delay threads of one run."""

    def __init__(
        self,
        bootstrap: str,
        recorder: HistoryRecorder,
        options: TxnOptions,
        seed: int,
        proxy: KafkaDelayProxy | None,
    ) -> None:
        assert not options.delay or proxy is not None, "txn-delay needs the proxies"
        self._stop = threading.Event()
        self._producers = [
            _TxnProducer(bootstrap, p, options, recorder, seed) for p in range(options.producers)
        ]
        self._threads = [
            threading.Thread(
                target=self._guard, args=(producer.run,), daemon=True, name=f"txn-producer-{n}"
            )
            for n, producer in enumerate(self._producers)
        ]
        first_reader = options.producers
        self._threads += [
            threading.Thread(
                target=self._guard,
                args=(lambda stop, p=p: _reader(bootstrap, p, options, recorder, stop),),
                daemon=True,
                name=f"txn-reader-{p}",
            )
            for p in range(first_reader, first_reader + options.readers)
        ]
        if options.delay and proxy is not None:
            self._producers[0].before = _Delayer(
                proxy, recorder, options, random.Random(seed)
            ).before
        self.crashes: list[str] = []

    def _guard(self, body: Callable[[threading.Event], None]) -> None:
        try:
            body(self._stop)
        except Exception as error:
            self.crashes.append(_error(error))

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self, timeout_s: float) -> int:
        """Stop every thread; the number still running after `timeout_s`."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        for producer in self._producers:
            producer.close()
        return sum(thread.is_alive() for thread in self._threads)


class _Delayer:
    """The txn-delay nemesis. The victim calls `before` with each transaction's plan; once the
    last hold is over and `delay_every_s` has passed, it arms the proxy for this transaction:
    its Produce when the plan aborts with records in flight, else its EndTxn. Every hold and
    release is a nemesis event.

    Why the Produce of an aborting transaction: librdkafka retries a timed-out Produce with
    the same sequence numbers and keeps a transaction open until its records' message timeout,
    so a late Produce of a committing transaction is always a duplicate the sequence check
    drops. An aborting one ends only after the message timeout, with EndTxn(abort) at the old
    epoch and then an epoch bump (InitProducerId); held past that, the batch reaches its
    partition after the ABORT marker, at the epoch and sequence the partition expects next,
    for a partition no transaction of the coordinator holds: exactly what the KIP-890 check
    (`kafka.txn_verification`) refuses. Let through, it opens a transaction no marker of its
    own ends, and the producer's next commit on that partition makes the aborted record
    visible (aborted_read), or it hangs the partition's last stable offset.
    """

    def __init__(
        self,
        proxy: KafkaDelayProxy,
        recorder: HistoryRecorder,
        options: TxnOptions,
        rng: random.Random,
    ) -> None:
        self._proxy = proxy
        self._recorder = recorder
        self._options = options
        self._rng = rng
        self._lock = threading.Lock()
        self._holding = False
        self._next_s = time.monotonic()
        proxy.set_listener(self._held)

    def _held(self, what: str, held: Held) -> None:
        with self._lock:
            self._holding = what == "held"
            if what == "released":
                self._next_s = time.monotonic() + self._options.delay_every_s
        value = {
            "nemesis": "txn-delay",
            "client_id": held.client_id,
            "api_key": held.api_key,
            "api_version": held.api_version,
            "correlation_id": held.correlation_id,
            "node_port": held.node_port,
            "delay_s": held.delay_s,
        }
        self._recorder.record(NEMESIS, "info", what, value)

    def before(self, plan: dict[str, Any]) -> None:
        """Arm the proxy for the victim's transaction `plan` when it is time (class docstring)."""
        if self._proxy.disarm():
            with self._lock:
                self._holding = False  # the last arming found no request in its transaction
        in_flight_abort = plan["intent"] == "abort" and not plan["flush"]
        apis = self._options.delay_apis
        if in_flight_abort and API_PRODUCE in apis:
            api = API_PRODUCE
        elif API_END_TXN in apis:
            api = API_END_TXN
        else:
            return
        with self._lock:
            if self._holding or time.monotonic() < self._next_s:
                return
            self._holding = True  # until the proxy reports the release (or the next arming)
        # A held Produce goes on as the victim's next transaction starts (its first
        # AddPartitionsToTxn): after the abort and its epoch bump, before the next batch.
        release_on = frozenset({API_ADD_PARTITIONS_TO_TXN}) if api == API_PRODUCE else frozenset()
        self._proxy.arm(transactional_id(0), frozenset({api}), self._options.delay_s,
                        release_on=release_on)  # fmt: skip
