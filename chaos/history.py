"""The history of a chaos run: events in, JSON lines out, operations paired back up.

Theory of operation. Every client process records an `invoke` event before it acts and one
completion after: `ok` (it happened, with what it saw), `fail` (it certainly did not happen)
or `info` (the outcome is unknown: a timeout, a lost connection, an ambiguous delivery
failure). The nemesis records its faults as `info` events of process "nemesis" with f
"start" or "stop". One event is one JSON line, exactly as in Jepsen:

    {"process": 3, "type": "invoke", "f": "send", "value": {...}, "time": 1234567}

`time` is nanoseconds since the run started. A producer process may have several sends in
flight (the producer pipelines them, and per-partition order is one of the checked
properties), so a send is paired with its completion by (process, value); every other
operation is paired by process alone, one at a time, as Jepsen does. An invoke with no
completion by the end of the run counts as `info`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TextIO

from raftlog.errors import RaftlogError

__all__ = ["Event", "EventType", "HistoryRecorder", "Op", "load_history", "pair_operations"]
__all__ += ["NEMESIS", "HistoryError", "dump_history"]

EventType = Literal["invoke", "ok", "fail", "info"]
EVENT_TYPES: frozenset[str] = frozenset({"invoke", "ok", "fail", "info"})
COMPLETIONS: frozenset[str] = frozenset({"ok", "fail", "info"})
NEMESIS = "nemesis"


class HistoryError(RaftlogError):
    """A history line that is not a valid event (names the line number and what was wrong)."""


@dataclass(frozen=True, slots=True)
class Event:
    process: int | str
    type: EventType
    f: str
    value: Any
    time: int  # nanoseconds since the run started

    def to_json(self) -> str:
        """The event as one compact JSON object (no newline), as history.jsonl holds it."""
        return json.dumps(
            {
                "process": self.process,
                "type": self.type,
                "f": self.f,
                "value": self.value,
                "time": self.time,
            },
            separators=(",", ":"),
        )

    @staticmethod
    def from_json(line: str, *, line_number: int = 0) -> Event:
        """The event one history line holds; raises HistoryError, naming `line_number`, for bad
        JSON, a missing field, an unknown type or a non-integer time."""
        try:
            raw = json.loads(line)
            event = Event(raw["process"], raw["type"], raw["f"], raw.get("value"), raw["time"])
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise HistoryError(f"history line {line_number}: not an event ({error})") from error
        if event.type not in EVENT_TYPES or not isinstance(event.time, int):
            raise HistoryError(f"history line {line_number}: bad type or time in {line.strip()}")
        return event


@dataclass(frozen=True, slots=True)
class Op:
    """One operation: its invoke and its completion (None: never completed, so unknown)."""

    invoke: Event
    completion: Event | None

    @property
    def process(self) -> int | str:
        return self.invoke.process

    @property
    def f(self) -> str:
        return self.invoke.f

    @property
    def type(self) -> EventType:
        """The completion's type; "info" for an operation that never completed."""
        return "info" if self.completion is None else self.completion.type

    @property
    def value(self) -> Any:
        """The completion's value (what the operation saw), or the invoke's if none came."""
        return self.invoke.value if self.completion is None else self.completion.value

    @property
    def latency_ns(self) -> int | None:
        """Nanoseconds from invoke to completion; None if it never completed."""
        if self.completion is None:
            return None
        return self.completion.time - self.invoke.time


class HistoryRecorder:
    """Thread-safe: client threads and the nemesis append; events go to memory and a file."""

    def __init__(self, clock_ns: Callable[[], int], sink: TextIO | None = None) -> None:
        self._clock_ns = clock_ns
        self._start_ns = clock_ns()
        self._sink = sink
        self._lock = threading.Lock()
        self._closed = False
        self.events: list[Event] = []

    def now_ns(self) -> int:
        """Nanoseconds since the recorder was created, on its clock."""
        return self._clock_ns() - self._start_ns

    def record(self, process: int | str, type: EventType, f: str, value: Any) -> Event:
        """Append an event stamped now, in time order, to memory and the sink, and return it; after
        `close` the event is returned but not kept. Safe from any thread."""
        assert type in EVENT_TYPES, type
        with self._lock:
            # The time is taken under the lock so the file is in time order.
            event = Event(process, type, f, value, self.now_ns())
            if self._closed:
                return event  # after the run: a late completion stays unknown, as it was
            assert not self.events or self.events[-1].time <= event.time
            self.events.append(event)
            if self._sink is not None:
                self._sink.write(event.to_json() + "\n")
        return event

    def close(self) -> None:
        """Record nothing more (late callbacks of abandoned sends are ignored)."""
        with self._lock:
            self._closed = True
            if self._sink is not None:
                self._sink.flush()
            self._sink = None


def dump_history(events: Iterable[Event], path: Path) -> None:
    """Write `events` to `path` as JSON lines, one event a line, replacing the file."""
    with path.open("w") as out:
        for event in events:
            out.write(event.to_json() + "\n")


def load_history(path: Path) -> list[Event]:
    """The events of a history.jsonl file, blank lines skipped; raises HistoryError naming the first
    line that is not an event."""
    with path.open() as lines:
        return [
            Event.from_json(line, line_number=number)
            for number, line in enumerate(lines, start=1)
            if line.strip()
        ]


def _pair_key(event: Event) -> tuple[int | str, str, str | None]:
    if event.f == "send" and isinstance(event.value, dict):
        return (event.process, event.f, str(event.value.get("value")))
    return (event.process, event.f, None)


def pair_operations(events: Iterable[Event]) -> Iterator[Op]:
    """Client operations in invoke order (nemesis events are left out)."""
    open_ops: dict[tuple[int | str, str, str | None], int] = {}
    invokes: list[Event] = []
    completions: list[Event | None] = []
    for event in events:
        if event.process == NEMESIS:
            continue
        key = _pair_key(event)
        if event.type == "invoke":
            if key in open_ops:
                raise HistoryError(f"process {event.process} invoked {key} twice at {event.time}")
            open_ops[key] = len(invokes)
            invokes.append(event)
            completions.append(None)
            continue
        index = open_ops.pop(key, None)
        if index is None:
            raise HistoryError(f"completion without invoke: {event.to_json()}")
        completions[index] = event
    for invoke, completion in zip(invokes, completions, strict=True):
        yield Op(invoke, completion)
