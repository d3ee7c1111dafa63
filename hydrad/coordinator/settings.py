"""Start-only settings of the coordinator, read from ``/etc/hydra/coordinator.yaml``.

One model and one ``load_config``, as for the engine, so ``--config`` and ``--check-config``
can never disagree. Relative paths resolve against the file's directory. ``bus`` may be a
plain endpoint (``tcp://*:9500``) or a mapping that adds CURVE keys; the short form is what
most hosts need, the long one is for pools on a real network.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hydrad.common.apikey import InferenceAccess, resolve_api_key
from hydrad.common.netaccess import address_allowed, check_networks, split_endpoint
from hydrad.common.yamlfile import ConfigError, beside, read_settings  # noqa: F401 (ConfigError: re-exported)
from hydrad.common.webui import WebUiSetting
from hydrad.coordinator.sessions import SessionSettings
from hydrad.store.settings import POOL_PATTERN, pool_of


class HttpSettings(InferenceAccess, WebUiSetting):
    model_config = ConfigDict(extra="forbid")
    host: str = Field("127.0.0.1", description="Address the OpenAI front door and /admin bind.")
    port: int = Field(9000, ge=0, le=65535, description="HTTP port; 0 = pick a free one (tests).")
    header_timeout_s: float = Field(10.0, gt=0, le=3600,
                                    description="How long a connection may take to send a request's headers (and may "
                                                "stay idle between requests, keep-alive) before it is closed; a body "
                                                "has body_timeout_s.")


class BusSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    endpoint: str = Field("tcp://127.0.0.1:9500", description="ROUTER endpoint the engines' DEALERs connect to.")
    curve_public_key: str | None = Field(None, min_length=40, max_length=40, description="Coordinator CURVE public key (Z85); engines name it as curve_server_key.")
    curve_secret_key: str | None = Field(None, min_length=40, max_length=40, description="Coordinator CURVE secret key (Z85); with it the bus and events are encrypted.")
    request_stream: str | None = Field("auto", max_length=300, description="The request stream: a plain TCP listener that admitted engines connect to for the request path alone (GENERATE and CANCEL out, tokens back), one thread wake per hop instead of ZeroMQ's three (docs/coordinator.md). \"auto\" (default): on a tcp bus without CURVE, the bus's host at the bus's port + 2 (9502 beside 9500 and the events' 9501; a bus on port 0 gets a free port too); if that port cannot be bound the coordinator warns and keeps requests on the bus. \"host:port\": that listener, and a port that cannot be bound stops the start. \"off\" or null: none. Not with CURVE, since it is not encrypted. Engines of an earlier release ignore the offer and keep to the bus.")

    @model_validator(mode="after")
    def _pair(self) -> "BusSettings":
        if (self.curve_public_key is None) != (self.curve_secret_key is None):
            raise ValueError("curve_public_key and curve_secret_key come together")
        if self.request_stream not in (None, "auto", "off"):
            try:
                split_endpoint(self.request_stream)
            except ValueError as e:
                raise ValueError(f"request_stream: {e} (or \"auto\", or \"off\")") from None
            if self.curve_secret_key is not None:
                raise ValueError("request_stream is not encrypted: it cannot be used with CURVE keys")
        return self

    def stream_plan(self) -> tuple[str, bool] | None:
        """Where the request stream listens and whether failing to bind there stops the start (an explicit
        endpoint) or only leaves requests on the bus (``auto``); None when there is none."""
        if self.request_stream in (None, "off"):
            return None
        if self.request_stream != "auto":
            return self.request_stream, True
        scheme, _, rest = self.endpoint.partition("://")
        host, sep, port = rest.rpartition(":")
        if self.curve_secret_key is not None or scheme != "tcp" or not sep or not (port.isdigit() or port == "*"):
            return None
        n = 0 if port == "*" else int(port)  # ZeroMQ's "*" port, like 0, is a free one: so is the stream's
        if n + 2 > 65535:
            return None
        return f"{host}:{n + 2 if n else 0}", False


class LogSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level.")


class CoordinatorSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field("coordinator", pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="Name the coordinator gives in WELCOME.")
    pool: str | None = Field(None, pattern=POOL_PATTERN, description="The pool's name, which names its Store directory "
                             "(<root>/hydra-store/<pool>, docs/store.md) unless sessions.store.dir is set. Unset: "
                             "derived from the bus endpoint, bus-<port> (the name its engines derive from theirs), "
                             "else this coordinator's name.")
    http: HttpSettings = Field(default_factory=HttpSettings, description="OpenAI front door and admin API.")
    bus: BusSettings = Field(default_factory=BusSettings, description="ZeroMQ ROUTER for the engines (string = endpoint).")
    events: str = Field("tcp://127.0.0.1:9501", description="ZeroMQ PUB endpoint for events (the console's feed); a "
                        "subscriber must present the events token (events_token_file).")
    events_token_file: Path | None = Field(None, description="File holding the token a subscriber of the events socket "
                                           "must present (ZeroMQ PLAIN's password, or under CURVE the key pair derived "
                                           "from it); others receive nothing. $HYDRA_EVENTS_TOKEN_FILE overrides it; "
                                           "unset, the admin token is used, else a token the coordinator writes once to "
                                           "<state_dir>/<name>.events.token (mode 0600).")
    heartbeat_interval_s: float = Field(1.0, gt=0, le=60, description="Seconds between the coordinator's PINGs; engines declare their own interval.")
    liveness: int = Field(3, ge=1, le=100, description="Heartbeat intervals of silence before an engine counts as dead.")
    registry: Path | None = Field(None, description="Model registry (alias → GGUF, size, KV bytes per token); default models.yaml beside this file.")
    profiles: Path | None = Field(None, description="Profiles file; default profiles.yaml beside this file, if present.")
    default_profile: str | None = Field(None, description="Profile applied at start (overrides the profiles file's default).")
    default_model: str | None = Field(None, min_length=1, max_length=512, description="The model that serves a "
                                      "request naming no model while the pool serves several, and one naming a "
                                      "model the pool does not know (its answer then carries X-Hydra-Default-Model). "
                                      "Unset: the first is a 400 and the second a 404, each naming the models served.")
    first_token_timeout_s: float = Field(120.0, gt=0, description="Longest wait for an engine's first event of a request (queue + load + prefill).")
    token_timeout_s: float = Field(60.0, gt=0, description="Longest silence between two events of a streaming request.")
    load_timeout_s: float = Field(600.0, gt=0, description="Longest wait for a model load (profile switch or on-demand).")
    configure_timeout_s: float = Field(30.0, gt=0, description="Longest wait for an engine to answer CONFIGURE.")
    pd_split: bool = Field(True, description="Let one engine prefill a request and another (serving the model or a "
                                             "sibling quant of it) decode it, when the measured speeds say that is "
                                             "faster than any single engine (docs/routing.md). The transfer uses "
                                             "sessions.engine_token_file.")
    load_on_demand: bool = Field(True, description="Let routing load a model on an engine that has it on disk but serves another.")
    affinity_margin_s: float = Field(2.0, ge=0, le=3600, description="How many seconds longer than going elsewhere a "
                                     "request may wait for the engine that holds its session or prefix warm "
                                     "(docs/routing.md). Smaller moves sessions off busy engines sooner.")
    drain_timeout_s: float = Field(30.0, gt=0, description="On SIGTERM, how long in-flight requests may run.")
    state_dir: Path | None = Field(None, description="Directory of the state file (<name>.state.json: the active profile, kept across restarts); default $STATE_DIRECTORY (systemd's StateDirectory=, /var/lib/hydra) when set, else ~/.local/state/hydra.")
    bus_token_file: Path | None = Field(None, description="File holding the pool's shared bus token: a REGISTER without it is refused. Required when the bus listens beyond loopback; $HYDRA_BUS_TOKEN_FILE overrides it.")
    admin_allow_from: list[str] = Field(default_factory=lambda: ["127.0.0.0/8", "::1/128"], description="CIDR networks allowed to call /admin/* (others get 403).")
    admin_token_file: Path | None = Field(None, description="File holding the admin token; when set, /admin/* also needs 'Authorization: Bearer <token>' (else 401).")
    max_body_bytes: int = Field(8 << 20, ge=1024, le=1 << 30, description="Largest request body the front door and /admin accept; larger ones get 413 before they are read.")
    body_timeout_s: float = Field(30.0, gt=0, le=3600, description="Longest time a client may take to send a request body (else 408).")
    models_dir: Path | None = Field(None, description="Directory of the registry's model files that the coordinator "
                                    "serves to engines lacking one (GET /models/files/<name>, for holders of the bus "
                                    "token; docs/coordinator.md, 'Model distribution'). Unset: it serves none.")
    model_files_rate_mib_s: float = Field(0.0, ge=0, le=1 << 20, description="Most MiB a second one model file "
                                          "transfer to an engine may take (0: as fast as the link goes), so that a "
                                          "fetch leaves the pool's requests their share of the link.")
    sessions: SessionSettings = Field(default_factory=SessionSettings, description="Sessions kept in the Store so "
                                      "that they outlive their engine (docs/store.md).")
    logging: LogSettings = Field(default_factory=LogSettings, description="Logging.")

    @field_validator("bus", mode="before")
    @classmethod
    def _bus_short(cls, v: Any) -> Any:
        return {"endpoint": v} if isinstance(v, str) else v

    @field_validator("admin_allow_from")
    @classmethod
    def _cidrs(cls, v: list[str]) -> list[str]:
        return check_networks(v)

    @model_validator(mode="after")
    def _pool(self) -> "CoordinatorSettings":
        """The pool's name, and the sessions' Store in it (two pools on a host never share a Store)."""
        if self.pool is None:
            self.pool = pool_of(self.bus.endpoint, self.name)
        self.sessions = self.sessions.model_copy(update={"store": self.sessions.store.in_pool(self.pool)})
        return self

    def allows_admin(self, host: str | None) -> bool:
        """Whether a client at ``host`` may call /admin/* (IPv4-mapped IPv6 counts as IPv4)."""
        return address_allowed(host, self.admin_allow_from)


def bus_is_loopback(endpoint: str) -> bool:
    """Whether a ROUTER endpoint is reachable from this host only (tcp on a loopback address, ipc, inproc)."""
    scheme, _, rest = endpoint.partition("://")
    if scheme in ("ipc", "inproc"):
        return True
    host = rest.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # "*", an interface name or a host name: assume reachable from the network


@dataclass(frozen=True)
class LoadedConfig:
    settings: CoordinatorSettings
    path: Path | None


def load_config(path: str | Path | None) -> LoadedConfig:
    if path is None:
        return LoadedConfig(CoordinatorSettings(), None)
    p = Path(path)
    settings, _ = read_settings(p, CoordinatorSettings)  # ConfigError naming the file and field
    base = p.resolve().parent
    defaults = {"registry": "models.yaml", "profiles": "profiles.yaml"}
    updates: dict[str, Any] = {key: beside(base, getattr(settings, key), defaults.get(key))
                               for key in ("registry", "profiles", "state_dir", "bus_token_file", "admin_token_file",
                                           "events_token_file", "models_dir")}
    updates["http"] = resolve_api_key(p, settings.http)
    sessions = settings.sessions
    updates["sessions"] = sessions.model_copy(update={
        "engine_token_file": beside(base, sessions.engine_token_file, None),
        "store": sessions.store.model_copy(update={"dir": beside(base, sessions.store.dir, None)})})
    return LoadedConfig(settings.model_copy(update=updates), p)
