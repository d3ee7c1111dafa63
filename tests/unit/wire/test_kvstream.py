"""The KV state stream's receiving end (wire/kvstream.py): bounded, and verified against STATE_END."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hydrad.wire import protocol as P
from hydrad.wire.kvstream import StateReceiver, chunked

DATA = bytes(range(256)) * 40  # 10 KiB


def end_of(data: bytes) -> dict[str, Any]:
    """The STATE_END body the sending side (``chunked``) writes for ``data``."""
    last = bytes(list(chunked({}, data))[-1])
    status, length = P.HEADER.unpack(last[:P.HEADER.size])
    assert status == P.Status.STATE_END and length == len(last) - P.HEADER.size
    return json.loads(last[P.HEADER.size:])


def receive(data: bytes, total: int, chunk: int = 3000) -> StateReceiver:
    rx = StateReceiver(total, take=bytearray)
    for off in range(0, len(data), chunk):
        rx.add(data[off:off + chunk])
    return rx


def test_a_whole_stream_verifies_and_lands_in_the_buffer() -> None:
    rx = receive(DATA, len(DATA))
    assert rx.verify(end_of(DATA)) is None
    assert bytes(rx.buffer) == DATA and rx.received == len(DATA) and rx.chunks == 4


def test_the_buffer_comes_from_take() -> None:
    asked: list[int] = []

    def take(n: int) -> bytearray:
        asked.append(n)
        return bytearray(n)

    StateReceiver(123, take=take)
    assert asked == [123]


def test_more_than_declared_is_refused_as_too_large() -> None:
    rx = StateReceiver(10, take=bytearray)
    rx.add(b"x" * 6)
    with pytest.raises(P.ProtocolError) as err:
        rx.add(b"y" * 5)
    assert err.value.status == P.Status.TOO_LARGE
    assert rx.received == 6  # nothing of the refused payload was taken


def test_short_stream_is_named() -> None:
    rx = receive(DATA[:100], len(DATA))
    assert rx.verify(end_of(DATA)) == f"received 100 of {len(DATA)} declared bytes"


def test_end_that_disagrees_with_meta_is_named() -> None:
    rx = receive(DATA, len(DATA))
    assert rx.verify({**end_of(DATA), "bytes": 5}) == f"STATE_END says 5 bytes, meta declared {len(DATA)}"


def test_corrupted_data_fails_the_hash() -> None:
    bad = bytearray(DATA)
    bad[500] ^= 0xFF
    rx = receive(bytes(bad), len(DATA))
    assert rx.verify(end_of(DATA)) == "xxh3_128 of the received data does not match STATE_END"


def test_an_end_without_a_hash_checks_only_the_length() -> None:
    rx = receive(DATA, len(DATA))
    assert rx.verify({"bytes": len(DATA)}) is None
