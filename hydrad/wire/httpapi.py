"""Clients of Hydra's two HTTP APIs, shared by ``hydractl`` and the console: one per API.

- :class:`EngineHttp`: an engine's own API (``/health``, ``/control/*``, ``/slots``);
- :class:`AdminHttp`: the coordinator's admin API (``/admin/*``).

Both are blocking, send a bearer token when given one, and answer with the ``httpx.Response``
itself: what a status or body means to an operator is the caller's to say (``hydractl`` turns
it into an exit code, the console into a line on screen). A request that gets no HTTP answer
raises :class:`NoAnswer`. The merged RPC port has its own client, ``rpcclient.py``.
"""

from __future__ import annotations

import os
from typing import Any

import httpx

from hydrad.common import tokenfile
from hydrad.common.apikey import ENV_API_KEY


class NoAnswer(Exception):
    """No HTTP answer came: ``cause`` is the transport's error, ``timeout`` whether time ran out."""

    def __init__(self, cause: httpx.TransportError) -> None:
        super().__init__(str(cause) or type(cause).__name__)
        self.cause = cause
        self.timeout = isinstance(cause, httpx.TimeoutException)


def json_of(resp: httpx.Response) -> Any:
    """The response's JSON body, or None when it has none."""
    try:
        return resp.json()
    except ValueError:
        return None


class HttpApi:
    """One HTTP API at ``base_url``; without one, every call names its server (``base=``)."""

    def __init__(self, base_url: str | None = None, *, timeout: float, token: str | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/") if base_url else None
        self._http = httpx.Client(base_url=self.base_url or "", timeout=timeout, transport=transport,
                                  headers=tokenfile.bearer(token))

    def set_token(self, token: str | None) -> None:
        """Send ``token`` as a bearer token from now on (nothing changes without one)."""
        self._http.headers.update(tokenfile.bearer(token))

    def close(self) -> None:
        self._http.close()

    def send(self, method: str, path: str, json: Any = None, *, base: str | None = None) -> httpx.Response:
        """One request; :class:`NoAnswer` when the transport fails (``httpx.InvalidURL`` passes through)."""
        url = base.rstrip("/") + path if base else path
        try:
            if json is None:
                return self._http.request(method, url)
            return self._http.request(method, url, json=json)
        except httpx.TransportError as exc:
            raise NoAnswer(exc) from None


class EngineHttp(HttpApi):
    """An engine's HTTP API; ``token`` is the engines' token (``rpc.token_file``). ``/slots`` is pool
    state behind the inference API key when the engine has one: the key (``api_key``, else
    ``$HYDRA_API_KEY`` as the daemons read it) goes in ``x-api-key``, beside the token's header."""

    def __init__(self, base_url: str | None = None, *, timeout: float, token: str | None = None,
                 transport: httpx.BaseTransport | None = None, api_key: str | None = None) -> None:
        super().__init__(base_url, timeout=timeout, token=token, transport=transport)
        key = api_key if api_key is not None else os.environ.get(ENV_API_KEY, "").strip()
        if key:
            self._http.headers["x-api-key"] = key

    def health(self, *, base: str | None = None) -> httpx.Response:
        return self.send("GET", "/health", base=base)

    def configure(self, payload: dict[str, Any], *, base: str | None = None) -> httpx.Response:
        return self.send("POST", "/control/configure", payload, base=base)

    def config(self, *, base: str | None = None) -> httpx.Response:
        return self.send("GET", "/control/config", base=base)

    def load(self, load_id: int, *, base: str | None = None) -> httpx.Response:
        return self.send("GET", f"/control/loads/{load_id}", base=base)

    def slots(self, *, base: str | None = None) -> httpx.Response:
        return self.send("GET", "/slots", base=base)


class AdminHttp(HttpApi):
    """The coordinator's admin API; ``token`` is its admin token."""

    def engines(self) -> httpx.Response:
        return self.send("GET", "/admin/engines")

    def profile(self) -> httpx.Response:
        return self.send("GET", "/admin/profile")

    def switch(self, name: str, *, wait: bool = False) -> httpx.Response:
        return self.send("POST", "/admin/profile", {"name": name, "wait": wait})

    def route(self, body: dict[str, Any]) -> httpx.Response:
        return self.send("POST", "/admin/route", body)

    def move_session(self, session: str, engine: str) -> httpx.Response:
        return self.send("POST", "/admin/sessions/move", {"session": session, "engine": engine})
