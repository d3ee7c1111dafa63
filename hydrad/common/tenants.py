"""Tenants: several API keys on one pool (``http.api_keys_file``), and what keeps them apart.

A keys file is YAML::

    keys:
      - name: alice            # who the key is: logs, metrics and cache isolation use the name
        key_file: alice.key    # or  key: <16..256 printable ASCII characters>
        rate_per_minute: 600   # optional: requests a minute, beyond it 429 with Retry-After
        store_quota_mib: 512   # optional: most of the pool's KV Store this key's objects may hold

A request's **cache namespace** (:func:`cache_namespace`) is made of its tenant and of its own
``cache_salt`` (vLLM's per-request field): the prompt cache, a slot's reuse, prefix sharing
between slots, the Store's prefix objects and routing's session and prefix affinity never cross
namespaces, so no key can learn a byte of another key's prompt through ``cached_tokens`` (or
through which engine a request is routed to). A pool with no key, or one key, has one tenant: its
requests share the cache as before unless they send a ``cache_salt``. The time to the first token
still differs with what is cached on the engine; that timing channel is documented, not closed.

A namespace starts with its tenant's own digest (:func:`store_owner`), so the KV Store can tell
whose an object is whatever salt it was made under, and hold each key to its ``store_quota_mib``:
a key past its quota evicts its own least recently used objects, never another key's.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydrad.common import tokenfile
from hydrad.common.yamlfile import ConfigError, read_mapping

DEFAULT_TENANT = "default"
MAX_TENANTS = 10_000
MAX_SALT = 256


@dataclass
class Tenant:
    name: str
    key: str
    rate_per_minute: float = 0.0  # 0: no limit
    store_quota_bytes: int = 0  # 0: only the Store's own cap
    _tokens: float = field(default=0.0, repr=False)
    _at: float = field(default=0.0, repr=False)
    _mu: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def admit(self, now: float | None = None) -> float:
        """0 when a request may go now, else the seconds until one may (a token bucket a minute deep)."""
        rate = self.rate_per_minute
        if rate <= 0:
            return 0.0
        now = time.monotonic() if now is None else now
        with self._mu:
            if self._at == 0.0:
                self._tokens, self._at = rate, now
            self._tokens = min(rate, self._tokens + (now - self._at) * rate / 60.0)
            self._at = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return 0.0
            return (1.0 - self._tokens) * 60.0 / rate


def read_keys(path: Path) -> list[Tenant]:
    """The tenants of a keys file; ConfigError naming the file and the entry."""
    data = read_mapping(path, "a mapping with a 'keys' list")
    entries = data.get("keys")
    if not isinstance(entries, list) or not entries or len(entries) > MAX_TENANTS:
        raise ConfigError(f"{path}: 'keys' must be a list of 1 to {MAX_TENANTS} entries")
    out: list[Tenant] = []
    names: set[str] = set()
    for i, e in enumerate(entries):
        where = f"{path}: keys[{i}]"
        if not isinstance(e, dict) or set(e) - {"name", "key", "key_file", "rate_per_minute", "store_quota_mib"}:
            raise ConfigError(f"{where}: an entry has name, key or key_file, and optionally rate_per_minute and "
                              "store_quota_mib")
        name = e.get("name")
        if not isinstance(name, str) or not 1 <= len(name) <= 64 or not name.isascii() or not name.isprintable():
            raise ConfigError(f"{where}.name: 1 to 64 printable ASCII characters")
        if name in names:
            raise ConfigError(f"{where}.name: '{name}' is named twice")
        if name == DEFAULT_TENANT:
            raise ConfigError(f"{where}.name: '{DEFAULT_TENANT}' is the name of a pool's only key; choose another")
        if ("key" in e) == ("key_file" in e):
            raise ConfigError(f"{where}: exactly one of key and key_file")
        try:
            if "key_file" in e:
                key = tokenfile.read_token(path.parent / str(e["key_file"]))
            else:
                key = str(e["key"])
                if not tokenfile.valid(key):
                    raise tokenfile.TokenError(f"a key is {tokenfile.MIN_LENGTH} to {tokenfile.MAX_LENGTH} "
                                               "printable ASCII characters without spaces")
        except tokenfile.TokenError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        rate = e.get("rate_per_minute", 0)
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not (0 <= rate < math.inf):
            raise ConfigError(f"{where}.rate_per_minute: a number of requests a minute, 0 for no limit")
        quota = e.get("store_quota_mib", 0)
        if isinstance(quota, bool) or not isinstance(quota, int) or not 0 <= quota <= 1 << 24:
            raise ConfigError(f"{where}.store_quota_mib: whole MiB of the KV Store, 0 for no quota of its own")
        if any(t.key == key for t in out):
            raise ConfigError(f"{where}: the same key as another entry")
        names.add(name)
        out.append(Tenant(name, key, float(rate), quota << 20))
    return out


OWNER_HEX = 16


def cache_namespace(tenant: str | None, salt: str | None) -> str:
    """The namespace a request's prompt cache lives in: "" (the shared one) for the only tenant of a
    pool without a salt, else the tenant's digest followed by one of the tenant and the salt (the
    salt never travels on)."""
    if not salt and tenant in (None, DEFAULT_TENANT):
        return ""
    name = (tenant or DEFAULT_TENANT).encode()
    h = hashlib.sha256(name + b"\0")
    h.update((salt or "").encode())
    return hashlib.sha256(name).hexdigest()[:OWNER_HEX] + h.hexdigest()[:OWNER_HEX]


def store_owner(ns: str) -> str:
    """Whose KV Store objects a namespace's are: its tenant's digest ("" for the shared namespace). An
    engine widens a namespace after a ``|`` (the LoRA adapters a prompt ran under: hydrad.engine.adapters);
    the owner is the tenant's all the same."""
    return ns.partition("|")[0][:OWNER_HEX]


def store_quota_of(scope_state: Any) -> int:
    """The Store quota (bytes) of the tenant the API-key check found, 0 for none."""
    return int(getattr(scope_state, "store_quota", 0) or 0)


def tenant_of(scope_state: Any) -> str | None:
    """The tenant the API-key check put on a request (``request.state``), None when the door is open."""
    return getattr(scope_state, "tenant", None)


def scoped(ns: str, name: str) -> str:
    """A client-chosen name (a session id) inside a cache namespace."""
    return f"{ns}/{name}" if ns else name
