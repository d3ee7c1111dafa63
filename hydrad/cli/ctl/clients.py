"""The clients ``hydractl`` talks through, one per API, each turning every failure into a
:class:`~hydrad.cli.common.CliError` with the right exit code:

- :class:`EngineClient`: an engine's HTTP API (``/health``, ``/control/*``);
- :class:`CoordinatorClient`: the coordinator's admin API (``/admin/*``);
- the merged RPC port through :class:`hydrad.wire.rpcclient.RpcClient` (:func:`connect`), its
  errors turned into CliErrors by :func:`rpc_errors`.

Also where the engines' token and the default URLs come from.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from typing import Any, Callable, Iterator

import httpx

from hydrad.cli.common import EXIT_REJECTED, EXIT_UNREACHABLE, CliError
from hydrad.common import tokenfile
from hydrad.wire import protocol as P
from hydrad.wire.httpapi import AdminHttp, EngineHttp, HttpApi, NoAnswer
from hydrad.wire.rpcclient import RpcClient, RpcError, parse_address

DEFAULT_URL = "http://127.0.0.1:8080"
URL_ENV = "HYDRA_ENGINE_URL"
POLL_INTERVAL_S = 0.2
RPC_TOKEN_ENV = "HYDRA_RPC_TOKEN"  # the older name of TOKEN_ENV, still read
TOKEN_ENV = "HYDRA_TOKEN"  # the engines' token (rpc.token / rpc.token_file), for HTTP and the RPC port
TOKEN_FILE_ENV = "HYDRA_TOKEN_FILE"


# ----- addresses and the token -----------------------------------------------------------

def split_url(args: list[str], default: str) -> tuple[str, list[str]]:
    """A leading http(s):// argument is the engine URL; everything else stays."""
    if args and args[0].startswith(("http://", "https://")):
        return args[0], args[1:]
    return default, args


def normalize_url(url: str) -> str:
    """Accept ``host:port`` as well as a full URL; drop a trailing slash."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    return url.rstrip("/")


def engine_token(args: argparse.Namespace) -> str | None:
    """The engines' token: --token, else --token-file, else $HYDRA_TOKEN / $HYDRA_RPC_TOKEN, else the file
    $HYDRA_TOKEN_FILE names. A file keeps the secret out of the shell history and the process list."""
    token = getattr(args, "token", None)
    if token:
        return token
    path = getattr(args, "token_file", None)
    if not path:
        token = os.environ.get(TOKEN_ENV) or os.environ.get(RPC_TOKEN_ENV)
        if token:
            return token
        path = os.environ.get(TOKEN_FILE_ENV)
    if not path:
        return None
    try:
        return tokenfile.read_token(path)
    except tokenfile.TokenError as exc:
        raise CliError(f"--token-file: {exc}", EXIT_REJECTED) from None


# ----- HTTP: the engine and the coordinator ----------------------------------------------

class ApiClient:
    """One HTTP API hydractl talks to (through :mod:`hydrad.wire.httpapi`), every failure a CliError."""

    what = "engine"  # named in every error, so the user knows which server is meant
    api: HttpApi

    def __init__(self, api: HttpApi, url: str) -> None:
        self.api = api
        self.url = url

    def close(self) -> None:
        self.api.close()

    def call(self, send: Callable[[], httpx.Response]) -> httpx.Response:
        """``send()``'s response; no answer (or a URL httpx cannot use) becomes a CliError."""
        try:
            return send()
        except NoAnswer as exc:
            raise CliError(f"cannot reach the {self.what} at {self.url} ({exc})", EXIT_UNREACHABLE) from None
        except httpx.InvalidURL as exc:
            raise CliError(f"bad {self.what} URL {self.url!r}: {exc}", EXIT_UNREACHABLE) from None

    def body(self, resp: httpx.Response) -> dict[str, Any]:
        """The JSON object of a response; anything else means this is not a Hydra server."""
        try:
            data = resp.json()
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise CliError(f"{self.url}{resp.request.url.path} answered {resp.status_code} without a JSON object; "
                           f"is this a Hydra {self.what}?", EXIT_UNREACHABLE)
        return data

    def checked(self, resp: httpx.Response) -> dict[str, Any]:
        """The body of a successful response; an OpenAI error body becomes a CliError."""
        data = self.body(resp)
        if resp.is_success:
            return data
        err = data.get("error")
        self._check_error(resp, err)
        message = err.get("message") if isinstance(err, dict) else None
        message = message or f"HTTP {resp.status_code}"
        code = EXIT_REJECTED if resp.is_client_error else EXIT_UNREACHABLE
        raise CliError(f"{self.what} refused ({resp.status_code}): {message}", code)

    def _check_error(self, resp: httpx.Response, err: Any) -> None:
        """A hook for errors that mean "wrong kind of server" rather than "refused"."""


class EngineClient(ApiClient):
    """The engine's HTTP API: ``/health``, ``/control/*``."""

    api: EngineHttp

    def __init__(self, url: str, timeout: float, token: str | None = None) -> None:
        url = normalize_url(url)
        # an engine with rpc.token wants it on /control/* and /slots/*/state*
        super().__init__(EngineHttp(url, timeout=timeout, token=token), url)

    def health(self) -> tuple[int, dict[str, Any]]:
        resp = self.call(self.api.health)
        data = self.body(resp)
        if "stage" not in data:
            raise CliError(f"{self.url}/health answered {resp.status_code} without a stage; is this a Hydra engine?",
                           EXIT_UNREACHABLE)
        return resp.status_code, data

    def configure(self, payload: dict[str, Any]) -> httpx.Response:
        return self.call(lambda: self.api.configure(payload))

    def config(self) -> dict[str, Any]:
        return self.checked(self.call(self.api.config))

    def load(self, load_id: int) -> dict[str, Any]:
        resp = self.call(lambda: self.api.load(load_id))
        if resp.status_code == 404:
            raise CliError(f"load {load_id} is unknown to {self.url} (did the engine restart?)", EXIT_UNREACHABLE)
        return self.checked(resp)


class CoordinatorClient(ApiClient):
    """The coordinator's admin API (``/admin/*``), with errors that say "coordinator"."""

    what = "coordinator"

    api: AdminHttp

    def __init__(self, url: str, timeout: float) -> None:
        url = normalize_url(url)
        api = AdminHttp(url, timeout=timeout)
        # /admin/* may need the admin token: $HYDRA_ADMIN_TOKEN, or the file $HYDRA_ADMIN_TOKEN_FILE names.
        try:
            api.set_token(tokenfile.admin_token_from_env())
        except tokenfile.TokenError as exc:
            raise CliError(f"{tokenfile.ENV_ADMIN_TOKEN_FILE}: {exc}", EXIT_REJECTED) from None
        super().__init__(api, url)

    def _check_error(self, resp: httpx.Response, err: Any) -> None:
        if resp.status_code == 404 and isinstance(err, dict) and err.get("code") == "not_found":
            raise CliError(f"{self.url} has no {resp.request.url.path}; is this a Hydra coordinator "
                           "(not an engine)?", EXIT_UNREACHABLE)
        if resp.status_code in (401, 403) and isinstance(err, dict):
            hint = (f"set {tokenfile.ENV_ADMIN_TOKEN_FILE} to the coordinator's admin token file"
                    if resp.status_code == 401 else "run it from an address in the coordinator's admin_allow_from")
            raise CliError(f"{self.url}: {err.get('message')}; {hint}", EXIT_UNREACHABLE)

    def engines(self) -> dict[str, Any]:
        return self.checked(self.call(self.api.engines))

    def profile(self) -> dict[str, Any]:
        return self.checked(self.call(self.api.profile))

    def switch(self, name: str) -> dict[str, Any]:
        """Start a switch to profile ``name`` and return at once."""
        return self.checked(self.call(lambda: self.api.switch(name, wait=False)))

    def route(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.checked(self.call(lambda: self.api.route(body)))

    def move_session(self, session: str, engine: str) -> dict[str, Any]:
        return self.checked(self.call(lambda: self.api.move_session(session, engine)))


def _coordinator(args: argparse.Namespace) -> CoordinatorClient:
    return CoordinatorClient(args.url or args.default_coordinator_url, args.timeout)


def coordinator(args: argparse.Namespace) -> CoordinatorClient:
    return CoordinatorClient(args.url or args.default_coordinator_url, args.timeout)


# ----- the merged RPC port ----------------------------------------------------------------

def rpc_address(text: str) -> str:
    """``host:port`` (``[v6]:port``, a ``tcp://`` prefix, a bare host for port 9503) as ``host:port``."""
    try:
        host, port = parse_address(text.strip())
    except ValueError:
        raise CliError(f"bad RPC address {text!r}: expected host:port", EXIT_UNREACHABLE) from None
    if not host or not 0 < port < 65536:
        raise CliError(f"bad RPC address {text!r}: expected host:port", EXIT_UNREACHABLE)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


@contextlib.contextmanager
def rpc_errors(address: str, refused: str | None = None) -> Iterator[None]:
    """Turn what the RPC client raises into CliErrors: an error frame exits 2, transport trouble 1.

    ``refused`` names the request in a refusal (default: the engine at ``address``). Local file
    problems must already be CliErrors by the time they get here, or they would read as
    network trouble.
    """
    try:
        yield
    except RpcError as exc:
        who = refused or f"the engine at {address}"
        raise CliError(f"{who} refused ({exc.code}): {exc.message}", EXIT_REJECTED) from None
    except P.ProtocolError as exc:
        raise CliError(f"{address} broke Hydra's RPC protocol ({exc.message}); is this an engine's RPC port?",
                       EXIT_UNREACHABLE) from None
    except TimeoutError:
        raise CliError(f"no answer from {address} in time; is this the engine's merged RPC port "
                       "(not its HTTP port)?", EXIT_UNREACHABLE) from None
    except OSError as exc:  # refused, reset, closed, unknown host
        raise CliError(f"cannot reach the engine's RPC port at {address} ({reason(exc)})", EXIT_UNREACHABLE) from None


def connect(address: str, args: argparse.Namespace) -> RpcClient:
    """A client that has said HELLO (with the token, when one is given)."""
    return RpcClient(address, token=engine_token(args), timeout=args.rpc_timeout)
