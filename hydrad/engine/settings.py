"""Start-only settings of one engine (tier T4), read from ``/etc/hydra/<name>.yaml``.

One settings model and one ``load_config`` so ``--config``, ``--check-config`` and
``--print-config`` can never disagree about what a file means. Relative paths in a file
resolve against that file's directory, so a unit started from ``/`` and a developer in the
repository read the same config the same way.
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hydrad.common import tokenfile
from hydrad.common.apikey import InferenceAccess, resolve_api_key
from hydrad.common.netaccess import address_allowed, check_networks
from hydrad.common.params import check_partial, validation_message
from hydrad.common.registry import ModelEntry
from hydrad.common.webui import WebUiSetting
from hydrad.common.yamlfile import ConfigError, beside, read_settings
from hydrad.engine.jinjabox import TemplateLimits
from hydrad.store.settings import POOL_PATTERN, StoreSettings, pool_of


class HttpSettings(InferenceAccess, WebUiSetting):
    model_config = ConfigDict(extra="forbid")
    host: str = Field("127.0.0.1", description="Address the OpenAI/control HTTP server binds.")
    port: int = Field(8080, ge=0, le=65535, description="HTTP port; 0 = pick a free one (tests).")
    max_body_bytes: int = Field(8 << 20, ge=1024, le=1 << 30,
                                description="Largest request body accepted; a larger one gets 413 before it is read.")
    header_timeout_s: float = Field(10.0, gt=0, le=3600,
                                    description="How long a connection may take to send a request's headers and body "
                                                "(and may stay idle between requests) before it is closed.")
    strict_model_names: bool = Field(False, description="Answer a request whose model names another model than "
                                     "the one loaded with 404 (model_not_found). Off (llama-server's way): the "
                                     "loaded model serves it, and the answer names the loaded model.")
    metrics_endpoint: bool = Field(True, description="Serve GET /metrics (Prometheus text). Off: it answers 501 "
                                   "not_supported, as llama-server does without --metrics; hydrad started with "
                                   "llama-server's command line (-m) turns it off unless --metrics is given.")
    slots_endpoint: bool = Field(True, description="Serve GET /slots (each slot's state). Off (llama-server's "
                                 "--no-slots): it answers 501 not_supported; the slot actions and state "
                                 "endpoints are not affected.")


class RpcSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    host: str = Field("127.0.0.1", description="Address the merged RPC port binds.")
    port: int = Field(9503, ge=0, le=65535, description="Merged RPC port (ggml-RPC and Hydra binary ops); 0 = pick a free one.")
    enabled: bool = Field(True, description="Open the merged RPC port at all.")
    ggml_rpc: bool = Field(True, description="Run llama.cpp's ggml RPC server in-process so peers can compute on this engine's devices.")
    ggml_threads: int = Field(0, ge=0, le=1024, description="CPU threads the ggml RPC server computes a peer's graphs "
                              "with when it lends a CPU device; 0 = every CPU the engine may use (its affinity, capped by a cgroup CPU quota).")
    cache_dir: Path | None = Field(None, description="Tensor cache of the ggml RPC server (weights a peer sent once are found by hash); default: <cache>/hydra/rpc-<name>.")
    token: str | None = Field(None, min_length=1, description="Shared secret: when set, Hydra ops need HELLO with it first and HTTP "
                              "/control/* and /slots/*/state* need 'Authorization: Bearer <token>'. Prefer token_file.")
    token_file: Path | None = Field(None, description="File holding the token (read once at start, surrounding whitespace "
                                    "stripped), so the secret stays out of this YAML; relative to the config file.")
    max_control_connections: int = Field(8, ge=1, le=1024, description="Identified (authenticated) Hydra control sessions "
                                         "served at once; more get BUSY.")
    max_pending_connections: int = Field(16, ge=1, le=1024, description="Connections not yet identified (no complete first "
                                         "request, or no HELLO on an engine with a token); beyond this the oldest is dropped.")
    control_idle_timeout_s: float = Field(60.0, gt=0, le=86400, description="An identified control session that sends "
                                          "nothing for this long (between requests, or inside one) is closed, so idle "
                                          "sessions cannot keep the max_control_connections places for good.")
    handshake_timeout_s: float = Field(5.0, gt=0, description="Time a new connection has to send its first complete request "
                                       "(and, with a token, its HELLO) before it is closed.")
    ggml_idle_timeout_s: float = Field(60.0, gt=0, description="A ggml-RPC peer that holds no buffer on this engine and sends "
                                       "no command for this long is closed (a peer with buffers is kept: keepalive finds dead ones).")
    ggml_io_timeout_s: float = Field(10.0, gt=0, description="A ggml-RPC peer that stalls inside a command for this long (or for "
                                     "ggml_idle_timeout_s if that is shorter) is closed.")
    max_ggml_connections: int = Field(8, ge=1, le=256, description="ggml-RPC peer connections served at once; more are closed.")
    ggml_direct_from: list[str] = Field(default_factory=list, description="Networks (CIDR) whose ggml-RPC peers are handed "
                                        "to llama.cpp's own RPC server once their HELLO is answered, one peer at a time: "
                                        "the stock server's speed (no per-command hop) and its trust model (a malformed "
                                        "command from such a peer can abort this engine). Empty: every peer goes through "
                                        "the checking relay. The peer must be in control_allow_from too (docs/rpc-protocol.md, 'The direct line').")

    @field_validator("ggml_direct_from")
    @classmethod
    def _direct_cidrs(cls, v: list[str]) -> list[str]:
        return check_networks(v)
    chunk_size: int = Field(2 << 20, ge=4096, le=64 << 20, description="STATE_DATA chunk size in bytes.")
    max_state_bytes: int = Field(8 << 30, ge=1, description="Largest KV state a STATE_PUT may declare.")
    first_byte_timeout_s: float = Field(10.0, gt=0, description="How long a new connection may wait before sending its first byte.")

    @model_validator(mode="after")
    def _token_source(self) -> "RpcSettings":
        if self.token is not None and self.token_file is not None:
            raise ValueError("set rpc.token or rpc.token_file, not both")
        return self

    def read_token_file(self, base: Path | None = None) -> "RpcSettings":
        """A copy with ``token`` read from ``token_file``; ConfigError naming the field when it cannot be used.

        Read at start only: the secret then lives in a root-readable file (e.g. /etc/hydra/engine.token,
        mode 0600) rather than in a YAML that operators copy around and paste into tickets. Same file
        format as the bus and admin tokens (hydrad.common.tokenfile)."""
        if self.token_file is None:
            return self
        path = self.token_file if self.token_file.is_absolute() or base is None else base / self.token_file
        try:
            token = tokenfile.read_token(path)
        except tokenfile.TokenError as exc:
            raise ConfigError(f"rpc.token_file: {exc}") from None
        return self.model_copy(update={"token_file": path, "token": token})


class LogSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level of the daemon.")
    llama_level: Literal["debug", "info", "warning", "error"] = Field(
        "warning", description="Least level of llama.cpp's own log lines that reach our log.")
    slow_turn_ms: float = Field(
        0.0, ge=0, description="Log (info) every turn of the engine loop that took longer than this many ms, with "
                               "where its time went (commands, admission, each generation's step, and what follows: "
                               "handing retired generations to the reaper, the hand-over of events): finds what "
                               "holds streams up, e.g. during a reload. 0 = off.")
    slow_loop_ms: float = Field(
        0.0, ge=0, description="Log (info, 'event loop held') every time the HTTP event loop took longer than this "
                               "many ms to run a callback, with where it was: a request's arrival and answer pass "
                               "that loop, outside the request's own timings. Checked every this many ms, one "
                               "wake-up of the loop each. 0 = off, else at least 1.")

    @field_validator("slow_loop_ms")
    @classmethod
    def _loop_check_not_too_often(cls, v: float) -> float:
        if 0 < v < 1:
            raise ValueError("0 (off) or at least 1 ms: each check wakes the event loop once")
        return v


class ReaperSettings(BaseModel):
    """Pacing of the reaper thread, which frees a retired generation while the new one serves.

    Freeing device memory (cudaFree) waits for the device and holds up the serving generation's next
    launches while it runs, so the free is paced: first the context (KV cache, compute buffers), then,
    ``pause_ms`` later, the weights, so that no request of the new generation waits for both."""

    model_config = ConfigDict(extra="forbid")
    delay_ms: float = Field(1000.0, ge=0, le=600_000,
                            description="Wait this long after a generation's last request before freeing it (its "
                                        "memory stays in use meanwhile). A load or shutdown frees it at once.")
    pause_ms: float = Field(200.0, ge=0, le=60_000,
                            description="Pause between freeing a retired generation's context and its weights.")


class BusSettings(BaseModel):
    """The engine's link to the coordinator's ZeroMQ bus (start-only, like every setting here)."""

    model_config = ConfigDict(extra="forbid")
    endpoint: str | None = Field(None, description="Coordinator ROUTER to connect, e.g. tcp://127.0.0.1:9500; None = no coordinator.")
    heartbeat_interval_s: float = Field(1.0, gt=0, le=60, description="Seconds between heartbeats; 3 missed = dead, both ways.")
    curve_server_key: str | None = Field(None, min_length=40, max_length=40, description="Coordinator's CURVE public key (Z85); set to encrypt the bus.")
    curve_public_key: str | None = Field(None, min_length=40, max_length=40, description="This engine's CURVE public key (Z85).")
    curve_secret_key: str | None = Field(None, min_length=40, max_length=40, description="This engine's CURVE secret key (Z85).")
    token_file: Path | None = Field(None, description="File holding the pool's shared bus token (the coordinator's bus_token_file), sent with REGISTER; absolute path, mode 0600. $HYDRA_BUS_TOKEN_FILE overrides it.")

    @field_validator("token_file")
    @classmethod
    def _token_file(cls, v: Path | None) -> Path | None:
        # Absolute only: this model does not know the config file's directory, and a token read
        # from wherever the daemon happens to start would be a silent misconfiguration.
        if v is not None and not v.is_absolute():
            raise ValueError(f"token_file must be an absolute path (got {str(v)!r})")
        return v

    def token_path(self) -> Path | None:
        """The bus token's file: ``$HYDRA_BUS_TOKEN_FILE`` (``hydractl up`` sets it for its pool) wins over
        ``token_file``. Read again by each user (REGISTER, a model fetch), so a replaced file takes effect."""
        env = os.environ.get(tokenfile.ENV_BUS_TOKEN_FILE, "").strip()
        return Path(env) if env else self.token_file

    @model_validator(mode="after")
    def _curve(self) -> "BusSettings":
        if (self.curve_public_key is None) != (self.curve_secret_key is None):
            raise ValueError("curve_public_key and curve_secret_key come together")
        if self.curve_public_key is not None and self.curve_server_key is None:
            raise ValueError("an engine key pair needs curve_server_key (the coordinator's public key)")
        return self


class FetchSettings(BaseModel):
    """Fetching a registry model this engine's disk lacks from the pool (docs/coordinator.md, 'Model distribution')."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(True, description="Fetch a registry model whose file is missing from models_dir (its entry "
                          "must give size_bytes and sha256) before loading it. Off: such a load is refused, as "
                          "for a model the registry does not know.")
    url: str | None = Field(None, pattern=r"^https?://[^/\s]+/?$", description="Where to fetch from: the "
                            "coordinator's HTTP door, http://host:port. Unset: the address the coordinator offers "
                            "on the bus (its bus host and HTTP port).")
    models_cache_gib: float = Field(64.0, gt=0, le=1 << 20, description="Most GiB of fetched model files kept in "
                                    "models_dir; a fetch beyond it first deletes the least recently used fetched "
                                    "files (never the model in use, never a file the operator put there).")
    stall_timeout_s: float = Field(30.0, gt=0, le=3600, description="A transfer that receives no byte for this long "
                                   "fails the load (a later load resumes it).")
    connect_timeout_s: float = Field(10.0, gt=0, le=600, description="Longest wait to connect to the source.")


class PrefixSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    share: bool = Field(True, description="Copy a shared prompt prefix from another slot of this engine instead of "
                                          "prefilling it again (and checkpoint it into the store when one is set).")
    min_tokens: int = Field(64, ge=1, description="Smallest gain, in tokens, for which a prefix is copied from "
                                                  "another slot or restored from the store.")
    store: StoreSettings | None = Field(None, description="The pool's Store (a directory every engine of the host "
                                                          "and the coordinator share, on tmpfs): prefixes are "
                                                          "checkpointed into it and restored from it. Unset: "
                                                          "prefixes are shared between this engine's slots only.")


class EngineSettings(BaseModel):
    """Everything fixed for the life of the process."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("engine", pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="Engine name, unique in the pool (the systemd instance name).")
    pool: str | None = Field(None, pattern=POOL_PATTERN, description="The pool's name, which names the Store directory "
                             "prefix.store uses unless it sets dir (<root>/hydra-store/<pool>, docs/store.md). Unset: "
                             "derived from bus.endpoint, bus-<port> (as the coordinator derives its own), else this "
                             "engine's name.")
    http: HttpSettings = Field(default_factory=HttpSettings, description="HTTP server.")
    rpc: RpcSettings = Field(default_factory=RpcSettings, description="Merged RPC port.")
    models_dir: Path = Field(Path("/var/lib/hydra/models"), description="Directory GGUF paths and registry entries are relative to.")
    registry: Path | None = Field(None, description="Model registry file (alias → GGUF); default: models.yaml beside this config, if present.")
    models: dict[str, ModelEntry] = Field(
        default_factory=dict, description="Registry entries of this engine's own, over the registry file's (an "
        "entry of the same name replaces the file's): what llama-server's -m and --alias make, an entry named by "
        "the first alias (else the file's name) that the other aliases also name.")
    control_allow_from: list[str] = Field(
        default_factory=lambda: ["127.0.0.0/8", "::1/128"],
        description="CIDR networks allowed to call /control/*, /slots/*/state*, every Hydra op "
                    "on the merged port and ggml-RPC compute.")
    device: str | None = Field(
        None, pattern=r"^([0-9]{1,3}(,[0-9]{1,3})*|GPU-[0-9a-fA-F-]{8,64})$",
        description="GPU(s) this engine may use: an index as nvidia-smi counts them (\"0\", \"0,1\") or a GPU UUID. "
                    "The others stay invisible to llama.cpp, so hydrad@a and hydrad@b on one host each get their own. "
                    "None = every GPU of the host.")
    cuda_graphs: bool = Field(
        True, description="Let llama.cpp's CUDA back end replay decode steps as CUDA graphs (about 1.9x single-stream "
                          "decode on an H200 with a small model). false sets GGML_CUDA_DISABLE_GRAPHS=1 for this engine: "
                          "the way around a CUDA-graph fault of the bundled llama.cpp seen with 32-64 concurrent streams "
                          "(docs/benchmarks.md). Read at start; ignored without CUDA.")
    cuda_pinned_host: bool | Literal["alone"] = Field(
        True, description="Let llama.cpp's CUDA back end keep its host-side buffers (a context's logits and CPU "
                          "compute buffers, the loader's staging) in page-locked memory. Allocating it "
                          "(cudaMallocHost) stalls every other context on the GPU for a moment, so a new context "
                          "created during an overlap reload stalls the old generation's steps by about 10 ms on an "
                          "H200. alone: page-locked except for a context created while another generation serves "
                          "(it keeps ordinary memory for its life); false: never (GGML_CUDA_NO_PINNED=1 for this "
                          "engine). Read at start; ignored without CUDA.")
    switch_interval_ms: float = Field(
        0.05, gt=0, le=100,
        description="The interpreter's thread switch interval (sys.setswitchinterval), ms. The engine thread gives "
                    "the interpreter lock up around every llama.cpp call of a step and, while the event loop (HTTP, "
                    "streaming) or the loader thread runs Python, waits up to this long for it each time: shorter "
                    "means shorter waits for the step and more switches for the others (Python's default is 5).")
    load_threads: int = Field(
        1, ge=0, le=256,
        description="CPU threads a model load takes from the generation serving beside it (an overlap reload): "
                    "until the load ends, the serving context computes with this many fewer (never fewer than 1) "
                    "and the new generation warms up on this many; then each has its own n_threads again. A "
                    "context's CPU thread pool waits at the end of each step for its slowest thread, so a pool "
                    "as wide as the machine that loses a core to the loader stalls whole steps (on the 2-core "
                    "machine: the longest gap of an overlap reload 3.4-3.9x the steady gap). 0 = no sharing.")
    reaper: ReaperSettings = Field(default_factory=ReaperSettings,
                                   description="How a generation retired by a reload is freed.")
    drain_timeout_s: float = Field(30.0, gt=0, description="On SIGTERM, how long in-flight requests may run before they are ended.")
    max_queue: int = Field(64, ge=0, description="Requests that may wait for a free slot; beyond that new ones get 503.")
    logging: LogSettings = Field(default_factory=LogSettings, description="Logging.")
    prefix: PrefixSettings = Field(default_factory=PrefixSettings, description="Prefix checkpoints: a shared prompt "
                                   "prefix copied from another slot or restored from the pool's Store instead of "
                                   "prefilled again.")
    bus: BusSettings = Field(default_factory=BusSettings, description="Link to the coordinator's bus.")
    fetch: FetchSettings = Field(default_factory=FetchSettings, description="Fetching model files this engine "
                                 "lacks from the coordinator.")
    templates: TemplateLimits = Field(default_factory=TemplateLimits, description="Limits on rendering a jinja chat "
                                      "template (the chat_template parameter, or the model's own, for requests with "
                                      "tools): time, memory and output of each render.")
    slot_save_dir: Path | None = Field(
        None, description="Directory of slot files, llama-server's --slot-save-path: POST /slots/{id}?action=save, "
                          "restore and erase are served only when it is set (501 otherwise). Relative to the config "
                          "file; created (mode 0700) on the first save. Only this engine's user should be able to "
                          "write it.")
    slot_file_max_bytes: int = Field(8 << 30, ge=4096, description="Largest slot file saved or restored; a bigger "
                                     "one is refused (413) before it is written or read.")
    defaults: dict[str, Any] = Field(default_factory=dict, description="Runtime parameter defaults (the YAML layer); a model here is loaded at boot.")

    @field_validator("control_allow_from")
    @classmethod
    def _cidrs(cls, v: list[str]) -> list[str]:
        return check_networks(v)

    @field_validator("device", mode="before")
    @classmethod
    def _device_number(cls, v: Any) -> Any:
        # YAML reads `device: 0` as a number; written the natural way, an index is still an index
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v

    @field_validator("defaults")
    @classmethod
    def _defaults(cls, v: dict[str, Any]) -> dict[str, Any]:
        return check_partial(v)

    @model_validator(mode="after")
    def _pool(self) -> "EngineSettings":
        """The pool's name, and the prefix Store in it: the directory the pool's coordinator uses too."""
        if self.pool is None:
            self.pool = pool_of(self.bus.endpoint, self.name)
        if self.prefix.store is not None:
            self.prefix = self.prefix.model_copy(update={"store": self.prefix.store.in_pool(self.pool)})
        return self

    def allows_control(self, host: str | None) -> bool:
        return address_allowed(host, self.control_allow_from)

    def token_ok(self, presented: str | None) -> bool:
        """Whether ``presented`` is the engine's token (constant time); True when no token is configured.

        One check for the merged port's HELLO and HTTP's ``Authorization: Bearer``, so the two
        doors of the same engine can never disagree about who is authenticated."""
        expected = self.rpc.token
        if expected is None:
            return True
        if not isinstance(presented, str):
            return False
        return hmac.compare_digest(presented.encode("utf-8", "surrogateescape"), expected.encode("utf-8"))


@dataclass(frozen=True)
class LoadedConfig:
    settings: EngineSettings
    path: Path | None
    raw: dict[str, Any]
    # The command line's layer (llama-server's flags, hydrad.cli.llamaflags), under the file's, and the
    # API keys it gave (never part of a layer: nothing prints them). A SIGHUP re-read keeps both.
    flags: dict[str, Any] = field(default_factory=dict)
    api_keys: tuple[str, ...] = ()

    def sources(self) -> dict[str, Any]:
        """Effective start-only values with where each came from ('yaml', 'flag' or 'default')."""
        out: dict[str, Any] = {}
        dumped = self.settings.model_dump(mode="json")

        def source(key: str, sub: str | None = None) -> str:
            for layer, name in ((self.raw, "yaml"), (self.flags, "flag")):
                node = layer.get(key)
                if (sub is None and key in layer) or (sub is not None and isinstance(node, dict) and sub in node):
                    return name
            return "default"

        for key, value in dumped.items():
            if key == "defaults":
                continue
            if isinstance(value, dict) and key != "models":
                for sub, subval in value.items():
                    if key == "rpc" and sub == "token" and subval is not None:
                        subval = "(set)"  # never print the secret
                    out[f"{key}.{sub}"] = {"value": subval, "source": source(key, sub)}
            else:
                out[key] = {"value": value, "source": source(key)}
        return out


def load_config(path: str | Path | None, flags: dict[str, Any] | None = None,
                api_keys: tuple[str, ...] = ()) -> LoadedConfig:
    """Read and validate a YAML config over the command line's layer ``flags`` (the file wins where
    both set a field); raise ConfigError naming file and field."""
    flags = flags or {}
    if path is None:
        try:
            settings = EngineSettings(**flags)
        except ValidationError as exc:
            raise ConfigError(validation_message(exc, "command line")[0]) from None
        return LoadedConfig(settings, None, {}, flags, api_keys)
    p = Path(path)
    settings, raw = read_settings(p, EngineSettings, flags)  # ConfigError naming the file and field
    base = p.resolve().parent
    updates: dict[str, Any] = {}
    if settings.rpc.token_file is not None:
        try:
            updates["rpc"] = settings.rpc.read_token_file(base)
        except ConfigError as exc:
            raise ConfigError(f"{p}: {exc}") from None
    updates["http"] = resolve_api_key(p, settings.http)
    updates["models_dir"] = beside(base, settings.models_dir)
    updates["registry"] = beside(base, settings.registry, "models.yaml")
    updates["slot_save_dir"] = beside(base, settings.slot_save_dir)
    if settings.prefix.store is not None:
        store = settings.prefix.store.model_copy(update={"dir": beside(base, settings.prefix.store.dir)})
        updates["prefix"] = settings.prefix.model_copy(update={"store": store})
    return LoadedConfig(settings.model_copy(update=updates), p, raw, flags, api_keys)
