"""The simulator's event trace: a bounded ring of the latest events, printed on a violation.

Events are stored unformatted (step, what, value) and rendered only when dumped or when
`verbose` asks for a live trace: formatting every delivered message would dominate the run
time of a passing seed, and passing seeds are almost all of them.
"""

from __future__ import annotations

import sys
from collections import deque
from typing import TextIO

__all__ = ["Trace"]


class Trace:
    def __init__(self, *, events_max: int, verbose: bool = False, out: TextIO | None = None):
        assert events_max > 0, events_max
        self.now = 0
        self._events: deque[tuple[int, str, object]] = deque(maxlen=events_max)
        self._verbose = verbose
        self._out = out if out is not None else sys.stdout

    def add(self, what: str, value: object = None) -> None:
        event = (self.now, what, value)
        self._events.append(event)
        if self._verbose:
            print(_render(event), file=self._out)

    def lines(self) -> list[str]:
        return [_render(event) for event in self._events]


def _render(event: tuple[int, str, object]) -> str:
    now, what, value = event
    return f"  [{now:5d}] {what}" + ("" if value is None else f" {value}")
