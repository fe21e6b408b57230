"""glibc malloc thresholds for node processes (raftlog.node.malloc_tuning, NodeConfig)."""

from __future__ import annotations

import platform

import pytest

from raftlog.config import MALLOC_MMAP_THRESHOLD_BYTES_MAX, MIB, NodeConfig
from raftlog.errors import ConfigError
from raftlog.node.malloc_tuning import tune_malloc
from raftlog.settings import apply_overrides


def test_the_defaults_are_accepted_by_glibc_and_only_there() -> None:
    config = NodeConfig().validate()
    applied = tune_malloc(
        trim_threshold_bytes=config.malloc_trim_threshold_bytes,
        mmap_threshold_bytes=config.malloc_mmap_threshold_bytes,
    )
    assert applied is (platform.libc_ver()[0] == "glibc")


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("malloc_mmap_threshold_bytes", MALLOC_MMAP_THRESHOLD_BYTES_MAX + 1),
        ("malloc_mmap_threshold_bytes", 0),
        ("malloc_trim_threshold_bytes", 0),
        ("malloc_trim_threshold_bytes", -MIB),
    ],
)
def test_a_threshold_out_of_range_is_refused_by_name(setting: str, value: int) -> None:
    with pytest.raises(ConfigError, match=f"{setting}.*{value}"):
        apply_overrides(NodeConfig(), [f"{setting}={value}"]).validate()


def test_the_thresholds_can_be_set_from_the_command_line() -> None:
    config = apply_overrides(
        NodeConfig(), ["malloc_trim_threshold_bytes=1048576", "malloc_mmap_threshold_bytes=4096"]
    ).validate()
    assert (config.malloc_trim_threshold_bytes, config.malloc_mmap_threshold_bytes) == (
        MIB,
        4096,
    )
