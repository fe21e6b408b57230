"""One Kafka request over a plain socket, encoded and decoded by kio: for the APIs a test
wants to see exactly (clients hide them behind their own state machines)."""

from __future__ import annotations

import io
import socket
import struct
from typing import Any

from kio.index import load_response_schema
from kio.serial import entity_reader, entity_writer


def kafka_call(address: str, request: Any, *, correlation_id: int = 1) -> Any:
    """Send `request` (a kio request entity) to `address`, return the decoded response."""
    api_key, version = int(request.__api_key__), int(request.__version__)
    body = io.BytesIO()
    entity_writer(type(request))(body, request)
    header = struct.pack(">hhih", api_key, version, correlation_id, 4) + b"test"
    if request.__flexible__:
        header += b"\x00"  # no tagged fields
    payload = header + body.getvalue()
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=15) as sock:
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        (size,) = struct.unpack(">i", read_exactly(sock, 4))
        data = read_exactly(sock, size)
    assert struct.unpack_from(">i", data)[0] == correlation_id
    response_class = load_response_schema(api_key, version)
    offset = 5 if response_class.__flexible__ and api_key != 18 else 4
    response, used = entity_reader(response_class)(data, offset)
    assert offset + used == len(data)
    return response


def read_exactly(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {count} bytes")
        data += chunk
    return data
