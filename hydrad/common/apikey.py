"""An optional API key for the inference endpoints of both daemons (llama-server's ``--api-key``).

Inference (the OpenAI and llama-server endpoints) then needs ``Authorization: Bearer <key>`` or
Anthropic's ``x-api-key: <key>``, compared in constant time; a missing or wrong key is a 401 in OpenAI's error shape.
Several keys (``http.api_keys_file``: :mod:`hydrad.common.tenants`) make several tenants: the key a
request presents names its tenant (``request.state.tenant``), whose prompt cache no other key
shares, and whose optional rate beyond which it gets 429. Left open, as
llama-server leaves them: the health and model-list endpoints and ``/metrics`` (and ``/openapi.json``,
which describes the doors and answers nothing else). The control
surfaces keep their own credentials (an engine's token, the coordinator's admin token), so the key
is never asked there. The key comes from ``http.api_key_file`` or, when no file is configured, from
``$HYDRA_API_KEY``.
"""

from __future__ import annotations

import hmac
import json
import math
import os
from pathlib import Path
from typing import Any, TypeVar

from pydantic import Field, field_validator

from hydrad.common import tokenfile
from hydrad.common.browser import HostAccess
from hydrad.common.cors import check_origins
from hydrad.common.tenants import DEFAULT_TENANT, Tenant, read_keys
from hydrad.common.yamlfile import ConfigError, beside

A = TypeVar("A", bound="InferenceAccess")
ENV_API_KEY = "HYDRA_API_KEY"
OPEN_PATHS = frozenset({"/health", "/livez", "/v1/health", "/metrics", "/version", "/models", "/v1/models",
                        "/openapi.json", "/", "/index.html"})  # the web page holds no secret (hydrad.common.webui)
OWN_CREDENTIALS = ("/control", "/slots", "/admin", "/models/files/")


class InferenceAccess(HostAccess):
    """Who may call the inference endpoints: the ``http`` settings both daemons share (their own
    ``HttpSettings`` add host, port and the rest)."""

    cors_origins: list[str] = Field(default_factory=list, description="Web origins (scheme://host[:port], "
                                    "localhost for every loopback origin of any port, or *) allowed to call the "
                                    "inference endpoints from a browser; none by default. "
                                    "Control endpoints never answer CORS.")

    api_key_file: Path | None = Field(None, description="File holding an API key: the inference endpoints then need "
                                      "'Authorization: Bearer <key>' (401 otherwise); $HYDRA_API_KEY when no file is set.")

    api_keys_file: Path | None = Field(None, description="YAML file of several API keys, one tenant each (name, key "
                                       "or key_file, optional rate_per_minute and store_quota_mib): a tenant's prompt cache is its own. "
                                       "Replaces api_key_file when set.")

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, v: list[str]) -> list[str]:
        return check_origins(v)


def api_key(key_file: Path | None) -> str | None:
    """The key in force: the file's, else ``$HYDRA_API_KEY``, else None (no key: open)."""
    if key_file is not None:
        return tokenfile.read_token(key_file)
    env = os.environ.get(ENV_API_KEY, "").strip()
    if env and not tokenfile.valid(env):
        raise tokenfile.TokenError(f"${ENV_API_KEY} must be {tokenfile.MIN_LENGTH} to {tokenfile.MAX_LENGTH} "
                                   "printable ASCII characters without spaces")
    return env or None


def api_keys(http: InferenceAccess, given: tuple[str, ...] = ()) -> list[Tenant] | None:
    """The tenants of the doors: the keys file's, else the key file's (``default``), else the keys
    ``given`` on the command line (llama-server's ``--api-key``: one is ``default``, several are
    ``key-1``, ``key-2``, ... each a tenant of its own), else ``$HYDRA_API_KEY``'s, else None (open)."""
    if http.api_keys_file is not None:
        return read_keys(http.api_keys_file)
    if http.api_key_file is None and given:
        if len(given) == 1:
            return [Tenant(DEFAULT_TENANT, given[0])]
        return [Tenant(f"key-{i}", key) for i, key in enumerate(given, 1)]
    key = api_key(http.api_key_file)
    return None if key is None else [Tenant(DEFAULT_TENANT, key)]


def resolve_api_key(config: Path, http: A) -> A:
    """A settings loader's step: ``http.api_key_file`` and ``http.api_keys_file`` resolved beside the
    config file and the keys they (or ``$HYDRA_API_KEY``) name checked usable, else ConfigError naming
    the file."""
    base = config.resolve().parent
    resolved = http.model_copy(update={"api_key_file": beside(base, http.api_key_file),
                                       "api_keys_file": beside(base, http.api_keys_file)})
    try:
        api_key(resolved.api_key_file)
    except tokenfile.TokenError as exc:
        raise ConfigError(f"{config}: http.api_key_file: {exc}") from None
    if resolved.api_keys_file is not None:
        read_keys(resolved.api_keys_file)  # ConfigError naming the keys file and the entry
    return resolved


def guarded(path: str) -> bool:
    """Whether ``path`` is behind the key. ``/slots`` (what each slot is doing) is a read of pool
    state like inference's own, so it is; ``/slots/<id>...`` keeps the control credentials."""
    return path not in OPEN_PATHS and (path == "/slots" or not path.startswith(OWN_CREDENTIALS))


_REFUSAL = json.dumps({"error": {"message": "a valid API key is needed: 'Authorization: Bearer <key>'",
                                 "type": "authentication_error", "code": "invalid_api_key", "param": None}}).encode()


def _too_many(seconds: float) -> tuple[list[tuple[bytes, bytes]], bytes]:
    body = json.dumps({"error": {"message": "this API key's rate is spent; retry later", "type": "rate_limit_error",
                                 "code": "rate_limited", "param": None}}).encode()
    return [(b"content-type", b"application/json"), (b"retry-after", str(max(1, math.ceil(seconds))).encode()),
            (b"content-length", str(len(body)).encode())], body


def with_api_key(app: Any, keys: str | list[Tenant] | None) -> Any:
    """``app`` with the inference endpoints behind ``keys`` (one key, or the tenants of a keys file;
    ``app`` itself when there are none). A request that presents a tenant's key carries its name in
    ``request.state.tenant``."""
    if keys is None:
        return app
    tenants = [Tenant(DEFAULT_TENANT, keys)] if isinstance(keys, str) else list(keys)
    raws = [(t, t.key.encode()) for t in tenants]

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] != "OPTIONS" and guarded(scope["path"]):
            headers = scope.get("headers", [])
            scheme, _, presented = next((v for k, v in headers if k == b"authorization"), b"").partition(b" ")
            # Anthropic's SDKs send the key as x-api-key; both are compared, each in constant time, against
            # every key (the loop does not stop at a match). The scheme's case is free (RFC 9110)
            anthropic = next((v for k, v in headers if k == b"x-api-key"), b"")
            bearer = scheme.lower() == b"bearer"
            who = None
            for tenant, raw in raws:
                if (hmac.compare_digest(presented, raw) & bearer) | hmac.compare_digest(anthropic, raw):
                    who = tenant
            if who is None:
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"www-authenticate", b'Bearer realm="hydra"'),
                                        (b"content-length", str(len(_REFUSAL)).encode())]})
                await send({"type": "http.response.body", "body": _REFUSAL})
                return
            wait = who.admit()
            if wait > 0:
                head, body = _too_many(wait)
                await send({"type": "http.response.start", "status": 429, "headers": head})
                await send({"type": "http.response.body", "body": body})
                return
            state = scope.setdefault("state", {})
            state["tenant"] = who.name
            if who.store_quota_bytes:
                state["store_quota"] = who.store_quota_bytes
        await app(scope, receive, send)

    return asgi
