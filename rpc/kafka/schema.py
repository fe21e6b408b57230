"""kio's generated message classes, looked up by API key and version, and built leniently.

kio generates one module per API version from Kafka's JSON schemas; a handler builds its
response once for every version it serves through `build`, which keeps only the fields the
version's class has (a field added in a later version is simply not sent to older clients,
as Kafka's own generated code does).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import sys
from types import ModuleType
from typing import Any, TypeVar

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i32Timedelta

__all__ = [
    "NO_THROTTLE",
    "Chunks",
    "build",
    "request_reader",
    "response_module",
    "response_writer",
    "timedelta_ms",
]

T = TypeVar("T")

NO_THROTTLE = i32Timedelta.parse(datetime.timedelta(0))


_FIELD_NAMES: dict[type[Any], frozenset[str]] = {}


def build(cls: type[T], **values: Any) -> T:
    """`cls(**values)` with the values `cls` has no field for left out."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = frozenset(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
    return cls(**{name: value for name, value in values.items() if name in names})


@functools.cache
def request_class(api_key: int, version: int) -> type[Any]:
    """kio's request class for `api_key` at `version` (cached); raises kio's UnknownAPIKey or
    UnknownEntity for an API or version kio does not know."""
    return load_request_schema(api_key, version)


@functools.cache
def request_reader(api_key: int, version: int) -> Any:
    """A cached kio reader that parses the body of an `api_key` request at `version`."""
    return entity_reader(request_class(api_key, version))


@functools.cache
def request_is_flexible(api_key: int, version: int) -> bool:
    """Whether `api_key` at `version` uses the flexible (tagged-field, KIP-482) encoding, which
    decides the layout of its request and response headers."""
    return bool(request_class(api_key, version).__flexible__)


@functools.cache
def response_module(api_key: int, version: int) -> ModuleType:
    """The kio module holding `api_key`'s response classes at `version` (cached), for `build` to
    construct responses and their nested entities from."""
    return sys.modules[load_response_schema(api_key, version).__module__]


@functools.cache
def response_writer(api_key: int, version: int) -> Any:
    """A cached kio writer that serialises an `api_key` response at `version`."""
    return entity_writer(load_response_schema(api_key, version))


def timedelta_ms(value: datetime.timedelta) -> int:
    """`value` as a whole number of milliseconds (truncated toward zero)."""
    return int(value.total_seconds() * 1000)


class Chunks:
    """A writer target that keeps each written piece, so record batches are referenced, not
    copied, on their way to the socket (`transport.writelines`)."""

    __slots__ = ("pieces",)

    def __init__(self) -> None:
        self.pieces: list[bytes] = []

    def write(self, data: bytes) -> int:
        """Keep `data` as the next piece (as `bytes`, copied only if it is another buffer type) and
        return its length, as a file's `write` does."""
        self.pieces.append(bytes(data) if not isinstance(data, bytes) else data)
        return len(data)
