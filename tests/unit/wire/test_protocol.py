"""The merged RPC port's codec: round trips, split-invariance, and a decoder that only ever parses or refuses."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydrad.wire.protocol import (
    FIRST_OPS,
    GGML_RPC_HELLO,
    HEADER,
    MAX_CONTROL_PAYLOAD,
    MAX_DATA_PAYLOAD,
    PROTOCOL_VERSION,
    REQUEST_CODES,
    RESPONSE_CODES,
    Frame,
    FrameDecoder,
    Op,
    ProtocolError,
    Status,
    encode,
    encode_json,
    error_frame,
    limit_for,
)

frame_specs = st.lists(
    st.tuples(st.sampled_from(sorted(REQUEST_CODES)), st.binary(max_size=300)), max_size=12)


def stream_of(specs: list[tuple[int, bytes]]) -> bytes:
    return b"".join(encode(code, payload) for code, payload in specs)


def chunks_at(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted(set(c for c in cuts if 0 < c < len(data))), len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


Outcome = tuple[list[tuple[int, bytes]], Status | None]


def run(chunks: list[Any], codes: frozenset[int] = REQUEST_CODES, limit: Any = limit_for, *, end: bool = True) -> Outcome:
    """Feed chunks, then eof(); the frames seen (including those carried by the error) and the error's status."""
    decoder = FrameDecoder(codes, limit)
    got: list[tuple[int, bytes]] = []
    try:
        for chunk in chunks:
            got += [(f.code, f.payload) for f in decoder.feed(chunk)]
        if end:
            decoder.eof()
    except ProtocolError as exc:
        got += [(f.code, f.payload) for f in exc.frames]
        return got, exc.status
    return got, None


# --- round trips and split invariance


@given(frame_specs)
def test_encode_decode_round_trip(specs: list[tuple[int, bytes]]) -> None:
    assert run([stream_of(specs)]) == (specs, None)


@given(frame_specs, st.data())
def test_any_split_gives_the_same_frames(specs: list[tuple[int, bytes]], data: st.DataObject) -> None:
    stream = stream_of(specs)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=20))
    whole = run([stream])
    assert run(chunks_at(stream, cuts)) == whole
    assert run([stream[i:i + 1] for i in range(len(stream))]) == whole


@given(frame_specs, st.data())
def test_input_buffer_types_and_reuse(specs: list[tuple[int, bytes]], data: st.DataObject) -> None:
    """bytearray and memoryview input work, and a caller may overwrite its buffer right after feed()."""
    stream = stream_of(specs)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=10))
    decoder = FrameDecoder(REQUEST_CODES)
    got: list[tuple[int, bytes]] = []
    for i, chunk in enumerate(chunks_at(stream, cuts)):
        buf = bytearray(chunk)
        got += [(f.code, f.payload) for f in decoder.feed(buf if i % 2 else memoryview(buf))]
        buf[:] = b"\xff" * len(buf)
    decoder.eof()
    assert got == specs


def _messy_stream() -> st.SearchStrategy[bytes]:
    """Streams near the grammar: valid and invalid codes, small and huge lengths, cut anywhere."""
    piece = st.one_of(
        st.builds(encode, st.sampled_from(sorted(REQUEST_CODES)), st.binary(max_size=80)),
        st.builds(lambda c, n, p: HEADER.pack(c, n) + p,
                  st.integers(0, 255), st.one_of(st.integers(0, 100), st.integers(0, 2**64 - 1)),
                  st.binary(max_size=100)),
        st.binary(max_size=20),
    )
    return st.builds(lambda ps, cut: b"".join(ps)[:cut], st.lists(piece, max_size=8), st.integers(0, 2000))


@settings(max_examples=300)
@given(st.one_of(st.binary(max_size=400), _messy_stream()), st.data())
def test_arbitrary_bytes_parse_or_protocol_error(stream: bytes, data: st.DataObject) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=20))
    small = lambda code: 64  # noqa: E731 - exercises TOO_LARGE often
    whole = run([stream], limit=small)
    assert run(chunks_at(stream, cuts), limit=small) == whole
    assert run([stream[i:i + 1] for i in range(len(stream))], limit=small) == whole
    frames, status = whole
    assert status in (None, Status.PROTOCOL_ERROR, Status.UNKNOWN_OP, Status.TOO_LARGE)
    assert all(code in REQUEST_CODES and len(payload) <= 64 for code, payload in frames)


@given(st.binary(max_size=200), st.sampled_from([REQUEST_CODES, RESPONSE_CODES]))
def test_arbitrary_bytes_never_raise_anything_else(stream: bytes, codes: frozenset[int]) -> None:
    decoder = FrameDecoder(codes)
    for chunk in (stream[:5], stream[5:], b"", stream):
        try:
            decoder.feed(chunk)
        except ProtocolError:
            pass
    try:
        decoder.eof()
    except ProtocolError:
        pass


# --- big payloads (the STATE_DATA path)


@pytest.mark.parametrize("chunk", [1 << 10, 1 << 16, 300_001, 2 << 20, 5 << 20])
@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_big_payloads_across_chunk_sizes(chunk: int, kind: type) -> None:
    payloads = [os.urandom(2 << 20), os.urandom(70_000), b"", os.urandom(3 << 20)]
    stream = b"".join(encode(Op.STATE_DATA, p) for p in payloads) + encode_json(Op.STATE_END, {"bytes": 1})
    decoder = FrameDecoder(REQUEST_CODES)
    got: list[Frame] = []
    for i in range(0, len(stream), chunk):
        buf = bytearray(stream[i:i + chunk])
        got += decoder.feed(kind(buf) if kind is not memoryview else memoryview(buf))
        buf[:] = bytes(len(buf))  # the caller reuses its buffer
    decoder.eof()
    assert [f.payload for f in got[:-1]] == payloads
    assert got[-1].json() == {"bytes": 1}
    assert all(type(f.payload) is bytes for f in got)


def test_buffered_counts_the_incomplete_frame() -> None:
    frame = encode(Op.INFO, b"{}")
    decoder = FrameDecoder(REQUEST_CODES)
    assert decoder.buffered == 0
    assert decoder.feed(frame[:4]) == [] and decoder.buffered == 4
    assert decoder.feed(frame[4:10]) == [] and decoder.buffered == 10
    assert decoder.feed(frame[10:]) == [Frame(Op.INFO, b"{}")] and decoder.buffered == 0


# --- refusals


@pytest.mark.parametrize("code, limit", [(Op.INFO, MAX_CONTROL_PAYLOAD), (Op.STATE_DATA, MAX_DATA_PAYLOAD)])
def test_oversized_length_is_refused_right_after_the_header(code: int, limit: int) -> None:
    assert limit_for(code) == limit
    ok = FrameDecoder(REQUEST_CODES)
    assert ok.feed(HEADER.pack(code, limit)) == [] and ok.buffered == HEADER.size
    decoder = FrameDecoder(REQUEST_CODES)
    assert decoder.feed(HEADER.pack(code, limit + 1)[:8]) == []
    with pytest.raises(ProtocolError) as err:
        decoder.feed(HEADER.pack(code, limit + 1)[8:])
    assert err.value.status is Status.TOO_LARGE
    with pytest.raises(ProtocolError) as err:
        FrameDecoder(REQUEST_CODES).feed(HEADER.pack(code, 2**64 - 1))
    assert err.value.status is Status.TOO_LARGE


def test_limit_for_response_codes() -> None:
    assert limit_for(Status.STATE_DATA) == MAX_DATA_PAYLOAD
    assert limit_for(Status.OK) == limit_for(Op.INFO) == MAX_CONTROL_PAYLOAD
    assert limit_for(Status.STATE_META) == limit_for(Op.STATE_PUT) == MAX_DATA_PAYLOAD  # metas carry token lists


@pytest.mark.parametrize("code", [GGML_RPC_HELLO, 0x00, 0x2F, 0x31, 0x47, 0xFF])
def test_unknown_code_is_refused_on_its_first_byte(code: int) -> None:
    with pytest.raises(ProtocolError) as err:
        FrameDecoder(REQUEST_CODES).feed(bytes([code]))
    assert err.value.status is Status.UNKNOWN_OP


def test_request_decoder_refuses_response_codes_and_back() -> None:
    with pytest.raises(ProtocolError) as err:
        FrameDecoder(RESPONSE_CODES).feed(encode(Op.HELLO))
    assert err.value.status is Status.UNKNOWN_OP
    with pytest.raises(ProtocolError):
        FrameDecoder(REQUEST_CODES).feed(encode(Status.OK))


def test_frames_before_an_error_ride_on_the_exception() -> None:
    good = encode_json(Op.INFO, {})
    with pytest.raises(ProtocolError) as err:
        FrameDecoder(REQUEST_CODES).feed(good + good + b"\x99")
    assert err.value.frames == (Frame(Op.INFO, b"{}"), Frame(Op.INFO, b"{}"))


@given(frame_specs.filter(bool), st.data())
def test_truncated_frame_fails_at_eof(specs: list[tuple[int, bytes]], data: st.DataObject) -> None:
    stream = stream_of(specs)
    cut = data.draw(st.integers(0, len(stream) - 1))
    boundaries = {0}
    for _code, payload in specs:
        boundaries.add(max(boundaries) + HEADER.size + len(payload))
    decoder = FrameDecoder(REQUEST_CODES)
    decoder.feed(stream[:cut])
    if cut in boundaries:
        decoder.eof()
    else:
        with pytest.raises(ProtocolError, match="truncated") as err:
            decoder.eof()
        assert err.value.status is Status.PROTOCOL_ERROR


@pytest.mark.parametrize("poison, status", [
    (b"\x01", Status.UNKNOWN_OP),
    (HEADER.pack(Op.HELLO, MAX_CONTROL_PAYLOAD + 1), Status.TOO_LARGE),
])
def test_dead_decoder_keeps_raising(poison: bytes, status: Status) -> None:
    decoder = FrameDecoder(REQUEST_CODES)
    with pytest.raises(ProtocolError):
        decoder.feed(poison)
    for _ in range(3):
        with pytest.raises(ProtocolError) as err:
            decoder.feed(encode(Op.HELLO))
        assert err.value.status is status
    with pytest.raises(ProtocolError) as err:
        decoder.eof()
    assert err.value.status is status
    assert decoder.buffered == 0


def test_eof_error_kills_the_decoder() -> None:
    decoder = FrameDecoder(REQUEST_CODES)
    decoder.feed(b"\x30\x05")
    with pytest.raises(ProtocolError):
        decoder.eof()
    with pytest.raises(ProtocolError):
        decoder.feed(b"")


def test_clean_eof_keeps_the_decoder_usable() -> None:
    decoder = FrameDecoder(REQUEST_CODES)
    decoder.eof()
    assert decoder.feed(encode(Op.INFO)) == [Frame(Op.INFO, b"")]
    decoder.eof()


# --- payloads and frames


@pytest.mark.parametrize("payload", [
    b"{", b"nope", b"[1, 2]", b'"text"', b"3", b"null", b"\xff\xfe{}", b'{"a": "\xc3"}',
    b'{"a": NaN}', b'{"a": Infinity}', b"[" * 100_000, b"\xef\xbb\xbf{}", "{}".encode("utf-16"),
])
def test_frame_json_refuses_non_objects(payload: bytes) -> None:
    with pytest.raises(ProtocolError) as err:
        Frame(Op.INFO, payload).json()
    assert err.value.status is Status.BAD_REQUEST


def test_frame_json_objects() -> None:
    assert Frame(Op.INFO, b"").json() == {}
    assert Frame(Op.INFO, b" {} ").json() == {}
    assert Frame(Op.HELLO, '{"client": "prüfer", "version": 1}'.encode()).json() == {"client": "prüfer", "version": 1}


@given(st.dictionaries(st.text(max_size=8), st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10), max_size=5))
def test_encode_json_round_trip(obj: dict[str, Any]) -> None:
    frames = FrameDecoder(RESPONSE_CODES).feed(encode_json(Status.OK, obj))
    assert len(frames) == 1 and frames[0].json() == obj


def test_encode_json_refuses_nan() -> None:
    with pytest.raises(ValueError):
        encode_json(Status.OK, {"x": float("nan")})


def test_encode_layout_and_range() -> None:
    assert encode(Op.INFO, b"{}") == b"\x41" + (2).to_bytes(8, "little") + b"{}"
    assert encode(Status.OK) == bytes(9)
    assert HEADER.size == 9
    for bad in (-1, 256):
        with pytest.raises(ValueError):
            encode(bad)


def test_error_frame() -> None:
    frame, = FrameDecoder(RESPONSE_CODES).feed(error_frame(Status.NOT_SUPPORTED, "not_supported", "später"))
    assert frame.code == Status.NOT_SUPPORTED
    assert frame.json() == {"code": "not_supported", "message": "später"}


def test_hello_worked_example_matches_the_spec() -> None:
    """The hex bytes printed in docs/rpc-protocol.md."""
    frame = encode_json(Op.HELLO, {"version": PROTOCOL_VERSION, "client": "hydractl"})
    assert frame.hex(" ") == (
        "30 21 00 00 00 00 00 00 00 7b 22 76 65 72 73 69 6f 6e 22 3a 31 2c 22 63 6c 69 65 6e 74 22 3a 22 68 "
        "79 64 72 61 63 74 6c 22 7d")


def test_frame_repr_is_short() -> None:
    text = repr(Frame(Op.STATE_DATA, bytes(1 << 20)))
    assert "STATE_DATA" in text and "1048576 bytes" in text and len(text) < 300


# --- code sets


def test_first_ops() -> None:
    assert 0x30 in FIRST_OPS and set(range(0x40, 0x47)) <= FIRST_OPS
    assert not {GGML_RPC_HELLO, Op.STATE_DATA, Op.STATE_END} & FIRST_OPS
    assert FIRST_OPS == {op for op in Op if 0x30 <= op <= 0x46}
    assert all(0x30 <= op <= 0x46 for op in FIRST_OPS)


def test_code_sets() -> None:
    assert REQUEST_CODES == set(Op) and RESPONSE_CODES == set(Status)
    assert GGML_RPC_HELLO not in REQUEST_CODES
    assert {Op.STATE_DATA, Op.STATE_END} <= REQUEST_CODES
    assert all(s < 0x10 for s in (Status.OK, Status.STATE_META, Status.STATE_DATA, Status.STATE_END, Status.CONTINUE))
    assert Status.PROTOCOL_ERROR == 0x1A and Op.PIPELINE_ATTACH == 0x46


def test_protocol_error_defaults() -> None:
    err = ProtocolError("bad")
    assert err.status is Status.PROTOCOL_ERROR and str(err) == "bad" and err.frames == ()
    assert ProtocolError("x", Status.BUSY).status is Status.BUSY


def test_json_payload_in_the_example_is_compact() -> None:
    payload = encode_json(Op.HELLO, {"version": 1, "client": "hydractl"})[HEADER.size:]
    assert payload == json.dumps({"version": 1, "client": "hydractl"}, separators=(",", ":")).encode()
