"""The merged port's control places: which idle session gives its place to a newcomer."""

from __future__ import annotations

import socket

from hydrad.engine.rpc.places import ControlPlaces


def _pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair()


def test_the_session_whose_request_began_first_gives_way_even_when_its_thread_marks_it_idle_last() -> None:
    """Two sessions speak one after the other; the first one's thread marks it idle only after the
    second's (its client already had its answer). The first still goes first."""
    places = ControlPlaces(2)
    (a, a_peer), (b, b_peer), (c, c_peer) = _pair(), _pair(), _pair()
    try:
        assert places.take(1, a) and places.busy(1)
        assert places.take(2, b) and places.busy(2)
        places.idle(2)
        places.idle(1)  # the slower thread
        assert places.take(3, c)
        assert places.idle_closed == 1
        a_peer.settimeout(2.0)
        assert a_peer.recv(1) == b""  # session 1 was shut down
        assert not places.busy(1)  # and must end unserved
        assert places.busy(2)  # session 2 kept its place
    finally:
        for s in (a, a_peer, b, b_peer, c, c_peer):
            s.close()


def test_busy_everywhere_refuses_the_newcomer() -> None:
    places = ControlPlaces(1)
    (a, a_peer), (b, b_peer) = _pair(), _pair()
    try:
        assert places.take(1, a) and places.busy(1)
        assert not places.take(2, b)
        places.idle(1)
        assert places.take(2, b)
        assert places.held == 1
    finally:
        for s in (a, a_peer, b, b_peer):
            s.close()
