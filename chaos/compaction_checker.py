"""The keyed workload's checker: a compacted topic keeps the latest value of every key.

Theory of operation. On a compacted topic the cleaner removes records whose key has a later
one, so `lost` (every acknowledged value is in the final read) cannot hold; what must hold is
what a changelog reader relies on. Per partition and key, let *latest* be the acknowledged
send with the highest offset:

    lost_latest      the final read's last record of the key is not *latest*, and is not a
                     send of unknown outcome that landed after it (an `info` send may have
                     been written later than *latest*); or the key is missing altogether
    value_reappears  a value of the key whose acknowledged offset is below that of a later
                     acknowledged value appears in the final read after that later value

Tombstones are not sent by this workload, so no key may vanish. Offsets in the final read are
checked against acknowledgements by the general checker (`inconsistent_offset`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from raftlog.chaos.history import Op

__all__ = ["COMPACTION_ANOMALIES", "check_compaction"]

COMPACTION_ANOMALIES = ("lost_latest", "value_reappears")
_Key = tuple[str, int, str]  # topic, partition, key


def _acknowledged(ops: Sequence[Op]) -> dict[_Key, list[tuple[int, str]]]:
    """(offset, value) of every acknowledged keyed send, sorted, per key."""
    acked: dict[_Key, list[tuple[int, str]]] = {}
    for op in ops:
        value = op.value if isinstance(op.value, dict) else {}
        keyed = value.get("key") is not None and value.get("offset", -1) >= 0
        if op.f == "send" and op.type == "ok" and keyed:
            key = (value["topic"], value["partition"], value["key"])
            acked.setdefault(key, []).append((value["offset"], value["value"]))
    for offsets in acked.values():
        offsets.sort()
    return acked


def _final(ops: Sequence[Op]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    final: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for op in ops:
        if op.f == "final_read" and op.type == "ok":
            final[(op.value["topic"], op.value["partition"])] = list(op.value["records"])
    return final


def check_compaction(ops: Sequence[Op], add: Any, unchecked: list[str]) -> None:
    """Report the anomalies above through `add(name, example)`."""
    sends = {str(op.invoke.value["value"]): op for op in ops if op.f == "send"}
    final = _final(ops)
    no_final: set[tuple[str, int]] = set()
    for (topic, partition, key), acked in sorted(_acknowledged(ops).items()):
        records = final.get((topic, partition))
        if records is None:
            if (topic, partition) not in no_final:
                unchecked.append(f"lost_latest: no final read of {topic}/{partition}")
                no_final.add((topic, partition))
            continue
        of_key = [r for r in records if r.get("key") == key]
        latest_offset, latest_value = acked[-1]
        last = of_key[-1] if of_key else None
        if last is None or not _is_latest(last, latest_offset, latest_value, sends):
            add("lost_latest", {"topic": topic, "partition": partition, "key": key,
                                "latest": {"offset": latest_offset, "value": latest_value},
                                "final_last": last})  # fmt: skip
        acked_offset = {value: offset for offset, value in acked}
        newest_seen = -1
        for record in of_key:
            offset = acked_offset.get(record["value"])
            if offset is None:
                continue
            if offset < newest_seen:
                add("value_reappears", {"topic": topic, "partition": partition, "key": key,
                                        "value": record["value"], "acked_offset": offset,
                                        "after_acked_offset": newest_seen})  # fmt: skip
            newest_seen = max(newest_seen, offset)


def _is_latest(last: dict[str, Any], offset: int, value: str, sends: dict[str, Op]) -> bool:
    if last["value"] == value:
        return bool(last["offset"] == offset)
    send = sends.get(last["value"])
    unknown = send is not None and send.type == "info"
    return unknown and last["offset"] > offset
