"""The request stream's framing (hydrad/wire/streamframes.py) and its setting: what is packed comes back
frame for frame, and anything malformed or too long is refused before it is read, with a reason."""

from __future__ import annotations

import asyncio
import struct

import pytest
from hypothesis import given, settings, strategies as st
from pydantic import ValidationError

from hydrad.common.netaccess import split_endpoint, split_socket_endpoint
from hydrad.coordinator.settings import BusSettings
from hydrad.wire import messages as M
from hydrad.wire import streamframes as SF


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=40))
def test_frames_come_back_as_packed(frames: list[bytes]) -> None:
    packed = SF.pack(frames)
    (n,) = struct.unpack_from("<I", packed)
    assert n == len(packed) - 4 and SF.unpack(packed[4:]) == frames


def test_bus_messages_and_batches_travel_unchanged() -> None:
    done = M.Done(req="r1", finish_reason="length", model="m", usage=M.UsageInfo(prompt_tokens=3, completion_tokens=1))
    batch = M.encode_batch([M.encode(M.Tokens(req="r1", texts=["hi"])), M.encode(done)])
    out = SF.unpack(SF.pack(batch)[4:])
    assert [type(m) for m in M.decode_all(out)] == [M.Tokens, M.Done]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_are_frames_or_a_frame_error(body: bytes) -> None:
    try:
        frames = SF.unpack(body)
    except SF.FrameError:
        return
    assert SF.pack(frames)[4:] == body


@pytest.mark.parametrize("body, why", [
    (b"", "shorter"), (b"\x00\x00", "0 frames"), (struct.pack("<H", SF.MAX_FRAMES + 1), "frames"),
    (struct.pack("<HI", 1, 10) + b"abc", "runs past"), (struct.pack("<H", 1) + b"\x01", "length runs past"),
    (struct.pack("<HI", 1, 1) + b"ab", "after the last frame"),
])
def test_malformed_messages_are_refused_with_a_reason(body: bytes, why: str) -> None:
    with pytest.raises(SF.FrameError, match=why):
        SF.unpack(body)


def test_a_length_over_the_limit_is_refused_unread() -> None:
    async def main() -> str:
        reader = asyncio.StreamReader()
        reader.feed_data(struct.pack("<I", 1 << 31))  # nothing follows: reading it would hang
        try:
            await asyncio.wait_for(SF.read(reader, limit=4096), 2)
        except SF.FrameError as exc:
            return str(exc)
        return "read"

    assert "at most 4096" in asyncio.run(main())


def test_the_end_of_the_stream_is_not_a_frame_error() -> None:
    async def main() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(SF.pack([b"a"])[:5])
        reader.feed_eof()
        await SF.read(reader)

    with pytest.raises(asyncio.IncompleteReadError):
        asyncio.run(main())


@pytest.mark.parametrize("value", ["127.0.0.1", "127.0.0.1:0", "127.0.0.1:70000", ":9502", "host:port"])
def test_a_bad_request_stream_endpoint_is_a_config_error_naming_it(value: str) -> None:
    with pytest.raises(ValidationError, match="request_stream"):
        BusSettings(request_stream=value)


def test_the_request_stream_is_refused_beside_curve() -> None:
    key = "x" * 40
    with pytest.raises(ValidationError, match="not encrypted"):
        BusSettings(request_stream="127.0.0.1:9502", curve_public_key=key, curve_secret_key=key)
    assert split_endpoint("[::1]:9502") == ("::1", 9502)
    assert BusSettings(request_stream="127.0.0.1:9502").request_stream == "127.0.0.1:9502"


def test_port_zero_is_an_endpoint_to_bind_not_one_to_connect_to() -> None:
    """The stream's listener may take a free port (a bus on a free port); an offer must name a real one."""
    assert split_endpoint("127.0.0.1:0", allow_zero=True) == ("127.0.0.1", 0)
    with pytest.raises(ValueError, match="port of 1-65535"):
        split_endpoint("127.0.0.1:0")


def test_a_socket_endpoint_is_split_with_its_scheme_and_a_wildcard_or_free_port() -> None:
    assert split_socket_endpoint("tcp://*:9500") == ("*", 9500)
    assert split_socket_endpoint("tcp://[::1]:0") == ("::1", 0)
    assert split_socket_endpoint("10.0.0.2:9502") == ("10.0.0.2", 9502)
    with pytest.raises(ValueError, match="host:port"):
        split_socket_endpoint("ipc:///run/hydra/bus")
