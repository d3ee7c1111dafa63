"""The internal port of llama.cpp's RPC server is held from the moment it is picked, and sealing it
touches only that server's sockets.

The engine used to pick the port with a probe it closed at once. Until the server's thread bound it,
the merged port's (or the HTTP listener's) ``bind(0)`` could be handed the same port; the relay then
connected to the merged port itself and, finding no ggml server there, sealed the merged port's own
listener (a CI run saw its connections refused). Real sockets on loopback; the listener that stands
for llama.cpp's server sets ``SO_REUSEADDR`` as that server does (ggml-rpc's transport.cpp)."""

from __future__ import annotations

import errno
import socket

import pytest

from hydrad.engine import ggml


def _reuse_listener(port: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(4)
    return s


def test_a_reserved_port_is_given_to_no_other_socket_but_the_server_can_listen_on_it() -> None:
    held = ggml.reserve_port()
    port = held.getsockname()[1]
    try:
        for reuse in (False, True):  # what a bind(0) of the merged port or uvicorn checks against
            other = socket.socket()
            if reuse:
                other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                if reuse:  # may bind beside the reservation, as llama.cpp's server does, and listen
                    other.bind(("127.0.0.1", port))
                    other.listen(1)
                    with socket.create_connection(("127.0.0.1", port), timeout=5):
                        pass
                else:
                    with pytest.raises(OSError) as taken:
                        other.bind(("127.0.0.1", port))
                    assert taken.value.errno == errno.EADDRINUSE
            finally:
                other.close()
    finally:
        held.close()


def test_the_rpc_server_thread_holds_the_port_it_picked() -> None:
    server = ggml.RpcServerThread("127.0.0.1", 0, None, 1)  # not started: only the reservation is looked at
    assert server.port > 0 and server.endpoint == f"127.0.0.1:{server.port}"
    plain = socket.socket()
    try:
        with pytest.raises(OSError):
            plain.bind(("127.0.0.1", server.port))
    finally:
        plain.close()
    assert ggml.RpcServerThread("127.0.0.1", 4321, None, 1).endpoint == "127.0.0.1:4321"  # a given port is kept


def test_sealing_cuts_foreign_connections_and_the_listener_but_not_the_reservation() -> None:
    held = ggml.reserve_port()
    port = held.getsockname()[1]
    listener = _reuse_listener(port)
    ours = socket.create_connection(("127.0.0.1", port), timeout=5)
    ours_accepted, _ = listener.accept()
    stranger = socket.create_connection(("127.0.0.1", port), timeout=5)
    stranger_accepted, _ = listener.accept()
    try:
        cut = ggml.seal_server(("127.0.0.1", port), ours.getsockname()[:2])
        assert cut == 1  # the stranger's accepted side; the reservation is no connection
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5)
        stranger.settimeout(5)
        assert stranger.recv(1) == b""  # shut down
        ours.sendall(b"x")
        ours_accepted.settimeout(5)
        assert ours_accepted.recv(1) == b"x"  # the kept connection still carries
    finally:
        for s in (held, listener, ours, ours_accepted, stranger, stranger_accepted):
            s.close()
