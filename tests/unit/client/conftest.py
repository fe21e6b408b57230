"""Fixtures for the client tests: a fresh fake cluster of two nodes per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from client_fake_cluster import FakeCluster


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    fake = FakeCluster(nodes=2)
    try:
        yield fake
    finally:
        fake.stop()
