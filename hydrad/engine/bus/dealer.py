"""The engine's DEALER socket to the coordinator's bus, set up for the link's reliability rules
(hydrad/engine/bus/link.py says why each option is what it is)."""

from __future__ import annotations

from typing import Any

import zmq
import zmq.asyncio

SNDHWM = 10_000  # messages queued towards the coordinator before a send fails (then the request is cancelled)


def open_dealer(ctx: zmq.asyncio.Context, endpoint: str, identity: bytes, interval: float, bus: Any) -> zmq.asyncio.Socket:
    """A DEALER of ``identity`` connecting to ``endpoint``, CURVE-encrypted when the bus settings name the
    coordinator's key (a fresh key pair of its own when they give none: the coordinator then does not
    authenticate engines, but the traffic is still encrypted)."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, identity)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IMMEDIATE, 1)  # no queueing towards a connection that is not up: fail, don't flood later
    sock.setsockopt(zmq.SNDHWM, SNDHWM)
    sock.setsockopt(zmq.RCVHWM, SNDHWM)
    sock.setsockopt(zmq.MAXMSGSIZE, -1)  # decode() refuses what is too big; a limit here drops the connection
    sock.setsockopt(zmq.RECONNECT_IVL, 100)
    # a connect whose SYN was lost (a partition) is given up after half an interval and tried again,
    # instead of waiting out the kernel's SYN retransmissions (1 s, 3 s, 7 s ...)
    sock.setsockopt(zmq.CONNECT_TIMEOUT, max(100, int(interval * 500)))
    # ZeroMQ doubles its reconnect wait up to this cap; a cap of seconds left a socket opened during a
    # partition trying only every 0.8-1.6 s by the time the link healed (re-admitted 1.65 s after it)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, max(100, int(interval * 500)))
    if bus.curve_server_key:
        pub, sec = bus.curve_public_key, bus.curve_secret_key
        if not (pub and sec):
            pk, sk = zmq.curve_keypair()
            pub, sec = pk.decode(), sk.decode()
        sock.setsockopt(zmq.CURVE_SERVERKEY, bus.curve_server_key.encode())
        sock.setsockopt(zmq.CURVE_PUBLICKEY, pub.encode())
        sock.setsockopt(zmq.CURVE_SECRETKEY, sec.encode())
    sock.connect(endpoint)
    return sock
