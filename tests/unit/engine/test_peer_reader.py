"""The relay's peer reader over a real socket pair: whatever arrives is read in one piece, every
command comes out whole however the bytes were cut, and the queue is flushed before every wait."""

from __future__ import annotations

import socket
import threading

import pytest

from hydrad.engine.rpc.peer_reader import PeerReader


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_pieces_come_out_whole_however_the_bytes_were_cut(pair) -> None:
    a, b = pair
    waits: list[int] = []
    r = PeerReader(b, lambda: waits.append(1), capacity=64)
    messages = [bytes([i]) * n for i, n in enumerate((9, 1, 63, 64, 200, 5, 0, 70), start=1)]
    blob = b"".join(messages)

    def send() -> None:
        for i in range(0, len(blob), 7):  # cut across every boundary
            a.sendall(blob[i:i + 7])

    t = threading.Thread(target=send)
    t.start()
    got = [r.take(len(m)) for m in messages]
    t.join()
    assert got == messages
    assert waits  # every blocking read was preceded by the flush hook


def test_one_read_takes_what_has_arrived(pair) -> None:
    a, b = pair
    calls: list[int] = []
    r = PeerReader(b, lambda: calls.append(1))
    a.sendall(b"x" * 9 + b"y" * 100 + b"z" * 9)
    r.need(9)
    assert r.buffered() == 118  # the three commands, in one recv
    assert r.take(9) == b"x" * 9 and r.take(100) == b"y" * 100 and r.take(9) == b"z" * 9
    assert len(calls) == 1


def test_large_payloads_pass_the_buffer_and_uploads_come_in_pieces(pair) -> None:
    a, b = pair
    r = PeerReader(b, lambda: None, capacity=32)
    a.sendall(b"h" * 10 + bytes(range(256)) * 4 + b"tail")
    assert r.take(10) == b"h" * 10
    assert r.take(1024) == bytes(range(256)) * 4  # past the 32-byte buffer
    into = memoryview(bytearray(16))
    n = r.read_some(into, 16)
    assert 0 < n <= 4 and bytes(into[:n]) == b"tail"[:n]


def test_a_peer_that_closes_mid_command_is_an_error(pair) -> None:
    a, b = pair
    r = PeerReader(b, lambda: None)
    a.sendall(b"abc")
    a.close()
    with pytest.raises(ConnectionError):
        r.take(9)
