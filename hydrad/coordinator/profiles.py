"""Profiles (``etc/hydra/profiles.yaml``): which model each engine serves, and how.

A profile maps engine names to an entry ``{model, mode, peer, ...}``; switching profiles
means sending each affected engine one ENGINE_CONFIGURE payload. :func:`resolve` is the one
place that turns an entry into that payload, so SOLO, COMBINE and PEER differ only in stock
runtime parameters (``rpc_servers``, ``tensor_split``, ``override_tensors``) and never in
special engine modes. An MoE expert split is a COMBINE entry with ``override_tensors`` (its
layers stay on the head unless ``tensor_split`` says otherwise; the expert tensors go where the
overrides send them).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from hydrad.common.yamlfile import read_mapping
from hydrad.common.modeloverrides import check_tensor_override
from hydrad.common.params import ALIASES, RuntimeParams, validation_message

Mode = Literal["SOLO", "COMBINE", "PEER"]

# Set by the mode through resolve(); a profile's `params` may not set them.
MODE_FIELDS: frozenset[str] = frozenset({"model", "split_mode", "tensor_split", "rpc_servers", "override_tensors"})

ENGINE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def _problem(field: str, message: str) -> PydanticCustomError:
    """An error whose message names the field below the failing object's location."""
    return PydanticCustomError("hydra_profile", "{field}: {detail}", {"field": field, "detail": message})


def _names_as_str(v: Any, what: str) -> Any:
    """YAML reads ``3060:`` as an integer; engine names are strings, so take its digits."""
    if not isinstance(v, dict):
        return v
    out: dict[Any, Any] = {}
    for k, val in v.items():
        if isinstance(k, bool) or not isinstance(k, (str, int)):
            raise ValueError(f"{what} names must be strings, got {k!r} (quote keys like 'on' or 'yes')")
        out[str(k)] = val
    return out


class EngineEntry(BaseModel):
    """What one engine does in a profile."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = Field(None, description="Registry alias (or GGUF path) to serve; none for a PEER.")
    mode: Mode = Field("SOLO", description="SOLO: its own GPU; COMBINE: its GPU plus the peer's over ggml-RPC; PEER: lends its GPU.")
    peer: str | None = Field(None, description="COMBINE only: the engine (mode PEER in the same profile) whose device joins this one.")
    tensor_split: tuple[float, float] | None = Field(
        None, description="COMBINE only: share of the layers on [this engine, the peer]; default an even split.")
    override_tensors: tuple[str, ...] | None = Field(
        None, description="Tensor placement overrides 'regex=BUFFER', e.g. experts on the peer: 'blk\\..*\\.ffn_.*_exps\\..*=RPC0'.")
    params: dict[str, Any] = Field(
        default_factory=dict, description="Further runtime parameters for this engine in this profile (n_ctx, n_parallel, ...).")

    @field_validator("mode", mode="before")
    @classmethod
    def _mode_case(cls, v: Any) -> Any:
        return v.upper() if isinstance(v, str) else v  # the bus reports modes in lower case

    @field_validator("tensor_split")
    @classmethod
    def _split(cls, v: tuple[float, float] | None) -> tuple[float, float] | None:
        if v is not None and (min(v) < 0 or sum(v) <= 0):
            raise ValueError("shares must be non-negative and not all zero")
        return v

    @field_validator("override_tensors")
    @classmethod
    def _overrides(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for item in v or ():
            check_tensor_override(item)
        return v

    @field_validator("params")
    @classmethod
    def _params(cls, v: dict[str, Any]) -> dict[str, Any]:
        owned = sorted(k for k in v if ALIASES.get(k, k) in MODE_FIELDS)  # llama.cpp's spelling is the same field
        if owned:
            raise ValueError(f"set by the entry's model/mode, not params: {', '.join(owned)}")
        try:
            RuntimeParams(**v)
        except ValidationError as exc:
            raise ValueError(validation_message(exc)[0]) from None
        return v

    @model_validator(mode="after")
    def _mode(self) -> "EngineEntry":
        if self.mode == "PEER":
            for name in ("model", "peer", "tensor_split", "override_tensors"):
                if getattr(self, name) is not None:
                    raise _problem(name, "a PEER serves no model of its own; its device serves its head's layers")
            if self.params:
                raise _problem("params", "a PEER serves no model, so it takes no runtime parameters")
            return self
        if self.model is None:
            raise _problem("model", f"{self.mode} needs a model")
        if self.mode == "COMBINE":
            if self.peer is None:
                raise _problem("peer", "COMBINE needs a peer engine")
        else:
            if self.peer is not None:
                raise _problem("peer", "only a COMBINE entry has a peer")
            if self.tensor_split is not None:
                raise _problem("tensor_split", "only a COMBINE entry splits across devices")
            rpc = [o for o in self.override_tensors or () if o.rpartition("=")[2].upper().startswith("RPC")]
            if rpc:
                raise _problem("override_tensors", f"a SOLO entry has no RPC device: {', '.join(rpc)}")
        return self


class Profile(BaseModel):
    """A named placement: engine name → entry. Engines not listed are left as they are."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    description: str = Field("", description="Free text shown by the console and hydractl.")
    engines: dict[str, EngineEntry] = Field(default_factory=dict, description="Engine name → what it does.")

    @field_validator("engines", mode="before")
    @classmethod
    def _engine_names(cls, v: Any) -> Any:
        return _names_as_str(v, "engine")

    @field_validator("engines")
    @classmethod
    def _engine_name_shape(cls, v: dict[str, EngineEntry]) -> dict[str, EngineEntry]:
        bad = [k for k in v if not ENGINE_NAME.match(k)]
        if bad:
            raise ValueError(f"bad engine name(s) {', '.join(map(repr, bad))}: use letters, digits, '_', '.', '-'")
        return v

    @model_validator(mode="after")
    def _peers(self) -> "Profile":
        lent: dict[str, str] = {}
        for name, entry in self.engines.items():
            if entry.mode != "COMBINE" or entry.peer is None:
                continue
            where = f"engines.{name}.peer"
            peer = self.engines.get(entry.peer)
            if entry.peer == name:
                raise _problem(where, "an engine cannot be its own peer")
            if peer is None:
                raise _problem(where, f"{entry.peer!r} is not an engine of this profile (add it with mode: PEER)")
            if peer.mode != "PEER":
                raise _problem(where, f"{entry.peer!r} has mode {peer.mode}; a peer must have mode PEER")
            if entry.peer in lent:
                raise _problem(where, f"{entry.peer!r} is already the peer of {lent[entry.peer]!r}")
            lent[entry.peer] = name
        return self


class ProfileSet(BaseModel):
    """Every profile of a profiles file, and which one applies when nobody chose."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profiles: dict[str, Profile] = Field(default_factory=dict, description="Profile name → profile.")
    default: str | None = Field(None, description="Profile applied at start unless the coordinator's settings name another; default the first.")

    @field_validator("profiles", mode="before")
    @classmethod
    def _profile_names(cls, v: Any) -> Any:
        return _names_as_str(v, "profile")

    @model_validator(mode="after")
    def _default(self) -> "ProfileSet":
        if self.default is not None and self.default not in self.profiles:
            raise _problem("default", f"{self.default!r} is not a profile ({self._known()})")
        return self

    @property
    def default_name(self) -> str | None:
        """The default profile's name: ``default`` when set, else the first profile, else None."""
        return self.default if self.default is not None else next(iter(self.profiles), None)

    def get(self, name: str) -> Profile:
        """The named profile; KeyError listing the known names otherwise."""
        try:
            return self.profiles[name]
        except KeyError:
            raise KeyError(f"unknown profile {name!r} ({self._known()})") from None

    def _known(self) -> str:
        return "known: " + ", ".join(sorted(self.profiles)) if self.profiles else "no profiles defined"


def load_profiles(path: str | Path) -> ProfileSet:
    """Read and validate a profiles file; ValueError naming the file and the field otherwise."""
    p = Path(path)
    raw = read_mapping(p, "a mapping with 'profiles' and 'default'")
    try:
        return ProfileSet(**raw)
    except ValidationError as exc:
        raise ValueError(f"{p}: {_messages(exc)}") from None


def _messages(exc: ValidationError) -> str:
    """pydantic's errors as 'field.path: message', with our own errors' field appended to the path."""
    parts: list[str] = []
    for err in exc.errors():
        loc = [str(x) for x in err["loc"]]
        ctx = err.get("ctx") or {}
        if err["type"] == "hydra_profile":
            loc.append(str(ctx["field"]))
            msg = str(ctx["detail"])
        elif err["type"] == "extra_forbidden":
            msg = "unknown field"
        else:
            msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{'.'.join(loc) or '(root)'}: {msg}")
    return "; ".join(parts)


# --------------------------------------------------------------------------- resolution


def resolve(
    entry: EngineEntry,
    models: Mapping[str, Any],
    peer_rpc: Mapping[str, str],
) -> dict[str, Any]:
    """The ENGINE_CONFIGURE payload that puts an engine in the state ``entry`` describes.

    ``models`` maps alias → registry entry (only membership is checked); ``peer_rpc`` maps engine name → its merged RPC address (``host:port``). A model
    given as a ``.gguf`` path needs no registry entry. Every non-PEER payload names
    ``tensor_split``, ``rpc_servers`` and ``override_tensors`` (None when unused) so switching
    from COMBINE back to SOLO clears them.
    """
    if entry.mode == "PEER":
        return {"model": None}
    assert entry.model is not None  # EngineEntry's validator guarantees it
    _check_known(entry.model, models)
    # The registry's defaults for the model are not copied in: the engine applies them itself as a layer
    # below its own YAML, so a GPU's tuned n_ctx in /etc/hydra/<name>.yaml is not overridden here. Nor
    # is its offload (n_gpu_layers, split_mode): forcing full offload made a CPU host's engine (0 layers
    # in its YAML) reload the model it had just loaded, and would push a GPU tuned for partial offload
    # out of memory. Only COMBINE needs them, for the peer's device.
    payload: dict[str, Any] = {"model": entry.model, **entry.params}
    payload["tensor_split"] = None
    payload["rpc_servers"] = None
    payload["override_tensors"] = list(entry.override_tensors) if entry.override_tensors else None
    if entry.mode == "COMBINE":
        assert entry.peer is not None
        address = peer_rpc.get(entry.peer)
        if not address:
            known = ", ".join(sorted(peer_rpc)) or "none"
            raise ValueError(f"no RPC address known for peer {entry.peer!r} (known: {known}); is it registered?")
        payload["rpc_servers"] = [address]
        if entry.tensor_split:
            payload["tensor_split"] = list(entry.tensor_split)
        else:  # a dense split halves the layers; an expert split keeps them on the head
            payload["tensor_split"] = [1.0, 0.0] if entry.override_tensors else [0.5, 0.5]
        payload.setdefault("n_gpu_layers", -1)
        payload.setdefault("split_mode", "layer")
    return payload


def resolve_profile(
    profile: Profile,
    models: Mapping[str, Any],
    peer_rpc: Mapping[str, str],
) -> dict[str, dict[str, Any]]:
    """Engine name → payload for every engine the profile names."""
    return {name: resolve(entry, models, peer_rpc) for name, entry in profile.engines.items()}


def diff_profiles(current: dict[str, dict[str, Any]], target: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The target payloads of the engines that would change; an unchanged engine is left alone.

    An engine changes when any key of its target payload differs from (or is missing in) its
    current one, so ``current`` may be a full effective configuration. Engines absent from
    ``target`` are not touched by the switch and do not appear.
    """
    missing = object()
    out: dict[str, dict[str, Any]] = {}
    for name, payload in target.items():
        now = current.get(name)
        if now is None or any(_norm(now.get(k, missing)) != _norm(v) for k, v in payload.items()):
            out[name] = payload
    return out


def _norm(v: Any) -> Any:
    """Lists and tuples compare equal: one side may have come through JSON, the other not."""
    return [_norm(x) for x in v] if isinstance(v, (list, tuple)) else v


def _check_known(alias: str, models: Mapping[str, Any]) -> None:
    if alias not in models and not alias.endswith(".gguf"):
        raise ValueError(f"unknown model {alias!r} (known: {', '.join(sorted(models)) or 'none'})")
