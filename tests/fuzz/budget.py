"""How long the fuzzers run: a few seconds each in CI, longer on demand.

`RAFTLOG_FUZZ_EXAMPLES=N` raises every fuzzer's example count (for example 20000 for a
night run); the default keeps each test to a few seconds on a shared 2-core machine.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings


def fuzz_settings(default_examples: int) -> settings:
    examples = int(os.environ.get("RAFTLOG_FUZZ_EXAMPLES", default_examples))
    assert examples > 0, examples
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
