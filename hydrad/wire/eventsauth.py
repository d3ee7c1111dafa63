"""How a subscriber of the coordinator's events socket presents the events token.

Both ends must agree on it, so it lives here: the coordinator checks it (its ZAP handler,
``hydrad.coordinator.eventsdoor``), the console and the tests present it.

- On a plain socket (no CURVE keys) ZeroMQ's PLAIN mechanism carries it: user name
  :data:`USER`, password the token. PLAIN sends it unencrypted, which is why an events socket
  beyond loopback wants CURVE keys (the coordinator warns otherwise).
- With CURVE keys (the bus's, ``bus.curve_secret_key``) the traffic is encrypted and the
  subscriber's CURVE key pair is *derived from the token* (:func:`curve_keypair`): the
  coordinator admits the one public key the token gives, so the token itself never crosses
  the wire, and a subscriber without it cannot complete the handshake.

A subscriber without the token (or with another one) fails the handshake and receives nothing:
no event, no subscription counted.
"""

from __future__ import annotations

import hashlib

import zmq
from zmq.utils import z85

DOMAIN = b"hydra-events"  # the ZAP domain of the events socket (the bus's sockets have none)
USER = b"hydra"  # PLAIN's user name; the token is the password
_KEY_LABEL = b"hydra events subscriber key\x00"


def curve_keypair(token: str) -> tuple[bytes, bytes]:
    """The CURVE (public, secret) key pair, Z85, a subscriber holding ``token`` uses: the secret key
    is a hash of the token (any 32 bytes are a Curve25519 secret key), the public key follows."""
    secret = z85.encode(hashlib.sha256(_KEY_LABEL + token.encode("ascii")).digest())
    return zmq.curve_public(secret), secret


def present(sock: zmq.Socket, token: str | None, curve_server_key: str | None = None) -> None:
    """Set a SUB socket up to present ``token`` (before it connects). With ``curve_server_key`` the
    connection is CURVE, with a key pair derived from the token (a fresh random one without a token:
    the coordinator then refuses it, as it should)."""
    if curve_server_key:
        public, secret = curve_keypair(token) if token else zmq.curve_keypair()
        sock.setsockopt(zmq.CURVE_SERVERKEY, curve_server_key.encode())
        sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
    elif token:
        sock.setsockopt(zmq.PLAIN_USERNAME, USER)
        sock.setsockopt(zmq.PLAIN_PASSWORD, token.encode("ascii"))
