"""Shared secrets kept in files: the bus token, the admin token and the events token.

A secret lives in a file of its own (mode 0600, owned by the service user), never in a YAML
file: configs are world-readable, get copied into bug reports and checked into repositories;
a token file is not. The YAML names the file (``bus_token_file``, ``bus.token_file``,
``admin_token_file``); the process reads it at start (the engine again at every reconnect, so a
rotated token is picked up without a restart).

Format: the first line of the file, surrounding whitespace stripped; at least
:data:`MIN_LENGTH` characters of printable ASCII (so it can travel in JSON and in an HTTP
header unchanged). Create one with::

    install -m 600 /dev/null /etc/hydra/bus.token
    python3 -c 'import secrets; print(secrets.token_urlsafe(32))' > /etc/hydra/bus.token

Checking is constant-time (:func:`same`), so a peer cannot learn a token byte by byte from
how long a refusal takes.
"""

from __future__ import annotations

import hmac
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path

MIN_LENGTH = 16
MAX_LENGTH = 256
ENV_BUS_TOKEN_FILE = "HYDRA_BUS_TOKEN_FILE"  # overrides the YAML's bus token file (hydractl up sets it)
ENV_ADMIN_TOKEN_FILE = "HYDRA_ADMIN_TOKEN_FILE"  # hydractl and the console read the admin token from it
ENV_ADMIN_TOKEN = "HYDRA_ADMIN_TOKEN"  # or take the admin token itself
ENV_EVENTS_TOKEN_FILE = "HYDRA_EVENTS_TOKEN_FILE"  # the events token: the coordinator's (over the YAML), a console's
ENV_EVENTS_TOKEN = "HYDRA_EVENTS_TOKEN"  # or, for a console, the events token itself
HOW_TO_CREATE = ("create it with: install -m 600 /dev/null FILE && "
                 "python3 -c 'import secrets; print(secrets.token_urlsafe(32))' > FILE")


class TokenError(ValueError):
    """A token file that cannot be used; the message names the file and what is wrong."""


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe characters)."""
    return secrets.token_urlsafe(32)


def valid(token: str) -> bool:
    return MIN_LENGTH <= len(token) <= MAX_LENGTH and all(0x21 <= ord(c) <= 0x7E for c in token)


def read_token(path: str | Path) -> str:
    """The token in ``path``; ``TokenError`` naming the file when it is missing, empty or malformed."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise TokenError(f"token file {p} does not exist; {HOW_TO_CREATE.replace('FILE', str(p))}") from None
    except OSError as exc:
        raise TokenError(f"cannot read token file {p}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise TokenError(f"token file {p} is not ASCII text") from None
    lines = text.strip().splitlines()
    token = lines[0].strip() if lines else ""
    if not valid(token):
        raise TokenError(f"token file {p} must hold one line of {MIN_LENGTH} to {MAX_LENGTH} printable ASCII "
                         f"characters without spaces (found {len(token)}); {HOW_TO_CREATE.replace('FILE', str(p))}")
    return token


def loose_permissions(path: str | Path) -> bool:
    """True when others than the owner (and its group) may read the file: worth a warning."""
    try:
        return bool(os.stat(path).st_mode & stat.S_IROTH)
    except OSError:
        return False


def write_token(path: str | Path, token: str | None = None) -> str:
    """Write ``token`` (a new one by default) to ``path`` readable by the owner only; returns it."""
    token = token or new_token()
    p = Path(path)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, token.encode("ascii") + b"\n")
    finally:
        os.close(fd)
    return token


def same(given: str | None, expected: str) -> bool:
    """Constant-time comparison; ``None`` (no token sent) never matches."""
    if given is None:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode("ascii"))


def admin_token_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """The admin token a client (hydractl, the console) should send: ``$HYDRA_ADMIN_TOKEN``, else
    the file named by ``$HYDRA_ADMIN_TOKEN_FILE``, else None. ``TokenError`` for a bad file."""
    env = os.environ if environ is None else environ
    token = (env.get(ENV_ADMIN_TOKEN) or "").strip()
    if token:
        return token
    path = (env.get(ENV_ADMIN_TOKEN_FILE) or "").strip()
    return read_token(path) if path else None


def events_token_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """The events token a subscriber (the console) presents: ``$HYDRA_EVENTS_TOKEN``, else the file
    ``$HYDRA_EVENTS_TOKEN_FILE`` names, else the admin token (a coordinator without an events token
    of its own takes its admin token for the events), else None. ``TokenError`` for a bad file."""
    env = os.environ if environ is None else environ
    token = (env.get(ENV_EVENTS_TOKEN) or "").strip()
    if token:
        return token
    path = (env.get(ENV_EVENTS_TOKEN_FILE) or "").strip()
    return read_token(path) if path else admin_token_from_env(env)


def bearer(token: str | None) -> dict[str, str]:
    """HTTP headers that present ``token`` (none without one)."""
    return {"Authorization": f"Bearer {token}"} if token else {}
