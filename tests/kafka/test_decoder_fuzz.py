"""Property tests of the Kafka frame decoder and every request decoder the listener uses:
whatever the bytes, the answer is a frame, a request, or a FrameError naming what is wrong
(never another exception, which would take the connection's handling down uncleanly)."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.rpc.kafka import APIS
from raftlog.rpc.kafka.frame import FrameDecoder, FrameError, decode_body, decode_header
from raftlog.rpc.kafka.schema import request_is_flexible, request_reader

VERSIONS = [
    (api.key, v) for api in APIS.values() for v in range(api.version_min, api.version_max + 1)
]


@settings(max_examples=300, deadline=None)
@given(chunks=st.lists(st.binary(max_size=64), max_size=20))
def test_the_frame_decoder_yields_frames_or_a_frame_error(chunks: list[bytes]) -> None:
    decoder = FrameDecoder(frame_bytes_max=256)
    try:
        for chunk in chunks:
            decoder.receive_data(chunk)
            while (frame := decoder.next_frame()) is not None:
                assert 8 <= len(frame) <= 256
    except FrameError as error:
        assert "frame size" in str(error)


@settings(max_examples=600, deadline=None)
@given(which=st.sampled_from(VERSIONS), body=st.binary(max_size=200), client=st.binary(max_size=8))
def test_every_request_decoder_answers_a_request_or_a_frame_error(
    which: tuple[int, int], body: bytes, client: bytes
) -> None:
    api_key, version = which
    frame = struct.pack(">hhih", api_key, version, 1, len(client)) + client + body
    flexible = request_is_flexible(api_key, version)
    try:
        header, offset = decode_header(frame, flexible=flexible)
        assert (header.api_key, header.api_version) == which
        decode_body(frame, offset, request_reader(api_key, version), what="fuzz")
    except FrameError:
        pass
